# SPDX-License-Identifier: Apache-2.0
"""Drop-in versions of the vLLM MLA cache / merge / index ops (vllm._custom_ops, vLLM's
merge_attn_states and sparse_utils), with vLLM's signatures and semantics (docs/SEMANTICS.md).

Where mla is stricter or more general:
  * any page size >= 1 and any head count; seq starts need not be page-aligned;
  * ``merge_attn_states``: both LSEs -inf (or +inf) give the prefix output and lse -inf, never NaN;
  * on CPU tensors duplicate slots in one ``concat_and_cache_mla`` call are refused (ValueError);
  * bad input raises ValueError/TypeError before anything is written.
``kv_cache_dtype``: "auto" / "bf16" / "bfloat16" (bf16 cache), "fp8" / "fp8_e4m3" (per-tensor scale),
"fp8_ds_mla" (656-byte records). Tensors may be CPU or CUDA; CUDA work runs on torch's current stream.
"""
from typing import Optional

import torch

from .. import _mla

_FORMATS = {
    "auto": _mla.CacheFormat.bf16, "bf16": _mla.CacheFormat.bf16, "bfloat16": _mla.CacheFormat.bf16,
    "fp8": _mla.CacheFormat.fp8, "fp8_e4m3": _mla.CacheFormat.fp8, "fp8_ds_mla": _mla.CacheFormat.fp8_ds_mla,
}


def _cache(kv_cache: torch.Tensor, kv_cache_dtype: str, scale: Optional[torch.Tensor]) -> "_mla.KVCache":
    """mla.KVCache over vLLM's [num_blocks, block_size, 576 | 656] cache tensor. The fp8 scale is read
    on the host (one scalar; vLLM keeps it in layer._k_scale), which synchronises a CUDA scale tensor."""
    if kv_cache_dtype not in _FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(_FORMATS)}, got {kv_cache_dtype!r}")
    fmt = _FORMATS[kv_cache_dtype]
    if fmt == _mla.CacheFormat.bf16:
        return _mla.KVCache(kv_cache, fmt, 1.0, kv_cache.size(-1), 64)
    if kv_cache.dtype != torch.uint8 and kv_cache.element_size() == 1:
        kv_cache = kv_cache.view(torch.uint8)
    s = 1.0 if scale is None or fmt != _mla.CacheFormat.fp8 else float(scale.reshape(-1)[0])
    return _mla.KVCache(kv_cache, fmt, s, kv_cache.size(-1) if fmt == _mla.CacheFormat.fp8 else 576, 64)


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor) -> None:
    """Write kv_c [T, 512] | k_pe [T, 64] into kv_cache at slot_mapping [T'] (slot < 0 skipped;
    T' <= T tokens written). fp8: x / scale saturated; fp8_ds_mla: per-128 tile scales (amax / 448)."""
    _mla.write_cache(kv_c, k_pe, slot_mapping, _cache(kv_cache, kv_cache_dtype, scale))


def gather_and_maybe_dequant_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                                   cu_seq_lens: torch.Tensor, token_to_seq: torch.Tensor, num_tokens: int,
                                   kv_cache_dtype: str, scale: torch.Tensor,
                                   seq_starts: Optional[torch.Tensor] = None) -> None:
    """dst[cu[b] + i] = dequant(row seq_starts[b] + i of request b) for the first num_tokens rows.
    token_to_seq is implied by cu_seq_lens and not read."""
    _mla.gather_cache(_cache(src_cache, kv_cache_dtype, scale), dst[:num_tokens], block_table,
                      cu_seq_lens.to(torch.int32), None if seq_starts is None else seq_starts.to(torch.int32))


def cp_gather_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                    cu_seq_lens: torch.Tensor, batch_size: int, seq_starts: Optional[torch.Tensor] = None) -> None:
    """Raw row copy (no dequantisation) of the first batch_size requests' rows into dst [TOT, row]."""
    fmt = "fp8_ds_mla" if src_cache.size(-1) == 656 else ("bf16" if src_cache.element_size() == 2 else "fp8")
    if src_cache.element_size() == 1 and dst.element_size() == 1:  # raw bytes travel as uint8
        src_cache, dst = src_cache.view(torch.uint8), dst.view(torch.uint8)
    _mla.cp_gather_cache(_cache(src_cache, fmt, None), dst, block_table[:batch_size],
                         cu_seq_lens[:batch_size + 1].to(torch.int32),
                         None if seq_starts is None else seq_starts[:batch_size].to(torch.int32))


def cp_gather_and_upconvert_fp8_kv_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                                         seq_lens: torch.Tensor, workspace_starts: torch.Tensor,
                                         batch_size: int) -> None:
    """fp8_ds_mla rows -> dst [TOT, 576] bf16: request b fills rows workspace_starts[b] + [0, seq_lens[b]).
    As vLLM calls it, dst is exactly the chunk's rows (sum of seq_lens, starts their exclusive cumsum):
    mla assigns rows by workspace_starts (request b ends where b + 1 starts, the last at dst's end)."""
    _mla.upconvert_ds_mla(_cache(src_cache, "fp8_ds_mla", None), dst, block_table[:batch_size],
                          workspace_starts[:batch_size].to(torch.int32))


def merge_attn_states(output: torch.Tensor, prefix_output: torch.Tensor, prefix_lse: torch.Tensor,
                      suffix_output: torch.Tensor, suffix_lse: torch.Tensor, output_lse: Optional[torch.Tensor] = None,
                      prefill_tokens_with_context: Optional[int] = None,
                      output_scale: Optional[torch.Tensor] = None) -> None:
    """output [T, H, D] = LSE-weighted merge of prefix and suffix (lse [H, T] fp32); tokens from
    prefill_tokens_with_context on take the suffix. output_scale: fp8 output = out / scale."""
    _mla.merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                           -1 if prefill_tokens_with_context is None else int(prefill_tokens_with_context),
                           0.0 if output_scale is None else float(output_scale.reshape(-1)[0]))


def triton_convert_req_index_to_global_index(req_id: torch.Tensor, block_table: torch.Tensor,
                                             token_indices: torch.Tensor, BLOCK_SIZE: int = 64,
                                             NUM_TOPK_TOKENS: int = 2048, BLOCK_N: int = 128,
                                             HAS_PREFILL_WORKSPACE: bool = False,
                                             prefill_workspace_request_ids: Optional[torch.Tensor] = None,
                                             prefill_workspace_starts: Optional[torch.Tensor] = None,
                                             return_valid_counts: bool = False):
    """Request-local top-k positions [T, topk] -> global cache slots block_table[req, i // BLOCK_SIZE] *
    BLOCK_SIZE + i % BLOCK_SIZE (-1 for invalid or out-of-table), or prefill workspace rows
    starts[id] + i for tokens with prefill_workspace_request_ids >= 0. Returns out, or (out, valid
    counts [T]) with return_valid_counts. BLOCK_N is a kernel tile size (ignored); any topk."""
    out = torch.empty_like(token_indices, dtype=torch.int32)
    counts = torch.empty(token_indices.size(0), dtype=torch.int32, device=out.device) if return_valid_counts else None
    ids = starts = None
    if HAS_PREFILL_WORKSPACE:
        ids, starts = prefill_workspace_request_ids, prefill_workspace_starts
    _mla.convert_topk_indices(req_id, block_table, token_indices, out, BLOCK_SIZE, 0, ids, starts, counts)
    return (out, counts) if return_valid_counts else out
