# SPDX-License-Identifier: Apache-2.0
"""torch custom ops (mla.ops): results against float64 references on every device, fake tensors,
torch's op checker, torch.compile and CUDA graph capture / replay (the latter three need torch 2)."""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")
import mla  # noqa: E402
import mla.ops  # noqa: E402
from torch_util import DEVICES, TORCH2, assert_bf16_close, needs_cuda, ref_attention, rows_of  # noqa: E402

F = int(mla.CacheFormat.bf16)


def decode_case(device, b=3, s_q=2, h=16, page=16, blocks=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(blocks, page, 576, generator=g).to(torch.bfloat16).to(device)
    table = torch.randperm(blocks, generator=g)[: b * 4].view(b, 4).to(torch.int32).to(device)
    seq_lens = torch.tensor([37, 0, 64][:b], dtype=torch.int32, device=device)
    q = torch.randn(b, s_q, h, 576, generator=g).to(torch.bfloat16).to(device)
    return cache, table, seq_lens, q


def decode_reference(cache, table, seq_lens, q, scale, causal=True):
    rows = rows_of(cache, mla.CacheFormat.bf16)
    b, s_q, h, _ = q.shape
    page = cache.size(1)
    outs, lses = [], []
    for i in range(b):
        n = int(seq_lens[i])
        pos = torch.arange(max(n, 1))
        k = rows[(table[i].cpu().long()[pos // page] * page + pos % page)]
        vis = torch.arange(max(n, 1)).view(1, -1) <= (n - s_q + torch.arange(s_q)).view(-1, 1)
        vis &= torch.arange(max(n, 1)).view(1, -1) < n
        if not causal:
            vis = torch.arange(max(n, 1)).view(1, -1).expand(s_q, -1) < n
        o, lse = ref_attention(q[i].double().cpu(), k.expand(s_q, -1, -1), k[:, :512].expand(s_q, -1, -1), scale, vis)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("device", DEVICES)
def test_mqa_decode_op(device):
    cache, table, seq_lens, q = decode_case(device)
    out = torch.full((3, 2, 16, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((3, 2, 16), float("nan"), device=device)
    torch.ops.mla.mqa_decode(q, cache, F, 1.0, 576, 64, table, seq_lens, out, lse, 0.05, True, None, 0)
    ref, ref_lse = decode_reference(cache, table, seq_lens, q, 0.05)
    assert_bf16_close(out, ref)
    torch.testing.assert_close(lse.cpu().double(), ref_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_write_cache_and_gather_ops(device):
    cache = torch.full((4, 8, 576), float("nan"), dtype=torch.bfloat16, device=device)
    kv, pe = torch.randn(5, 512, device=device).bfloat16(), torch.randn(5, 64, device=device).bfloat16()
    slots = torch.tensor([3, 9, -1, 31, 16], device=device)
    torch.ops.mla.write_cache(kv, pe, slots, cache, F, 1.0, 576, 64, 0)
    flat = cache.view(32, 576)
    assert torch.equal(flat[31, :512], kv[3]) and torch.equal(flat[16, 512:], pe[4])
    dst = torch.full((4, 576), float("nan"), device=device)
    table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)
    torch.ops.mla.gather_cache(cache, F, 1.0, 576, 64, dst, table, cu, torch.tensor([1, 7], dtype=torch.int32,
                                                                                     device=device))
    assert torch.equal(dst[0], flat[9].float()) and torch.equal(dst[3], flat[16].float())


def test_fake_tensors_trace():
    """The fake (meta) implementations accept meta tensors and allocate nothing."""
    m = torch.empty(2, 1, 4, 576, device="meta", dtype=torch.bfloat16)
    torch.ops.mla.mqa_decode(m, torch.empty(3, 16, 576, device="meta", dtype=torch.bfloat16), F, 1.0, 576, 64,
                             torch.empty(2, 1, device="meta", dtype=torch.int32),
                             torch.empty(2, device="meta", dtype=torch.int32),
                             torch.empty(2, 1, 4, 512, device="meta", dtype=torch.bfloat16), None, 0.1, True, None, 0)


@pytest.mark.skipif(not TORCH2, reason="torch.compile needs torch >= 2")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    cache, table, seq_lens, q = decode_case(device)

    def step(q, cache, table, seq_lens):
        out = torch.empty(q.shape[:-1] + (512,), dtype=q.dtype, device=q.device)
        torch.ops.mla.mqa_decode(q * 1.0, cache, F, 1.0, 576, 64, table, seq_lens, out, None, 0.05, True, None, 0)
        return out.float() * 2.0

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(q, cache, table, seq_lens), step(q, cache, table, seq_lens))


@needs_cuda
@pytest.mark.skipif(not TORCH2, reason="CUDA graphs of custom ops are tested with torch 2")
def test_cuda_graph_capture_and_replay():
    cache, table, seq_lens, q = decode_case("cuda")
    kv, pe = torch.randn(3, 512, device="cuda").bfloat16(), torch.randn(3, 64, device="cuda").bfloat16()
    slots = torch.tensor([5, 40, 70], device="cuda")
    out = torch.empty(3, 2, 16, 512, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(mla.mqa_decode_workspace_bytes(3, 2, 16, 64, "cuda"), dtype=torch.uint8, device="cuda")

    def step():
        torch.ops.mla.write_cache(kv, pe, slots, cache, F, 1.0, 576, 64, 0)
        torch.ops.mla.mqa_decode(q, cache, F, 1.0, 576, 64, table, seq_lens, out, None, 0.05, True, ws, 0)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (1, 2):  # new inputs written into the captured buffers, then replay
        g = torch.Generator().manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=g).bfloat16())
        kv.copy_(torch.randn(kv.shape, generator=g).bfloat16())
        seq_lens.copy_(torch.tensor([50, 3, 64], dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = decode_reference(cache, table, seq_lens, q, 0.05)
        assert_bf16_close(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_forward_op(device):
    """torch.ops.mla.layer_forward with a registered layer and set_step equals the direct forward."""
    dims = mla.ModelDims(num_heads=4, qk_nope_head_dim=32, v_head_dim=32, softmax_scale=0.1)
    opt = mla.LayerOptions(dims=dims, device=device)
    w = (torch.randn(4 * 64, 512) / 23).bfloat16().to(device)
    layer = mla.MlaAttention(opt, w)
    handle = mla.ops.register_layer(layer)
    cfg = mla.PlannerConfig(dims=dims, page_size=16, max_model_len=128, max_num_seqs=4,
                            num_sms=mla.multiprocessor_count(device))
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=[0, 1, 5], seq_lens=[20, 4]), cfg)
    meta = torch.zeros(max(plan.metadata.bytes(), 16), dtype=torch.uint8, device=device)
    mla.upload_step_metadata(plan, mla.pinned_buffer(meta.numel()), meta)
    ws = torch.empty(layer.workspace_bytes(plan) + 1, dtype=torch.uint8, device=device)
    args = dict(q=torch.randn(5, 4, 96, device=device).bfloat16(), kv_c=torch.randn(5, 512, device=device).bfloat16(),
                k_pe=torch.randn(5, 64, device=device).bfloat16(),
                slots=torch.tensor([19, 32, 33, 34, 35], device=device),
                table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device),
                seq_lens=torch.tensor([20, 4], dtype=torch.int32, device=device))
    results = []
    for via_op in (False, True):
        cache = torch.zeros(4, 16, 576, dtype=torch.bfloat16, device=device)
        out = torch.full((5, 4 * 32), float("nan"), dtype=torch.bfloat16, device=device)
        if via_op:
            mla.ops.set_step(plan)
            torch.ops.mla.layer_forward(handle, args["q"], args["kv_c"], args["k_pe"], args["slots"], args["table"],
                                        args["seq_lens"], None, out, cache, F, 1.0, 576, 64, ws, meta)
        else:
            layer.forward(plan, mla.KVCache(cache), ws, q=args["q"], kv_c=args["kv_c"], k_pe=args["k_pe"],
                          slot_mapping=args["slots"], block_table=args["table"], seq_lens=args["seq_lens"], out=out,
                          metadata=meta)
        results.append(out)
    assert not results[0].isnan().any()
    assert torch.equal(results[0], results[1])


def capture(step):
    """step() once on a side stream (warm-up), then captured into a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


@needs_cuda
@pytest.mark.skipif(not TORCH2, reason="CUDA graphs of custom ops are tested with torch 2")
def test_cuda_graph_layer_forward_and_compat():
    """torch.ops.mla.layer_forward (plan set outside the capture) and the FlashMLA compat decode are captured
    in CUDA graphs; replays with new inputs equal eager calls on those inputs."""
    import mla.compat.flash_mla as flash_mla
    dims = mla.ModelDims(num_heads=16, qk_nope_head_dim=128, v_head_dim=128, softmax_scale=0.07)
    layer = mla.MlaAttention(mla.LayerOptions(dims=dims, device="cuda"),
                             (torch.randn(16 * 256, 512) / 23).bfloat16().cuda())
    handle = mla.ops.register_layer(layer)
    cfg = mla.PlannerConfig(dims=dims, page_size=64, max_model_len=4096, max_num_seqs=4,
                            num_sms=mla.multiprocessor_count("cuda"))
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=[0, 1, 2], seq_lens=[700, 1500]), cfg)
    meta = torch.zeros(max(plan.metadata.bytes(), 16), dtype=torch.uint8, device="cuda")
    mla.upload_step_metadata(plan, mla.pinned_buffer(meta.numel()), meta)
    ws = torch.empty(layer.workspace_bytes(plan) + 1, dtype=torch.uint8, device="cuda")
    table = torch.arange(2 * 24, dtype=torch.int32, device="cuda").view(2, 24)
    seq_lens = torch.tensor([700, 1500], dtype=torch.int32, device="cuda")
    slots = torch.tensor([699, 24 * 64 + 1499], device="cuda")
    q, kv_c, k_pe = (torch.empty(2, 16, 192), torch.empty(2, 512), torch.empty(2, 64))
    q, kv_c, k_pe = q.bfloat16().cuda(), kv_c.bfloat16().cuda(), k_pe.bfloat16().cuda()
    cache = torch.randn(48, 64, 576, device="cuda").bfloat16()
    out = torch.empty(2, 16 * 128, dtype=torch.bfloat16, device="cuda")
    fq = torch.empty(2, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
    sched, _ = flash_mla.get_mla_metadata()

    def step():
        torch.ops.mla.layer_forward(handle, q, kv_c, k_pe, slots, table, seq_lens, None, out, cache, F, 1.0, 576, 64,
                                    ws, meta)
        return flash_mla.flash_mla_with_kvcache(fq, cache.unsqueeze(2), table, seq_lens, 512, sched, causal=True)

    mla.ops.set_step(plan)
    graph, (f_out, f_lse) = capture(step)
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        for t in (q, kv_c, k_pe, fq):
            t.copy_(torch.randn(t.shape, generator=g).bfloat16())
        before = cache.clone()
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref_cache, ref_out = before.clone(), torch.empty_like(out)
        layer.forward(plan, mla.KVCache(ref_cache), ws, q=q, kv_c=kv_c, k_pe=k_pe, slot_mapping=slots,
                      block_table=table, seq_lens=seq_lens, out=ref_out, metadata=meta)
        assert torch.equal(out, ref_out) and torch.equal(cache, ref_cache)
        e_out, e_lse = flash_mla.flash_mla_with_kvcache(fq, cache.unsqueeze(2), table, seq_lens, 512,
                                                        flash_mla.get_mla_metadata()[0], causal=True)
        assert torch.equal(f_out, e_out) and torch.equal(f_lse, e_lse)


def test_extension_before_torch():
    """The extension loaded before torch leaves torch's import intact (torch 2.11 aborted with "free():
    invalid pointer" when _mla.so exported libstdc++ functions: python/CMakeLists.txt); the module is
    loaded by path, without mla/__init__, so nothing else runs first."""
    import subprocess
    import sys
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('_mla', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "assert 'torch' not in sys.modules; import torch, torch.nn.functional; "
            "print(m.KVCache.__name__, torch.nn.functional.relu(torch.ones(2)).sum().item())")
    r = subprocess.run([sys.executable, "-c", code, mla._mla.__file__], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split()[-2:] == ["KVCache", "2.0"], r.stdout[-3000:]


def op_cases(device):
    """Valid arguments of every functional op (layer_forward: test_layer_forward_op / the graph test)."""
    g = torch.Generator().manual_seed(4)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    cache = rnd(2, 16, 576)
    ds = torch.zeros(2, 16, 656, dtype=torch.uint8, device=device)
    torch.ops.mla.write_cache(rnd(32, 512), rnd(32, 64), torch.arange(32, device=device), ds,
                              int(mla.CacheFormat.fp8_ds_mla), 1.0, 576, 64, 0)
    ab = torch.bfloat16 if device == "cuda" else torch.float32
    T, H = 5, 4
    icache = torch.zeros(2, 16, 132, dtype=torch.uint8, device=device)
    torch.ops.mla.indexer_write_k(rnd(32, 128), torch.arange(32, device=device), icache, 0)
    codes = (torch.randint(0, 126, (T, H, 128), generator=g).to(torch.uint8)).to(device)  # finite e4m3 codes
    return {
        "write_cache": (rnd(3, 512), rnd(3, 64), torch.tensor([1, 17, -1], device=device), cache.clone(), F, 1.0,
                        576, 64, 0),
        "gather_cache": (cache, F, 1.0, 576, 64, rnd(6, 576, dtype=torch.float32), i32([[1, 0], [0, 1]]),
                         i32([0, 4, 6]), i32([3, 0])),
        "cp_gather_cache": (cache, F, 1.0, 576, 64, rnd(6, 576), i32([[1, 0], [0, 1]]), i32([0, 4, 6]), None),
        "upconvert_ds_mla": (ds, rnd(20, 576), i32([[1], [0]]), i32([0, 10]), None),
        "merge_attn_states": (rnd(T, H, 64, dtype=torch.float32), rnd(H, T, dtype=torch.float32),
                              rnd(T, H, 64, dtype=torch.float32), rnd(H, T, dtype=torch.float32),
                              rnd(T, H, 64, dtype=torch.float32), rnd(H, T, dtype=torch.float32), -1, 0.0),
        "convert_topk_indices": (i32([0, 1]), i32([[1, 0], [0, 1]]), i32([[0, 17, -1], [5, 40, 2]]),
                                 i32([[0] * 3] * 2), 16, 0, None, None, i32([0, 0]), None),
        "mqa_decode": (rnd(2, 1, H, 576), cache, F, 1.0, 576, 64, i32([[1, 0], [0, 1]]), i32([20, 9]),
                       rnd(2, 1, H, 512), rnd(2, 1, H, dtype=torch.float32), 0.05, True, None, 0),
        "mha_prefill": (rnd(6, H, 192), rnd(9, H, 128), rnd(9, H, 64), rnd(9, H, 128), i32([0, 2, 6]),
                        i32([0, 4, 9]), 4, 5, rnd(6, H, 128), rnd(H, 6, dtype=torch.float32), 0.08, True),
        "sparse_mqa": (rnd(3, H, 576), cache, F, 1.0, 576, 64, i32([[0, 5, -1, 31], [2, 2, 9, 40], [-1] * 4]), None,
                       rnd(3, H, 512), rnd(3, H, dtype=torch.float32), 0.05),
        "gemm": (rnd(8, 16, dtype=ab), rnd(16, 8, dtype=ab), rnd(8, 8, dtype=torch.float32), 1.0, 0.0),
        "bmm": (rnd(2, 8, 16, dtype=ab), rnd(2, 16, 8, dtype=ab), rnd(2, 8, 8, dtype=torch.float32), 1.0, 0.0),
        "indexer_write_k": (rnd(3, 128), torch.tensor([4, -1, 30], device=device), icache.clone(), 1),
        "indexer_gather_k": (icache, torch.zeros(9, 128, dtype=torch.uint8, device=device),
                             rnd(9, dtype=torch.float32), i32([[1, 0], [0, 1]]), i32([0, 5, 9])),
        "indexer_logits_prefill": (codes, rnd(T, H, dtype=torch.float32), codes[:, 0].clone(),
                                   rnd(T, dtype=torch.float32).abs(), i32([0, 1, 0, 4, 2]), i32([5, 3, 1, 5, 2]),
                                   rnd(T, T, dtype=torch.float32)),
        "indexer_logits_decode": (codes[:4], rnd(4, H, dtype=torch.float32), icache, i32([[1, 0], [0, 1]]),
                                  i32([20, 3]), 2, rnd(4, 24, dtype=torch.float32)),
        "indexer_prepare": (rnd(T, H, 128, dtype=ab), rnd(T, 128, dtype=ab), rnd(T, H, dtype=ab),
                            torch.tensor([0, 3, 1, 2, 7], device=device), rnd(8, 64, dtype=torch.float32),
                            rnd(128, dtype=torch.float32), rnd(128, dtype=torch.float32),
                            torch.zeros(T, H, 128, dtype=torch.uint8, device=device), rnd(T, H, dtype=torch.float32),
                            rnd(T, 128, dtype=ab), 1e-6, True),
        "indexer_topk": (rnd(T, 12, dtype=torch.float32), None, i32([12, 5, 0, 9, 3]), i32([[0] * 4] * T)),
        "indexer_topk_decode": (rnd(4, 12, dtype=torch.float32), i32([10, 2]), 2, i32([[0] * 4] * 4)),
        "quantize_output": (rnd(T, 128), int(mla.OutputQuant.fp8_group128),
                            torch.zeros(8, 128, dtype=torch.uint8, device=device), rnd(1, 8, dtype=torch.float32), 1.0),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_mha_prefill_fp8_op(device):
    """The op's fp8 form (keywords fp8, q / k / v scales, workspace; docs/SEMANTICS.md §10.1) gives the binding's
    result bit for bit, and passes torch's op checker."""
    if device == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("fp8 mha_prefill runs on sm_90 on CUDA")
    q, kn, kp, v, cq, ck, mq, mk, out, lse, sc, causal = op_cases(device)["mha_prefill"]
    ws_bytes = mla.mha_prefill_workspace_bytes(q.shape[0], kn.shape[0], q.shape[1], cq.numel() - 1, True, device)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=device) if ws_bytes else None
    kw = {"fp8": True, "q_scale": 0.02, "k_scale": 0.03, "v_scale": 0.025, "workspace": ws}
    out_b, lse_b = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    torch.ops.mla.mha_prefill(q, kn, kp, v, cq, ck, mq, mk, out, lse, sc, causal, **kw)
    mla.mha_prefill(q, kn, kp, v, cq, ck, mq, mk, out_b, lse_b, sc, causal, **kw)
    assert not torch.isnan(out).any() and torch.equal(out, out_b) and torch.equal(lse, lse_b)
    if hasattr(torch.library, "opcheck"):
        torch.library.opcheck(torch.ops.mla.mha_prefill.default, (q, kn, kp, v, cq, ck, mq, mk, out, lse, sc, causal),
                              kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(op_cases("cpu")))
def test_every_op_runs_and_opcheck(device, name):
    """Every op runs through torch.ops.mla with these arguments; torch's op checker (schema, fake tensors,
    AOT dispatch with dynamic shapes) passes on each where torch has it."""
    args = op_cases(device)[name]
    op = getattr(torch.ops.mla, name)
    op(*args)
    if hasattr(torch.library, "opcheck"):
        torch.library.opcheck(op.default, args)
