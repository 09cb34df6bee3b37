# SPDX-License-Identifier: Apache-2.0
"""The lightning indexer (mla/indexer.h) from Python against float64 NumPy references: the K cache
writer (ue8m0 / amax scales, SoA bytes per block), the prefill gather, the fp8 MQA logits (prefill and
paged decode), the top-k per row (tie and NaN rules); bad input raises ValueError and writes nothing."""
import numpy as np
import pytest

import mla
from conftest import E4M3, e4m3_decode, e4m3_encode

D = 128


def ue8m0(amax):
    return 2.0 ** np.ceil(np.log2(np.maximum(amax, 1e-4) / 448.0))


def cache_bytes(cache):
    """(codes [slots, 128] u8, scales [slots] f32) of a CPU indexer cache (SoA per block)."""
    raw = np.from_dlpack(cache.data) if not isinstance(cache.data, mla.Tensor) else cache.data.numpy()
    nb, page = raw.shape[:2]
    blocks = raw.reshape(nb, page * 132)
    codes = blocks[:, :page * D].reshape(nb * page, D)
    scales = blocks[:, page * D:].copy().view(np.float32).reshape(nb * page)
    return codes, scales


def written_cache(rng, nb=3, page=8, scale=mla.IndexerScale.ue8m0):
    cache = mla.allocate_indexer_cache(nb, page)
    k = (rng.standard_normal((nb * page, D)) * rng.uniform(0.01, 30, (nb * page, 1))).astype(np.float32)
    mla.indexer_write_k(k, np.arange(nb * page), cache, scale)
    return cache, k


@pytest.mark.parametrize("scale", [mla.IndexerScale.ue8m0, mla.IndexerScale.amax])
def test_write_k_bytes(rng, scale):
    cache = mla.allocate_indexer_cache(3, 8)
    raw = cache.data.numpy()
    raw[:] = 0xAB
    k = (rng.standard_normal((5, D)) * 3).astype(np.float32)
    k[2] = 0  # amax 0: the 1e-4 floor
    slots = np.array([9, 0, -1, 23, 4])
    mla.indexer_write_k(k, slots, cache, scale)
    codes, scales = cache_bytes(cache)
    amax = np.abs(k.astype(np.float64)).max(axis=1)
    want = ue8m0(amax) if scale == mla.IndexerScale.ue8m0 else np.maximum(amax, 1e-4) / 448.0
    for t, s in enumerate(slots):
        if s < 0:
            continue
        sc = np.float32(want[t])
        assert scales[s] == sc
        np.testing.assert_array_equal(codes[s], e4m3_encode(k[t] / np.float64(sc)))
    untouched = np.setdiff1d(np.arange(24), slots[slots >= 0])
    assert (codes[untouched] == 0xAB).all()


def test_gather_k(rng):
    cache, _ = written_cache(rng)
    codes, scales = cache_bytes(cache)
    table = np.array([[2, 0, 1], [1, 2, 0]], dtype=np.int32)
    cu = np.array([0, 11, 14], dtype=np.int32)
    dst_k = np.full((16, D), 0x11, np.uint8)
    dst_s = np.full(16, -1.0, np.float32)
    mla.indexer_gather_k(cache, dst_k, dst_s, table, cu)
    for b in range(2):
        for i in range(cu[b + 1] - cu[b]):
            slot = table[b, i // 8] * 8 + i % 8
            np.testing.assert_array_equal(dst_k[cu[b] + i], codes[slot])
            assert dst_s[cu[b] + i] == scales[slot]
    assert (dst_k[14:] == 0x11).all() and (dst_s[14:] == -1).all()


def finite_codes(rng, shape):
    c = rng.integers(0, 256, shape).astype(np.uint8)
    return np.where((c & 0x7F) == 0x7F, c ^ 1, c).astype(np.uint8)  # no NaN codes


def logits_ref(q, w, k, ks, visible):
    """sum_h w[t, h] relu((q[t, h] . k[j]) * ks[j]), -inf where not visible; float64."""
    dots = np.einsum("thd,jd->thj", e4m3_decode(q), e4m3_decode(k)) * ks.astype(np.float64)[None, None, :]
    out = np.einsum("th,thj->tj", w.astype(np.float64), np.maximum(dots, 0.0))
    return np.where(visible, out, -np.inf)


@pytest.mark.parametrize("precision", [mla.Precision.reference, mla.Precision.fast])
def test_logits_prefill(rng, precision):
    T, h, Tk = 6, 5, 37
    q, k = finite_codes(rng, (T, h, D)), finite_codes(rng, (Tk, D))
    w = rng.standard_normal((T, h)).astype(np.float32)
    ks = rng.uniform(0.001, 0.01, Tk).astype(np.float32)
    starts = np.array([0, 3, 10, 0, 36, 20], dtype=np.int32)
    ends = np.array([37, 9, 10, 1, 37, 30], dtype=np.int32)
    logits = np.full((T, Tk), np.nan, np.float32)
    mla.indexer_logits_prefill(q, w, k, ks, starts, ends, logits, precision=precision)
    j = np.arange(Tk)
    ref = logits_ref(q, w, k, ks, (j >= starts[:, None]) & (j < ends[:, None]))
    tol = 1e-6 if precision == mla.Precision.reference else 1e-4
    np.testing.assert_allclose(logits, ref, rtol=tol, atol=tol * np.abs(ref[np.isfinite(ref)]).max())


def test_logits_decode(rng):
    cache, _ = written_cache(rng, nb=4, page=8)
    codes, scales = cache_bytes(cache)
    b, s_q, h, N = 2, 2, 3, 24
    table = np.array([[3, 1, 0], [2, 0, 1]], dtype=np.int32)
    lens = np.array([19, 2], dtype=np.int32)
    q = finite_codes(rng, (b * s_q, h, D))
    w = rng.standard_normal((b * s_q, h)).astype(np.float32)
    logits = np.full((b * s_q, N), np.nan, np.float32)
    mla.indexer_logits_decode(q, w, cache, table, lens, s_q, logits, precision=mla.Precision.reference)
    for t in range(b * s_q):
        r, i = divmod(t, s_q)
        n = lens[r] - s_q + i + 1
        pos = np.arange(N)
        slots = table[r][np.minimum(pos // 8, 2)] * 8 + pos % 8
        ref = logits_ref(q[t:t + 1], w[t:t + 1], codes[slots], scales[slots], (pos < n)[None, :])[0]
        np.testing.assert_allclose(logits[t], ref, rtol=1e-6, atol=1e-9)


def topk_ref(row, k):
    """Positions of the k largest (NaN below everything, ties: lower position), ascending, -1 padded."""
    order = sorted(range(len(row)), key=lambda p: (np.isnan(row[p]), -row[p] if not np.isnan(row[p]) else 0, p))
    sel = sorted(order[:k])
    return sel + [-1] * (k - len(sel))


def test_topk_rows_and_decode(rng):
    T, N, k = 5, 40, 6
    logits = rng.standard_normal((T, N)).astype(np.float32)
    logits[0, [3, 7, 9, 30]] = 2.5  # ties
    logits[1, :] = -np.inf
    logits[1, [4, 5]] = np.nan
    logits[2, 10:14] = np.nan
    starts = np.array([0, 2, 5, 9, 0], dtype=np.int32)
    ends = np.array([40, 10, 14, 12, 0], dtype=np.int32)
    out = np.full((T, k), 99, np.int32)
    mla.indexer_topk(logits, starts, ends, out)
    for t in range(T):
        assert list(out[t]) == topk_ref(logits[t, starts[t]:ends[t]], k), t
    out2 = np.full((T, k), 99, np.int32)
    mla.indexer_topk(logits, None, ends, out2)
    for t in range(T):
        assert list(out2[t]) == topk_ref(logits[t, :ends[t]], k), t
    s_q, lens = 2, np.array([9, 33], dtype=np.int32)
    out3 = np.full((4, k), 99, np.int32)
    mla.indexer_topk_decode(logits[:4], lens, s_q, out3)
    for t in range(4):
        end = lens[t // s_q] - s_q + t % s_q + 1
        assert list(out3[t]) == topk_ref(logits[t, :end], k), t


def test_bad_input_writes_nothing(rng):
    cache, _ = written_cache(rng)
    before = cache.data.numpy().copy()
    with pytest.raises(ValueError, match="indexer_write_k"):
        mla.indexer_write_k(np.zeros((2, 64), np.float32), np.array([0, 1]), cache)  # 64 != 128 columns
    with pytest.raises(ValueError):
        mla.indexer_write_k(np.zeros((2, D), np.float32), np.array([0, 999]), cache)  # slot past the cache
    assert (cache.data.numpy() == before).all()
    out = np.full((2, 3), 7, np.int32)
    with pytest.raises(ValueError):
        mla.indexer_topk(np.zeros((2, 5), np.float32), None, np.array([6, 1], dtype=np.int32), out)  # end past N
    assert (out == 7).all()
    with pytest.raises(TypeError):
        mla.indexer_write_k("not a tensor", np.array([0]), cache)
    assert E4M3[0x7E] == 448.0


def test_prepare_rejects_position_past_table(rng):
    """indexer_prepare (the end-to-end check is test_indexer_hf.py): a position outside the rope table
    raises with the library's message and no output is written."""
    T, h = 3, 4
    q, k, wr = rng.standard_normal((T, h, D)), rng.standard_normal((T, D)), rng.standard_normal((T, h))
    cs, kw, kb = np.ones((8, 64), np.float32), np.ones(D, np.float32), np.zeros(D, np.float32)
    codes, w, k_out = np.full((T, h, D), 5, np.uint8), np.full((T, h), 7.0, np.float32), np.full((T, D), 9.0)
    with pytest.raises(ValueError, match="indexer_prepare"):
        mla.indexer_prepare(q, k, wr, np.array([0, 8, 1]), cs, kw, kb, codes, w, k_out)
    assert (codes == 5).all() and (w == 7).all() and (k_out == 9).all()
    mla.indexer_prepare(q, k, wr, np.array([0, 7, 1]), cs, kw, kb, codes, w, k_out)
    assert np.isfinite(w).all() and not (codes == 5).all()
