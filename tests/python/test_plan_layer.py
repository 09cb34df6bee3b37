# SPDX-License-Identifier: Apache-2.0
"""The planner and the step plan through Python, and MlaAttention (dense and sparse, the float64 oracle
layer and the bf16 fast layer) against a naive float64 NumPy MHA with explicit K/V up-projection."""
import numpy as np
import pytest

import mla
from conftest import L, R, attention, bf16_round

H, P, V, PAGE, TOPK = 4, 32, 32, 16, 16


def test_planner_functions():
    assert mla.classify_request(0, 5, 1) == mla.RequestRegion.prefill
    assert mla.classify_request(10, 1, 1) == mla.RequestRegion.decode
    r = mla.reorder_decodes_first([0, 10, 5], [4, 1, 1], 1)
    assert r.moved and r.order == [2, 1, 0]  # vLLM swaps the misplaced requests only
    assert mla.split_decodes_and_prefills([0, 1, 2, 10], 1, False) == mla.Split(
        num_decodes=2, num_prefills=1, num_decode_tokens=2, num_prefill_tokens=8)
    cp = mla.plan_context_chunks([40, 10], 32, 16)
    assert cp.chunk_size == 16 and len(cp.chunks) == 3 and cp.chunks[0].lens == [16, 10]
    assert mla.req_id_per_token([0, 2, 3]) == [0, 0, 1]
    assert mla.split_prefill_chunks([5, 5, 5], 10) == [(0, 2), (2, 3)]
    assert mla.sparse_prefill_workspace_rows(100) == 500
    assert mla.decode_num_splits(1, 1, 16, 8192, 0) == 1
    assert mla.chunked_prefill_workspace_rows(1000, 4, 16) == 8000
    with pytest.raises(ValueError, match="query_start_loc"):
        mla.split_decodes_and_prefills([1, 2], 1, False)
    # The sparse fp8_ds_mla prefill mode: the head rule by default, or either mode forced.
    assert mla.sparse_mixed_batch_for(mla.SparsePrefillMode.automatic, 16) == mla.sparse_use_mixed_batch(16)
    assert not mla.sparse_mixed_batch_for(mla.SparsePrefillMode.separate, 16)
    # automatic on compute capability 9.0 (the sm90 kernels): separate, except in a DCP group.
    assert not mla.sparse_mixed_batch_for(mla.SparsePrefillMode.automatic, 16, compute_capability=90)
    assert mla.sparse_mixed_batch_for(mla.SparsePrefillMode.automatic, 16, compute_capability=90, dcp_world_size=2)
    assert mla.compute_capability("cpu") == 0
    ds = mla.ModelDims(kv_lora_rank=L, qk_rope_head_dim=R, qk_nope_head_dim=P, v_head_dim=V, num_heads=16,
                       softmax_scale=0.1, index_topk=TOPK)
    cfg = mla.PlannerConfig(dims=ds, cache_format=mla.CacheFormat.fp8_ds_mla, page_size=PAGE, max_model_len=256,
                            max_num_seqs=8, sparse=True, decode_threshold=1, require_uniform=True)
    batch = mla.BatchDesc(query_start_loc=[0, 1, 9], seq_lens=[20, 8])
    assert cfg.sparse_prefill_mode == mla.SparsePrefillMode.automatic and mla.make_plan(batch, cfg).sparse_mixed_batch
    cfg.sparse_prefill_mode = mla.SparsePrefillMode.separate
    sep = mla.make_plan(batch, cfg)
    assert not sep.sparse_mixed_batch and len(sep.sparse_chunks) == 1
    cfg.sparse_prefill_mode = mla.SparsePrefillMode.automatic
    cfg.compute_capability = 90
    assert not cfg.sparse_mixed_batch() and not mla.make_plan(batch, cfg).sparse_mixed_batch
    cfg.compute_capability = 0


def dims(sparse):
    return mla.ModelDims(kv_lora_rank=L, qk_rope_head_dim=R, qk_nope_head_dim=P, v_head_dim=V, num_heads=H,
                         softmax_scale=1 / np.sqrt(P + R), index_topk=TOPK if sparse else 0)


def make_step(rng, reqs, sparse):
    """Context rows already in a NaN-filled bf16 cache, shuffled block tables, bf16-exact inputs."""
    n_blocks = sum(-(-(c + q) // PAGE) for c, q in reqs) + 2
    cache = mla.allocate_cache(mla.CacheFormat.bf16, n_blocks, PAGE)
    mla.fill(cache.data, float("nan"))
    perm = rng.permutation(n_blocks)
    width = max(-(-(c + q) // PAGE) for c, q in reqs)
    table = np.zeros((len(reqs), width), np.int32)
    hist, used = [], 0
    for r, (c, q) in enumerate(reqs):
        nb = -(-(c + q) // PAGE)
        table[r, :nb] = perm[used:used + nb]
        used += nb
        hist.append(bf16_round(rng.standard_normal((c + q, L + R))))
        if c:
            slots = np.array([table[r, p // PAGE] * PAGE + p % PAGE for p in range(c)], np.int64)
            mla.write_cache(hist[r][:c, :L].copy(), hist[r][:c, L:].copy(), slots, cache)
    new = np.concatenate([hist[r][c:] for r, (c, q) in enumerate(reqs)])
    slots = np.array([table[r, p // PAGE] * PAGE + p % PAGE for r, (c, q) in enumerate(reqs) for p in range(c, c + q)])
    topk = None
    if sparse:
        topk = np.full((len(new), TOPK), -1, np.int32)
        t = 0
        for c, q in reqs:
            for i in range(q):
                pos = rng.choice(c + i + 1, size=min(TOPK - 2, c + i + 1), replace=False)
                topk[t, :len(pos)] = pos
                t += 1
    return cache, table, hist, new, slots, topk


def naive(reqs, hist, q, w, topk, sparse):
    """Float64 MHA over each token's keys (causal, or its top-k positions), K/V up-projected from kv_c."""
    w = w.reshape(H, P + V, L)
    out, t = [], 0
    for r, (c, n) in enumerate(reqs):
        kv, pe = hist[r][:, :L], hist[r][:, L:]
        k = np.concatenate([np.einsum("ml,hpl->hmp", kv, w[:, :P]), np.broadcast_to(pe, (H,) + pe.shape)], axis=2)
        v = np.einsum("ml,hvl->hmv", kv, w[:, P:])
        for i in range(n):
            keys = [p for p in topk[t] if p >= 0] if sparse else list(range(c + i + 1))
            o, _ = attention(q[t][:, None, :], k[:, keys], v[:, keys], 1 / np.sqrt(P + R))
            out.append(o[:, 0].reshape(-1))
            t += 1
    return np.stack(out)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("oracle", [True, False])
def test_layer_against_naive_mha(rng, sparse, oracle):
    reqs = [(20, 1), (33, 1), (40, 7), (0, 9)]  # two decodes, a prefill with context, a fresh prefill
    cache, table, hist, new, slots, topk = make_step(rng, reqs, sparse)
    d = dims(sparse)
    w = bf16_round(rng.standard_normal((H * (P + V), L)) / np.sqrt(L))
    opt = mla.oracle_layer_options(d, sparse=sparse) if oracle else mla.LayerOptions(dims=d, sparse=sparse)
    layer = mla.MlaAttention(opt, w)
    assert layer.w_uk_t.shape == (H, P, L) and layer.w_uv.shape == (H, L, V)
    cfg = mla.PlannerConfig(dims=d, page_size=PAGE, max_model_len=256, max_num_seqs=8, sparse=sparse)
    qsl = np.cumsum([0] + [q for _, q in reqs]).tolist()
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=qsl, seq_lens=[c + q for c, q in reqs]), cfg)
    assert plan.split.num_decodes == 2 and plan.has_prefill()
    ws = mla.empty([max(layer.workspace_bytes(plan), 1)], "u8")
    assert layer.max_workspace_bytes(cfg, 64) >= layer.workspace_bytes(plan)
    q = bf16_round(rng.standard_normal((len(new), H, P + R)))
    if oracle:
        args = dict(q=q, kv_c=new[:, :L].copy(), k_pe=new[:, L:].copy(), out=np.full((len(new), H * V), np.nan))
    else:  # the fast layer takes bf16 activations: torch when present, else mla.Tensor buffers
        torch = pytest.importorskip("torch")
        args = dict(q=torch.tensor(q).bfloat16(), kv_c=torch.tensor(new[:, :L]).bfloat16(),
                    k_pe=torch.tensor(new[:, L:]).bfloat16(), out=torch.full((len(new), H * V), float("nan")).bfloat16())
    meta = mla.empty([max(plan.metadata.bytes(), 16)], "u8")
    mla.upload_step_metadata(plan, mla.pinned_buffer(meta.nbytes), meta)
    layer.forward(plan, cache, ws, slot_mapping=slots, block_table=table,
                  seq_lens=np.array([c + q for c, q in reqs], np.int32), topk_indices=topk, metadata=meta,
                  precision=mla.Precision.reference if oracle else mla.Precision.fast, **args)
    out = args["out"]
    out = out.float().numpy().astype(np.float64) if not oracle else out
    ref = naive(reqs, hist, q, w, topk, sparse)
    tol = dict(rtol=1e-10, atol=1e-10) if oracle else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(out, ref, **tol)


def test_layer_bad_input_writes_nothing(rng):
    reqs = [(5, 1)]
    cache, table, hist, new, slots, _ = make_step(rng, reqs, False)
    layer = mla.MlaAttention(mla.oracle_layer_options(dims(False)), rng.standard_normal((H * (P + V), L)))
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=[0, 1], seq_lens=[6]),
                         mla.PlannerConfig(dims=dims(False), page_size=PAGE, max_model_len=256))
    before = cache.data.numpy().copy()
    out = np.full((1, H * V), np.nan)
    with pytest.raises(ValueError, match="q"):
        layer.forward(plan, cache, mla.empty([layer.workspace_bytes(plan) + 1], "u8"),
                      q=np.zeros((1, H, P)), kv_c=new[:, :L].copy(), k_pe=new[:, L:].copy(), slot_mapping=slots,
                      block_table=table, seq_lens=np.array([6], np.int32), out=out)
    assert np.isnan(out).all()
    np.testing.assert_array_equal(cache.data.numpy(), before)


def test_edited_plan_is_refused_and_writes_nothing(rng):
    """Issue 14: nested plan objects are references into the plan; an edit through them voids the
    seal, and forward refuses the plan before writing the cache or out."""
    reqs = [(5, 1)]
    cache, table, hist, new, slots, _ = make_step(rng, reqs, False)
    layer = mla.MlaAttention(mla.oracle_layer_options(dims(False)), rng.standard_normal((H * (P + V), L)))
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=[0, 1], seq_lens=[6]),
                         mla.PlannerConfig(dims=dims(False), page_size=PAGE, max_model_len=256))
    assert plan.seal != 0 and plan.seal == mla.plan_digest(plan)
    ws = mla.empty([layer.workspace_bytes(plan) + 1], "u8")
    plan.split.num_decode_tokens = 0  # through the reference Python hands out
    assert mla.plan_digest(plan) != plan.seal
    before = cache.data.numpy().copy()
    out = np.full((1, H * V), np.nan)
    with pytest.raises(ValueError, match="modified after make_plan"):
        layer.forward(plan, cache, ws, q=np.zeros((1, H, P + R)), kv_c=new[:, :L].copy(), k_pe=new[:, L:].copy(),
                      slot_mapping=slots, block_table=table, seq_lens=np.array([6], np.int32), out=out)
    assert np.isnan(out).all()
    np.testing.assert_array_equal(cache.data.numpy(), before)


def _oracle_step(rng, opt_kwargs, cache_format=mla.CacheFormat.bf16):
    """One float64 oracle step (two decodes, a prefill with context, a fresh prefill) of a layer with the
    given extra options; returns (layer, plan, run) where run(out, out_scales) performs the step on a
    fresh copy of the cache."""
    reqs = [(20, 1), (33, 1), (40, 7), (0, 9)]
    cache, table, hist, new, slots, _ = make_step(rng, reqs, False)
    w = bf16_round(rng.standard_normal((H * (P + V), L)) / np.sqrt(L))
    opt = mla.oracle_layer_options(dims(False))
    for k, v in opt_kwargs.items():
        setattr(opt, k, v)
    opt.cache_format = cache_format
    layer = mla.MlaAttention(opt, w)
    cfg = mla.PlannerConfig(dims=dims(False), page_size=PAGE, max_model_len=256, max_num_seqs=8,
                            cache_format=cache_format)
    qsl = np.cumsum([0] + [q for _, q in reqs]).tolist()
    plan = mla.make_plan(mla.BatchDesc(query_start_loc=qsl, seq_lens=[c + q for c, q in reqs]), cfg)
    q = bf16_round(rng.standard_normal((len(new), H, P + R)))
    seq_lens = np.array([c + q for c, q in reqs], np.int32)

    def run(out, out_scales=None):
        kv = cache
        if cache_format != mla.CacheFormat.bf16:  # the context rows are zero in another format's cache
            kv = mla.allocate_cache(cache_format, cache.data.shape[0], PAGE)
            mla.fill(kv.data, 0.0)
        ws = mla.empty([max(layer.workspace_bytes(plan), 1)], "u8")
        layer.forward(plan, kv, ws, q=q, kv_c=new[:, :L].copy(), k_pe=new[:, L:].copy(), slot_mapping=slots,
                      block_table=table, seq_lens=seq_lens, out=out, out_scales=out_scales,
                      precision=mla.Precision.reference)
    run.kv_c = new[:, :L]
    return layer, len(new), run


@pytest.mark.parametrize("key", ["fp8", "fp8_group128", "fp8_group64", "nvfp4"])
def test_layer_quantised_output_equals_quantize_of_unfused(rng, key):
    """docs/SEMANTICS.md §15: the layer's quantised output is quantize_output of its unquantised output."""
    scale = 672.0 if key == "nvfp4" else 1 / 32
    plain, T, run_plain = _oracle_step(np.random.default_rng(5), {})
    quant, _, run_quant = _oracle_step(np.random.default_rng(5), {"out_quant": key, "out_scale": scale})
    assert quant.options.out_quant == getattr(mla.OutputQuant, key)
    unfused = np.full((T, H * V), np.nan)
    run_plain(unfused)
    rows = T + 2
    width = H * V // 2 if key == "nvfp4" else H * V
    group = {"fp8": 0, "fp8_group128": 128, "fp8_group64": 64, "nvfp4": 16}[key]

    def buffers():
        codes = np.full((rows, width), 0xFF, np.uint8)
        if key == "nvfp4":
            return codes, np.full((rows, H * V // 16), 0xFF, np.uint8)
        return codes, (np.full((H * V // group, rows), np.nan, np.float32) if group else None)
    got_c, got_s = buffers()
    run_quant(got_c, got_s)
    want_c, want_s = buffers()
    mla.quantize_output(unfused, key, want_c, want_s, scale)
    np.testing.assert_array_equal(got_c, want_c)
    assert not got_c[T:].any()
    if got_s is not None:
        np.testing.assert_array_equal(got_s, want_s)


def test_layer_quantised_output_refuses_bad_keys(rng):
    with pytest.raises(ValueError, match="fp8_group128"):
        mla.LayerOptions(out_quant="int4")
    with pytest.raises(ValueError, match="out_scale"):
        mla.MlaAttention(mla.LayerOptions(dims=dims(False), out_quant="fp8", out_scale=0.0),
                         rng.standard_normal((H * (P + V), L)))
    _, T, run = _oracle_step(rng, {"out_quant": "fp8_group128"})
    codes = np.zeros((T, H * V), np.uint8)
    with pytest.raises(ValueError, match="scales"):
        run(codes)  # no out_scales
    with pytest.raises(ValueError):
        run(np.zeros((T, H * V)), np.zeros((1, T), np.float32))  # float64 codes


def test_layer_kv_scales_auto(rng):
    """docs/SEMANTICS.md §16: the first batch's max |kv_c| / 200 becomes the fp8 cache's scale."""
    layer, T, run = _oracle_step(rng, {"kv_scales": "auto"}, mla.CacheFormat.fp8)
    assert layer.options.kv_scales == mla.KvScales.from_first_batch and layer.kv_scale is None
    run(np.full((T, H * V), np.nan))
    assert layer.kv_scale == np.float32(np.abs(run.kv_c).max()) / np.float32(200)
    with pytest.raises(ValueError, match="fp8"):
        mla.MlaAttention(mla.LayerOptions(dims=dims(False), kv_scales="auto"), rng.standard_normal((H * (P + V), L)))
    with pytest.raises(TypeError):
        mla.LayerOptions(kv_scales="sometimes")
