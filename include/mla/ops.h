// SPDX-License-Identifier: Apache-2.0
#pragma once
// Functional ops. Each validates its arguments (throwing mla::Error before anything is written) and
// dispatches on the device of its tensors: all tensors of one call must live on one device. The CPU
// backend accepts any floating dtype for activations (bf16/f16/f32/f64; Context::precision selects
// float32 or float64 accumulation); the CUDA backend takes bf16 activations, and also f16 / f32 where
// vLLM's ops do (merge_attn_states, gather_cache / upconvert_ds_mla dst, mqa_decode and sparse_mqa q / out,
// one dtype per call), with fp32 LSE. CUDA attention feeds bf16 tensor cores: f16 / f32 queries are
// rounded to bf16 on load; outputs are written in their own dtype from fp32.
//
// Conventions (DESIGN.md §4):
//   * LSE is fp32, natural log. An empty key set gives out = 0 and lse = -inf. The CPU backend also
//     accepts f64 LSE tensors (the float64 oracle keeps merges exact); CUDA takes fp32 only.
//   * Index -1 (any negative) = no token; slot < 0 = do not write.
//   * Integer metadata (block tables, lengths, indices) is int32 unless stated; slots are int64 (int32 accepted).
//   * Strides are in elements; the innermost dimension of activations must have stride 1.
//   * Optional tensors are passed as a default-constructed TensorView {}.
#include <cstdint>

#include "mla/cache.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// ---------------------------------------------------------------------------------------------
// Cache write (concat_and_cache_mla, semantics §4).
//   kv_c         [T, L]   latent (kv_c_normed), any row stride
//   k_pe         [T, R]   rope part, any row stride
//   slot_mapping [T']     int64 or int32; T' <= T tokens are written (kv_c may be padded); slot < 0 skipped
// Formats: bf16 exact copy (rounded from wider inputs); fp8 e4m3_satfinite(x / scale) for latent and
// rope alike; fp8_ds_mla per-128 tile scales (mode `ds_scale`), rope copied as bf16.
void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping,
                 const KVCache& cache, DsMlaScale ds_scale = DsMlaScale::amax, const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Gather with dequantisation for chunked context (gather_and_maybe_dequant_cache, §5.1).
//   dst          [TOT, D] bf16/f16/f32/f64 (CUDA: not f64), D = d_qk (full row) or d_latent (latent only)
//   block_table  [B, max_blocks] int32
//   cu_seq_lens  [B+1] int32: request b fills dst rows [cu[b], cu[b+1])
//   seq_starts   [B] int32 optional: token i of request b is logical position seq_starts[b] + i (any alignment)
// Row position p maps through block_table[b][p / page_size]; positions whose block lies outside the
// table are never read and their dst rows are left untouched. TOT = dst.size(0); TOT = 0 is a no-op.
// Works for every cache format (fp8: q*scale; fp8_ds_mla: q*tile_scale, rope bit copy).
void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts = {}, const Context& ctx = {});

// Raw row copy without conversion (cp_gather_cache, §5.2): dst [TOT, E] has the cache tensor's dtype
// and row width E. Same index mapping as gather_cache.
void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts = {}, const Context& ctx = {});

// fp8_ds_mla -> bf16 upconvert into a workspace (cp_gather_and_upconvert_fp8_kv_cache, §5.3).
//   dst              [TOT, 576] bf16 (CPU: any float dtype; CUDA: bf16 / f16 / f32)
//   block_table      [B, max_blocks] int32
//   workspace_starts [B] int32: request b occupies rows [starts[b], starts[b+1]) (last ends at TOT)
//   seq_starts       [B] int32 optional logical start position per request
void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts = {},
                      const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// LSE merge of two partial attentions (merge_attn_states, §7).
//   out, prefix, suffix      [T, H, D]; prefix and suffix share the head stride, out may differ
//   prefix_lse, suffix_lse   [H, T] fp32 (any strides: a transposed [T, H] view is accepted)
//   out_lse                  [H, T] fp32 optional
//   prefill_tokens_with_context: tokens t >= this copy the suffix (and its lse); -1 = all tokens merge
//   output_scale: 0 = none; otherwise out must be fp8_e4m3 and receives clamp(out / output_scale)
// Edge rules [PIN]: +-inf lse is treated as -inf; both sides -inf -> out = prefix, lse = -inf; NaN propagates.
void merge_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& prefix,
                       const TensorView& prefix_lse, const TensorView& suffix, const TensorView& suffix_lse,
                       int64_t prefill_tokens_with_context = -1, float output_scale = 0.0f,
                       const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// N-way LSE combine of partial attentions over disjoint key sets (decode context parallelism §13:
// one part per rank's cache shard; any split of the keys).
//   parts      [N, T, H, D]  partial outputs, each normalised over its own keys (any strides, unit inner)
//   part_lses  [N, T, H]     fp32 (CPU: f64 too), natural log, any strides
//   out        [T, H, D]     combined output (CUDA: the parts' dtype)
//   out_lse    [T, H]        fp32 optional
//   attn_sink  [H]           fp32 optional (CPU: f64 too), any stride: a per-head attention sink (§11.8)
//                            folded in once, as one more part of value 0 and lse sink[h]: m = max(finite
//                            lse_n, sink_h), l = Σ exp(lse_n − m) + exp(sink_h − m), out = Σ exp(lse_n − m)
//                            out_n / l, lse = m + ln l. The parts then are attentions without the sink (the
//                            V4 DCP step, mla/dcp.h). −inf = no sink; NaN or +inf makes the row NaN; every
//                            part empty -> out 0, lse = sink_h.
// Rules [PIN] (§13): a part with lse ±inf is empty and contributes exactly 0 (its out is never read, so
// garbage or NaN there is harmless); every part empty -> out 0, lse -inf; a NaN lse makes the row and its
// lse NaN (a NaN score on one shard is a NaN score of the whole key set, §14.6a). 1 <= N <= 256.
inline constexpr int64_t kCombineMaxParts = 256;
void combine_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& parts,
                         const TensorView& part_lses, const Context& ctx = {}, const TensorView& attn_sink = {});

// ---------------------------------------------------------------------------------------------
// Top-k index conversion (request-local positions -> cache slots / workspace rows, §11.3).
//   req_id         [T] int32 request of each token (row of block_table)
//   block_table    [R, max_blocks] int32
//   indices        [T, topk] int32 request-local positions, < 0 invalid
//   out            [T, topk] int32
//   block_stride_rows: rows between consecutive blocks in the flat row view (0 -> page_size)
//   prefill_request_ids      [T] int32 optional: >= 0 -> token reads the prefill workspace
//   prefill_workspace_starts [P] int32 optional: out = starts[pid] + idx (no block-table bound check [PIN])
//   valid_counts   [T] int32 optional: number of outputs >= 0 per row
//   seq_lens       [R] int32 optional: positions >= seq_lens[req_id[t]] are invalid (-1), for cache and
//                  workspace tokens alike (req_id is then read for every token). The layer passes its
//                  seq_lens: a top-k entry past its request's length never reads another request's row.
// Cache rows: blk = idx / page_size outside [0, max_blocks) -> -1, else block_table[..][blk] *
// block_stride_rows + idx % page_size. A row past int32 is refused on the CPU and -1 on CUDA.
void convert_topk_indices(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,
                          const TensorView& out, int64_t page_size, int64_t block_stride_rows = 0,
                          const TensorView& prefill_request_ids = {},
                          const TensorView& prefill_workspace_starts = {},
                          const TensorView& valid_counts = {}, const TensorView& seq_lens = {},
                          const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Absorbed MQA decode over the paged cache (§6).
//   q           [b, s_q, h_q, d_qk]  (d_qk = cache.d_qk; query columns pair with cache row columns)
//   block_table [b, max_blocks] int32
//   seq_lens    [b] int32, 0 <= seq_len <= max_blocks * page_size
//   out         [b, s_q, h_q, d_v]   d_v <= d_latent: values are the first d_v columns of each row
//   lse         [b, s_q, h_q] fp32 optional
//   causal: query i of s_q (position seq_len - s_q + i) sees keys [0, seq_len - s_q + i]; else all keys.
//   workspace: device scratch (CPU needs none). Required on CUDA: the split-KV partials of num_splits
//               (0 bytes for one split); mqa_decode_workspace_bytes(...) bytes also let the sm90 kernel run
//               its balanced (request, key-block) schedule and its small steps' two partials a split, which it
//               does only when the workspace holds them.
//   num_splits: KV ranges per request on CUDA (split-KV, merged by a combine kernel). 0 = the planner's
//               policy decode_num_splits(b, s_q, h_q, max_blocks * page_size, multiprocessor_count(device))
//               (mla/plan.h); a step plan passes the split of its decode schedule. The CPU backend
//               parallelises over its own threads and ignores it.
//   whole_requests: what the caller knows of the lengths on the host (a step plan's DecodeRun::whole_requests):
//               they are near-uniform, so one CTA per request is the best split of the batch; the sm90 kernel
//               then runs it without the balanced schedule's combine launch. A hint only: any value gives the
//               same result; false (the default) assumes nothing.
//   batch_invariant: each request's result is bit-identical whatever else is in the batch (PlannerConfig::
//               batch_invariant; a step plan passes its config's flag). The kernel then depends on the row
//               count s_q * h_q only, num_splits (which must be >= 1: a step plan's DecodeRun::num_splits,
//               e.g. batch_invariant_splits) cuts each request's own keys into that many equal ranges merged
//               in split order, and no schedule follows the batch; a CUDA workspace that cannot hold the
//               num_splits partials (or is not 16-byte aligned) is refused instead of running fewer splits. The
//               CPU backend splits each request's keys into fixed chunks of kBatchInvariantKeys.
//   fp8_compute: an fp8 per-tensor cache may be read with e4m3 products (q per query row and the softmax weights
//               rounded to e4m3 on the fp8 tensor cores): results within the fp8-compute bound of docs/SEMANTICS.md
//               §14.10 rather than the exact-code one. A permission, not a demand: where no such kernel runs (the
//               CPU, other formats, 32 rows or fewer per request, a batch-invariant call) the exact codes are read.
// Any page size >= 1, any h_q >= 1, any s_q >= 1. seq_len 0 (or no visible key) -> out 0, lse -inf.
void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse, double softmax_scale,
                bool causal = true, const TensorView& workspace = {}, const Context& ctx = {}, int num_splits = 0,
                bool whole_requests = false, bool batch_invariant = false, bool fp8_compute = false);
// Keys per split of the CPU backend's batch-invariant mqa_decode and sparse_mqa (a multiple of its 64-key blocks).
inline constexpr int64_t kBatchInvariantKeys = 1024;
// Scratch bytes to give mqa_decode for these sizes and num_splits (0 = the same default as mqa_decode's):
// the larger of the split-KV partials and, on sm90 for <= 32 query rows, the balanced schedule's partials
// (0 bytes on the CPU; a one-split call may be given less, down to none: see workspace above).
std::size_t mqa_decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, Device device,
                                       int num_splits = 0);
// Streaming multiprocessors of a CUDA device (cached after the first query; 0 for the CPU): pass it
// as PlannerConfig::num_sms.
int multiprocessor_count(Device device);
// Compute capability of a CUDA device, major * 10 + minor (cached; 0 for the CPU): pass it as
// PlannerConfig::compute_capability.
int compute_capability(Device device);

// ---------------------------------------------------------------------------------------------
// MHA prefill over up-projected K/V (varlen, §9-10).
//   q        [Tq, h, d_nope + d_rope]
//   k_nope   [Tk, h, d_nope]
//   k_pe     [Tk, h, d_rope]  head stride may be 0 (one rope row shared by all heads, as in MLA)
//   v        [Tk, h, d_v]
//   cu_seqlens_q, cu_seqlens_k [B+1] int32 (device of the tensors); max_seqlen_q/k: host bounds
//   out      [Tq, h, d_v]
//   lse      [h, Tq] fp32 optional (any strides)
//   causal: bottom-right aligned: query i of a request with lengths (sq, sk) sees keys j <= sk - sq + i.
void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale,
                 bool causal, const Context& ctx = {});

// fp8 compute of mha_prefill (SEMANTICS §10.1; vLLM's use_prefill_query_quantization). A default-constructed
// PrefillOptions is the op above, bit for bit.
//   fp8        q, k = [k_nope | k_pe] and v are quantised to e4m3 with the three per-tensor scales
//              (code = e4m3(x / scale)), S and P V run on the codes, P is quantised to e4m3 (256 p);
//              inputs and out keep their dtypes. CUDA: an sm_90 device and d_nope 128, d_rope 64, d_v 128
//              (the sm90_fp8 variant), else mla::Error; the CPU backend computes it in float64 over the
//              codes (the exact-codes oracle), any head dims.
//   q_scale, k_scale, v_scale  positive and finite (static, like vLLM's layer _q_scale / _k_scale / _v_scale)
//   workspace  CUDA fp8: u8, contiguous, 16-byte aligned, >= mha_prefill_workspace_bytes(...) (the quantised
//              q, k and transposed v); unused otherwise
struct PrefillOptions {
  bool fp8 = false;
  float q_scale = 1.0f, k_scale = 1.0f, v_scale = 1.0f;
  TensorView workspace{};
};
void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale,
                 bool causal, const PrefillOptions& opts, const Context& ctx = {});
// Workspace bytes of an fp8 mha_prefill with total_q query rows, total_k key rows, `heads` heads and `batch`
// requests (cu_seqlens of batch + 1 entries); 0 without fp8 or on the CPU.
std::size_t mha_prefill_workspace_bytes(int64_t total_q, int64_t total_k, int64_t heads, int64_t batch, bool fp8,
                                        Device device);

// ---------------------------------------------------------------------------------------------
// Sparse MQA over top-k rows (FlashMLA-sparse semantics, §11).
//   q           [T, h_q, d_qk]
//   kv          any cache format; row r = block r / page_size, offset r % page_size (a bf16 workspace
//               [rows, 576] is passed as KVCache{ws.reshape({1, rows, 576}), bf16})
//   indices     [T, topk] int32 rows; < 0 or >= kv.num_slots() invalid (never read); duplicates count twice
//   topk_length [T] int32 optional: entries at positions >= topk_length[t] are invalid
//   out         [T, h_q, d_v]
//   lse         [T, h_q] fp32 optional; a row with no valid index gives out 0, lse -inf [PIN]
void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const Context& ctx = {});

// DeepSeek-V4 inputs of sparse_mqa (SEMANTICS §11.8; docs/design/attention_portable.md "DeepSeek-V4 on
// `sparse_mqa`"). Every member is optional;
// a default-constructed SparseOptions is the V3.2 op above, bit for bit.
//
// A second paged cache attended in the same softmax as the main one (V4: the compressed cache beside the
// sliding window). It has its own page size, block count and strides, and the main cache's format,
// d_qk, d_rope (and, fp8, per-tensor scale).
//   kv          the extra cache; row r = block r / kv.page_size(), offset r % kv.page_size()
//   indices     [T, extra_topk] int32 rows of kv; < 0 or >= kv.num_slots() invalid (never read)
//   topk_length [T] int32 optional: entries at positions >= topk_length[t] are invalid
struct SparseExtraCache {
  KVCache kv{};
  TensorView indices{};
  TensorView topk_length{};
  bool defined() const { return indices.defined() || kv.data.defined(); }
};
// The output's rotary rotation (DeepSeek-V4: the values carry the keys' rope, K = V, and the block turns each
// head's output back by -position): the last rope_dim columns of out (d_v - rope_dim .. d_v - 1) rotated
// pairwise, pair i = columns (2i, 2i + 1) of them (interleaved, as DeepSeek's checkpoints), by the angle
// positions[t] * inv_freq[i]: (a, b) <- (a cos - b sin, b cos + a sin), the angle and its cos / sin in float64,
// applied to the float output before its one rounding. Equal to apply_rope(out, out, positions, inv_freq, 1,
// rope_dim, true) of the unrotated output but for that rounding. The LSE is unchanged.
//   positions [T] int32 / int64 (any sign)    inv_freq [rope_dim / 2] f64, contiguous; both on q's device
//   rope_dim even, in [2, d_v]; d_v even
struct SparseOutRotation {
  TensorView positions{};
  TensorView inv_freq{};
  int64_t rope_dim = 0;
  bool defined() const { return rope_dim != 0 || positions.defined() || inv_freq.defined(); }
};
struct SparseOptions {
  // [h_q] fp32: per-head logit (the units of score = (q . k) * softmax_scale) entering the softmax
  // denominator only, as a key of value 0: l_h = sum_j exp(s_hj - m) + exp(sink_h - m); out = sum_j
  // exp(s_hj - m) v_j / l_h; lse = m + ln l_h (includes the sink). No valid key: out 0, lse = sink_h;
  // sink -inf = no sink; a NaN sink makes its head's out and lse NaN.
  TensorView attn_sink{};
  SparseExtraCache extra{};
  // K = V over the whole row: out's d_v may go up to d_qk (values are the first d_v columns, rope
  // columns included; V4: d_qk = d_v = 512). false: d_v <= d_latent as above.
  bool values_include_rope = false;
  // Not a V4 input: each token's result bit-identical whatever else is in the call (PlannerConfig::
  // batch_invariant): the kernel depends on h_q only and a token's keys are never split by the number of
  // tokens (CUDA: one CTA per token and row tile; the CPU: fixed chunks of kBatchInvariantKeys).
  bool batch_invariant = false;
  // The output's rotation (SparseOutRotation); not with dcp_sparse_mqa.
  SparseOutRotation out_rotation{};

  bool any() const { return attn_sink.defined() || extra.defined() || values_include_rope || out_rotation.defined(); }
};
// sparse_mqa with DeepSeek-V4 inputs: token t's keys are its valid main rows followed by its valid extra
// rows, all in one softmax (duplicates within and across the two lists count as separate keys).
void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const SparseOptions& opts,
                const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Matrix products (row-major views with strides; the CUDA backend needs each matrix to have a unit
// stride in one of its two dims). c = alpha * a @ b + beta * c; accumulation fp32 (fp64 in reference mode).
// dtypes: CPU any float dtype; CUDA a and b bf16, c bf16 or f32.
//   gemm: a [m, k], b [k, n], c [m, n]
//   bmm:  a [batch, m, k], b [batch, k, n], c [batch, m, n]
void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha = 1.0f, float beta = 0.0f,
          const Context& ctx = {});
void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha = 1.0f, float beta = 0.0f,
         const Context& ctx = {});

}  // namespace mla
