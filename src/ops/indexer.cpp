// SPDX-License-Identifier: Apache-2.0
// Front ends of the lightning-indexer ops (mla/indexer.h, docs/INDEXER.md): validation, then backend
// dispatch. Everything is checked before the backend runs, so a rejected call writes nothing.
#include <algorithm>
#include <cmath>
#include <utility>
#include <limits>

#include "core/checked.h"
#include "core/index_view.h"
#include "mla/indexer.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {
namespace {

// e4m3 codes (u8 accepted: the same bytes), [..., 128] with a unit inner stride.
void check_codes(const TensorView& t, int ndim, const char* op, const char* arg) {
  detail::check_ndim(t, ndim, op, arg);
  MLA_CHECK(t.dtype == DType::fp8_e4m3 || t.dtype == DType::u8, "{}: {} must hold e4m3 codes (fp8_e4m3 or u8), got {}",
            op, arg, t.describe());
  detail::check_size(t, ndim - 1, kIndexerHeadDim, op, arg);
  detail::check_inner_contiguous(t, op, arg);
  detail::check_strides(t, false, op, arg);
}

void check_f32(const TensorView& t, int ndim, bool is_output, const char* op, const char* arg) {
  detail::check_ndim(t, ndim, op, arg);
  detail::check_dtype(t, DType::f32, op, arg);
  if (ndim > 1) detail::check_inner_contiguous(t, op, arg);
  detail::check_strides(t, is_output, op, arg);
}

// t has exactly `shape`.
void check_shape(const TensorView& t, std::initializer_list<int64_t> shape, const char* op, const char* arg) {
  detail::check_ndim(t, static_cast<int>(shape.size()), op, arg);
  int d = 0;
  for (int64_t n : shape) detail::check_size(t, d++, n, op, arg);
}
void check_activation_shape(const TensorView& t, std::initializer_list<int64_t> shape, bool is_output, const char* op,
                            const char* arg) {
  check_shape(t, shape, op, arg);
  detail::check_activation(t, is_output, op, arg, detail::CudaActivations::bf16_f16_f32);
}
void check_f32_shape(const TensorView& t, std::initializer_list<int64_t> shape, bool is_output, const char* op,
                     const char* arg) {
  check_shape(t, shape, op, arg);
  check_f32(t, static_cast<int>(shape.size()), is_output, op, arg);
}

// q [T, h, 128] codes and weights [T, h] f32; returns T.
int64_t check_queries(const TensorView& q, const TensorView& weights, const char* op) {
  check_codes(q, 3, op, "q [T, h, 128]");
  MLA_CHECK(q.size(1) >= 1, "{}: q needs h >= 1 heads, got {}", op, q.describe());
  check_f32(weights, 2, false, op, "weights [T, h]");
  detail::check_size(weights, 0, q.size(0), op, "weights (one row per query row)");
  detail::check_size(weights, 1, q.size(1), op, "weights (one weight per head)");
  return q.size(0);
}

}  // namespace

void indexer_write_k(const TensorView& k, const TensorView& slot_mapping, const IndexerKCache& cache,
                     IndexerScale scale, const Context& ctx) {
  constexpr const char* op = "indexer_write_k";
  validate_indexer_cache(cache, op);
  check_indexer_scale(scale, op);
  const Device dev = cache.data.device;
  detail::check_ndim(k, 2, op, "k [T, 128]");
  detail::check_activation(k, false, op, "k", detail::CudaActivations::bf16_f16_f32);
  detail::check_size(k, 1, kIndexerHeadDim, op, "k");
  detail::check_ndim(slot_mapping, 1, op, "slot_mapping");
  detail::check_index(slot_mapping, op, "slot_mapping");
  detail::check_strides(slot_mapping, false, op, "slot_mapping");
  MLA_CHECK(slot_mapping.size(0) <= k.size(0), "{}: slot_mapping names {} tokens but k holds only {} rows ({})", op,
            slot_mapping.size(0), k.size(0), k.describe());
  detail::check_devices(dev, op, {{k, "k"}, {slot_mapping, "slot_mapping"}});
  if (dev.is_cpu()) detail::check_slot_values(slot_mapping, cache.num_slots(), op);
  if (slot_mapping.size(0) == 0) return;
  MLA_DISPATCH(dev, indexer_write_k, k, slot_mapping, cache, scale, ctx);
}

void indexer_gather_k(const IndexerKCache& cache, const TensorView& dst_k, const TensorView& dst_scale,
                      const TensorView& block_table, const TensorView& cu_seq_lens, const Context& ctx) {
  constexpr const char* op = "indexer_gather_k";
  validate_indexer_cache(cache, op);
  const Device dev = cache.data.device;
  check_codes(dst_k, 2, op, "dst_k [TOT, 128]");
  detail::check_strides(dst_k, true, op, "dst_k");
  check_f32(dst_scale, 1, true, op, "dst_scale [TOT]");
  detail::check_size(dst_scale, 0, dst_k.size(0), op, "dst_scale (one scale per dst_k row)");
  detail::check_i32_vector(cu_seq_lens, -1, op, "cu_seq_lens [B+1]");
  MLA_CHECK(cu_seq_lens.size(0) >= 1, "{}: cu_seq_lens needs B+1 >= 1 entries, got {}", op, cu_seq_lens.describe());
  const int64_t b = cu_seq_lens.size(0) - 1;
  detail::check_block_table(block_table, b, op);
  detail::check_devices(dev, op,
                        {{dst_k, "dst_k"}, {dst_scale, "dst_scale"}, {block_table, "block_table"},
                         {cu_seq_lens, "cu_seq_lens"}});
  if (dev.is_cpu()) {
    detail::check_cu_seqlens_values(cu_seq_lens, dst_k.size(0), op, "cu_seq_lens");
    for (int64_t r = 0; r < b; ++r) {
      const int64_t len = index_at(cu_seq_lens, r + 1) - index_at(cu_seq_lens, r);
      MLA_CHECK(len <= block_table.size(1) * cache.page_size(),
                "{}: request {} gathers {} positions but its block_table row covers {} ({} blocks of {})", op, r, len,
                block_table.size(1) * cache.page_size(), block_table.size(1), cache.page_size());
      detail::check_block_ids(block_table, r, 0, len, cache.page_size(), cache.num_blocks(), op);
    }
  }
  if (dst_k.size(0) == 0 || b == 0) return;
  MLA_DISPATCH(dev, indexer_gather_k, cache, dst_k, dst_scale, block_table, cu_seq_lens, ctx);
}

void indexer_logits_prefill(const TensorView& q, const TensorView& weights, const TensorView& k,
                            const TensorView& k_scale, const TensorView& row_starts, const TensorView& row_ends,
                            const TensorView& logits, const Context& ctx) {
  constexpr const char* op = "indexer_logits_prefill";
  const int64_t T = check_queries(q, weights, op);
  check_codes(k, 2, op, "k [Tk, 128]");
  const int64_t Tk = k.size(0);
  check_f32(k_scale, 1, false, op, "k_scale [Tk]");
  detail::check_size(k_scale, 0, Tk, op, "k_scale (one scale per key)");
  detail::check_i32_vector(row_starts, T, op, "row_starts [T]");
  detail::check_i32_vector(row_ends, T, op, "row_ends [T]");
  check_f32(logits, 2, true, op, "logits [T, Tk]");
  detail::check_size(logits, 0, T, op, "logits");
  detail::check_size(logits, 1, Tk, op, "logits (one column per key)");
  detail::check_devices(q.device, op,
                        {{weights, "weights"}, {k, "k"}, {k_scale, "k_scale"}, {row_starts, "row_starts"},
                         {row_ends, "row_ends"}, {logits, "logits"}});
  if (T == 0 || Tk == 0) return;
  MLA_DISPATCH(q.device, indexer_logits_prefill, q, weights, k, k_scale, row_starts, row_ends, logits, ctx);
}

void indexer_logits_decode(const TensorView& q, const TensorView& weights, const IndexerKCache& cache,
                           const TensorView& block_table, const TensorView& seq_lens, int64_t s_q,
                           const TensorView& logits, const Context& ctx) {
  constexpr const char* op = "indexer_logits_decode";
  validate_indexer_cache(cache, op);
  const int64_t T = check_queries(q, weights, op);
  MLA_CHECK(s_q >= 1, "{}: s_q must be >= 1, got {}", op, s_q);
  detail::check_i32_vector(seq_lens, -1, op, "seq_lens [b]");
  const int64_t b = seq_lens.size(0);
  MLA_CHECK(T == detail::checked_mul(b, s_q, "b * s_q"), "{}: q holds {} rows but b * s_q = {} * {} ({})", op, T, b,
            s_q, q.describe());
  detail::check_block_table(block_table, b, op);
  check_f32(logits, 2, true, op, "logits [b * s_q, N]");
  detail::check_size(logits, 0, T, op, "logits");
  detail::check_devices(cache.data.device, op,
                        {{q, "q"}, {weights, "weights"}, {block_table, "block_table"}, {seq_lens, "seq_lens"},
                         {logits, "logits"}});
  if (cache.data.device.is_cpu()) {
    const int64_t cap = block_table.size(1) * cache.page_size();
    for (int64_t r = 0; r < b; ++r) {
      const int64_t len = index_at(seq_lens, r);
      MLA_CHECK(0 <= len && len <= cap, "{}: seq_lens[{}] = {} must lie in [0, max_blocks * page_size = {}]", op, r,
                len, cap);
      MLA_CHECK(len <= logits.size(1), "{}: seq_lens[{}] = {} is past the logits width {} ({})", op, r, len,
                logits.size(1), logits.describe());
      detail::check_block_ids(block_table, r, 0, len, cache.page_size(), cache.num_blocks(), op);
    }
  }
  if (T == 0 || logits.size(1) == 0) return;
  MLA_DISPATCH(cache.data.device, indexer_logits_decode, q, weights, cache, block_table, seq_lens, s_q, logits, ctx);
}

void indexer_prepare(const TensorView& q, const TensorView& k, const TensorView& weights_raw,
                     const TensorView& positions, const TensorView& cos_sin, const TensorView& k_norm_weight,
                     const TensorView& k_norm_bias, const TensorView& q_codes, const TensorView& weights,
                     const TensorView& k_out, double eps, bool hadamard, const Context& ctx) {
  constexpr const char* op = "indexer_prepare";
  detail::check_ndim(q, 3, op, "q [T, h, 128]");
  const int64_t T = q.size(0), h = q.size(1), D = kIndexerHeadDim;
  MLA_CHECK(h >= 1, "{}: q needs h >= 1 heads, got {}", op, q.describe());
  check_activation_shape(q, {T, h, D}, false, op, "q [T, h, 128]");
  check_activation_shape(k, {T, D}, false, op, "k [T, 128]");
  check_activation_shape(weights_raw, {T, h}, false, op, "weights_raw [T, h]");
  check_activation_shape(k_out, {T, D}, true, op, "k_out [T, 128]");
  detail::check_ndim(positions, 1, op, "positions [T]");
  detail::check_index(positions, op, "positions");
  detail::check_size(positions, 0, T, op, "positions");
  detail::check_strides(positions, false, op, "positions");
  check_f32(cos_sin, 2, false, op, "cos_sin [P, 64] (32 cos then 32 sin per position)");
  detail::check_size(cos_sin, 1, 64, op, "cos_sin [P, 64] (32 cos then 32 sin per position)");
  check_f32_shape(k_norm_weight, {D}, false, op, "k_norm_weight [128]");
  check_f32_shape(k_norm_bias, {D}, false, op, "k_norm_bias [128]");
  check_codes(q_codes, 3, op, "q_codes [T, h, 128]");
  detail::check_strides(q_codes, true, op, "q_codes [T, h, 128]");
  check_f32_shape(weights, {T, h}, true, op, "weights [T, h]");
  detail::check_size(q_codes, 0, T, op, "q_codes [T, h, 128]");
  detail::check_size(q_codes, 1, h, op, "q_codes [T, h, 128]");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&weights_raw, "weights_raw"}, std::pair{&k_out, "k_out"}})
    detail::check_same_dtype_on_cuda(*t, q, op, name, "q");
  MLA_CHECK(eps > 0 && std::isfinite(eps), "{}: eps must be positive and finite, got {}", op, eps);
  detail::check_devices(q.device, op,
                        {{k, "k"}, {weights_raw, "weights_raw"}, {positions, "positions"}, {cos_sin, "cos_sin"},
                         {k_norm_weight, "k_norm_weight"}, {k_norm_bias, "k_norm_bias"}, {q_codes, "q_codes"},
                         {weights, "weights"}, {k_out, "k_out"}});
  if (q.device.is_cpu())
    detail::check_values_in_range(positions, 0, cos_sin.size(0) - 1, op, "positions (rows of cos_sin)");
  if (T == 0) return;
  MLA_DISPATCH(q.device, indexer_prepare, q, k, weights_raw, positions, cos_sin, k_norm_weight, k_norm_bias, q_codes,
               weights, k_out, eps, hadamard, ctx);
}

namespace {

void check_topk_common(const TensorView& logits, const TensorView& out, const char* op) {
  check_f32(logits, 2, false, op, "logits [T, N]");
  detail::check_ndim(out, 2, op, "out [T, k]");
  detail::check_dtype(out, DType::i32, op, "out [T, k]");
  detail::check_size(out, 0, logits.size(0), op, "out (one row per logits row)");
  MLA_CHECK(out.size(1) >= 1, "{}: out needs k >= 1 columns, got {}", op, out.describe());
  detail::check_inner_contiguous(out, op, "out");
  detail::check_strides(out, true, op, "out");
  MLA_CHECK(logits.size(1) <= std::numeric_limits<int32_t>::max(),
            "{}: logits rows of {} columns do not fit int32 positions", op, logits.size(1));
}

}  // namespace

void indexer_topk(const TensorView& logits, const TensorView& row_starts, const TensorView& row_ends,
                  const TensorView& out, const Context& ctx) {
  constexpr const char* op = "indexer_topk";
  check_topk_common(logits, out, op);
  const int64_t T = logits.size(0), N = logits.size(1);
  if (row_starts.defined()) detail::check_i32_vector(row_starts, T, op, "row_starts [T]");
  detail::check_i32_vector(row_ends, T, op, "row_ends [T]");
  detail::check_devices(logits.device, op, {{row_starts, "row_starts"}, {row_ends, "row_ends"}, {out, "out"}});
  if (logits.device.is_cpu()) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = row_starts.defined() ? index_at(row_starts, t) : 0, e = index_at(row_ends, t);
      if (e <= s) continue;
      MLA_CHECK(s >= 0 && e <= N, "{}: row {} considers columns [{}, {}) outside the {} columns of logits", op, t, s,
                e, N);
    }
  }
  if (T == 0) return;
  MLA_DISPATCH(logits.device, indexer_topk_rows, logits, row_starts, row_ends, TensorView{}, int64_t{1}, out, ctx);
}

void indexer_topk_decode(const TensorView& logits, const TensorView& seq_lens, int64_t s_q, const TensorView& out,
                         const Context& ctx) {
  constexpr const char* op = "indexer_topk_decode";
  check_topk_common(logits, out, op);
  const int64_t T = logits.size(0);
  MLA_CHECK(s_q >= 1, "{}: s_q must be >= 1, got {}", op, s_q);
  detail::check_i32_vector(seq_lens, -1, op, "seq_lens [b]");
  MLA_CHECK(T == detail::checked_mul(seq_lens.size(0), s_q, "b * s_q"),
            "{}: logits holds {} rows but b * s_q = {} * {}", op, T, seq_lens.size(0), s_q);
  detail::check_devices(logits.device, op, {{seq_lens, "seq_lens"}, {out, "out"}});
  if (logits.device.is_cpu())
    detail::check_values_in_range(seq_lens, std::numeric_limits<int32_t>::min(), logits.size(1), op,
                                  "seq_lens (at most the logits width)");
  if (T == 0) return;
  MLA_DISPATCH(logits.device, indexer_topk_rows, logits, TensorView{}, TensorView{}, seq_lens, s_q, out, ctx);
}

}  // namespace mla
