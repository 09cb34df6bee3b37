# SPDX-License-Identifier: Apache-2.0
"""python -m mla.bench: mla's entry points against the peers a user would pick, on a CUDA device.

  dense decode   flash_mla_with_kvcache (bf16 and fp8_ds_mla cache)  vs  FlashMLA (the `flash_mla` package)
                 and torch SDPA's fused backends over K/V gathered from the same paged cache (the gather
                 is not timed: the baseline gets contiguous K/V)
  sparse decode  flash_mla_with_kvcache(indices=...)                vs  FlashMLA, and torch gather + bmm
  dense prefill  mla.mha_prefill (varlen, causal, d_qk 192, d_v 128)  vs  torch SDPA's flash / efficient /
                 cuDNN backends and flash_attn's flash_attn_varlen_func
  merge          compat.vllm.merge_attn_states                       vs  the torch expression

Each peer that is installed and accepts the case is timed; one that is missing, or refuses the shape, is
named with the reason in the line and the JSON (SDPA's math backend is not a peer: nobody serves with it;
its cuDNN backend is left out of decode, which it refuses or mishandles at d_qk 576 with d_v 512 on some
versions). Times are CUDA-event medians over --iters runs after warm-up (no L2 flush: the C++ `mla bench`
is the reference for kernel tables). Prints one line per case as it is measured (x = peer time / mla
time: above 1 mla is faster); --only runs one group; --json FILE writes the records.
"""
import argparse
import importlib
import json
import sys

import torch
import torch.nn.functional as F

import mla
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


def optional_module(name):
    """(module, None) when `name` imports, else (None, why)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 (a broken install is reported like a missing one)
        return None, f"not installed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


FLASH_MLA, FLASH_MLA_MISSING = optional_module("flash_mla")
FLASH_ATTN, FLASH_ATTN_MISSING = optional_module("flash_attn")


def try_peer(peers, name, fn, iters):
    """Times fn as peer `name`; a refusal (RuntimeError, ValueError, TypeError, NotImplementedError) is
    recorded with its first line instead."""
    try:
        peers[name] = timed(fn, iters)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        torch.cuda.synchronize()
        peers[name] = "refused: " + (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def sdpa_peers(peers, fn, iters, backends):
    """Times fn under each of torch SDPA's named fused backends alone (torch >= 2.3 can choose them)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        peers["sdpa"] = f"missing: torch {torch.__version__} cannot choose SDPA backends (torch >= 2.3)"
        return
    for name in backends:
        be = getattr(SDPBackend, name.upper() + "_ATTENTION", None)
        if be is None:
            peers["sdpa_" + name] = f"missing: torch {torch.__version__} has no SDPA {name} backend"
            continue
        def run(be=be):
            with sdpa_kernel([be]):
                return fn()
        try_peer(peers, "sdpa_" + name, run, iters)


def flash_mla_peer(peers, call, iters):
    if FLASH_MLA is None:
        peers["FlashMLA"] = "missing: flash_mla " + FLASH_MLA_MISSING
    else:
        try_peer(peers, "FlashMLA", lambda: call(FLASH_MLA), iters)


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

    def call(api):
        meta, _ = api.get_mla_metadata()
        return lambda: api.flash_mla_with_kvcache(q, cache.unsqueeze(2), table, lens, 512, meta, is_fp8_kvcache=fp8)
    t_mla = timed(call(flash_mla), iters)
    peers = {}
    flash_mla_peer(peers, lambda api: call(api)(), iters)
    k = kv.view(blocks, page, 576)[table.long()].view(b, 1, s_k, 576)
    qs = q.transpose(1, 2)  # [b, h, 1, 576]
    sdpa_peers(peers, lambda: F.scaled_dot_product_attention(qs, k, k[..., :512], scale=576 ** -0.5), iters,
               ("flash", "efficient"))
    return t_mla, peers


def sparse_case(t, h, topk, fp8, iters, page=64, blocks=2048):
    kv = torch.randn(blocks * page, 576, device="cuda").bfloat16()
    cache = kv.view(blocks, page, 576)
    if fp8:
        cache = torch.empty(blocks, page, 656, dtype=torch.uint8, device="cuda")
        vllm_ops.concat_and_cache_mla(kv[:, :512], kv[:, 512:], cache, torch.arange(blocks * page, device="cuda"),
                                      "fp8_ds_mla", None)
    idx = torch.randint(0, blocks * page, (t, 1, topk), dtype=torch.int32, device="cuda")
    q = torch.randn(t, 1, h, 576, device="cuda").bfloat16()

    def call(api):
        meta, _ = api.get_mla_metadata()
        return lambda: api.flash_mla_with_kvcache(q, cache.unsqueeze(2), None, None, 512, meta, is_fp8_kvcache=fp8,
                                                  indices=idx, softmax_scale=0.07)
    t_mla = timed(call(flash_mla), iters)
    peers = {}
    flash_mla_peer(peers, lambda api: call(api)(), iters)

    def ref():
        k = kv.index_select(0, idx.view(-1).long()).view(t, topk, 576)
        p = torch.softmax((q.view(t, h, 576) @ k.transpose(1, 2)).float() * 0.07, dim=-1).bfloat16()
        return p @ k[..., :512]
    try_peer(peers, "torch_gather_bmm", ref, iters)
    return t_mla, peers


def prefill_case(b, s, h, iters):
    """Causal self-attention prefill of b sequences of s tokens: q [T, h, 192], k = [k_nope | k_pe] with
    k_pe shared by the heads, v [T, h, 128] (DeepSeek's up-projected shapes)."""
    tq = b * s
    q = torch.randn(tq, h, 192, device="cuda").bfloat16()
    k_nope = torch.randn(tq, h, 128, device="cuda").bfloat16()
    k_pe = torch.randn(tq, 1, 64, device="cuda").bfloat16()
    v = torch.randn(tq, h, 128, device="cuda").bfloat16()
    cu = torch.arange(0, tq + 1, s, dtype=torch.int32, device="cuda")
    out = torch.empty(tq, h, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(h, tq, dtype=torch.float32, device="cuda")
    scale = 192 ** -0.5
    t_mla = timed(lambda: mla.mha_prefill(q, k_nope, k_pe, v, cu, cu, s, s, out, lse, scale, True), iters)
    peers = {}
    k = torch.cat([k_nope, k_pe.expand(-1, h, -1)], dim=-1)  # the peers take whole K rows
    qb, kb, vb = (x.view(b, s, h, -1).transpose(1, 2) for x in (q, k, v))
    sdpa_peers(peers, lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale), iters,
               ("flash", "efficient", "cudnn"))
    if FLASH_ATTN is None:
        peers["flash_attn"] = "missing: flash_attn " + FLASH_ATTN_MISSING
    else:
        try_peer(peers, "flash_attn", lambda: FLASH_ATTN.flash_attn_varlen_func(
            q, k, v, cu, cu, s, s, softmax_scale=scale, causal=True), iters)
    return t_mla, peers


def merge_case(t, h, iters):
    p, s = (torch.randn(t, h, 128, device="cuda").bfloat16() for _ in range(2))
    pl, sl = (torch.randn(h, t, device="cuda") for _ in range(2))
    out = torch.empty_like(p)

    def ref():
        m = torch.logaddexp(pl, sl)
        return (p.float() * torch.exp(pl - m).T.unsqueeze(-1) + s.float() * torch.exp(sl - m).T.unsqueeze(-1)).bfloat16()
    peers = {}
    try_peer(peers, "torch_expression", ref, iters)
    return timed(lambda: vllm_ops.merge_attn_states(out, p, pl, s, sl), iters), peers


def report(case, shape, t_mla, peers, nbytes=None):
    """Print one case and return its record: mla's time, each peer's time or why it has none, and (when
    given) mla_GBps = the bytes the entry point must move (cache rows read, q, out; sparse rows counted per
    index) over mla's time."""
    r = dict(case=case, **shape, mla_us=t_mla,
             peers={k: v for k, v in peers.items() if isinstance(v, float)},
             missing={k: v for k, v in peers.items() if not isinstance(v, float)})
    if nbytes:
        r["mla_GBps"] = nbytes / t_mla / 1e3
    desc = " ".join(f"{k}={v}" for k, v in shape.items())
    line = f"{case:14s} {desc:40s} mla {t_mla:9.1f} us"
    if nbytes:
        line += f" ({r['mla_GBps']:6.0f} GB/s)"
    for name, us in r["peers"].items():
        line += f" | {name} {us:.1f} us x{us / t_mla:.2f}"
    for name, why in r["missing"].items():
        line += f" | {name}: {why}"
    print(line, flush=True)
    return r


def row_bytes(fp8):
    return 656 if fp8 else 576 * 2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", choices=["dense", "sparse", "prefill", "merge"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not mla.built_with_cuda():
        print("mla.bench: this mla was built without CUDA (-DMLA_WITH_CUDA=OFF or no nvcc); the benchmark "
              "times CUDA kernels", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"mla.bench: torch {torch.__version__} sees no CUDA device (a CPU-only torch, or no GPU); "
              "the benchmark needs one. Without a GPU, `mla run --backend cpu` runs and checks a layer on the CPU, "
              "and `python -m pytest tests/python` runs the CPU tests.", file=sys.stderr)
        return 2
    print(f"peers: flash_mla {'present' if FLASH_MLA else FLASH_MLA_MISSING}; flash_attn "
          f"{'present' if FLASH_ATTN else FLASH_ATTN_MISSING}; torch {torch.__version__} SDPA", flush=True)
    rows = []
    if a.only in (None, "dense"):
        for b, h, s_k in [(64, 16, 4096), (128, 16, 8192), (32, 128, 4096)]:
            for fp8 in (False, True):
                rows.append(report("dense_decode", dict(b=b, h=h, s_k=s_k, fp8=fp8), *dense_case(b, h, s_k, fp8, a.iters),
                                   b * s_k * row_bytes(fp8) + b * h * (576 + 512) * 2))
    if a.only in (None, "sparse"):
        for t, h, topk in [(64, 128, 2048), (256, 16, 2048)]:
            for fp8 in (False, True):
                rows.append(report("sparse_decode", dict(t=t, h=h, topk=topk, fp8=fp8),
                                   *sparse_case(t, h, topk, fp8, a.iters), t * topk * row_bytes(fp8) + t * h * (576 + 512) * 2))
    if a.only in (None, "prefill"):
        for b, s, h in [(1, 4096, 128), (4, 4096, 16)]:
            rows.append(report("dense_prefill", dict(b=b, s=s, h=h), *prefill_case(b, s, h, a.iters)))
    if a.only in (None, "merge"):
        rows.append(report("merge", dict(t=8192, h=16), *merge_case(8192, 16, a.iters), 8192 * 16 * (128 * 2 * 3 + 4 * 2)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, mla=mla.__version__,
                           records=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
