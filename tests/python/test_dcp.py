# SPDX-License-Identifier: Apache-2.0
"""Decode context parallelism from Python (docs/SCALE.md): W ranks as Python threads over the in-process
group, and as processes (torchrun-style environment: the CPU socket group; on a machine with 2+ GPUs,
NCCL), each attending its shard of every request's cache for the group's heads; the outputs of its own
heads must equal one decode over the whole cache (every DcpExchange). A rank that dies makes the other
raise ValueError naming it, not hang."""
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest

import mla

D_QK, D_V, L = 576, 512, 512
EXCHANGES = [mla.DcpExchange.all_to_all, mla.DcpExchange.allgather_reduce_scatter,
             mla.DcpExchange.all_to_all_overlap]

# The problem every rank builds from the same seed (also run inside the rank processes below).
PROBLEM = textwrap.dedent("""
    import numpy as np
    import mla
    D_QK, D_V, L = 576, 512, 512
    PAGE, H, MB, LENS, SCALE = 4, 2, 10, [37, 0, 20], 0.07

    def bf16(x):
        b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
        return b.view(np.float32)

    def problem(w):
        rng = np.random.default_rng(77)
        keys = [bf16(rng.standard_normal((n, D_QK))) for n in LENS]
        q_all = bf16(rng.standard_normal((len(LENS), 1, w * H, D_QK)))
        return keys, q_all

    def cache_of(rows_by_req):
        # request r's local position p -> block r * MB + p // PAGE
        b = len(rows_by_req)
        c = mla.allocate_cache(mla.CacheFormat.bf16, b * MB, PAGE)
        for r, rows in enumerate(rows_by_req):
            if len(rows):
                slots = np.array([(r * MB + p // PAGE) * PAGE + p % PAGE for p in range(len(rows))], np.int64)
                mla.write_cache(np.ascontiguousarray(rows[:, :L]), np.ascontiguousarray(rows[:, L:]), slots, c)
        table = np.array([[r * MB + j for j in range(MB)] for r in range(b)], np.int32)
        return c, table

    def reference(w):
        keys, q_all = problem(w)
        c, table = cache_of(keys)
        out = np.zeros((len(LENS), 1, w * H, D_V), np.float32)
        lse = np.zeros((len(LENS), 1, w * H), np.float32)
        mla.mqa_decode(q_all, c, table, np.array(LENS, np.int32), out, lse, SCALE, True)
        return out, lse

    def rank_step(comm, exchange, device=None):
        w, r = comm.world_size, comm.rank
        keys, q_all = problem(w)
        shard = [np.array([k[p] for p in range(len(k)) if mla.dcp_owner(p, w) == r]).reshape(-1, D_QK) for k in keys]
        c, table = cache_of(shard)
        local = np.array(mla.dcp_local_query_lengths(LENS, 1, True, w, r), np.int32)
        q = np.ascontiguousarray(q_all[:, :, r * H:(r + 1) * H])
        out = np.full((len(LENS), 1, H, D_V), np.nan, np.float32)
        lse = np.full((len(LENS), 1, H), np.nan, np.float32)
        ws = np.zeros(mla.dcp_mqa_decode_workspace_bytes(len(LENS), 1, H, MB, PAGE, "f32", w, "cpu",
                                                         exchange=exchange), np.uint8)
        mla.dcp_mqa_decode(comm, q, c, table, local, out, lse, SCALE, ws, exchange=exchange)
        comm.synchronize()
        return out, lse

    def cuda_rank_inputs(w, r, dev):
        # Rank r's inputs as torch tensors on dev: its cache shard (bf16), block table, local lengths, q.
        import torch
        keys, q_all = problem(w)
        shard = [np.array([k[p] for p in range(len(k)) if mla.dcp_owner(p, w) == r]).reshape(-1, D_QK) for k in keys]
        cache_t = torch.zeros((len(LENS) * MB, PAGE, D_QK), dtype=torch.bfloat16, device=dev)
        c = mla.KVCache(cache_t, mla.CacheFormat.bf16)
        for b, rows in enumerate(shard):
            if len(rows):
                slots = torch.tensor([(b * MB + p // PAGE) * PAGE + p % PAGE for p in range(len(rows))], device=dev)
                t = torch.tensor(rows, dtype=torch.bfloat16, device=dev)
                mla.write_cache(t[:, :L].contiguous(), t[:, L:].contiguous(), slots, c)
        table = torch.tensor([[b * MB + j for j in range(MB)] for b in range(len(LENS))], dtype=torch.int32,
                             device=dev)
        local = torch.tensor(mla.dcp_local_query_lengths(LENS, 1, True, w, r), dtype=torch.int32, device=dev)
        q = torch.tensor(q_all[:, :, r * H:(r + 1) * H], dtype=torch.bfloat16, device=dev).contiguous()
        return c, table, local, q
""")
exec(PROBLEM)  # noqa: S102  (the module-level helpers above, for the in-process tests)


def _run_threads(world, fn, timeout_s):
    """fn(rank) on one thread per rank; the ranks' results in rank order. Any rank's exception fails the
    test (a rank that has not finished within timeout_s leaves its result None)."""
    results, errors = [None] * world, [None] * world

    def run(r):
        try:
            results[r] = fn(r)
        except Exception as e:  # noqa: BLE001
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert errors == [None] * world
    return results


def check_rank(out, lse, want, want_lse, r):
    np.testing.assert_allclose(out, want[:, :, r * H:(r + 1) * H], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse[:, :, r * H:(r + 1) * H], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_threads_equal_whole_cache(exchange):
    w = 3
    want, want_lse = reference(w)
    group = mla.local_group(w, timeout=20)
    assert [c.rank for c in group] == [0, 1, 2] and group[0].backend == "local"
    results = _run_threads(w, lambda r: rank_step(group[r], exchange), 60)
    for r in range(w):
        check_rank(*results[r], want, want_lse, r)


def test_threads_v4_sparse_equal_whole_cache():
    """The DeepSeek-V4 step from Python (dcp_compact_topk per list, convert_topk_indices, then dcp_sparse_mqa with
    the V4 options) on 2 thread ranks, each holding its positions of a window cache (interleave 1) and its entries of
    a compressed cache (interleave 2); float64 rows of 512 with K = V. Equals the formula over the whole caches with
    the sink once (token 1 has no valid row anywhere: out 0, lse = the sink)."""
    rng = np.random.default_rng(5)
    w, h, d, page, scale = 2, 2, 512, 4, 512 ** -0.5
    win, ent = rng.standard_normal((21, d)), rng.standard_normal((9, d))
    idx = np.array([[20, 19, 18, 17, 3, -1], [-1] * 6, [0, 1, 2, 3, 4, 5]], np.int32)
    win_len = np.array([5, 6, 4], np.int32)
    e_idx = np.array([[8, 8, 2, -1], [9, 12, 0, 1], [0, 3, 5, 7]], np.int32)
    e_len = np.array([4, 2, 3], np.int32)
    T = len(idx)
    q_all = rng.standard_normal((T, w * h, d))
    sink_all = rng.standard_normal(w * h).astype(np.float32)
    req = np.zeros(T, np.int32)

    want_out, want_lse = np.zeros((T, w * h, d)), np.zeros((T, w * h))
    for t in range(T):
        keys = [win[p] for j, p in enumerate(idx[t]) if j < win_len[t] and 0 <= p < len(win)]
        keys += [ent[e] for j, e in enumerate(e_idx[t]) if j < e_len[t] and 0 <= e < len(ent)]
        k = np.array(keys).reshape(-1, d)
        s = q_all[t] @ k.T * scale
        m = np.maximum(s.max(axis=1, initial=-np.inf), sink_all)
        p = np.exp(s - m[:, None])
        l = p.sum(axis=1) + np.exp(sink_all - m)
        want_out[t], want_lse[t] = p @ k / l[:, None], m + np.log(l)

    def shard(rows, r, il):
        local = [rows[p] for p in range(len(rows)) if mla.dcp_owner(p, w, r, il) == r]
        mb = (len(local) + page - 1) // page
        c = np.full((mb * page, d), np.nan)
        c[:len(local)] = local
        return mla.KVCache(c.reshape(mb, page, d), mla.CacheFormat.f64, d_qk=d), np.arange(mb, dtype=np.int32)[None]

    group = mla.local_group(w, timeout=20)

    def step(r):
        lists = []
        for rows, il, ix, vl in ((win, 1, idx, win_len), (ent, 2, e_idx, e_len)):
            cache, table = shard(rows, r, il)
            local, counts = np.empty_like(ix), np.empty(T, np.int32)
            mla.dcp_compact_topk(req, np.array([len(rows)], np.int32), ix, vl, local, counts, w, r, il)
            slots = np.empty_like(ix)
            mla.convert_topk_indices(req, table, local, slots, page)
            lists.append((cache, slots, counts))
        (wc, wrows, wcount), (ec, erows, ecount) = lists
        out, lse = np.full((T, h, d), np.nan), np.full((T, h), np.nan, np.float32)
        ws = np.zeros(mla.dcp_sparse_mqa_workspace_bytes(T, h, "f64", w, d_qk=d, d_v=d), np.uint8)
        mla.dcp_sparse_mqa(group[r], np.ascontiguousarray(q_all[:, r * h:(r + 1) * h]), wc, wrows, wcount, out, lse,
                           scale, ws, attn_sink=np.ascontiguousarray(sink_all[r * h:(r + 1) * h]), extra_kv=ec,
                           extra_indices=erows, extra_topk_length=ecount, values_include_rope=True)
        return out, lse

    results = _run_threads(w, step, 60)
    for r in range(w):
        out, lse = results[r]
        np.testing.assert_allclose(out, want_out[:, r * h:(r + 1) * h], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(lse, want_lse[:, r * h:(r + 1) * h], rtol=2e-5, atol=2e-5)
        assert (out[1] == 0).all() and (lse[1] == sink_all[r * h:(r + 1) * h]).all()


def test_layout_helpers():
    assert [mla.dcp_owner(p, 2, interleave=2) for p in range(6)] == [0, 0, 1, 1, 0, 0]
    assert mla.dcp_local_length(7, 2, 1) == 3 and mla.dcp_local_length(7, 2, 0) == 4
    assert mla.dcp_local_query_lengths([5, 0], 1, True, 2, 0) == [3, 0]
    with pytest.raises(ValueError):
        mla.local_group(0)


def test_thread_group_collectives_and_missing_rank():
    group = mla.local_group(2, timeout=0.3)
    out = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="not every rank"):  # rank 1 never arrives
        group[0].all_gather(np.ones(2, np.float32), out)


def _env(rank, world, rendezvous, timeout_ms=20000, master_port=None):
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(mla.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("MLA_DCP_RENDEZVOUS", "MLA_NCCL_ID", "MASTER_ADDR", "MASTER_PORT", "MLA_DCP_PORT"):
        env.pop(k, None)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MLA_DCP_TIMEOUT_MS=str(timeout_ms))
    if master_port is None:
        env["MLA_DCP_RENDEZVOUS"] = rendezvous
    else:  # torchrun's TCP rendezvous: rank 0 listens on MASTER_PORT + 1
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port - 1))
    return env


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    import socket  # noqa: PLC0415
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_SCRIPT = PROBLEM + textwrap.dedent("""
    import sys
    mode, device = sys.argv[1], (None if sys.argv[2] == "cpu" else sys.argv[2])
    env = mla.process_group_env()
    if mode == "die" and env["rank"] == 1:
        comm = mla.process_group(device)
        sys.exit(3)                              # a rank that fails after joining
    comm = mla.process_group(device, peer=mode == "decode_peer")
    if mode == "die":
        try:
            comm.all_gather(np.ones(2, np.float32), np.zeros(4, np.float32))
        except ValueError as e:
            print("RAISED:", e)
            sys.exit(0)
        sys.exit(1)
    if device is None:
        want, want_lse = reference(comm.world_size)
        for ex in [mla.DcpExchange.all_to_all, mla.DcpExchange.allgather_reduce_scatter,
                   mla.DcpExchange.all_to_all_overlap]:
            out, lse = rank_step(comm, ex)
            r = comm.rank
            np.testing.assert_allclose(out, want[:, :, r * H:(r + 1) * H], rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(lse, want_lse[:, :, r * H:(r + 1) * H], rtol=2e-5, atol=2e-5)
    else:                                        # CUDA: NCCL, torch tensors on cuda:LOCAL_RANK
        import torch
        dev = torch.device("cuda", env["local_rank"])
        w, r = comm.world_size, comm.rank
        want, want_lse = reference(w)
        c, table, local, q = cuda_rank_inputs(w, r, dev)
        for ex in [mla.DcpExchange.all_to_all, mla.DcpExchange.allgather_reduce_scatter,
                   mla.DcpExchange.all_to_all_overlap]:
            out = torch.full((len(LENS), 1, H, D_V), float("nan"), dtype=torch.bfloat16, device=dev)
            lse = torch.full((len(LENS), 1, H), float("nan"), dtype=torch.float32, device=dev)
            ws = torch.zeros(mla.dcp_mqa_decode_workspace_bytes(len(LENS), 1, H, MB, PAGE, "bf16", w, dev,
                                                                exchange=ex), dtype=torch.uint8, device=dev)
            mla.dcp_mqa_decode(comm, q, c, table, local, out, lse, SCALE, ws, exchange=ex)
            comm.synchronize()
            torch.cuda.synchronize(dev)
            np.testing.assert_allclose(out.float().cpu().numpy(), want[:, :, r * H:(r + 1) * H], rtol=2e-2, atol=2e-2)
            np.testing.assert_allclose(lse.cpu().numpy(), want_lse[:, :, r * H:(r + 1) * H], rtol=1e-3, atol=1e-3)
    print("RANK OK", comm.rank, comm.backend)
""")


def _run_ranks(world, mode, device="cpu", timeout_ms=20000, master_port=None):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        rdv = os.path.join(d, "rendezvous")
        procs = [subprocess.Popen([sys.executable, script, mode, device],
                                  env=_env(r, world, rdv, timeout_ms, master_port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        return wait_all(procs, 120)


def wait_all(procs, timeout_s):
    """(exit codes, outputs) of the rank processes; all are killed when one outlives timeout_s."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [p.returncode for p in procs], outs


@pytest.mark.parametrize("mode", ["decode", "decode_peer"])
def test_processes_equal_whole_cache(mode):
    codes, outs = _run_ranks(2, mode)            # peer=True on the CPU: the socket group, unchanged
    assert codes == [0, 0], outs
    assert all("RANK OK" in o and "socket" in o and "peer" not in o for o in outs), outs


def test_tcp_rendezvous_processes_equal_whole_cache():
    """MASTER_ADDR / MASTER_PORT instead of a rendezvous path: rank 0 hands the socket group's path over TCP."""
    codes, outs = _run_ranks(2, "decode", master_port=free_port())
    assert codes == [0, 0], outs
    assert all("RANK OK" in o and "socket" in o for o in outs), outs


def test_dead_rank_raises_not_hangs():
    codes, outs = _run_ranks(2, "die", timeout_ms=5000)
    assert codes == [0, 3], outs
    assert "RAISED:" in outs[0] and "rank 1 of 2 failed" in outs[0], outs


def _cuda_gpus():
    if not mla.built_with_cuda() or not mla.nccl_available():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode,tcp", [("decode", False), ("decode_peer", False), ("decode", True)])
def test_nccl_processes_equal_whole_cache(mode, tcp, world):
    """One process per GPU at every group size the machine has (2, and 4 where four GPUs are visible); tcp:
    through torchrun's MASTER_ADDR / MASTER_PORT rendezvous instead of a rendezvous file."""
    if _cuda_gpus() < world:
        pytest.skip(f"needs {world} CUDA GPUs, NCCL and torch")
    codes, outs = _run_ranks(world, mode, device="cuda", timeout_ms=60000, master_port=free_port() if tcp else None)
    assert codes == [0] * world, outs
    want = "nccl+peer" if mode == "decode_peer" else "nccl"
    assert all("RANK OK " in o and o.split("RANK OK ")[1].split()[1] == want for o in outs), outs


def test_layer_dcp_threads_equal_one_layer():
    """MlaAttention in DCP mode (the float64 oracle layer), two Python threads as ranks: a step of two
    decodes, a prefill with context and a fresh prefill; each rank holds half the heads and the positions
    it owns. The group's output equals one layer with all heads over the whole cache, and every new
    token's row lands in its owner's shard only."""
    from conftest import bf16_round  # noqa: PLC0415
    Hh, P, V, R, page, w = 4, 32, 32, 64, 16, 2
    rng = np.random.default_rng(5)
    reqs = [(20, 1), (33, 1), (40, 7), (0, 9)]
    d_all = mla.ModelDims(kv_lora_rank=L, qk_rope_head_dim=R, qk_nope_head_dim=P, v_head_dim=V, num_heads=Hh,
                          softmax_scale=1 / np.sqrt(P + R))
    n_blocks = sum(-(-(c + q) // page) for c, q in reqs) + 2
    width = max(-(-(c + q) // page) for c, q in reqs)
    table = np.zeros((len(reqs), width), np.int32)
    perm, used, hist = rng.permutation(n_blocks), 0, []
    for r, (c, q) in enumerate(reqs):
        nb = -(-(c + q) // page)
        table[r, :nb] = perm[used:used + nb]
        used += nb
        hist.append(bf16_round(rng.standard_normal((c + q, L + R))))
    new = np.concatenate([hist[r][c:] for r, (c, q) in enumerate(reqs)])
    weight = bf16_round(rng.standard_normal((Hh * (P + V), L)) / np.sqrt(L))
    q_all = bf16_round(rng.standard_normal((len(new), Hh, P + R)))
    qsl = np.cumsum([0] + [q for _, q in reqs]).tolist()
    seq_lens = [c + q for c, q in reqs]
    desc = mla.BatchDesc(query_start_loc=qsl, seq_lens=seq_lens)

    def slot(r, p, rank=None):  # global position p of request r: its slot in the rank's shard (-1 elsewhere)
        if rank is not None and mla.dcp_owner(p, w) != rank:
            return -1
        lp = p if rank is None else mla.dcp_local_position(p, w)
        return int(table[r, lp // page]) * page + lp % page

    def run(d, weight_rows, q, rank, comm):
        cache = mla.allocate_cache(mla.CacheFormat.bf16, n_blocks, page)
        mla.fill(cache.data, float("nan"))
        for r, (c, _) in enumerate(reqs):
            rows = [p for p in range(c) if rank is None or mla.dcp_owner(p, w) == rank]
            if rows:
                mla.write_cache(hist[r][rows, :L].copy(), hist[r][rows, L:].copy(),
                                np.array([slot(r, p, rank) for p in rows], np.int64), cache)
        cfg = mla.PlannerConfig(dims=d, page_size=page, max_model_len=256, max_num_seqs=8)
        if rank is not None:
            cfg.dcp = mla.DcpLayout(world_size=w, rank=rank, interleave=1)
        plan = mla.make_plan(desc, cfg)
        layer = mla.MlaAttention(mla.oracle_layer_options(d), weight_rows, dcp_comm=comm)
        ws = mla.empty([max(layer.workspace_bytes(plan), 1)], "u8")
        meta = mla.empty([max(plan.metadata.bytes(), 16)], "u8")
        mla.upload_step_metadata(plan, mla.pinned_buffer(meta.nbytes), meta)
        out = np.full((len(new), d.num_heads * V), np.nan)
        slots = np.array([slot(r, p, rank) for r, (c, n) in enumerate(reqs) for p in range(c, c + n)], np.int64)
        layer.forward(plan, cache, ws, q=q, kv_c=new[:, :L].copy(), k_pe=new[:, L:].copy(), slot_mapping=slots,
                      block_table=table, seq_lens=np.array(seq_lens, np.int32), out=out, metadata=meta,
                      precision=mla.Precision.reference)
        return out, cache, slots

    want, _, _ = run(d_all, weight, q_all, None, None)
    hr = Hh // w
    d_rank = mla.ModelDims(kv_lora_rank=L, qk_rope_head_dim=R, qk_nope_head_dim=P, v_head_dim=V, num_heads=hr,
                           softmax_scale=1 / np.sqrt(P + R))
    group = mla.local_group(w, timeout=30)

    def rank_main(r):
        rows = weight[r * hr * (P + V):(r + 1) * hr * (P + V)].copy()
        return run(d_rank, rows, q_all[:, r * hr:(r + 1) * hr].copy(), r, group[r])

    results = _run_threads(w, rank_main, 120)
    got = np.concatenate([results[r][0].reshape(len(new), hr, V) for r in range(w)], axis=1).reshape(len(new), -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the LSEs travel in fp32 (as test_layer_dcp.cpp)
    for r in range(w):  # every shard holds exactly the rows of the positions its rank owns, new ones included
        bits = np.asarray(results[r][1].data.numpy()).reshape(n_blocks * page, L + R)
        written = ~((bits & 0x7F80) == 0x7F80).all(axis=1)
        owned = sum(1 for c, n in reqs for p in range(c + n) if mla.dcp_owner(p, w) == r)
        assert written.sum() == owned
