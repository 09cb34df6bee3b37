# SPDX-License-Identifier: Apache-2.0
"""Every functional op of mla/ops.h on the CPU against a float64 NumPy reference (reference
precision, f64 activations: agreement to ~1e-12), with seeded inputs and NaN-poisoned outputs."""
import numpy as np
import pytest

import mla
from conftest import (D_QK, D_V, L, R, attention, bf16_cache_with, bf16_round, cache_rows, e4m3_decode,
                      e4m3_encode)

REF = mla.Precision.reference
TOL = dict(rtol=1e-11, atol=1e-11)


def slot_of(block_table, b, pos, page):
    return block_table[b, pos // page] * page + pos % page


def test_write_cache_fp8_per_tensor(rng):
    c = mla.allocate_cache(mla.CacheFormat.fp8, 3, 4, scale=0.5)
    kv, pe = bf16_round(rng.standard_normal((5, L)) * 64), bf16_round(rng.standard_normal((5, R)))
    slots = np.array([3, 0, -1, 11, 6], np.int64)
    mla.write_cache(kv, pe, slots, c)
    raw = c.data.numpy().reshape(12, 576)
    for t, s in enumerate(slots):
        if s >= 0:  # x / 0.5 is exact: the codes are the e4m3 rounding of 2x, saturated at 448
            np.testing.assert_array_equal(raw[s], e4m3_encode(np.concatenate([kv[t], pe[t]]) / 0.5))


def test_write_cache_fp8_ds_mla(rng):
    c = mla.allocate_cache(mla.CacheFormat.fp8_ds_mla, 2, 3)
    kv, pe = rng.standard_normal((4, L)), bf16_round(rng.standard_normal((4, R)))
    mla.write_cache(kv, pe, np.array([5, 0, 2, 3], np.int32), c)
    raw = c.data.numpy().reshape(6, 656)
    rows = cache_rows(c)
    for t, s in enumerate([5, 0, 2, 3]):
        amax = np.abs(kv[t].astype(np.float32)).reshape(4, 128).max(axis=1)
        np.testing.assert_array_equal(raw[s, 512:528].view(np.float32), np.float32(amax) / np.float32(448))
        np.testing.assert_array_equal(rows[s, L:], pe[t])  # rope: bf16 bits
        np.testing.assert_allclose(rows[s, :L], kv[t], rtol=2.0 ** -4, atol=1e-30)  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("with_starts", [False, True])
def test_gather_cache_and_cp_gather(rng, with_starts):
    page = 4
    cache, rows = bf16_cache_with(rng, 6, page)
    block_table = np.array([[5, 1, 2], [0, 3, 4]], np.int32)
    lens = [7, 5]
    starts = np.array([2, 5], np.int32) if with_starts else None
    cu = np.array([0, 7, 12], np.int32)
    dst = np.full((12, D_QK), np.nan)
    mla.gather_cache(cache, dst, block_table, cu, starts)
    for b in range(2):
        for i in range(lens[b]):
            pos = i + (starts[b] if with_starts else 0)
            np.testing.assert_array_equal(dst[cu[b] + i], rows[slot_of(block_table, b, pos, page)])
    # raw copy of an fp8_ds_mla cache: the 656-byte records themselves
    ds = mla.allocate_cache(mla.CacheFormat.fp8_ds_mla, 6, page)
    mla.write_cache(rng.standard_normal((24, L)), rng.standard_normal((24, R)), np.arange(24), ds)
    raw = ds.data.numpy().reshape(24, 656)
    out = np.zeros((12, 656), np.uint8)
    mla.cp_gather_cache(ds, out, block_table, cu, starts)
    for b in range(2):
        for i in range(lens[b]):
            pos = i + (starts[b] if with_starts else 0)
            np.testing.assert_array_equal(out[cu[b] + i], raw[slot_of(block_table, b, pos, page)])


def test_upconvert_ds_mla(rng):
    page = 2
    ds = mla.allocate_cache(mla.CacheFormat.fp8_ds_mla, 5, page)
    mla.write_cache(rng.standard_normal((10, L)), rng.standard_normal((10, R)), np.arange(10), ds)
    rows = cache_rows(ds)
    block_table = np.array([[4, 1, 0], [2, 3, 0]], np.int32)
    ws_starts = np.array([0, 5], np.int32)  # request 0: 5 rows, request 1: 3 rows
    dst = np.full((8, D_QK), np.nan)
    mla.upconvert_ds_mla(ds, dst, block_table, ws_starts)
    for b, n in enumerate([5, 3]):
        for i in range(n):
            np.testing.assert_array_equal(dst[ws_starts[b] + i], rows[slot_of(block_table, b, i, page)])


def test_merge_attn_states(rng):
    T, H, D = 6, 3, 16
    prefix, suffix = rng.standard_normal((T, H, D)), rng.standard_normal((T, H, D))
    p_lse = rng.standard_normal((H, T)).astype(np.float32)
    s_lse = rng.standard_normal((H, T)).astype(np.float32)
    p_lse[0, 1], s_lse[1, 2] = -np.inf, np.inf  # one side empty; +inf counts as -inf
    p_lse[2, 3] = s_lse[2, 3] = -np.inf  # both empty: the prefix, lse -inf
    out, out_lse = np.full((T, H, D), np.nan), np.full((H, T), np.nan, np.float32)
    mla.merge_attn_states(out, out_lse, prefix, p_lse, suffix, s_lse, precision=REF)
    pl = p_lse.astype(np.float64)
    sl = np.where(np.isposinf(s_lse), -np.inf, s_lse).astype(np.float64)
    m = np.maximum(pl, sl)
    both = ~np.isfinite(m)
    m = np.where(both, 0, m)
    wp, ws = np.exp(pl - m), np.exp(sl - m)
    ref = (prefix * wp.T[..., None] + suffix * ws.T[..., None]) / np.where(both, 1, wp + ws).T[..., None]
    ref = np.where(both.T[..., None], prefix, ref)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)  # weights from fp32 LSEs
    np.testing.assert_allclose(out_lse, np.where(both, -np.inf, np.log(np.where(both, 1, wp + ws)) + m), rtol=1e-6)


def test_convert_topk_indices(rng):
    page, topk = 4, 5
    block_table = np.array([[3, 1, 0], [2, 5, 4]], np.int32)
    req = np.array([0, 0, 1], np.int32)
    idx = np.array([[0, 5, 11, 12, -1], [3, 4, 7, -1, 2], [9, 0, 1, 100, -3]], np.int32)
    out = np.full((3, topk), 7777, np.int32)
    counts = np.full(3, -5, np.int32)
    mla.convert_topk_indices(req, block_table, idx, out, page, valid_counts=counts)
    ref = np.full_like(idx, -1)
    for t in range(3):
        for j in range(topk):
            i = idx[t, j]
            if 0 <= i and i // page < 3:
                ref[t, j] = block_table[req[t], i // page] * page + i % page
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(counts, (ref >= 0).sum(axis=1))
    seq_lens = np.array([6, 9], np.int32)  # positions at or past a request's length are invalid
    mla.convert_topk_indices(req, block_table, idx, out, page, seq_lens=seq_lens)
    np.testing.assert_array_equal(out, np.where(idx < seq_lens[req][:, None], ref, -1))


@pytest.mark.parametrize("causal", [True, False])
def test_mqa_decode(rng, causal):
    page, b, s_q, h = 4, 3, 2, 5
    cache, rows = bf16_cache_with(rng, 8, page)
    block_table = np.array([[7, 2, 5], [0, 1, 3], [4, 6, 6]], np.int32)
    seq_lens = np.array([9, 0, 12], np.int32)
    q = rng.standard_normal((b, s_q, h, D_QK))
    out, lse = np.full((b, s_q, h, D_V), np.nan), np.full((b, s_q, h), np.nan, np.float32)
    scale = 0.07
    mla.mqa_decode(q, cache, block_table, seq_lens, out, lse, scale, causal, precision=REF)
    for i in range(b):
        n = seq_lens[i]
        k = rows[[slot_of(block_table, i, p, page) for p in range(n)]] if n else np.zeros((0, D_QK))
        mask = None
        if causal:
            mask = np.arange(n)[None, None, :] <= (n - s_q + np.arange(s_q))[None, :, None]
        o, l = attention(q[i].transpose(1, 0, 2), k, k[:, :D_V], scale, mask)
        np.testing.assert_allclose(out[i], o.transpose(1, 0, 2), **TOL)
        np.testing.assert_allclose(lse[i], l.T, rtol=1e-6)
    assert mla.mqa_decode_workspace_bytes(b, s_q, h, 12, "cpu") == 0


def test_mqa_decode_batch_invariant(rng):
    """batch_invariant: a fixed request's bytes (float32 out) are the same next to other requests as alone."""
    page, s_q, h, n = 16, 2, 4, 1500
    cache, _ = bf16_cache_with(rng, 200, page)
    own = rng.permutation(200)[:94].astype(np.int32)  # the fixed request's 94 pages
    q0 = rng.standard_normal((1, s_q, h, D_QK)).astype(np.float32)
    results = []
    for others in ([], [1600], [40, 3000 // 2, 7]):
        b = 1 + len(others)
        table = rng.integers(0, 200, (b, 100)).astype(np.int32)
        table[0, :94], table[0, 94:] = own, -1
        lens = np.array([n] + others, np.int32)
        q = rng.standard_normal((b, s_q, h, D_QK)).astype(np.float32)
        q[0] = q0[0]
        out, lse = np.full((b, s_q, h, D_V), np.nan, np.float32), np.full((b, s_q, h), np.nan, np.float32)
        mla.mqa_decode(q, cache, table, lens, out, lse, 0.07, num_splits=1, batch_invariant=True)
        results.append((out[0].tobytes(), lse[0].tobytes()))
    assert results[1] == results[0] and results[2] == results[0]
    with pytest.raises(ValueError, match="num_splits"):  # 0 would take the split count from the batch
        mla.mqa_decode(q, cache, table, lens, out, lse, 0.07, batch_invariant=True)
    cfg = mla.PlannerConfig(dims=mla.ModelDims.deepseek_v3(8), max_num_seqs=8, num_sms=132, batch_invariant=True)
    assert mla.batch_invariant_splits(cfg, 1) == mla.decode_num_splits(8, 1, 16, 163840, 132)


def test_sparse_mqa_batch_invariant(rng):
    cache, _ = bf16_cache_with(rng, 100, 16)
    topk = 1500
    row = rng.integers(0, 1600, topk).astype(np.int32)
    q0 = rng.standard_normal((1, 4, D_QK)).astype(np.float32)
    results = []
    for t in (1, 3, 6):
        idx = rng.integers(-1, 1600, (t, topk)).astype(np.int32)
        idx[t - 1] = row
        q = rng.standard_normal((t, 4, D_QK)).astype(np.float32)
        q[t - 1] = q0[0]
        out, lse = np.full((t, 4, D_V), np.nan, np.float32), np.full((t, 4), np.nan, np.float32)
        mla.sparse_mqa(q, cache, idx, None, out, lse, 0.05, batch_invariant=True)
        results.append((out[t - 1].tobytes(), lse[t - 1].tobytes()))
    assert results[1] == results[0] and results[2] == results[0]


def test_mha_prefill(rng):
    h, dn, dr, dv = 3, 16, 8, 12
    lq, lk = [3, 5], [6, 5]
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    q = rng.standard_normal((cq[-1], h, dn + dr))
    k_nope, v = rng.standard_normal((ck[-1], h, dn)), rng.standard_normal((ck[-1], h, dv))
    pe = rng.standard_normal((ck[-1], 1, dr))  # one rope row for all heads: head stride 0, as MLA shares it
    k_pe = np.lib.stride_tricks.as_strided(pe, (ck[-1], h, dr), (pe.strides[0], 0, pe.strides[2]))
    out, lse = np.full((cq[-1], h, dv), np.nan), np.full((h, cq[-1]), np.nan, np.float32)
    mla.mha_prefill(q, k_nope, k_pe, v, cq, ck, 5, 6, out, lse, 0.2, True, precision=REF)
    for r in range(2):
        qs, ks = slice(cq[r], cq[r + 1]), slice(ck[r], ck[r + 1])
        k = np.concatenate([k_nope[ks], k_pe[ks]], axis=2).transpose(1, 0, 2)
        mask = np.arange(lk[r])[None, None, :] <= (lk[r] - lq[r] + np.arange(lq[r]))[None, :, None]
        o, l = attention(q[qs].transpose(1, 0, 2), k, v[ks].transpose(1, 0, 2), 0.2, mask)
        np.testing.assert_allclose(out[qs], o.transpose(1, 0, 2), **TOL)
        np.testing.assert_allclose(lse[:, qs], l, rtol=1e-6)


def test_mha_prefill_fp8(rng):
    """fp8 compute (docs/SEMANTICS.md §10.1) on the CPU: codes-exact inputs, P = e4m3(256 p), out = s_v sum P8 v8 / l."""
    h, dn, dr, dv = 2, 16, 8, 12
    lq, lk = [3, 5], [6, 5]
    sq, sk, sv = 0.5, 0.25, 2.0
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)

    def codes(shape, s):  # values that are e4m3 codes times the scale: their quantisation is exact
        return e4m3_decode(e4m3_encode(rng.standard_normal(shape) * 8)) * s

    q, k_nope, k_pe, v = codes((cq[-1], h, dn + dr), sq), codes((ck[-1], h, dn), sk), codes((ck[-1], h, dr), sk), \
        codes((ck[-1], h, dv), sv)
    out, lse = np.full((cq[-1], h, dv), np.nan), np.full((h, cq[-1]), np.nan)
    mla.mha_prefill(q, k_nope, k_pe, v, cq, ck, 5, 6, out, lse, 0.2, False, fp8=True, q_scale=sq, k_scale=sk,
                    v_scale=sv, precision=REF)
    assert mla.mha_prefill_workspace_bytes(8, 11, h, 2, True, "cpu") == 0
    for r in range(2):
        qs, ks = slice(cq[r], cq[r + 1]), slice(ck[r], ck[r + 1])
        k = np.concatenate([k_nope[ks], k_pe[ks]], axis=2)
        s = np.einsum("nhd,mhd->hnm", q[qs], k) * 0.2
        m = s.max(axis=-1, keepdims=True)
        p = 256 * np.exp(s - m)
        p8 = e4m3_decode(e4m3_encode(p.astype(np.float32)))
        o = np.einsum("hnm,mhd->nhd", p8, v[ks]) / p.sum(axis=-1).T[:, :, None]
        np.testing.assert_allclose(out[qs], o, **TOL)
        np.testing.assert_allclose(lse[:, qs], m[..., 0] + np.log(p.sum(axis=-1) / 256), **TOL)
    with pytest.raises(ValueError):
        mla.mha_prefill(q, k_nope, k_pe, v, cq, ck, 5, 6, out, lse, 0.2, False, fp8=True, q_scale=0.0)
    o = mla.LayerOptions(fp8_prefill=True, fp8_prefill_scales=(0.5, 0.25, 2.0))
    assert o.fp8_prefill and o.fp8_prefill_scales == (0.5, 0.25, 2.0)


def test_sparse_mqa(rng):
    cache, rows = bf16_cache_with(rng, 4, 8)
    T, h, topk = 3, 4, 6
    q = rng.standard_normal((T, h, D_QK))
    idx = np.array([[0, 31, 5, 5, -1, 40], [-1, -1, -1, -1, -1, -1], [7, 8, 9, 10, 11, 12]], np.int32)
    lengths = np.array([6, 6, 4], np.int32)
    out, lse = np.full((T, h, D_V), np.nan), np.full((T, h), np.nan, np.float32)
    mla.sparse_mqa(q, cache, idx, lengths, out, lse, 0.05, precision=REF)
    for t in range(T):
        sel = [i for j, i in enumerate(idx[t]) if 0 <= i < 32 and j < lengths[t]]  # duplicates count twice
        k = rows[sel] if sel else np.zeros((0, D_QK))
        o, l = attention(q[t][:, None, :], k, k[:, :D_V], 0.05)
        np.testing.assert_allclose(out[t], o[:, 0], **TOL)
        np.testing.assert_allclose(lse[t], l[:, 0], rtol=1e-6)
    assert (lse[1] == -np.inf).all() and (out[1] == 0).all()


def test_sparse_mqa_v4(rng):
    """DeepSeek-V4 inputs: d_qk 512 with K = V (whole-row values), a per-head sink, an extra cache at its
    own page size in the same softmax (float64 oracle caches, so the check is exact)."""
    d = 512
    main = rng.standard_normal((3, 16, d))
    extra = rng.standard_normal((5, 4, d))
    main_c = mla.KVCache(main, mla.CacheFormat.f64, d_qk=d)
    extra_c = mla.KVCache(extra, mla.CacheFormat.f64, d_qk=d)
    T, h = 3, 4
    q = rng.standard_normal((T, h, d))
    idx = np.array([[0, 47, 5, 5, -1], [-1, -1, -1, -1, 48], [7, 8, 9, 10, 11]], np.int32)
    e_idx = np.array([[3, 19, -1], [-1, -1, -1], [0, 0, 20]], np.int32)
    e_len = np.array([3, 3, 2], np.int32)
    sink = rng.standard_normal(h).astype(np.float32)
    scale = d ** -0.5
    out, lse = np.full((T, h, d), np.nan), np.full((T, h), np.nan)
    mla.sparse_mqa(q, main_c, idx, None, out, lse, scale, precision=REF, attn_sink=sink, extra_kv=extra_c,
                   extra_indices=e_idx, extra_topk_length=e_len, values_include_rope=True)
    mr, er = main.reshape(-1, d), extra.reshape(-1, d)
    for t in range(T):
        keys = [mr[i] for i in idx[t] if 0 <= i < len(mr)]
        keys += [er[i] for j, i in enumerate(e_idx[t]) if 0 <= i < len(er) and j < e_len[t]]
        k = np.array(keys).reshape(-1, d)
        s = q[t] @ k.T * scale  # [h, n]
        m = np.maximum(s.max(axis=1, initial=-np.inf), sink)
        p = np.exp(s - m[:, None])
        l = p.sum(axis=1) + np.exp(sink - m)
        np.testing.assert_allclose(out[t], p @ k / l[:, None], **TOL)
        np.testing.assert_allclose(lse[t], m + np.log(l), rtol=1e-12)
    assert (out[1] == 0).all() and np.allclose(lse[1], sink.astype(np.float64), rtol=0, atol=0)
    with pytest.raises(Exception, match="extra"):
        mla.sparse_mqa(q, main_c, idx, None, out, lse, scale, extra_indices=e_idx, values_include_rope=True)

    # The output rotation: the last 64 columns turned pairwise by position * inv_freq (the V4 block's inverse
    # rope), the LSE untouched.
    pos = np.array([5, 0, 123456], np.int64)
    inv = -(10000.0 ** (-np.arange(32) * 2.0 / 64))
    turned, lse2 = np.full((T, h, d), np.nan), np.full((T, h), np.nan)
    mla.sparse_mqa(q, main_c, idx, None, turned, lse2, scale, precision=REF, attn_sink=sink, extra_kv=extra_c,
                   extra_indices=e_idx, extra_topk_length=e_len, values_include_rope=True,
                   out_rotation_positions=pos, out_rotation_inv_freq=inv, out_rotation_dim=64)
    np.testing.assert_array_equal(lse2, lse)
    ang = pos[:, None] * inv[None, :]  # [T, 32]
    a, b = out[:, :, d - 64::2], out[:, :, d - 63::2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    np.testing.assert_allclose(turned[:, :, d - 64::2], a * c - b * s, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(turned[:, :, d - 63::2], b * c + a * s, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(turned[:, :, :d - 64], out[:, :, :d - 64])
    with pytest.raises(Exception, match="out_rotation"):
        mla.sparse_mqa(q, main_c, idx, None, turned, lse2, scale, attn_sink=sink, values_include_rope=True,
                       out_rotation_positions=pos, out_rotation_inv_freq=inv, out_rotation_dim=63)


def test_bmm(rng):
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2))
    c = rng.standard_normal((3, 4, 2))
    ref = 0.5 * a @ b + 2.0 * c
    mla.bmm(a, b, c, 0.5, 2.0, precision=REF)
    np.testing.assert_allclose(c, ref, **TOL)


def test_bad_inputs_raise_and_write_nothing(rng):
    cache, _ = bf16_cache_with(rng, 2, 4)
    q = rng.standard_normal((1, 1, 2, D_QK))
    out = np.full((1, 1, 2, D_V), np.nan)
    with pytest.raises(ValueError, match="mqa_decode"):  # seq_len beyond the block table
        mla.mqa_decode(q, cache, np.array([[0]], np.int32), np.array([5], np.int32), out, None, 0.1)
    with pytest.raises(ValueError, match="i32"):  # int64 block table
        mla.mqa_decode(q, cache, np.array([[0]], np.int64), np.array([1], np.int32), out, None, 0.1)
    assert np.isnan(out).all()
    dst = np.full((3, D_QK), np.nan)
    with pytest.raises(ValueError):
        mla.gather_cache(cache, dst, np.array([[0]], np.int32), np.array([0, 4], np.int32))
    assert np.isnan(dst).all()


def v41_pow2_scales(x, tile):
    """2^ceil(log2(max(amax / 448, 1e-4))) per tile of float32 inputs (the V4 / V4.1 MXFP8 writers)."""
    amax = np.abs(x.astype(np.float32)).reshape(-1, tile).max(axis=1)
    s = np.maximum(amax / np.float32(448), np.float32(1e-4))
    return np.exp2(np.ceil(np.log2(s.astype(np.float64))))


def test_v4_record_formats_write_gather_and_sparse(rng):
    """The DeepSeek-V4 records (docs/SEMANTICS.md §3.5): v41's bytes against NumPy's quantiser, every record
    read back by gather_cache as the codes times their scales, sparse_mqa over a v41 window cache with a
    v41_fp4 extra cache equal to the same call over f64 caches of the decoded rows, and mqa_decode refusing."""
    F = mla.CacheFormat
    assert [int(F.v4), int(F.v41), int(F.v41_fp4)] == [4, 5, 6]
    page, n = 3, 6
    kv, pe = rng.standard_normal((n, 448)) * 4, rng.standard_normal((n, 64))
    caches = {f: mla.allocate_cache(f, 2, page, d_qk=512, d_rope=64) for f in (F.v4, F.v41, F.v41_fp4)}
    for c in caches.values():
        mla.write_cache(kv, pe, np.arange(n), c)
    raw = caches[F.v41].data.numpy().reshape(n, 528)
    x = np.concatenate([kv, pe], axis=1).astype(np.float32)
    for t in range(n):
        s = v41_pow2_scales(x[t], 32)
        np.testing.assert_array_equal(raw[t, 512:], (np.log2(s) + 127).astype(np.uint8))
        np.testing.assert_array_equal(raw[t, :512], e4m3_encode(x[t] / np.repeat(s, 32)))
    bt, cu = np.array([[0, 1]], np.int32), np.array([0, n], np.int32)
    decoded = {}
    for f, c in caches.items():
        dst = np.full((n, 512), np.nan)
        mla.gather_cache(c, dst, bt, cu)
        decoded[f] = dst
        tol = 0.5 if f == F.v41_fp4 else 2.0 ** -4
        np.testing.assert_allclose(dst[:, :448], kv, rtol=tol, atol=tol * 4)
    np.testing.assert_array_equal(decoded[F.v4][:, 448:], bf16_round(pe))  # v4's rope: bf16
    # V4.1: a v41 window cache + a v41_fp4 compressed cache in one softmax, against f64 copies.
    f64 = {f: mla.KVCache(np.ascontiguousarray(decoded[f].reshape(2, page, 512)), F.f64, d_qk=512)
           for f in (F.v41, F.v41_fp4)}
    T, h = 3, 4
    q = rng.standard_normal((T, h, 512))
    idx, eidx = rng.integers(-1, n, (T, 5)).astype(np.int32), rng.integers(-1, n, (T, 4)).astype(np.int32)
    sink = rng.standard_normal(h).astype(np.float32)

    def run(main, extra):
        out, lse = np.full((T, h, 512), np.nan), np.full((T, h), np.nan)
        mla.sparse_mqa(q, main, idx, None, out, lse, 512 ** -0.5, attn_sink=sink, extra_kv=extra,
                       extra_indices=eidx, values_include_rope=True, precision=REF)
        return out, lse

    got, want = run(caches[F.v41], caches[F.v41_fp4]), run(f64[F.v41], f64[F.v41_fp4])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match="DeepSeek-V4 records"):
        mla.mqa_decode(rng.standard_normal((1, 1, 2, 512)), caches[F.v41], bt, np.array([3], np.int32),
                       np.zeros((1, 1, 2, 448)), None, 0.1)
