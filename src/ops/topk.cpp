// SPDX-License-Identifier: Apache-2.0
// Front end of convert_topk_indices (semantics §11.3): validation, then backend dispatch.
#include <limits>

#include "core/index_view.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {
namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

void check_index_matrix(const TensorView& t, int64_t rows, int64_t cols, bool is_output, const char* op,
                        const char* arg) {
  detail::check_ndim(t, 2, op, arg);
  detail::check_dtype(t, DType::i32, op, arg);
  detail::check_size(t, 0, rows, op, arg);
  if (cols >= 0) detail::check_size(t, 1, cols, op, arg);
  detail::check_inner_contiguous(t, op, arg);
  detail::check_strides(t, is_output, op, arg);
}

// CPU: request and prefill ids name existing rows, and every output fits int32 (the output dtype).
// Workspace rows get no block-table bound check [PIN], but they still must be representable.
// With seq_lens, req_id must name a table row for every token, and positions >= the request's length
// are invalid (never checked further: their block-table columns may hold anything).
void check_topk_values(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,
                       int64_t page_size, int64_t stride_rows, const TensorView& prefill_ids,
                       const TensorView& ws_starts, const TensorView& seq_lens, const char* op) {
  const int64_t T = indices.size(0), K = indices.size(1), max_blocks = block_table.size(1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pid = prefill_ids.defined() ? index_at(prefill_ids, t) : -1;
    int64_t limit = std::numeric_limits<int64_t>::max();
    if (seq_lens.defined()) {
      const int64_t req = index_at(req_id, t);
      MLA_CHECK(0 <= req && req < block_table.size(0), "{}: req_id[{}] = {} names no row of block_table {}", op, t,
                req, block_table.describe());
      limit = index_at(seq_lens, req);
    }
    if (pid >= 0) {
      MLA_CHECK(pid < ws_starts.size(0),
                "{}: prefill_request_ids[{}] = {} names no entry of prefill_workspace_starts ({} entries)", op, t, pid,
                ws_starts.size(0));
      const int64_t start = index_at(ws_starts, pid);
      MLA_CHECK(start >= 0, "{}: prefill_workspace_starts[{}] must be >= 0, got {}", op, pid, start);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t idx = index_at(indices, t, k);
        MLA_CHECK(idx < 0 || idx >= limit || start + idx <= kI32Max,
                  "{}: workspace row {} + {} of token {} does not fit the int32 output", op, start, idx, t);
      }
      continue;
    }
    const int64_t req = index_at(req_id, t);
    MLA_CHECK(0 <= req && req < block_table.size(0), "{}: req_id[{}] = {} names no row of block_table {}", op, t, req,
              block_table.describe());
    for (int64_t k = 0; k < K; ++k) {
      const int64_t idx = index_at(indices, t, k);
      if (idx < 0 || idx >= limit || idx / page_size >= max_blocks) continue;
      const int64_t row = index_at(block_table, req, idx / page_size) * stride_rows + idx % page_size;
      MLA_CHECK(row <= kI32Max && row >= std::numeric_limits<int32_t>::min(),
                "{}: cache row {} of token {} (index {}) does not fit the int32 output", op, row, t, idx);
    }
  }
}

}  // namespace

void convert_topk_indices(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,
                          const TensorView& out, int64_t page_size, int64_t block_stride_rows,
                          const TensorView& prefill_request_ids, const TensorView& prefill_workspace_starts,
                          const TensorView& valid_counts, const TensorView& seq_lens, const Context& ctx) {
  constexpr const char* op = "convert_topk_indices";
  detail::check_ndim(indices, 2, op, "indices [T, topk]");
  const int64_t T = indices.size(0), K = indices.size(1);
  const Device dev = indices.device;
  check_index_matrix(indices, T, K, false, op, "indices [T, topk]");
  check_index_matrix(out, T, K, true, op, "out [T, topk]");
  detail::check_i32_vector(req_id, T, op, "req_id [T] (must cover the same tokens as indices)");
  detail::check_block_table(block_table, 0, op);
  MLA_CHECK(page_size >= 1, "{}: page_size must be >= 1, got {}", op, page_size);
  MLA_CHECK(block_stride_rows == 0 || (block_stride_rows >= page_size && block_stride_rows <= INT32_MAX),
            "{}: block_stride_rows must be 0 (= page_size) or in [page_size {}, 2^31 - 1] (rows are int32), got {}", op,
            page_size, block_stride_rows);
  MLA_CHECK(page_size <= INT32_MAX, "{}: page_size must be <= 2^31 - 1 (rows are int32), got {}", op, page_size);
  MLA_CHECK(prefill_request_ids.defined() == prefill_workspace_starts.defined(),
            "{}: prefill_request_ids and prefill_workspace_starts are given together or not at all", op);
  if (prefill_request_ids.defined()) {
    detail::check_i32_vector(prefill_request_ids, T, op, "prefill_request_ids [T]");
    detail::check_i32_vector(prefill_workspace_starts, -1, op, "prefill_workspace_starts [P]");
  }
  if (seq_lens.defined())
    detail::check_i32_vector(seq_lens, block_table.size(0), op, "seq_lens [R] (one per block_table row)");
  if (valid_counts.defined()) {
    detail::check_i32_vector(valid_counts, T, op, "valid_counts [T]");
    detail::check_strides(valid_counts, true, op, "valid_counts [T]");
  }
  detail::check_devices(dev, op,
                         {{out, "out"}, {req_id, "req_id"}, {block_table, "block_table"},
                          {prefill_request_ids, "prefill_request_ids"},
                          {prefill_workspace_starts, "prefill_workspace_starts"}, {valid_counts, "valid_counts"},
                          {seq_lens, "seq_lens"}});
  const int64_t stride_rows = block_stride_rows == 0 ? page_size : block_stride_rows;
  if (dev.is_cpu())
    check_topk_values(req_id, block_table, indices, page_size, stride_rows, prefill_request_ids,
                      prefill_workspace_starts, seq_lens, op);
  if (T == 0) return;
  MLA_DISPATCH(dev, convert_topk_indices, req_id, block_table, indices, out, page_size, stride_rows,
               prefill_request_ids, prefill_workspace_starts, valid_counts, seq_lens, ctx);
}

namespace {

// The checks dcp_localize_topk and dcp_compact_topk share: the layout, indices and out [T, topk] (out writable and
// not aliasing indices), req_id [T], seq_lens [R].
void check_dcp_topk_args(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                         const TensorView& out, const DcpLayout& layout, const char* op) {
  validate_dcp_layout(layout);
  detail::check_ndim(indices, 2, op, "indices [T, topk]");
  const int64_t T = indices.size(0), K = indices.size(1);
  check_index_matrix(indices, T, K, false, op, "indices [T, topk]");
  check_index_matrix(out, T, K, true, op, "out [T, topk]");
  MLA_CHECK(T == 0 || K == 0 || out.data != indices.data, "{}: out must not alias indices", op);
  detail::check_i32_vector(req_id, T, op, "req_id [T]");
  detail::check_i32_vector(seq_lens, -1, op, "seq_lens [R]");
}

}  // namespace

void dcp_localize_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                       const TensorView& out, const DcpLayout& layout, const Context& ctx) {
  constexpr const char* op = "dcp_localize_topk";
  check_dcp_topk_args(req_id, seq_lens, indices, out, layout, op);
  const int64_t T = indices.size(0), K = indices.size(1);
  const Device dev = indices.device;
  detail::check_devices(dev, op, {{out, "out"}, {req_id, "req_id"}, {seq_lens, "seq_lens"}});
  if (T == 0 || K == 0) return;
  MLA_DISPATCH(dev, dcp_localize_topk, req_id, seq_lens, indices, out, layout.world_size, layout.rank,
               layout.interleave, ctx);
}

void dcp_compact_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                      const TensorView& topk_length, const TensorView& out, const TensorView& valid_counts,
                      const DcpLayout& layout, const Context& ctx) {
  constexpr const char* op = "dcp_compact_topk";
  check_dcp_topk_args(req_id, seq_lens, indices, out, layout, op);
  const int64_t T = indices.size(0);
  const Device dev = indices.device;
  if (topk_length.defined()) detail::check_i32_vector(topk_length, T, op, "topk_length [T]");
  detail::check_i32_vector(valid_counts, T, op, "valid_counts [T]");
  detail::check_strides(valid_counts, true, op, "valid_counts [T]");
  detail::check_devices(dev, op,
                         {{out, "out"}, {req_id, "req_id"}, {seq_lens, "seq_lens"}, {topk_length, "topk_length"},
                          {valid_counts, "valid_counts"}});
  if (T == 0) return;
  MLA_DISPATCH(dev, dcp_compact_topk, req_id, seq_lens, indices, topk_length, out, valid_counts, layout.world_size,
               layout.rank, layout.interleave, ctx);
}

}  // namespace mla
