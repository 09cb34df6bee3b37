# SPDX-License-Identifier: Apache-2.0
"""Drop-in replacement of FlashMLA's Python API (deepseek-ai/FlashMLA, flash_mla/flash_mla_interface.py):
``import mla.compat.flash_mla as flash_mla`` and keep the script.

Same signatures, shapes, dtypes and return values. Where mla is stricter or more general:
  * any page size >= 1, any number of query heads >= 1, any s_q (FlashMLA: page 64, h_q 64/128 for
    sparse fp8), bf16 *and* fp8_ds_mla caches for sparse decode (FlashMLA: fp8 only);
  * a query with no visible key gets out = 0 and lse = -inf (FlashMLA reports lse = +inf there;
    merges treat both alike);
  * ``is_fp8_kvcache=True`` means the 656-byte fp8_ds_mla record (512 e4m3 | 4 fp32 tile scales |
    64 bf16 rope), for dense and sparse decode alike;
  * the scheduler metadata carries no device state: mla plans its split-KV schedule itself, so one
    ``FlashMLASchedMeta`` may be reused for any batch (the FlashMLA consistency checks are kept).
Runs on CPU tensors too (the float64-capable oracle backend). Outputs are new tensors, as FlashMLA's.
"""
import dataclasses
import math
from typing import Optional, Tuple

import torch

from .. import _mla


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Scheduler metadata handle (FlashMLA's type); filled on the first flash_mla_with_kvcache call."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """Returns (FlashMLASchedMeta(), None), as FlashMLA does; the arguments of the older interface
    (cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...) are accepted and ignored."""
    return FlashMLASchedMeta(), None


def _cache(k_cache: torch.Tensor, is_fp8_kvcache: bool) -> "_mla.KVCache":
    """[num_blocks, page, h_k = 1, head_dim] -> mla.KVCache (bf16 576 wide, or 656-byte fp8_ds_mla)."""
    if k_cache.dim() == 4:
        if k_cache.size(2) != 1:
            raise ValueError(f"k_cache must have num_heads_k = 1 (MLA), got shape {tuple(k_cache.shape)}")
        k_cache = k_cache.squeeze(2)
    if is_fp8_kvcache:
        if k_cache.dtype != torch.uint8:
            k_cache = k_cache.view(torch.uint8)
        return _mla.KVCache(k_cache, _mla.CacheFormat.fp8_ds_mla)
    return _mla.KVCache(k_cache, _mla.CacheFormat.bf16, 1.0, k_cache.size(-1), 64)


def _check_meta(meta, cfg):
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError("tile_scheduler_metadata must be of type FlashMLASchedMeta")
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, cfg
    elif meta.config != cfg:
        raise ValueError(f"Your input arguments are inconsistent with sched_meta: {cfg} vs {meta.config}")


def _sparse_part(q, cache, indices, topk_length, scale, d_v):
    """One sparse_mqa over [b * s_q] rows: out [T, h_q, d_v], lse [T, h_q]."""
    b, s_q, h_q, d = q.shape
    t = b * s_q
    out = torch.empty(t, h_q, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(t, h_q, dtype=torch.float32, device=q.device)
    length = None
    if topk_length is not None:  # FlashMLA's topk_length is per batch entry
        length = topk_length.to(torch.int32).repeat_interleave(s_q)
    _mla.sparse_mqa(q.reshape(t, h_q, d), cache, indices.reshape(t, -1).to(torch.int32), length, out, lse, scale)
    return out, lse


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a paged latent cache (dense, or sparse with ``indices``).

    q [b, s_q, h_q, 576]; k_cache [num_blocks, page, 1, 576] bf16 or [.., 656] bytes (is_fp8_kvcache);
    block_table [b, max_blocks] int32 and cache_seqlens [b] int32 (dense); indices [b, s_q, topk]
    int32 global slots block * page + offset, -1 invalid (sparse; extra_k_cache / extra_indices add a
    second key set, merged by LSE). Returns out [b, s_q, h_q, head_dim_v] (q's dtype) and
    lse [b, h_q, s_q] fp32 (natural log; -inf where no key is visible, FlashMLA: +inf).
    ``num_splits`` from the old interface (a tensor or None) is ignored."""
    b, s_q, h_q, d = q.shape
    topk = indices.shape[-1] if indices is not None else None
    _check_meta(tile_scheduler_metadata, FlashMLASchedMeta.Config(
        b, s_q, h_q, k_cache.shape[1], k_cache.shape[2] if k_cache.dim() == 4 else 1, causal, is_fp8_kvcache, topk,
        extra_k_cache.shape[1] if extra_k_cache is not None else None,
        extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None))
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    cache = _cache(k_cache, is_fp8_kvcache)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    if indices is None:
        if any(x is not None for x in (attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length)):
            raise ValueError("attn_sink, extra_k_cache, extra_indices_in_kvcache and topk_length need indices "
                             "(sparse attention)")
        if block_table is None or cache_seqlens is None:
            raise ValueError("block_table and cache_seqlens must be provided when dense attention is used")
        out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
        ws = None
        if q.is_cuda:  # split-KV scratch for the planner's default split (0 bytes for one split)
            ws = torch.empty(_mla.mqa_decode_workspace_bytes(b, s_q, h_q, block_table.size(1) * cache.page_size,
                                                             str(q.device)), dtype=torch.uint8, device=q.device)
        _mla.mqa_decode(q, cache, block_table, cache_seqlens, out, lse.transpose(1, 2), scale, causal, ws)
        return out, lse
    if causal:
        raise ValueError("causal must be False when indices is given (sparse attention)")
    if extra_k_cache is None and (extra_indices_in_kvcache is not None or extra_topk_length is not None):
        raise ValueError("extra_indices_in_kvcache and extra_topk_length must not be provided when extra_k_cache "
                         "is not provided")
    # FlashMLA rounds the output once, after the extra key set and the sink: those paths keep fp32 partials.
    qs = q.float() if extra_k_cache is not None or attn_sink is not None else q
    out, part_lse = _sparse_part(qs, cache, indices, topk_length, scale, head_dim_v)
    if extra_k_cache is not None:
        if extra_indices_in_kvcache is None:
            raise ValueError("extra_k_cache needs extra_indices_in_kvcache")
        out2, lse2 = _sparse_part(qs, _cache(extra_k_cache, is_fp8_kvcache), extra_indices_in_kvcache,
                                  extra_topk_length, scale, head_dim_v)
        merged, merged_lse = torch.empty_like(out), torch.empty(h_q, b * s_q, dtype=torch.float32, device=q.device)
        _mla.merge_attn_states(merged, merged_lse, out, part_lse.t(), out2, lse2.t())
        out, part_lse = merged, merged_lse.t()
    out = _apply_sink(out, part_lse, attn_sink).to(q.dtype)  # lse itself unchanged, as FlashMLA
    lse.copy_(part_lse.view(b, s_q, h_q).transpose(1, 2))
    return out.view(b, s_q, h_q, head_dim_v), lse


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill: q [s_q, h_q, 576] bf16, kv [s_kv, h_kv = 1, 576] bf16, indices [s_q, 1, topk] int32
    rows of kv (< 0 or >= s_kv invalid), attn_sink [h_q] fp32 (out *= exp(lse) / (exp(lse) + exp(sink));
    +-inf allowed), topk_length [s_q] int32 (entries from topk_length[t] on are ignored).
    Returns (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32), as FlashMLA.
    Rows with no valid index: out 0, max_logits -inf, lse -inf (FlashMLA: lse +inf)."""
    s_q, h_q, d = q.shape
    if kv.dim() == 3:
        if kv.size(1) != 1:
            raise ValueError(f"kv must have h_kv = 1 (MLA), got shape {tuple(kv.shape)}")
        kv = kv.squeeze(1)
    idx = indices.reshape(s_q, -1).to(torch.int32)
    cache = _mla.KVCache(kv.unsqueeze(0), _mla.CacheFormat.bf16, 1.0, kv.size(-1), 64)
    out = torch.empty(s_q, h_q, d_v, dtype=q.dtype if attn_sink is None else torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    _mla.sparse_mqa(q if attn_sink is None else q.float(), cache, idx, topk_length, out, lse, sm_scale)
    max_logits = _max_logits(q, kv, idx, topk_length, sm_scale)
    return _apply_sink(out, lse, attn_sink).to(q.dtype), max_logits, lse  # one rounding, after the sink


def _apply_sink(out, lse, attn_sink):
    """out [T, h_q, d_v] (fp32) *= exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink) per head (lse [T, h_q]);
    a row without keys (lse -inf) stays 0 whatever the sink (-inf - -inf is NaN: taken as 0)."""
    if attn_sink is None:
        return out
    w = torch.sigmoid(lse - attn_sink.float().view(1, -1)).nan_to_num(nan=0.0)
    return (out.float() * w.unsqueeze(-1)).to(out.dtype)


def _max_logits(q, kv, idx, topk_length, scale):
    """max over valid indices of q . k * scale, in fp32 (-inf for rows without one), by chunks of rows."""
    s_kv, topk = kv.size(0), idx.size(1)
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=idx.device).view(1, topk) < topk_length.view(-1, 1)
    res = torch.empty(q.size(0), q.size(1), dtype=torch.float32, device=q.device)
    step = max(1, (1 << 26) // max(1, topk * kv.size(1)))
    for s in range(0, q.size(0), step):
        e = min(s + step, q.size(0))
        k = kv.index_select(0, torch.where(valid[s:e], idx[s:e], 0).flatten()).view(e - s, topk, -1).float()
        logits = torch.einsum("thd,tkd->thk", q[s:e].float(), k) * scale
        logits.masked_fill_(~valid[s:e].unsqueeze(1), -math.inf)
        res[s:e] = logits.amax(dim=-1)
    return res
