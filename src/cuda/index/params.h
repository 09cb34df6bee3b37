// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of convert_topk_indices (semantics §11.3). Strides in elements, 64-bit.
#include <cstdint>

namespace mla::cuda::index {

struct TopkParams {
  const int32_t* req_id;        // [T], stride req_stride: row of block_table of each token
  const int32_t* block_table;   // [num_table_rows, max_blocks], row stride bt_stride, unit inner stride
  const int32_t* indices;       // [T, topk], row stride idx_stride: request-local positions, < 0 invalid
  int32_t* out;                 // [T, topk], row stride out_stride
  const int32_t* ws_request;    // [T] prefill_request_ids or nullptr, stride ws_request_stride
  const int32_t* ws_starts;     // [num_ws] prefill_workspace_starts, stride ws_starts_stride
  int32_t* valid;               // [T] valid counts or nullptr, stride valid_stride
  const int32_t* seq_lens;      // [num_table_rows] or nullptr, stride seq_lens_stride: positions >= the
                                // token's request length are invalid (req_id then read for every token)
  int64_t seq_lens_stride;
  int64_t req_stride, bt_stride, idx_stride, out_stride, ws_request_stride, ws_starts_stride, valid_stride;
  int64_t num_tokens, topk, num_table_rows, max_blocks, num_ws;
  int64_t page_size, block_stride_rows;
};

}  // namespace mla::cuda::index
