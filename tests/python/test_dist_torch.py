# SPDX-License-Identifier: Apache-2.0
"""DCP over the engine's own torch.distributed group (mla.dist.torch_group): two processes run the DCP
decode of test_dcp.PROBLEM (every DcpExchange) once over a torch.distributed group and once over mla's own
group of the same kind, and the outputs must be equal bit for bit (the same bytes moved, sums in the same
order). CPU: gloo vs mla's socket group. CUDA (2 GPUs): NCCL vs mla's NCCL group."""
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

import mla

torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")
from test_dcp import PROBLEM, _cuda_gpus, free_port, wait_all  # noqa: E402

RANK_SCRIPT = PROBLEM + textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import mla.dist
    kind, port, rdv = sys.argv[1], sys.argv[2], sys.argv[3]
    env = mla.process_group_env()
    w, r = env["world_size"], env["rank"]
    backend = "nccl" if kind == "cuda" else "gloo"
    if kind == "cuda":
        torch.cuda.set_device(env["local_rank"])
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=w)
    ours = mla.dist.torch_group()
    assert (ours.rank, ours.world_size, ours.backend) == (r, w, "torch:" + backend), (ours.rank, ours.backend)
    own = mla.process_group(None if kind == "cpu" else "cuda")
    EXCHANGES = [mla.DcpExchange.all_to_all, mla.DcpExchange.allgather_reduce_scatter,
                 mla.DcpExchange.all_to_all_overlap]

    def step_cuda(comm, ex):
        dev = torch.device("cuda", env["local_rank"])
        c, table, local, q = cuda_rank_inputs(w, r, dev)
        out = torch.full((len(LENS), 1, H, D_V), float("nan"), dtype=torch.bfloat16, device=dev)
        lse = torch.full((len(LENS), 1, H), float("nan"), dtype=torch.float32, device=dev)
        ws = torch.zeros(mla.dcp_mqa_decode_workspace_bytes(len(LENS), 1, H, MB, PAGE, "bf16", w, dev, exchange=ex),
                         dtype=torch.uint8, device=dev)
        mla.dcp_mqa_decode(comm, q, c, table, local, out, lse, SCALE, ws, exchange=ex)
        comm.synchronize()
        torch.cuda.synchronize(dev)
        return out.view(torch.int16).cpu().numpy(), lse.cpu().numpy()

    step = rank_step if kind == "cpu" else step_cuda
    for ex in EXCHANGES:
        a, b = step(ours, ex), step(own, ex)
        assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes(), f"rank {r} {ex}: not bit-equal"
        assert not np.isnan(a[1]).any(), f"rank {r} {ex}: lse not written"
    if kind == "cuda":  # mla over torch's own ncclComm_t, where this torch exposes it
        pg = dist.distributed_c10d._get_default_group()
        nccl_pg = pg._get_backend(torch.device("cuda")) if hasattr(pg, "_get_backend") else None
        if nccl_pg is not None and hasattr(nccl_pg, "_comm_ptr"):
            borrowed = mla.nccl_group_from(nccl_pg._comm_ptr(), f"cuda:{env['local_rank']}")
            assert (borrowed.rank, borrowed.world_size) == (r, w)
            for ex in EXCHANGES:
                a, b = step(borrowed, ex), step(own, ex)
                assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes(), f"rank {r} {ex}"
            print("COMM_PTR OK", r)
    # A collective of the wrong size is refused before torch sees it; so are views off the group's device.
    if kind == "cuda":
        gdev = torch.device("cuda", env["local_rank"])
        small, wrong = torch.ones(2, device=gdev), torch.zeros(5, device=gdev)
    else:
        small, wrong = np.ones(2, np.float32), np.zeros(5, np.float32)
    try:
        ours.all_gather(small, wrong)
        sys.exit(4)
    except ValueError as e:
        assert f"expected {2 * w}" in str(e), e
    if kind == "cuda":
        try:
            ours.all_gather(np.ones(2, np.float32), np.zeros(2 * w, np.float32))
            sys.exit(5)
        except ValueError as e:
            assert "group's device" in str(e), e
    dist.barrier()
    dist.destroy_process_group()
    print("RANK OK", r, ours.backend, own.backend)
""")


def _run(kind, world=2):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        port = free_port()
        procs = []
        for r in range(world):
            env = dict(os.environ)
            pkg = os.path.dirname(os.path.dirname(os.path.abspath(mla.__file__)))
            env["PYTHONPATH"] = pkg + os.pathsep + os.path.dirname(__file__) + os.pathsep + env.get("PYTHONPATH", "")
            for k in ("MLA_NCCL_ID", "MASTER_ADDR", "MASTER_PORT", "MLA_DCP_PORT"):
                env.pop(k, None)
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MLA_DCP_TIMEOUT_MS="60000",
                       MLA_DCP_RENDEZVOUS=os.path.join(d, "rendezvous"))
            procs.append(subprocess.Popen([sys.executable, script, kind, str(port), d], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True))
        return wait_all(procs, 300)


@pytest.mark.parametrize("world", [2, 3])  # 3: the float64 sums of reduce_scatter in rank order
def test_gloo_group_equals_socket_group(world):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    codes, outs = _run("cpu", world)
    assert codes == [0] * world, outs
    assert all("RANK OK" in o and "torch:gloo socket" in o for o in outs), outs


@pytest.mark.parametrize("world", [2, 4])
def test_nccl_torch_group_equals_mla_nccl_group(world):
    if _cuda_gpus() < world:
        pytest.skip(f"needs {world} CUDA GPUs, NCCL and torch")
    codes, outs = _run("cuda", world)
    assert codes == [0] * world, outs
    assert all("RANK OK" in o and "torch:nccl nccl" in o for o in outs), outs
    print("\n".join(o for o in outs if "COMM_PTR OK" in o) or "this torch does not expose its ncclComm_t")


def test_torch_group_needs_init():
    import mla.dist  # noqa: PLC0415
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("torch.distributed is initialised in this process")
    with pytest.raises(ValueError, match="not initialised"):
        mla.dist.torch_group()


def test_callback_group_checks_impl():
    with pytest.raises(TypeError, match="no method 'all_gather'"):
        mla.callback_group(object(), 0, 2, "cpu")
    with pytest.raises(TypeError, match="rank"):
        mla.callback_group(object(), 2, 2, "cpu")
