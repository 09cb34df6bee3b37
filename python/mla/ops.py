# SPDX-License-Identifier: Apache-2.0
"""torch custom ops (``torch.ops.mla.*``) for every functional op and the layer forward.

Importing this module registers the ops with torch.library: one schema per op (outputs are mutated
arguments, so the ops return nothing and torch.compile functionalizes them), an implementation for
CPU and CUDA that calls the binding (zero copy, torch's current stream), and a fake (meta)
implementation so that torch.compile traces them and CUDA graphs capture them. A cache travels as its
tensor plus ``format`` (mla.CacheFormat value), ``scale`` and ``d_qk`` / ``d_rope``; an indexer K cache
as its u8 tensor (``scale`` of indexer_write_k: an mla.IndexerScale value).

The layer: ``register_layer(layer)`` returns an int handle; ``set_step(plan)`` (outside the compiled
or captured region, once per step, as vLLM's forward context does) names the plan that
``torch.ops.mla.layer_forward`` runs with. The plan's host decisions are baked into a captured graph.
"""
import torch

from . import _mla

_LIB = torch.library.Library("mla", "DEF")

_CACHE = "int format, float scale, int d_qk, int d_rope"
SCHEMAS = {
    "write_cache": "(Tensor kv_c, Tensor k_pe, Tensor slot_mapping, Tensor(a!) cache, " + _CACHE
                   + ", int ds_scale) -> ()",
    "gather_cache": "(Tensor cache, " + _CACHE + ", Tensor(a!) dst, Tensor block_table, Tensor cu_seq_lens, "
                    "Tensor? seq_starts) -> ()",
    "cp_gather_cache": "(Tensor cache, " + _CACHE + ", Tensor(a!) dst, Tensor block_table, Tensor cu_seq_lens, "
                       "Tensor? seq_starts) -> ()",
    "upconvert_ds_mla": "(Tensor cache, Tensor(a!) dst, Tensor block_table, Tensor workspace_starts, "
                        "Tensor? seq_starts) -> ()",
    "merge_attn_states": "(Tensor(a!) out, Tensor(b!)? out_lse, Tensor prefix, Tensor prefix_lse, Tensor suffix, "
                         "Tensor suffix_lse, int prefill_tokens_with_context, float output_scale) -> ()",
    "convert_topk_indices": "(Tensor req_id, Tensor block_table, Tensor indices, Tensor(a!) out, int page_size, "
                            "int block_stride_rows, Tensor? prefill_request_ids, Tensor? prefill_workspace_starts, "
                            "Tensor(b!)? valid_counts, Tensor? seq_lens) -> ()",
    "mqa_decode": "(Tensor q, Tensor cache, " + _CACHE + ", Tensor block_table, Tensor seq_lens, Tensor(a!) out, "
                  "Tensor(b!)? lse, float softmax_scale, bool causal, Tensor(c!)? workspace, int num_splits) -> ()",
    "mha_prefill": "(Tensor q, Tensor k_nope, Tensor k_pe, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                   "int max_seqlen_q, int max_seqlen_k, Tensor(a!) out, Tensor(b!)? lse, float softmax_scale, "
                   "bool causal, bool fp8=False, float q_scale=1.0, float k_scale=1.0, float v_scale=1.0, "
                   "Tensor(c!)? workspace=None) -> ()",
    "sparse_mqa": "(Tensor q, Tensor kv, " + _CACHE + ", Tensor indices, Tensor? topk_length, Tensor(a!) out, "
                  "Tensor(b!)? lse, float softmax_scale) -> ()",
    "gemm": "(Tensor a, Tensor b, Tensor(a!) c, float alpha, float beta) -> ()",
    "bmm": "(Tensor a, Tensor b, Tensor(a!) c, float alpha, float beta) -> ()",
    "indexer_write_k": "(Tensor k, Tensor slot_mapping, Tensor(a!) cache, int scale) -> ()",
    "indexer_gather_k": "(Tensor cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, Tensor block_table, "
                        "Tensor cu_seq_lens) -> ()",
    "indexer_logits_prefill": "(Tensor q, Tensor weights, Tensor k, Tensor k_scale, Tensor row_starts, "
                              "Tensor row_ends, Tensor(a!) logits) -> ()",
    "indexer_logits_decode": "(Tensor q, Tensor weights, Tensor cache, Tensor block_table, Tensor seq_lens, int s_q, "
                             "Tensor(a!) logits) -> ()",
    "indexer_prepare": "(Tensor q, Tensor k, Tensor weights_raw, Tensor positions, Tensor cos_sin, "
                       "Tensor k_norm_weight, Tensor k_norm_bias, Tensor(a!) q_codes, Tensor(b!) weights, "
                       "Tensor(c!) k_out, float eps, bool hadamard) -> ()",
    "indexer_topk": "(Tensor logits, Tensor? row_starts, Tensor row_ends, Tensor(a!) out) -> ()",
    "indexer_topk_decode": "(Tensor logits, Tensor seq_lens, int s_q, Tensor(a!) out) -> ()",
    "quantize_output": "(Tensor x, int key, Tensor(a!) codes, Tensor(b!)? scales, float scale) -> ()",
    "layer_forward": "(int layer, Tensor q, Tensor kv_c, Tensor k_pe, Tensor slot_mapping, Tensor block_table, "
                     "Tensor seq_lens, Tensor? topk_indices, Tensor(a!) out, Tensor(b!) cache, " + _CACHE
                     + ", Tensor(c!) workspace, Tensor? metadata, Tensor(d!)? out_scales=None) -> ()",
}


def _kv(cache, format, scale, d_qk, d_rope):
    return _mla.KVCache(cache, _mla.CacheFormat(format), scale, d_qk, d_rope)


_LAYERS = {}
_STEP = {"plan": None}


def register_layer(layer):
    """Int handle of an mla.MlaAttention for torch.ops.mla.layer_forward's ``layer`` argument (the layer stays
    alive as long as the process)."""
    handle = len(_LAYERS)
    _LAYERS[handle] = layer
    return handle


def set_step(plan):
    """The mla.Plan (from mla.make_plan) every following torch.ops.mla.layer_forward runs with; call once per
    step, outside a compiled or captured region."""
    _STEP["plan"] = plan


IMPLS = {
    "write_cache": lambda kv_c, k_pe, slots, cache, f, s, dq, dr, ds: _mla.write_cache(
        kv_c, k_pe, slots, _kv(cache, f, s, dq, dr), _mla.DsMlaScale(ds)),
    "gather_cache": lambda cache, f, s, dq, dr, dst, bt, cu, st: _mla.gather_cache(
        _kv(cache, f, s, dq, dr), dst, bt, cu, st),
    "cp_gather_cache": lambda cache, f, s, dq, dr, dst, bt, cu, st: _mla.cp_gather_cache(
        _kv(cache, f, s, dq, dr), dst, bt, cu, st),
    "upconvert_ds_mla": lambda cache, dst, bt, ws, st: _mla.upconvert_ds_mla(
        _mla.KVCache(cache, _mla.CacheFormat.fp8_ds_mla), dst, bt, ws, st),
    "merge_attn_states": _mla.merge_attn_states,
    "convert_topk_indices": _mla.convert_topk_indices,
    "mqa_decode": lambda q, cache, f, s, dq, dr, bt, sl, out, lse, sc, causal, ws, ns: _mla.mqa_decode(
        q, _kv(cache, f, s, dq, dr), bt, sl, out, lse, sc, causal, ws, ns),
    "mha_prefill": lambda q, kn, kp, v, cq, ck, mq, mk, out, lse, sc, causal, fp8=False, q_scale=1.0, k_scale=1.0,
    v_scale=1.0, workspace=None: _mla.mha_prefill(q, kn, kp, v, cq, ck, mq, mk, out, lse, sc, causal, fp8=fp8,
                                                  q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                                  workspace=workspace),
    "sparse_mqa": lambda q, kv, f, s, dq, dr, idx, tl, out, lse, sc: _mla.sparse_mqa(
        q, _kv(kv, f, s, dq, dr), idx, tl, out, lse, sc),
    "gemm": _mla.gemm,
    "bmm": _mla.bmm,
    "indexer_write_k": lambda k, slots, cache, scale: _mla.indexer_write_k(
        k, slots, _mla.IndexerKCache(cache), _mla.IndexerScale(scale)),
    "indexer_gather_k": lambda cache, dst_k, dst_scale, bt, cu: _mla.indexer_gather_k(
        _mla.IndexerKCache(cache), dst_k, dst_scale, bt, cu),
    "indexer_logits_prefill": _mla.indexer_logits_prefill,
    "indexer_logits_decode": lambda q, w, cache, bt, sl, s_q, logits: _mla.indexer_logits_decode(
        q, w, _mla.IndexerKCache(cache), bt, sl, s_q, logits),
    "indexer_prepare": _mla.indexer_prepare,
    "indexer_topk": _mla.indexer_topk,
    "indexer_topk_decode": _mla.indexer_topk_decode,
    "quantize_output": lambda x, key, codes, scales, scale: _mla.quantize_output(
        x, _mla.OutputQuant(key), codes, scales, scale),
    "layer_forward": lambda layer, q, kv_c, k_pe, slots, bt, sl, topk, out, cache, f, s, dq, dr, ws, meta,
    out_scales=None: _LAYERS[layer].forward(_STEP["plan"], _kv(cache, f, s, dq, dr), ws, q=q, kv_c=kv_c, k_pe=k_pe,
                                            slot_mapping=slots, block_table=bt, seq_lens=sl, out=out,
                                            topk_indices=topk, metadata=meta, out_scales=out_scales),
}


def _fake(*args, **kwargs):
    """Every op writes only into its arguments: nothing to allocate under fake tensors."""
    return None


def _register():
    fake_api = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
    for name, schema in SCHEMAS.items():
        _LIB.define(name + schema)
        impl = IMPLS[name]
        for key in ("CPU", "CUDA"):
            _LIB.impl(name, impl, key)
        if fake_api is not None:
            fake_api("mla::" + name, _fake, lib=_LIB)
        else:  # torch < 2.2: a Meta kernel serves the same purpose (AutogradMeta has no fallthrough there)
            _LIB.impl(name, _fake, "Meta")
            _LIB.impl(name, _fake, "AutogradMeta")


_register()


def cache_args(cache):
    """(tensor, format, scale, d_qk, d_rope) of an mla.KVCache for the ops' cache parameters: the cache tensor
    ([blocks, page, 576] bf16 / fp8_e4m3, [blocks, page, 656] u8 for fp8_ds_mla), format as int (mla.CacheFormat),
    scale as float (fp8's per-tensor scale), d_qk and d_rope as int (576 and 64 for DeepSeek)."""
    return cache.data, int(cache.format), float(cache.scale), cache.d_qk, cache.d_rope
