# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the Python tests: seeded inputs, float64 NumPy decoders of the cache formats and
the references every op is checked against (independent of the library: plain NumPy)."""
import numpy as np
import pytest

import mla

L, R = 512, 64
D_QK, D_V = L + R, L


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def bf16_round(x):
    """Round to the nearest bf16 (ties to even), returned as float64."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return bf16_decode(b.astype(np.uint16))


def bf16_decode(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _e4m3_table():
    t = np.empty(256, np.float64)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        t[c] = -v if s else v
    t[0x7F] = t[0xFF] = np.nan
    return t


E4M3 = _e4m3_table()


def e4m3_decode(codes):
    return E4M3[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(x):
    """Round to the nearest e4m3fn code, ties to the even code, saturating at +-448 (satfinite)."""
    x = np.clip(np.asarray(x, np.float64), -448.0, 448.0)
    pos = E4M3[:0x7F]  # 0 .. 448, increasing
    a = np.abs(x)
    hi = np.clip(np.searchsorted(pos, a), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)  # -tiny -> -0 (0x80)


def cache_rows(cache):
    """Dequantised [num_slots, 576] float64 rows of a CPU cache (any format)."""
    data = np.from_dlpack(cache.data) if not isinstance(cache.data, mla.Tensor) else cache.data.numpy()
    n = cache.num_slots
    if cache.format == mla.CacheFormat.bf16:
        return bf16_decode(data.reshape(n, -1).view(np.uint16) if data.dtype != np.uint16 else data.reshape(n, -1))
    raw = data.reshape(n, -1).view(np.uint8)
    if cache.format == mla.CacheFormat.fp8:
        return e4m3_decode(raw) * np.float64(np.float32(cache.scale))
    scales = raw[:, 512:528].copy().view(np.float32).astype(np.float64)  # [n, 4]
    lat = e4m3_decode(raw[:, :512]) * np.repeat(scales, 128, axis=1)
    rope = bf16_decode(raw[:, 528:656].copy().view(np.uint16))
    return np.concatenate([lat, rope], axis=1)


def attention(q, k, v, scale, mask=None):
    """Float64 softmax(q k^T * scale) v per head. q [h, n, d], k [m, d] or [h, m, d], v likewise.
    Returns out [h, n, dv] and lse [h, n] (-inf, out 0 for an empty key set)."""
    k = np.broadcast_to(k, (q.shape[0],) + k.shape[-2:])
    v = np.broadcast_to(v, (q.shape[0],) + v.shape[-2:])
    s = np.einsum("hnd,hmd->hnm", q, k) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True, initial=-np.inf)
    empty = ~np.isfinite(mx)
    mx = np.where(empty, 0.0, mx)
    p = np.exp(s - mx)
    den = p.sum(axis=-1, keepdims=True)
    out = np.einsum("hnm,hmv->hnv", p, v) / np.where(den == 0, 1, den)
    lse = np.where(empty[..., 0], -np.inf, np.log(np.where(den == 0, 1, den))[..., 0] + mx[..., 0])
    return np.where(empty, 0.0, out), lse


def bf16_cache_with(rng, num_blocks, page, fill_nan=True):
    """A bf16 cache whose rows hold seeded bf16-exact values (NaN where fill_nan says unused)."""
    c = mla.allocate_cache(mla.CacheFormat.bf16, num_blocks, page)
    rows = bf16_round(rng.standard_normal((num_blocks * page, D_QK)))
    kv = rows[:, :L].copy()
    pe = rows[:, L:].copy()
    mla.write_cache(kv, pe, np.arange(num_blocks * page), c)
    return c, rows
