#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A script written against FlashMLA's Python API (deepseek-ai/FlashMLA, flash_mla/flash_mla_interface.py)
that runs on mla unchanged: the import line is the only difference (`import flash_mla` there).

It calls the API the way FlashMLA's own tests do and checks every result against a float64 torch
reference it computes itself, with the tolerances of FlashMLA's tests (kernelkit's check_is_allclose:
an element passes within abs_tol or rel_tol, the tensor within a cosine difference, and infinities /
NaNs must sit at the same places):

  dense decode    get_mla_metadata() -> flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
                  head_dim_v, sched_meta, num_splits, causal=...) over a bf16 cache of 64-token pages:
                  varlen and zero-length requests, unused block-table entries holding 2147480000 and
                  NaN in every cache row past a request's length (tests/test_flash_mla_dense_decoding.py)
  sparse decode   indices=, is_fp8_kvcache=True over the 656-byte "FP8 with scale" cache (tests/quant.py:
                  power-of-two tile scales, blocks one page apart in a larger allocation), attn_sink with
                  +-inf entries, topk_length, extra_k_cache / extra_indices_in_kvcache, -1 indices, NaN in
                  every row no index selects, non-contiguous q / indices (tests/test_flash_mla_sparse_decoding.py)
  sparse prefill  flash_mla_sparse_fwd(q, kv, indices, sm_scale=, attn_sink=, topk_length=) with
                  out-of-range indices of every kind FlashMLA's tests use (tests/test_flash_mla_sparse_prefill.py)
  dense fp8       is_fp8_kvcache=True without indices: the 656-byte cache in dense decode (an mla
                  extension; FlashMLA's sm90 dense decode takes bf16 / fp16 caches only: --flashmla-only skips it)

One documented difference is tolerated by the checks: for a query with no key FlashMLA reports
lse = +inf and mla lse = -inf (both give out = 0 and merge alike), so an infinite lse matches either sign.

Usage: PYTHONPATH=build/python python3 examples/flash_mla_api_script.py [--device cuda|cpu] [--quick]
Exit status 0 when every case matches, 1 otherwise. Needs torch (>= 1.13); on the CPU it runs smaller sizes.
"""
import argparse
import math
import random
import sys
import time

import torch

import mla.compat.flash_mla as flash_mla  # FlashMLA: import flash_mla

D_QK, D_V = 576, 512
INVALID_PREFILL = [-2147483648, -123456, -1, None, 114514, 1919810, 2147480000, 2147483647]  # None: s_kv


def cdiv(a, b):
    return (a + b - 1) // b


def non_contiguous(t):
    """The same values in a strided view (each dim padded by 1, the last by 128), as FlashMLA's tests use."""
    shape = list(t.shape)
    big = torch.zeros([d + 1 for d in shape[:-1]] + [shape[-1] + 128], dtype=t.dtype, device=t.device)
    v = big[tuple(slice(0, d) for d in shape)]
    v.copy_(t)
    return v


# ---- the "FP8 with scale" cache (656 bytes per token), written and read here without the library ----

def _e4m3_values():
    v = torch.empty(256, dtype=torch.float64)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        x = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[c] = -x if s else x
    v[0x7F] = v[0xFF] = math.nan
    return v


E4M3 = _e4m3_values()


def e4m3_codes(x):
    """float tensor (|x| <= 448 or NaN) -> uint8 e4m3fn codes, round to nearest even."""
    if hasattr(torch, "float8_e4m3fn"):
        return x.float().to(torch.float8_e4m3fn).view(torch.uint8)
    pos = E4M3[:0x7F].to(x.device)  # codes 0x00..0x7E: 0 .. 448, increasing
    a = x.double().abs().clamp(max=448.0).contiguous()
    hi = torch.searchsorted(pos, a).clamp(max=0x7E)
    lo = (hi - 1).clamp(min=0)
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = torch.where(dlo < dhi, lo, torch.where(dhi < dlo, hi, torch.where(lo % 2 == 0, lo, hi)))
    code = code | (torch.signbit(x).long() << 7)
    return torch.where(torch.isnan(x), torch.full_like(code, 0x7F), code).to(torch.uint8)


def quantize_k_cache(k):
    """[blocks, page, 1, 576] bf16 -> [blocks, page, 1, 656] uint8 (512 e4m3 | 4 fp32 scales | 64 bf16 rope);
    scale of each 128-wide tile 2^ceil(log2(max(amax / 448, 1e-4))); blocks page + 1 rows apart."""
    nb, page = k.shape[:2]
    k = k.squeeze(2)
    res = torch.zeros(nb, page + 1, 656, dtype=torch.uint8, device=k.device)[:, :page]
    scales = torch.empty(nb, page, 4, dtype=torch.float32, device=k.device)
    for t in range(4):
        tile = k[..., t * 128:(t + 1) * 128].float()
        s = torch.pow(2.0, (tile.abs().amax(dim=-1) / 448.0).clamp_min(1e-4).log2().ceil())
        scales[..., t] = s
        res[..., t * 128:(t + 1) * 128] = e4m3_codes(tile / s.unsqueeze(-1))
    res[..., 512:528] = scales.view(torch.uint8)
    res[..., 528:] = k[..., 512:].contiguous().view(torch.uint8)
    return res.unsqueeze(2)


def dequantize_k_cache(q):
    """[blocks, page, 1, 656] uint8 -> [blocks, page, 1, 576] float64."""
    q = q.squeeze(2)
    scales = q[..., 512:528].contiguous().view(torch.float32).double()
    nope = E4M3.to(q.device)[q[..., :512].long()] * scales.repeat_interleave(128, dim=-1)
    rope = q[..., 528:].contiguous().view(torch.bfloat16).double()
    return torch.cat([nope, rope], dim=-1).unsqueeze(2)


def randn_on(dev, seed, *shape):
    """Seeded normal samples drawn on the device itself (the large caches)."""
    return torch.randn(*shape, generator=torch.Generator(device=dev).manual_seed(seed), device=dev)


# ---- the check of FlashMLA's tests (kernelkit.check_is_allclose) ----

def check_close(name, ans, ref, abs_tol, rel_tol, cos_diff_tol=None, either_inf=False):
    assert ans.shape == ref.shape, f"{name}: shape {tuple(ans.shape)} vs {tuple(ref.shape)}"
    ans, ref = ans.double().clone(), ref.double().clone()
    if either_inf:  # a query with no key: lse +inf (FlashMLA) or -inf (mla)
        ans[torch.isinf(ans)] = math.inf
        ref[torch.isinf(ref)] = math.inf
    for val in (math.inf, -math.inf, math.nan):
        a_mask = torch.isnan(ans) if math.isnan(val) else ans == val
        r_mask = torch.isnan(ref) if math.isnan(val) else ref == val
        if not torch.equal(a_mask, r_mask):
            print(f"  {name}: {val} at {int(a_mask.sum())} places, reference {int(r_mask.sum())}")
            return False
        ans[a_mask], ref[r_mask] = 0.0, 0.0
    err = (ans - ref).abs()
    rel = err / (ref.abs() + 1e-6)
    ok = (err < abs_tol) | (rel < rel_tol)
    if not bool(ok.all()):
        i = int(torch.argmax(torch.where(ok, torch.zeros_like(err), err)))
        print(f"  {name}: {int((~ok).sum())} of {ok.numel()} off; worst {ans.flatten()[i].item():.6g} vs "
              f"{ref.flatten()[i].item():.6g}")
        return False
    if cos_diff_tol is not None and float((ref * ref).sum()) >= 1e-12:
        cos_diff = 1 - 2 * float((ans * ref).sum()) / float((ans * ans + ref * ref).sum())
        if abs(cos_diff) > cos_diff_tol:
            print(f"  {name}: cosine difference {cos_diff:.3g} > {cos_diff_tol}")
            return False
    return True


def randperm_rows(rows, ranges, k, paddings, g):
    """[rows, k] int32: distinct values in [0, ranges[r]) per row, as many as fit, the rest from paddings."""
    width = max(int(ranges.max()), k)
    rand = torch.rand(rows, width, generator=g)
    rand[torch.arange(width).view(1, -1) >= ranges.view(-1, 1)] = -math.inf
    res = rand.topk(k, dim=-1).indices.to(torch.int32)
    pad = torch.tensor(paddings, dtype=torch.int32)[torch.randint(0, len(paddings), (rows, k), generator=g)]
    return torch.where(res >= ranges.view(-1, 1), pad, res)


def lens_and_table(g, b, s_q, s_k, varlen, zero_seqlen, page, align):
    """cache_seqlens [b] (varlen: normal around s_k, at least s_q; some 0 with zero_seqlen) and a block table
    [b, max_blocks] int32 of randomly permuted blocks, max_blocks * page a multiple of align."""
    seqlens = torch.full((b,), s_k, dtype=torch.int32)
    if varlen:
        for i in range(b):
            seqlens[i] = max(int(random.normalvariate(s_k, s_k / 2)), s_q)
    if zero_seqlen:
        seqlens[torch.randn(b, generator=g) > 0] = 0
    max_pad = max(cdiv(int(seqlens.max()), align), 1) * align
    table = torch.arange(b * max_pad // page, dtype=torch.int32)
    return seqlens, table[torch.randperm(table.numel(), generator=g)].view(b, -1)


# ---- dense decode ----

def dense_case(dev, b, s_q, s_k, h_q, varlen, causal, zero_seqlen=False, fp8=False, seed=0, page=64):
    random.seed(seed)
    g = torch.Generator().manual_seed(seed)
    seqlens, table = lens_and_table(g, b, s_q, s_k, varlen, zero_seqlen, page, 256)
    q = (torch.randn(b, s_q, h_q, D_QK, generator=g) / 10).clamp(-1, 1).bfloat16()
    k = (randn_on(dev, seed, table.numel(), page, 1, D_QK) / 10).clamp(-1, 1).bfloat16()
    for i in range(b):
        n = int(seqlens[i])
        used = cdiv(n, page)
        k[table[i, used:].long().to(dev)] = math.nan
        if n % page:
            k[int(table[i, used - 1]), n % page:] = math.nan
        table[i, used:] = 2147480000
    q, table, seqlens = q.to(dev), table.to(dev), seqlens.to(dev)
    k_in = quantize_k_cache(k) if fp8 else k
    rows = dequantize_k_cache(k_in) if fp8 else k.double()

    sched_meta, num_splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_in, table, seqlens, D_V, sched_meta, num_splits,
                                                causal=causal, is_fp8_kvcache=fp8)
    again, _ = flash_mla.flash_mla_with_kvcache(q, k_in, table, seqlens, D_V, sched_meta, num_splits,
                                                causal=causal, is_fp8_kvcache=fp8)  # the same sched_meta reused

    out_ref = torch.empty(b, s_q, h_q, D_V, dtype=torch.float64, device=dev)
    lse_ref = torch.empty(b, h_q, s_q, dtype=torch.float64, device=dev)
    scale = D_QK ** -0.5
    for i in range(b):
        n = int(seqlens[i])
        kv = rows[table[i, :cdiv(n, page)].long()].view(-1, D_QK)[:n]  # [n, 576]
        kv = torch.nan_to_num(kv, nan=0.0)
        s = q[i].double() @ kv.t() * scale  # [s_q, h_q, n]
        if causal:
            vis = torch.arange(n, device=dev).view(1, -1) <= (n - s_q + torch.arange(s_q, device=dev)).view(-1, 1)
            s = s.masked_fill(~vis.unsqueeze(1), -math.inf)
        l = torch.logsumexp(s, dim=-1) if n else torch.full(s.shape[:2], -math.inf, dtype=torch.float64, device=dev)
        p = torch.exp(s - torch.where(torch.isinf(l), torch.zeros_like(l), l).unsqueeze(-1))
        out_ref[i] = p @ kv[:, :D_V]
        lse_ref[i] = torch.where(torch.isinf(l), torch.full_like(l, math.inf), l).t()  # no key: +inf
    ok = out.dtype == torch.bfloat16 and tuple(out.shape) == (b, s_q, h_q, D_V) and lse.dtype == torch.float32
    ok = ok and check_close("out", out, out_ref.bfloat16(), 8e-4, 2.01 / 128, 5e-6)
    ok = ok and check_close("lse", lse, lse_ref, 1e-6, 8.01 / 65536, either_inf=True)
    return ok and torch.equal(out, again)


# ---- sparse decode (fp8 cache) ----

def kv_scope(dev, g, b, s_q, s_k, topk, page, varlen, zero_seqlen, all_invalid, with_topk_length):
    seqlens, table = lens_and_table(g, b, s_q, s_k, varlen, zero_seqlen, page, 4 * page)
    k = (randn_on(dev, int(torch.randint(0, 1 << 30, (1,), generator=g)), table.numel(), page, 1, D_QK) / 10)
    k = k.clamp(-1, 1).bfloat16()
    if all_invalid:
        pos = torch.full((b, s_q, topk), -1, dtype=torch.int32)
    else:
        pos = randperm_rows(b * s_q, seqlens.repeat_interleave(s_q), topk, [-1], g).view(b, s_q, topk)
    blk = table.gather(1, (pos.clamp_min(0) // page).view(b, -1).long()).view(b, s_q, topk)
    idx = torch.where(pos >= 0, blk * page + pos % page, torch.full_like(pos, -1))
    length = torch.randint(0, topk + 1, (b,), dtype=torch.int32, generator=g) if with_topk_length else None
    used = idx if length is None else idx.masked_fill(torch.arange(topk).view(1, 1, -1) >= length.view(b, 1, 1), -1)
    unused = torch.ones(k.shape[0] * page, dtype=torch.bool)
    unused[used[used >= 0].long()] = False
    k.view(-1, D_QK)[unused.to(dev)] = math.nan  # rows no (counted) index selects are never read
    cache = quantize_k_cache(k)
    return dict(cache=cache, rows=dequantize_k_cache(cache).view(-1, D_QK), idx=non_contiguous(idx.to(dev)),
                length=None if length is None else length.to(dev))


def sparse_decode_case(dev, b, s_q, h_q, s_k, topk, page, extra=None, with_topk_length=False, sink=True,
                       varlen=True, zero_seqlen=False, all_invalid=False, seed=0):
    random.seed(seed)
    g = torch.Generator().manual_seed(seed)
    q = non_contiguous(torch.randn(b, s_q, h_q, D_QK, generator=g).clamp(-1, 1).bfloat16().to(dev))
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=g)
        m = torch.randn(h_q, generator=g)
        attn_sink[m > 0.5], attn_sink[m < -0.5] = math.inf, -math.inf
        attn_sink = attn_sink.to(dev)
    scopes = [kv_scope(dev, g, b, s_q, s_k, topk, page, varlen, zero_seqlen, all_invalid, with_topk_length)]
    if extra is not None:  # (s_k, topk, page) of the extra key set
        scopes.append(kv_scope(dev, g, b, s_q, extra[0], extra[1], extra[2], varlen, zero_seqlen, all_invalid,
                               with_topk_length))
    sm_scale = D_QK ** -0.55
    x = scopes[1] if extra is not None else dict(cache=None, idx=None, length=None)

    sched_meta, num_splits = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, scopes[0]["cache"], None, None, D_V, sched_meta, num_splits,
        sm_scale, False, True,
        scopes[0]["idx"], attn_sink, x["cache"], x["idx"], scopes[0]["length"], x["length"])

    ks, valid = [], []
    for sc in scopes:
        idx = sc["idx"].long()
        v = idx >= 0
        if sc["length"] is not None:
            v &= torch.arange(idx.size(-1), device=dev).view(1, 1, -1) < sc["length"].view(-1, 1, 1).long()
        ks.append(sc["rows"][idx.clamp_min(0)])  # [b, s_q, topk, 576]
        valid.append(v)
    kv = torch.nan_to_num(torch.cat(ks, dim=2), nan=0.0).view(b * s_q, -1, D_QK)
    valid = torch.cat(valid, dim=2).view(b * s_q, 1, -1)
    s = (q.double().reshape(b * s_q, h_q, D_QK) @ kv.transpose(1, 2)) * sm_scale
    s = s.masked_fill(~valid, -math.inf)
    l = torch.logsumexp(s, dim=-1)  # [b * s_q, h_q]
    o = torch.exp(s - torch.where(torch.isinf(l), torch.zeros_like(l), l).unsqueeze(-1)) @ kv[..., :D_V]
    if attn_sink is not None:
        o = o / (1 + torch.exp(attn_sink.double().view(1, -1) - l)).unsqueeze(-1)
    o[torch.isinf(l)] = 0.0
    lse_ref = torch.where(torch.isinf(l), torch.full_like(l, math.inf), l).view(b, s_q, h_q).transpose(1, 2)
    ok = tuple(out.shape) == (b, s_q, h_q, D_V) and tuple(lse.shape) == (b, h_q, s_q)
    ok = ok and check_close("out", out, o.view(b, s_q, h_q, D_V).bfloat16(), 1e-3, 2.01 / 128, 5e-6)
    return ok and check_close("lse", lse, lse_ref, 1e-6, 8.01 / 65536, either_inf=True)


# ---- sparse prefill ----

def sparse_prefill_case(dev, s_q, s_kv, topk, h_q, sink=False, with_topk_length=False, all_invalid=False, seed=0):
    random.seed(seed)
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(s_q, h_q, D_QK, generator=g) / 10 + (random.random() - 0.5) / 10).bfloat16().clamp(-10, 10)
    kv = (torch.randn(s_kv, 1, D_QK, generator=g) / 10 + (random.random() - 0.5) / 10).bfloat16().clamp(-10, 10)
    pads = [s_kv if p is None else p for p in INVALID_PREFILL]
    idx = randperm_rows(s_q, torch.full((s_q,), s_kv, dtype=torch.int32), topk, pads, g)
    if all_invalid:
        idx[torch.randn(s_q, generator=g) < -2] = random.choice(pads)
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=g)
        m = torch.randn(h_q, generator=g)
        attn_sink[m < -0.5], attn_sink[m > 0.5] = -math.inf, math.inf
        attn_sink = attn_sink.to(dev)
    length = None
    if with_topk_length:
        length = torch.randint(0, max(topk + 1, 64), (s_q,), dtype=torch.int32, generator=g).clamp_max(topk).to(dev)
    q, kv, idx = non_contiguous(q.to(dev)), non_contiguous(kv.to(dev)), non_contiguous(idx.view(s_q, 1, topk).to(dev))
    sm_scale = 0.5

    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, idx, sm_scale=sm_scale, attn_sink=attn_sink,
                                                          topk_length=length)

    i = idx.squeeze(1).long()
    valid = (i >= 0) & (i < s_kv)
    if length is not None:
        valid &= torch.arange(topk, device=dev).view(1, -1) < length.view(-1, 1).long()
    k = kv.squeeze(1).double()[torch.where(valid, i, torch.zeros_like(i))]  # [s_q, topk, 576]
    s = (q.double() @ k.transpose(1, 2)) * sm_scale
    s = s.masked_fill(~valid.unsqueeze(1), -math.inf)
    l = torch.logsumexp(s, dim=-1)
    ml = s.max(dim=-1).values
    o = torch.exp(s - torch.where(torch.isinf(l), torch.zeros_like(l), l).unsqueeze(-1)) @ k[..., :D_V]
    if attn_sink is not None:
        o = o / (1 + torch.exp(attn_sink.double().view(1, -1) - l)).unsqueeze(-1)
    o[torch.isinf(l)] = 0.0
    lse_ref = torch.where(torch.isinf(l), torch.full_like(l, math.inf), l)
    ok = out.dtype == torch.bfloat16 and tuple(out.shape) == (s_q, h_q, D_V)
    ok = ok and check_close("out", out.float(), o, 8e-4, 3.01 / 128, 7e-6)
    ok = ok and check_close("max_logits", max_logits, ml, 1e-6, 2.01 / 65536)
    return ok and check_close("lse", lse, lse_ref, 1e-6, 2.01 / 65536, either_inf=True)


def cases(dev, quick, flashmla_only):
    gpu = dev != "cpu" and not quick
    for b in ([2, 64] if gpu else [2]):
        for s_q in ([1, 2, 4] if gpu else [1, 2]):
            for s_k in ([20, 140, 4096] if gpu else [20, 140]):
                for h_q in ([1, 9, 64, 128] if gpu else [1, 16]):
                    for varlen in (False, True):
                        for causal in (False, True):
                            yield "dense", dict(b=b, s_q=s_q, s_k=s_k, h_q=h_q, varlen=varlen, causal=causal)
    for h_q in ([16, 128] if gpu else [16]):
        for causal in (False, True):
            yield "dense", dict(b=32 if gpu else 6, s_q=2, s_k=4096 if gpu else 100, h_q=h_q, varlen=True,
                                causal=causal, zero_seqlen=True)
    if not flashmla_only:
        for s_q, h_q in ([(1, 16), (2, 128)] if gpu else [(1, 16), (2, 3)]):
            yield "dense fp8", dict(b=4, s_q=s_q, s_k=1000 if gpu else 150, h_q=h_q, varlen=True, causal=True,
                                    fp8=True, zero_seqlen=True)
    shapes = [(512, 64, 2), (512, 64, 64), (512, 64, 69), (1024, 576, 61), (2046, 2048, 64)] if gpu else \
        [(128, 32, 2), (200, 64, 61)]
    for h_q in ([64, 128] if gpu else [16]):
        for s_k, topk, page in shapes:
            for s_q in ([1, 3] if gpu else [1, 2]):
                for with_len in (False, True):
                    for extra in ([None, (512, 64, 64)] if gpu else [None, (64, 16, 16)]):
                        b = 4 if topk > 512 else (74 if gpu else 3)
                        yield "sparse decode", dict(b=b, s_q=s_q, h_q=h_q, s_k=s_k, topk=topk, page=page, extra=extra,
                                                    with_topk_length=with_len)
        for s_k, topk, page in shapes[:2]:
            for all_invalid, zero in ((True, False), (False, True)):
                yield "sparse decode", dict(b=74 if gpu else 4, s_q=3, h_q=h_q, s_k=s_k, topk=topk, page=page,
                                            extra=None, all_invalid=all_invalid, zero_seqlen=zero, sink=not zero)
    for h_q in ([128, 64] if gpu else [16]):
        for s_kv, topk in ([(128, 128), (592, 128), (1521, 512), (95, 128), (153, 256)] if gpu else
                           [(128, 32), (95, 128)]):
            for s_q in ([1, 62, 213] if gpu else [1, 17]):
                for sink, with_len in ((False, False), (True, True), (True, False)):
                    yield "sparse prefill", dict(s_q=s_q, s_kv=s_kv, topk=topk, h_q=h_q, sink=sink,
                                                 with_topk_length=with_len)
        for s_q, s_kv, topk in ([(1, 256, 256), (200, 4321, 4096), (64, 64, 8192)] if gpu else [(9, 40, 64)]):
            yield "sparse prefill", dict(s_q=s_q, s_kv=s_kv, topk=topk, h_q=h_q, sink=True, with_topk_length=True,
                                         all_invalid=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="the small CPU case list on any device")
    ap.add_argument("--flashmla-only", action="store_true", help="skip the dense fp8 cases (an mla extension)")
    a = ap.parse_args()
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this torch ({torch.__version__}) has no CUDA device "
                 "(torch.cuda.is_available() is False); run with --device cpu")
    run = {"dense": dense_case, "dense fp8": dense_case, "sparse decode": sparse_decode_case,
           "sparse prefill": sparse_prefill_case}
    passed, failed, t0 = {}, 0, time.time()
    with torch.inference_mode() if hasattr(torch, "inference_mode") else torch.no_grad():
        for n, (kind, kw) in enumerate(cases(a.device, a.quick, a.flashmla_only)):
            if not run[kind](a.device, seed=n, **kw):
                print(f"FAILED {kind} {kw}")
                failed += 1
            else:
                passed[kind] = passed.get(kind, 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in passed.items())
    print(f"{sum(passed.values())} cases passed ({summary}), {failed} failed on {a.device} in {time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
