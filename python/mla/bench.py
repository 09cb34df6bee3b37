# SPDX-License-Identifier: Apache-2.0
"""python -m mla.bench: the compat entry points against torch baselines on a CUDA device.

  dense decode   flash_mla_with_kvcache (bf16 and fp8_ds_mla cache)  vs  torch SDPA over K/V gathered
                 from the same paged cache (the gather is not timed: the baseline gets contiguous K/V)
  sparse decode  flash_mla_with_kvcache(indices=...)                vs  torch gather + bmm softmax bmm
  merge          compat.vllm.merge_attn_states                       vs  the torch expression

Times are CUDA-event medians over --iters runs after warm-up (no L2 flush: the C++ `mla bench`
is the reference for kernel tables). The SDPA baseline may pick the math or memory-efficient backend
(cuDNN's is left out: it refuses or mishandles d_qk 576 with d_v 512 on some versions). Prints one line
per case as it is measured; --only runs one group; --json FILE writes the records.
"""
import argparse
import contextlib
import json

import torch
import torch.nn.functional as F

import mla.compat.flash_mla as flash_mla
import mla.compat.vllm as vllm_ops


def timed(fn, iters):
    for _ in range(3):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in ev)[iters // 2] * 1e3  # us


def dense_case(b, h, s_k, fp8, iters, page=64):
    blocks = b * (s_k // page)
    kv = torch.randn(blocks * page, 576, device="cuda").bfloat16()
    if fp8:
        cache = torch.empty(blocks, page, 656, dtype=torch.uint8, device="cuda")
        vllm_ops.concat_and_cache_mla(kv[:, :512], kv[:, 512:], cache, torch.arange(blocks * page, device="cuda"),
                                      "fp8_ds_mla", None)
    else:
        cache = kv.view(blocks, page, 576)
    table = torch.randperm(blocks, device="cuda").to(torch.int32).view(b, -1)
    lens = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, h, 576, device="cuda").bfloat16()
    meta, _ = flash_mla.get_mla_metadata()
    t_mla = timed(lambda: flash_mla.flash_mla_with_kvcache(q, cache.unsqueeze(2), table, lens, 512, meta,
                                                           is_fp8_kvcache=fp8), iters)
    k = kv.view(blocks, page, 576)[table.long()].view(b, 1, s_k, 576)
    qs = q.transpose(1, 2)  # [b, h, 1, 576]
    with sdpa_backends():
        t_ref = timed(lambda: F.scaled_dot_product_attention(qs, k, k[..., :512], scale=576 ** -0.5), iters)
    return t_mla, t_ref


def sdpa_backends():
    """SDPA limited to its math and memory-efficient backends (torch >= 2.3; else torch's choice)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def sparse_case(t, h, topk, fp8, iters, page=64, blocks=2048):
    kv = torch.randn(blocks * page, 576, device="cuda").bfloat16()
    cache = kv.view(blocks, page, 576)
    if fp8:
        cache = torch.empty(blocks, page, 656, dtype=torch.uint8, device="cuda")
        vllm_ops.concat_and_cache_mla(kv[:, :512], kv[:, 512:], cache, torch.arange(blocks * page, device="cuda"),
                                      "fp8_ds_mla", None)
    idx = torch.randint(0, blocks * page, (t, 1, topk), dtype=torch.int32, device="cuda")
    q = torch.randn(t, 1, h, 576, device="cuda").bfloat16()
    meta, _ = flash_mla.get_mla_metadata()
    t_mla = timed(lambda: flash_mla.flash_mla_with_kvcache(q, cache.unsqueeze(2), None, None, 512, meta,
                                                           is_fp8_kvcache=fp8, indices=idx, softmax_scale=0.07), iters)

    def ref():
        k = kv.index_select(0, idx.view(-1).long()).view(t, topk, 576)
        p = torch.softmax((q.view(t, h, 576) @ k.transpose(1, 2)).float() * 0.07, dim=-1).bfloat16()
        return p @ k[..., :512]
    return t_mla, timed(ref, iters)


def merge_case(t, h, iters):
    p, s = (torch.randn(t, h, 128, device="cuda").bfloat16() for _ in range(2))
    pl, sl = (torch.randn(h, t, device="cuda") for _ in range(2))
    out = torch.empty_like(p)

    def ref():
        m = torch.logaddexp(pl, sl)
        return (p.float() * torch.exp(pl - m).T.unsqueeze(-1) + s.float() * torch.exp(sl - m).T.unsqueeze(-1)).bfloat16()
    return timed(lambda: vllm_ops.merge_attn_states(out, p, pl, s, sl), iters), timed(ref, iters)


def report(r, nbytes):
    """Print one case; mla_GBps = the bytes the entry point must move (cache rows read, q, out; the
    sparse rows counted per index) over mla's time."""
    r["mla_GBps"] = nbytes / r["mla_us"] / 1e3
    shape = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("case", "mla_us", "torch_us", "mla_GBps"))
    print(f"{r['case']:14s} {shape:40s} mla {r['mla_us']:9.1f} us ({r['mla_GBps']:6.0f} GB/s)   "
          f"torch {r['torch_us']:9.1f} us   x{r['torch_us'] / r['mla_us']:.2f}", flush=True)
    return r


def row_bytes(fp8):
    return 656 if fp8 else 576 * 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", choices=["dense", "sparse", "merge"])
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    if a.only in (None, "dense"):
        for b, h, s_k in [(64, 16, 4096), (128, 16, 8192), (32, 128, 4096)]:
            for fp8 in (False, True):
                rows.append(report(dict(case="dense_decode", b=b, h=h, s_k=s_k, fp8=fp8, **dict(
                    zip(("mla_us", "torch_us"), dense_case(b, h, s_k, fp8, a.iters)))),
                    b * s_k * row_bytes(fp8) + b * h * (576 + 512) * 2))
    if a.only in (None, "sparse"):
        for t, h, topk in [(64, 128, 2048), (256, 16, 2048)]:
            for fp8 in (False, True):
                rows.append(report(dict(case="sparse_decode", t=t, h=h, topk=topk, fp8=fp8, **dict(
                    zip(("mla_us", "torch_us"), sparse_case(t, h, topk, fp8, a.iters)))),
                    t * topk * row_bytes(fp8) + t * h * (576 + 512) * 2))
    if a.only in (None, "merge"):
        rows.append(report(dict(case="merge", t=8192, h=16, **dict(zip(("mla_us", "torch_us"),
                                                                       merge_case(8192, 16, a.iters)))),
                           8192 * 16 * (128 * 2 * 3 + 4 * 2)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, records=rows), f, indent=1)


if __name__ == "__main__":
    main()
