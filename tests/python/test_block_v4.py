# SPDX-License-Identifier: Apache-2.0
"""mla.DeepseekV4Attention (docs/SEMANTICS.md section 17) from Python: a small random-weight block (real head dims,
everything else small) serves two requests in two steps through a float block and the float64 block (every layer
kind: sliding only, ratio 4 with top-k picks, ratio 8 with every causal entry) over NaN-poisoned caches: the f32
block over bf16 caches (CPU) and the bf16 block (CUDA, torch tensors, where present) within the bf16 rule of the
float64 block over f64 caches. Refused arguments raise and write nothing."""
import numpy as np
import pytest

import mla

PAGE = 4


def small_config():
    c = mla.DeepseekV4Config(model_type="deepseek_v4", hidden_size=64, num_attention_heads=4, q_lora_rank=32,
                             o_groups=2, o_lora_rank=16, sliding_window=8, index_topk=3, yarn_factor=4.0,
                             yarn_original_max_position_embeddings=16, compress_ratios=[0, 4, 8])
    c.validate()
    return c


def weights(c, seed=3):
    g = np.random.default_rng(seed)
    D, H, h, G = c.head_dim, c.hidden_size, c.num_attention_heads, c.o_groups

    def lin(out, inp):
        return (g.uniform(-1, 1, (out, inp)) / np.sqrt(inp)).astype(np.float32)

    return {"q_a_proj.weight": lin(c.q_lora_rank, H), "q_b_proj.weight": lin(h * D, c.q_lora_rank),
            "kv_proj.weight": lin(D, H), "o_a_proj.weight": lin(G * c.o_lora_rank, h // G * D),
            "o_b_proj.weight": lin(H, G * c.o_lora_rank),
            "q_a_norm.weight": g.uniform(0.9, 1.1, c.q_lora_rank).astype(np.float32),
            "kv_norm.weight": g.uniform(0.9, 1.1, D).astype(np.float32),
            "sinks": g.uniform(-1, 1, h).astype(np.float32)}


def serve(blk, fmt, hidden_rows, compressed, device="cpu"):
    """Two requests (lengths 13 and 9) in two steps through blk over fresh NaN-poisoned caches of format fmt on
    `device`; returns every step's outputs as float64."""
    torch = pytest.importorskip("torch") if device != "cpu" else None
    c, ratio = blk.config, blk.compress_ratio
    lens, steps = [13, 9], [[(0, 8), (1, 5)], [(0, 5), (1, 4)]]
    per_req = 1 + -(-13 // PAGE)
    blocks = 2 * per_req
    table = np.arange(blocks, dtype=np.int32)[::-1].reshape(2, per_req).copy()  # reversed pages

    def cache_of(f):
        if device == "cpu":
            k = mla.allocate_cache(f, blocks, PAGE, d_qk=512, d_rope=64)
            mla.fill(k.data, 255 if f in (mla.CacheFormat.v4, mla.CacheFormat.v41, mla.CacheFormat.v41_fp4)
                     else float("nan"))
            return k
        assert f == mla.CacheFormat.bf16
        t = torch.full((blocks, PAGE, 2 * 512), 0xFF, dtype=torch.uint8, device="cuda").view(torch.bfloat16)  # NaN
        return mla.KVCache(t, f, d_qk=512, d_rope=64)

    main = cache_of(fmt)
    extra = cache_of(fmt) if ratio > 0 else None
    K = 0 if ratio == 0 else (c.index_topk if ratio == 4 else -(-13 // ratio))
    done, outs = [0, 0], []
    for step in steps:
        pos, rid, slots, topk, ekv, eslots = [], [], [], [], [], []
        for r, n in step:
            for i in range(n):
                p = done[r] + i
                pos.append(p)
                rid.append(r)
                slots.append(int(table[r, p // PAGE]) * PAGE + p % PAGE)
                if ratio > 0:
                    vis = list(range((p + 1) // ratio))[:K]
                    topk.append(vis + [-1] * (K - len(vis)))
                    if (p + 1) % ratio == 0:
                        e = (p + 1) // ratio - 1
                        ekv.append(compressed[r][e])
                        eslots.append(int(table[r, e // PAGE]) * PAGE + e % PAGE)
            done[r] += n
        T = len(pos)
        x = np.stack([hidden_rows[r][done[r] - n + i] for r, n in step for i in range(n)])
        kw = dict(positions=np.array(pos, np.int64), req_id=np.array(rid, np.int32), block_table=table,
                  slot_mapping=np.array(slots, np.int64))
        if ratio > 0:
            kw.update(extra_topk=np.array(topk, np.int32), extra_block_table=table)
            if ekv:
                kw.update(extra_kv=np.array(ekv, np.float32), extra_slot_mapping=np.array(eslots, np.int64))
        ws_bytes = blk.workspace_bytes(T, K)
        if device == "cpu":
            out = np.full((T, c.hidden_size), np.nan, dtype=np.float64 if blk.options.dtype == mla.DType.f64
                          else np.float32)
            hid = x.astype(out.dtype)
            blk.forward(main, extra, mla.empty([ws_bytes], "u8"), hidden=hid, out=out, **kw,
                        precision=mla.Precision.reference if out.dtype == np.float64 else mla.Precision.fast)
            outs.append(out.astype(np.float64))
        else:
            tkw = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in kw.items()}
            out = torch.full((T, c.hidden_size), float("nan"), dtype=torch.bfloat16, device="cuda")
            ws = torch.full((max(ws_bytes, 16),), 0xFF, dtype=torch.uint8, device="cuda")
            blk.forward(main, extra, ws, hidden=torch.from_numpy(x).to(torch.bfloat16).cuda(), out=out, **tkw)
            torch.cuda.synchronize()
            outs.append(out.float().cpu().numpy().astype(np.float64))
    return np.concatenate(outs)


def inputs(c, seed=7):
    g = np.random.default_rng(seed)
    hidden = [g.uniform(-1, 1, (n, c.hidden_size)).astype(np.float32) for n in (13, 9)]
    compressed = [g.uniform(-1.5, 1.5, (n // 4 + 1, c.head_dim)).astype(np.float32) for n in (13, 9)]
    return hidden, compressed


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_v4_block_f32_with_bf16_caches_within_the_bf16_rule(layer):
    c = small_config()
    w = weights(c)
    hidden, compressed = inputs(c)
    ref = serve(mla.DeepseekV4Attention(c, layer, w, mla.DeepseekV4Options(dtype="f64", cache_format=mla.CacheFormat.f64,
                                                                           extra_cache_format=mla.CacheFormat.f64)),
                mla.CacheFormat.f64, hidden, compressed)
    got = serve(mla.DeepseekV4Attention(c, layer, w, mla.DeepseekV4Options(dtype="f32", cache_format=mla.CacheFormat.bf16,
                                                                           extra_cache_format=mla.CacheFormat.bf16)),
                mla.CacheFormat.bf16, hidden, compressed)
    assert np.isfinite(got).all()
    assert rel_l2(got, ref) <= 1e-2


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_v4_block_on_cuda_with_torch_tensors(layer):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and mla.cuda_device_count() > 0):
        pytest.skip("no CUDA device (or mla built without CUDA)")
    c = small_config()
    w = weights(c)
    hidden, compressed = inputs(c)
    ref = serve(mla.DeepseekV4Attention(c, layer, w, mla.DeepseekV4Options(dtype="f64", cache_format=mla.CacheFormat.f64,
                                                                           extra_cache_format=mla.CacheFormat.f64)),
                mla.CacheFormat.f64, hidden, compressed)
    blk = mla.DeepseekV4Attention(c, layer, w, mla.DeepseekV4Options(dtype="bf16", device="cuda",
                                                                      cache_format=mla.CacheFormat.bf16,
                                                                      extra_cache_format=mla.CacheFormat.bf16))
    got = serve(blk, mla.CacheFormat.bf16, hidden, compressed, device="cuda")
    assert np.isfinite(got).all()
    assert rel_l2(got, ref) <= 1e-2


def test_v4_block_refusals():
    c = small_config()
    w = weights(c)
    with pytest.raises(Exception, match="unknown weight"):
        mla.DeepseekV4Attention(c, 0, {**w, "o_proj.weight": w["o_b_proj.weight"]})
    with pytest.raises(Exception, match="layer 7"):
        mla.DeepseekV4Attention(c, 7, w)
    blk = mla.DeepseekV4Attention(c, 0, w, mla.DeepseekV4Options(dtype="f32", cache_format=mla.CacheFormat.bf16,
                                                                 extra_cache_format=mla.CacheFormat.bf16))
    cache = mla.allocate_cache(mla.CacheFormat.bf16, 4, PAGE, d_qk=512, d_rope=64)
    out = np.full((2, c.hidden_size), np.nan, np.float32)
    with pytest.raises(Exception, match="hidden"):  # hidden rows of the wrong width
        blk.forward(cache, None, mla.empty([blk.workspace_bytes(2)], "u8"),
                    hidden=np.zeros((2, c.hidden_size + 1), np.float32), out=out, positions=np.array([0, 1], np.int64),
                    req_id=np.zeros(2, np.int32), block_table=np.zeros((1, 4), np.int32),
                    slot_mapping=np.array([0, 1], np.int64))
    assert np.isnan(out).all()
    assert mla.DeepseekV4Config.preset("v41-flash").q_head_norm is False
