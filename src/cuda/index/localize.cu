// SPDX-License-Identifier: Apache-2.0
// dcp_localize_topk on CUDA (mla/dcp.h, semantics §13): per top-k entry, the owner test
// (p / I) % W == rank and the local position (p / (W·I))·I + p % I, -1 for other ranks' positions,
// negative entries and positions at or past the request's length. One thread per entry, grid-stride;
// 64-bit index math. Memory-bound and tiny beside the attention it feeds.
#include <cstdint>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

struct LocalizeParams {
  const int32_t* req_id;   // [T], stride req_stride
  const int32_t* seq_lens; // [R], stride len_stride
  const int32_t* indices;  // [T, K], row stride in_stride
  int32_t* out;            // [T, K], row stride out_stride
  int64_t req_stride, len_stride, in_stride, out_stride, num_tokens, topk, num_reqs;
  int world, rank, interleave;
};

__global__ void localize_kernel(LocalizeParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int64_t n = p.num_tokens * p.topk, turn = int64_t(p.world) * p.interleave;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.topk, k = i - t * p.topk;
    const int64_t req = p.req_id[t * p.req_stride];
    const int64_t limit = req >= 0 && req < p.num_reqs ? p.seq_lens[req * p.len_stride] : 0;
    const int64_t pos = p.indices[t * p.in_stride + k];
    const bool mine = pos >= 0 && pos < limit && (pos / p.interleave) % p.world == p.rank;
    p.out[t * p.out_stride + k] = mine ? static_cast<int32_t>(pos / turn * p.interleave + pos % p.interleave) : -1;
  }
}

}  // namespace

void dcp_localize_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                       const TensorView& out, int world_size, int rank, int interleave, const Context& ctx) {
  DeviceGuard guard(indices.device);
  LocalizeParams p{};
  p.req_id = static_cast<const int32_t*>(req_id.data);
  p.seq_lens = static_cast<const int32_t*>(seq_lens.data);
  p.indices = static_cast<const int32_t*>(indices.data);
  p.out = static_cast<int32_t*>(out.data);
  p.req_stride = req_id.stride[0];
  p.len_stride = seq_lens.stride[0];
  p.in_stride = indices.stride[0];
  p.out_stride = out.stride[0];
  p.num_tokens = indices.size(0);
  p.topk = indices.size(1);
  p.num_reqs = seq_lens.size(0);
  p.world = world_size;
  p.rank = rank;
  p.interleave = interleave;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.num_tokens * p.topk + kThreads - 1) / kThreads, 4096);
  launch_kernel(localize_kernel, grid_for(blocks, 1, "dcp_localize_topk"), kThreads, 0, stream_of(ctx), ctx.pdl,
                "dcp_localize_topk", p);
}

}  // namespace mla::cuda
