// SPDX-License-Identifier: Apache-2.0
// CPU top-k index conversion (semantics §11.3): request-local positions -> flat cache rows, or
// prefill-workspace rows for tokens that read the workspace.
#include <algorithm>
#include <cstdint>

#include "cpu/cpu_ops.h"
#include "core/index_view.h"

namespace mla::cpu {

void convert_topk_indices(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,
                          const TensorView& out, int64_t page_size, int64_t block_stride_rows,
                          const TensorView& prefill_request_ids, const TensorView& prefill_workspace_starts,
                          const TensorView& valid_counts, const TensorView& seq_lens, const Context&) {
  const int64_t T = indices.size(0), K = indices.size(1), max_blocks = block_table.size(1);
  const int64_t stride_rows = block_stride_rows == 0 ? page_size : block_stride_rows;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pid = prefill_request_ids.defined() ? index_at(prefill_request_ids, t) : -1;
    const int64_t ws_start = pid >= 0 ? index_at(prefill_workspace_starts, pid) : 0;
    int32_t* o = static_cast<int32_t*>(out.data) + t * out.stride[0];
    // Positions at or past the request's length are invalid (the front end checked req_id then).
    const int64_t limit = seq_lens.defined() ? index_at(seq_lens, index_at(req_id, t)) : INT64_MAX;
    int32_t valid = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t idx = index_at(indices, t, k);
      int64_t row = -1;
      if (idx >= 0 && idx < limit) {
        if (pid >= 0) {
          row = ws_start + idx;  // workspace rows: no block-table bound check [PIN]
        } else if (idx / page_size < max_blocks) {
          row = index_at(block_table, index_at(req_id, t), idx / page_size) * stride_rows + idx % page_size;
        }
      }
      if (row > INT32_MAX) row = -1;  // not representable in the int32 output: invalid, never a wrapped row
      o[k * out.stride[1]] = static_cast<int32_t>(row);
      valid += row >= 0 ? 1 : 0;
    }
    if (valid_counts.defined()) static_cast<int32_t*>(valid_counts.data)[t * valid_counts.stride[0]] = valid;
  }
}

namespace {

// The owner test and local position of §13 for one rank: position p of a request of `limit` positions as this
// rank's local position, or -1 (p outside [0, limit) or owned by another rank).
struct RankPositions {
  int64_t world_size, rank, interleave;
  int64_t local(int64_t p, int64_t limit) const {
    if (p < 0 || p >= limit || (p / interleave) % world_size != rank) return -1;
    return p / (world_size * interleave) * interleave + p % interleave;
  }
};

// Token t's request length: seq_lens[req_id[t]], 0 for a request id outside [0, R).
int64_t request_limit(const TensorView& req_id, const TensorView& seq_lens, int64_t t) {
  const int64_t req = index_at(req_id, t);
  return req >= 0 && req < seq_lens.size(0) ? index_at(seq_lens, req) : 0;
}

}  // namespace

// dcp_localize_topk (mla/dcp.h): the owner test and local position of §13, per entry.
void dcp_localize_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                       const TensorView& out, int world_size, int rank, int interleave, const Context&) {
  const int64_t T = indices.size(0), K = indices.size(1);
  const RankPositions rp{world_size, rank, interleave};
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t limit = request_limit(req_id, seq_lens, t);
    const int32_t* in = static_cast<const int32_t*>(indices.data) + t * indices.stride[0];
    int32_t* o = static_cast<int32_t*>(out.data) + t * out.stride[0];
    for (int64_t k = 0; k < K; ++k) o[k] = static_cast<int32_t>(rp.local(in[k], limit));
  }
}

// dcp_compact_topk (mla/dcp.h): the owner test of §13 on the entries below the valid length, the kept ones'
// local positions packed at the front in their order, -1 after them, their count.
void dcp_compact_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                      const TensorView& topk_length, const TensorView& out, const TensorView& valid_counts,
                      int world_size, int rank, int interleave, const Context&) {
  const int64_t T = indices.size(0), K = indices.size(1);
  const RankPositions rp{world_size, rank, interleave};
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t limit = request_limit(req_id, seq_lens, t);
    const int64_t len = topk_length.defined() ? std::clamp<int64_t>(index_at(topk_length, t), 0, K) : K;
    const int32_t* in = static_cast<const int32_t*>(indices.data) + t * indices.stride[0];
    int32_t* o = static_cast<int32_t*>(out.data) + t * out.stride[0];
    int64_t n = 0;
    for (int64_t k = 0; k < len; ++k) {
      const int64_t q = rp.local(in[k], limit);
      if (q >= 0) o[n++] = static_cast<int32_t>(q);
    }
    for (int64_t k = n; k < K; ++k) o[k] = -1;
    static_cast<int32_t*>(valid_counts.data)[t * valid_counts.stride[0]] = static_cast<int32_t>(n);
  }
}

}  // namespace mla::cpu
