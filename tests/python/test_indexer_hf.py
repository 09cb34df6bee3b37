# SPDX-License-Identifier: Apache-2.0
"""The lightning indexer against HuggingFace transformers' DeepseekV32Indexer (docs/INDEXER.md §7).

tests/fixtures/indexer/v32_indexer.npz (scripts/gen_indexer_fixture.py, generated on the GPU machine)
holds a small random indexer's parameters, its inputs, and transformers' index scores and top-k. mla
runs the same layer from the projections on: indexer_prepare (k_norm, rope, Hadamard, fp8 q),
indexer_write_k into a paged cache, then the logits and top-k by both paths (paged decode with
s_q = S causal rows; gather + prefill with ragged ranges). Checks:
  - logits: -inf exactly where transformers masks; elsewhere within the fp8 rule: |mla - hf| <= 6
    sigma of the e4m3 rounding of q and k (each code off by at most half an ulp, uniformly, given the
    codes mla chose) + 1e-5 of the magnitude sum (fp32 arithmetic on both sides);
  - top-k: the selected sets equal transformers' except positions whose transformers score lies within
    2 E of the row's k-th score, E the row's largest logit error (near-ties that fp8 may decide either
    way), and mla's selection is exactly the top-k of its own logits (tie rule of §3).
MLA_INDEXER_FIXTURE names another fixture (the device run checks a freshly generated one)."""
import json
import os

import numpy as np
import pytest

import mla
from conftest import e4m3_decode

FIX = os.environ.get("MLA_INDEXER_FIXTURE") or os.path.join(
    os.path.dirname(__file__), "..", "fixtures", "indexer", "v32_indexer.npz")
PAGE = 16

try:
    import torch
    DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and mla.cuda_device_count() > 0 else [])
except ImportError:
    torch = None
    DEVICES = ["cpu"]

def load():
    with np.load(FIX) as f:
        fx = {k: f[k] for k in f.files}
    fx["meta"] = json.loads(str(fx["meta"]))
    return fx


class Dev:
    """NumPy on the CPU (float64 inputs, the float64 reference precision); torch f32 on CUDA (fast)."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        self.precision = mla.Precision.fast if self.cuda else mla.Precision.reference

    def arr(self, a, dtype=None):
        a = np.ascontiguousarray(a if dtype is None else a.astype(dtype))
        if self.cuda:
            if a.dtype == np.float64:
                a = a.astype(np.float32)
            return torch.from_numpy(a).cuda()
        return a

    def zeros(self, shape, dtype):
        return self.arr(np.zeros(shape, dtype))

    def full(self, shape, value):
        return self.arr(np.full(shape, value, np.float32))

    @staticmethod
    def host(t):
        return t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t)


def run_mla(fx, dev):
    """mla's indexer on the fixture: (decode logits [T, S], decode top-k, prefill logits [T, T], prefill
    top-k, q codes, weights, the cache's codes and scales per token)."""
    B, S, _ = fx["hidden"].shape
    T, K = B * S, fx["topk"].shape[-1]
    x = fx["hidden"].reshape(T, -1).astype(np.float64)
    qr = fx["q_resid"].reshape(T, -1).astype(np.float64)
    q = (qr @ fx["wq_b"].astype(np.float64).T).reshape(T, -1, 128)  # the caller's GEMMs
    k = x @ fx["wk"].astype(np.float64).T
    wr = x @ fx["weights_proj"].astype(np.float64).T
    h = q.shape[1]
    q_codes, weights, k_out = dev.zeros((T, h, 128), np.uint8), dev.zeros((T, h), np.float32), dev.arr(k * 0)
    mla.indexer_prepare(dev.arr(q), dev.arr(k), dev.arr(wr), dev.arr(fx["positions"].reshape(T)),
                        dev.arr(fx["cos_sin"]), dev.arr(fx["k_norm_weight"]), dev.arr(fx["k_norm_bias"]),
                        q_codes, weights, k_out, precision=dev.precision)
    # Paged cache: request b's pages in a shuffled block table.
    per = -(-S // PAGE)
    table = np.random.default_rng(5).permutation(B * per).astype(np.int32).reshape(B, per)
    j = np.arange(S)
    slots = (table[:, j // PAGE] * PAGE + j % PAGE).reshape(T).astype(np.int64)
    cache = mla.allocate_indexer_cache(B * per, PAGE, "cuda" if dev.cuda else "cpu")
    mla.indexer_write_k(k_out, dev.arr(slots), cache)
    seq_lens = np.full(B, S, np.int32)
    dec = dev.full((T, S), np.nan)
    mla.indexer_logits_decode(q_codes, weights, cache, dev.arr(table), dev.arr(seq_lens), S, dec,
                              precision=dev.precision)
    dec_top = dev.zeros((T, K), np.int32)
    mla.indexer_topk_decode(dec, dev.arr(seq_lens), S, dec_top)
    gk, gs = dev.zeros((T, 128), np.uint8), dev.full((T,), np.nan)
    mla.indexer_gather_k(cache, gk, gs, dev.arr(table), dev.arr(np.array([0, S, 2 * S][:B + 1], np.int32)))
    starts = np.repeat(np.arange(B) * S, S).astype(np.int32)
    ends = (starts + np.tile(j + 1, B)).astype(np.int32)
    pre = dev.full((T, T), np.nan)
    mla.indexer_logits_prefill(q_codes, weights, gk, gs, dev.arr(starts), dev.arr(ends), pre,
                               precision=dev.precision)
    pre_top = dev.zeros((T, K), np.int32)
    mla.indexer_topk(pre, dev.arr(starts), dev.arr(ends), pre_top)
    H = dev.host
    return H(dec), H(dec_top), H(pre), H(pre_top), H(q_codes), H(weights), H(gk), H(gs)


def fp8_tolerance(q_codes, weights, k_codes, k_scale, S):
    """Per (row, key of the same request) 6 sigma of the logit's e4m3 rounding error + 1e-5 of the
    magnitude sum. A code c stands for a value within half an ulp: max(2^-4 |c|, 2^-10) (normal /
    subnormal e4m3), uniformly: sigma = that / sqrt(3). q's scale is folded into weights (§2b)."""
    qc = e4m3_decode(q_codes)  # [T, h, 128]
    kc = e4m3_decode(k_codes) * k_scale.astype(np.float64)[:, None]  # [T, 128] values
    sq = np.maximum(2.0 ** -4 * np.abs(qc), 2.0 ** -10) / np.sqrt(3)
    sk = np.maximum(2.0 ** -4 * np.abs(e4m3_decode(k_codes)), 2.0 ** -10) / np.sqrt(3) * np.abs(k_scale)[:, None]
    w = weights.astype(np.float64)
    T = qc.shape[0]
    tol = np.zeros((T, S))
    for r0 in range(0, T, S):  # one request: its rows against its keys
        rows, keys = slice(r0, r0 + S), slice(r0, r0 + S)
        var = (np.einsum("thd,jd->thj", sq[rows] ** 2, kc[keys] ** 2)
               + np.einsum("thd,jd->thj", qc[rows] ** 2, sk[keys] ** 2))
        mag = np.einsum("thd,jd->thj", np.abs(qc[rows]), np.abs(kc[keys]))
        tol[rows] = (6 * np.sqrt(np.einsum("th,thj->tj", w[rows] ** 2, var))
                     + 1e-5 * np.einsum("th,thj->tj", np.abs(w[rows]), mag))
    return tol


def exact_topk(row, n, k):
    """Top-k of row[:n] by value, ties to the lower position, ascending, -1 padded (§3)."""
    sel = sorted(sorted(range(n), key=lambda p: (-row[p], p))[:k])
    return sel + [-1] * (k - len(sel))


def check_against_hf(fx, logits, top, tol, what):
    B, S, K = fx["topk"].shape
    hf = fx["scores"].reshape(B * S, S).astype(np.float64)
    hf_top = fx["topk"].reshape(B * S, K)
    got = logits.astype(np.float64)
    fin = np.isfinite(hf)
    assert np.array_equal(np.isfinite(got), fin), f"{what}: -inf where transformers masks"
    assert np.all(got[~fin] == -np.inf), what
    err = np.zeros_like(hf)
    err[fin] = np.abs(got[fin] - hf[fin])
    bad = np.argwhere(err > tol)
    assert bad.size == 0, (f"{what}: {len(bad)} logits outside the fp8 rule, first {bad[0]}: mla "
                           f"{got[tuple(bad[0])]} transformers {hf[tuple(bad[0])]} tol {tol[tuple(bad[0])]}")
    near = 0
    for t in range(B * S):
        n = t % S + 1
        row = got[t, :n]
        assert list(top[t]) == exact_topk(row, n, K), f"{what} row {t}: not the top-k of mla's own logits"
        mine = {p for p in top[t] if p >= 0}
        theirs = {int(p) for p in hf_top[t] if p < n and np.isfinite(hf[t, p])}
        if n <= K:
            assert mine == set(range(n)) == theirs, f"{what} row {t}"
            continue
        kth = np.sort(hf[t, :n])[::-1][K - 1]
        e_row = err[t, :n].max()
        for p in mine ^ theirs:
            assert abs(hf[t, p] - kth) <= 2 * e_row, (
                f"{what} row {t}: position {p} (transformers {hf[t, p]}, k-th {kth}, row error {e_row}) "
                f"selected by {'mla' if p in mine else 'transformers'} only")
        near += len(mine ^ theirs) // 2
    x, y = got[fin], hf[fin]
    diff = 1 - 2 * (x * y).sum() / (x * x + y * y).sum()
    print(f"{what}: max |err| / tol {np.max(err / np.maximum(tol, 1e-300)):.3f}, calc_diff {diff:.2e}, "
          f"near-tie swaps {near}")
    return diff


@pytest.mark.parametrize("device", DEVICES)
def test_indexer_matches_transformers(device):
    fx = load()
    B, S, K = fx["topk"].shape
    assert fx["meta"]["masks_equal"] and fx["meta"]["own_vs_hf_max_abs_rel"] < 1e-5, fx["meta"]
    dec, dec_top, pre, pre_top, q_codes, weights, gk, gs = run_mla(fx, Dev(device))
    tol = fp8_tolerance(q_codes, weights, gk, gs, S)
    d1 = check_against_hf(fx, dec, dec_top, tol, f"decode ({device})")
    # The prefill logits are request-local columns of the [T, T] matrix.
    pre_local = np.stack([pre[t, (t // S) * S:(t // S + 1) * S] for t in range(B * S)])
    outside = np.ones_like(pre, bool)
    for t in range(B * S):
        outside[t, (t // S) * S:(t // S + 1) * S] = False
    assert np.all(pre[outside] == -np.inf), "prefill: columns of other requests are -inf"
    d2 = check_against_hf(fx, pre_local, pre_top, tol, f"prefill ({device})")
    assert max(d1, d2) < 1e-3  # DeepGEMM's fp8 MQA logits test bound
