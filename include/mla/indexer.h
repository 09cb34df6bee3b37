// SPDX-License-Identifier: Apache-2.0
#pragma once
// DeepSeek-V3.2 lightning indexer (docs/INDEXER.md, semantics §12): the indexer K cache (a second
// cache kind beside the latent KVCache), its writer and prefill gather, the fp8 MQA logits
// (prefill over a contiguous K, decode over the paged cache) and the top-k per row that fills the
// sparse attention's index buffer with request-local positions.
//
// Conventions as in mla/ops.h: every op validates before anything is written (mla::Error), integer
// metadata is int32, strides are in elements with a unit innermost stride, optional tensors are a
// default TensorView {}. Value-range checks of metadata run where values are host-readable (CPU).
#include <cstdint>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

inline constexpr int64_t kIndexerHeadDim = 128;     // d_idx: one key / one query head (64 rope | 64 nope)
inline constexpr int64_t kIndexerScaleBytes = 4;    // one fp32 scale per token (quant block = 128 = d_idx)
inline constexpr int64_t kIndexerEntryBytes = 132;  // bytes per token in the cache
inline constexpr int64_t kIndexerHeads = 64;        // V3.2's index_n_heads (any h >= 1 is accepted)
inline constexpr int64_t kIndexerTopk = 2048;       // V3.2's index_topk (any k >= 1 is accepted)

// How the writer picks a token's scale from amax = max |k| over its 128 values:
//   ue8m0: 2^ceil(log2(max(amax, 1e-4) / 448))  (V3.2's scale_fmt "ue8m0"; vLLM's indexer default) [PIN]
//   amax:  max(amax, 1e-4) / 448                (scale_fmt "" in vLLM)
// Codes are e4m3_satfinite(k / scale) (round to nearest even).
enum class IndexerScale : uint8_t { ue8m0 = 0, amax = 1 };

// Indexer K cache: data u8 [num_blocks, page_size, 132] (the logical shape engines give it). The bytes
// of one block are laid out structure-of-arrays (vLLM's layout):
//   [0, page_size * 128)                     e4m3 codes, token o of the page at o * 128
//   [page_size * 128, page_size * 132)       fp32 scales, token o at page_size * 128 + o * 4
// so the view's inner strides must be (132, 1) (one contiguous block); the block stride is any value
// >= page_size * 132 (a view inside a larger allocation). Token slot s lives in block s / page_size,
// position s % page_size. Dequantised value = code * scale.
struct IndexerKCache {
  TensorView data;
  int64_t num_blocks() const { return data.size(0); }
  int64_t page_size() const { return data.size(1); }
  int64_t num_slots() const { return num_blocks() * page_size(); }
  int64_t block_stride_bytes() const { return data.stride[0]; }
};

struct IndexerCacheBuffer {
  Tensor storage;
  IndexerKCache cache;
};
IndexerCacheBuffer allocate_indexer_cache(int64_t num_blocks, int64_t page_size, Device device);
// Throws mla::Error unless `c` is a well-formed indexer cache descriptor.
void validate_indexer_cache(const IndexerKCache& c, const char* what = "indexer cache");
void check_indexer_scale(IndexerScale s, const char* what);

// ---------------------------------------------------------------------------------------------
// Write (vLLM indexer_k_quant_and_cache): quantise k per token (one block of 128) into the cache.
//   k            [T, 128]  bf16/f16/f32 (CPU: f64 too), any row stride
//   slot_mapping [T'] int64 or int32, T' <= T tokens are written; slot < 0 skipped; a slot at most once
void indexer_write_k(const TensorView& k, const TensorView& slot_mapping, const IndexerKCache& cache,
                     IndexerScale scale = IndexerScale::ue8m0, const Context& ctx = {});

// Gather for prefill (vLLM cp_gather_indexer_k_quant_cache): request b's first cu[b+1] - cu[b]
// positions, paged through block_table row b, into rows [cu[b], cu[b+1]) of
//   dst_k        [TOT, 128] fp8_e4m3 (u8 accepted), any row stride
//   dst_scale    [TOT] f32
//   block_table  [B, max_blocks] int32;  cu_seq_lens [B+1] int32 (cu[B] <= TOT)
// Rows not covered by cu are untouched. Positions must lie inside the table (checked on the CPU;
// CUDA skips a position whose block is outside the table or the cache and leaves its row untouched).
void indexer_gather_k(const IndexerKCache& cache, const TensorView& dst_k, const TensorView& dst_scale,
                      const TensorView& block_table, const TensorView& cu_seq_lens, const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Logits (vLLM fp8_mqa_logits / fp8_paged_mqa_logits). For query row t and key j:
//   logits[t, j] = sum_h w[t, h] * relu((q[t, h, :] . k[j, :]) * k_scale[j])       j visible to t
//                = -inf                                                           otherwise
// q codes are e4m3 (their per-(token, head) scales are folded into w by the caller); relu propagates
// NaN (a NaN code makes the logit NaN). CPU: float64 sums in Precision::reference, float32 in fast.
//
// Prefill: keys are a contiguous gathered K.
//   q          [T, h, 128] fp8_e4m3 (u8 accepted)        weights [T, h] f32
//   k          [Tk, 128] fp8_e4m3 (u8 accepted)          k_scale [Tk] f32
//   row_starts, row_ends [T] int32: row t sees keys [row_starts[t], row_ends[t]) (clipped to [0, Tk))
//   logits     [T, Tk] f32 (any row stride): every element written
void indexer_logits_prefill(const TensorView& q, const TensorView& weights, const TensorView& k,
                            const TensorView& k_scale, const TensorView& row_starts, const TensorView& row_ends,
                            const TensorView& logits, const Context& ctx = {});

// Decode: keys are request b's positions in the paged cache; rows t = b * s_q + i (i < s_q, causal:
// row i sees positions [0, seq_lens[b] - s_q + i + 1), empty when that is <= 0).
//   q [b * s_q, h, 128] fp8_e4m3     weights [b * s_q, h] f32
//   block_table [b, max_blocks] int32;  seq_lens [b] int32
//   logits [b * s_q, N] f32: column p = position p; every column < N is written (-inf past the
//          visible length). Visible positions >= N are not computed (refused on the CPU, where the
//          values are readable: N must cover every row's visible length).
void indexer_logits_decode(const TensorView& q, const TensorView& weights, const IndexerKCache& cache,
                           const TensorView& block_table, const TensorView& seq_lens, int64_t s_q,
                           const TensorView& logits, const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Query / key preparation of a V3.2 layer's indexer (DeepSeek's Indexer.forward between its
// projections and the fp8 scoring). The projections are the caller's GEMMs (mla::gemm):
//   q = q_lat @ wq_b  -> [T, h * 128] viewed [T, h, 128];  k = x @ wk -> [T, 128];
//   weights_raw = x @ weights_proj -> [T, h]
// Then per token (positions[t] indexes the rope table):
//   k      <- LayerNorm(k; k_norm_weight, k_norm_bias, eps)                 (biased variance)
//   q[h], k <- RoPE on dims [0, 64), NON-interleaved (NeoX: dim i pairs with i + 32):
//             x_i' = x_i cos_i - x_{i+32} sin_i,  x_{i+32}' = x_{i+32} cos_i + x_i sin_i  (i < 32)
//   q[h], k <- H x / sqrt(128) when `hadamard` (Sylvester Walsh-Hadamard; orthonormal, so exact
//             logits are unchanged, but fp8 quantisation sees spread-out values, as DeepSeek does)
//   q_codes[t, h] = e4m3(q[h] / s_h), s_h = the ue8m0 writer scale of amax |q[h]| (IndexerScale::ue8m0)
//   weights[t, h] = weights_raw[t, h] * h^-1/2 * 128^-1/2 * s_h
//   k_out[t] = k (rounded to k_out's dtype; write it with indexer_write_k)
// Inputs: q [T, h, 128], k [T, 128], weights_raw [T, h] bf16/f16/f32 (CPU: f64 too; CUDA: one dtype
// for q, k, weights_raw and k_out); positions [T] int32/int64; cos_sin [P, 64] f32 (cos of the 32
// frequencies, then their sin: vLLM's cos_sin_cache); k_norm_weight, k_norm_bias [128] f32.
// Outputs: q_codes [T, h, 128] fp8_e4m3 (u8 accepted), weights [T, h] f32, k_out [T, 128].
// Arithmetic in fp32 (float64 in Precision::reference on the CPU). A position outside [0, P) is
// refused on the CPU; CUDA reads no table row for it and writes NaN codes / weights / keys.
void indexer_prepare(const TensorView& q, const TensorView& k, const TensorView& weights_raw,
                     const TensorView& positions, const TensorView& cos_sin, const TensorView& k_norm_weight,
                     const TensorView& k_norm_bias, const TensorView& q_codes, const TensorView& weights,
                     const TensorView& k_out, double eps = 1e-6, bool hadamard = true, const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Top-k per row (vLLM top_k_per_row_prefill / _decode). Row t considers columns [start, end) of
// logits [T, N] f32 and writes into out [T, k] int32 the positions (column - start) of its
// min(k, end - start) largest values, then -1 padding. Order: values descending, NaN below every
// number (also below -inf), ties broken by the lower position first [PIN]. The selected positions are
// written in ascending order (valid entries form a prefix). Any k >= 1.
//   indexer_topk:        start = row_starts[t] (0 when absent), end = row_ends[t] (int32 [T])
//   indexer_topk_decode: start = 0, end = seq_lens[t / s_q] - s_q + t % s_q + 1 (the decode rows'
//                        causal lengths; seq_lens [T / s_q] int32)
// Rows with end <= start are all -1. end past N is refused on the CPU and clipped to N on CUDA.
void indexer_topk(const TensorView& logits, const TensorView& row_starts, const TensorView& row_ends,
                  const TensorView& out, const Context& ctx = {});
void indexer_topk_decode(const TensorView& logits, const TensorView& seq_lens, int64_t s_q, const TensorView& out,
                         const Context& ctx = {});

}  // namespace mla
