// SPDX-License-Identifier: Apache-2.0
// Launcher of convert_topk_indices: one block per token row (grid.x = T).
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"
#include "cuda/index/kernel.cuh"

namespace mla::cuda {

void convert_topk_indices(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,
                          const TensorView& out, int64_t page_size, int64_t block_stride_rows,
                          const TensorView& prefill_request_ids, const TensorView& prefill_workspace_starts,
                          const TensorView& valid_counts, const TensorView& seq_lens, const Context& ctx) {
  constexpr int kThreads = 128;
  DeviceGuard guard(indices.device);
  index::TopkParams p{};
  p.req_id = static_cast<const int32_t*>(req_id.data);
  p.req_stride = req_id.stride[0];
  p.block_table = static_cast<const int32_t*>(block_table.data);
  p.bt_stride = block_table.stride[0];
  p.num_table_rows = block_table.size(0);
  p.max_blocks = block_table.size(1);
  p.indices = static_cast<const int32_t*>(indices.data);
  p.idx_stride = indices.stride[0];
  p.out = static_cast<int32_t*>(out.data);
  p.out_stride = out.stride[0];
  if (prefill_request_ids.defined()) {
    p.ws_request = static_cast<const int32_t*>(prefill_request_ids.data);
    p.ws_request_stride = prefill_request_ids.stride[0];
    p.ws_starts = static_cast<const int32_t*>(prefill_workspace_starts.data);
    p.ws_starts_stride = prefill_workspace_starts.stride[0];
    p.num_ws = prefill_workspace_starts.size(0);
  }
  if (valid_counts.defined()) {
    p.valid = static_cast<int32_t*>(valid_counts.data);
    p.valid_stride = valid_counts.stride[0];
  }
  p.num_tokens = indices.size(0);
  p.topk = indices.size(1);
  p.seq_lens = seq_lens.defined() ? static_cast<const int32_t*>(seq_lens.data) : nullptr;
  p.seq_lens_stride = seq_lens.defined() ? seq_lens.stride[0] : 0;
  p.page_size = page_size;
  p.block_stride_rows = block_stride_rows == 0 ? page_size : block_stride_rows;
  if (p.num_tokens == 0) return;
  const unsigned grid = grid_for(p.num_tokens, 1, "convert_topk_indices");
  const bool vec = p.topk % 4 == 0 && dev::aligned_to(p.indices, 16) && dev::aligned_to(p.out, 16) &&
                   (p.num_tokens == 1 || (p.idx_stride % 4 == 0 && p.out_stride % 4 == 0));
  launch_kernel(vec ? index::convert_topk_kernel<true, kThreads> : index::convert_topk_kernel<false, kThreads>, grid,
                kThreads, 0, stream_of(ctx), ctx.pdl, "convert_topk_indices", p);
}

}  // namespace mla::cuda
