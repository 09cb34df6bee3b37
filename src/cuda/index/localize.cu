// SPDX-License-Identifier: Apache-2.0
// dcp_localize_topk on CUDA (mla/dcp.h, semantics §13): per top-k entry, the owner test
// (p / I) % W == rank and the local position (p / (W·I))·I + p % I, -1 for other ranks' positions,
// negative entries and positions at or past the request's length. One thread per entry, grid-stride;
// 64-bit index math. Memory-bound and tiny beside the attention it feeds.
// dcp_compact_topk: the same test on the entries below the token's valid length, the kept local positions
// packed at the front of the row in their order (a warp per token: 32 entries a step, ballot + popc give each
// kept entry its place), -1 after them, and the count.
#include <algorithm>
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

struct CompactParams {
  const int32_t* req_id;       // [T], stride req_stride
  const int32_t* seq_lens;     // [R], stride len_stride
  const int32_t* indices;      // [T, K], row stride in_stride
  const int32_t* topk_length;  // [T], stride tl_stride, or nullptr
  int32_t* out;                // [T, K], row stride out_stride
  int32_t* valid_counts;       // [T], stride vc_stride
  int64_t req_stride, len_stride, in_stride, tl_stride, out_stride, vc_stride, num_tokens, topk, num_reqs;
  int world, rank, interleave;
};

constexpr int kCompactWarps = 8;

__global__ void __launch_bounds__(kCompactWarps * 32) compact_kernel(CompactParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t turn = int64_t(p.world) * p.interleave;
  const unsigned below = (1u << lane) - 1u;  // lanes before this one
  for (int64_t t = int64_t(blockIdx.x) * kCompactWarps + threadIdx.x / 32; t < p.num_tokens;
       t += int64_t(gridDim.x) * kCompactWarps) {
    const int64_t req = p.req_id[t * p.req_stride];
    const int64_t limit = req >= 0 && req < p.num_reqs ? p.seq_lens[req * p.len_stride] : 0;
    int64_t len = p.topk;
    if (p.topk_length) len = min(max(int64_t(p.topk_length[t * p.tl_stride]), int64_t(0)), p.topk);
    const int32_t* in = p.indices + t * p.in_stride;
    int32_t* o = p.out + t * p.out_stride;
    int64_t n = 0;  // kept so far (warp-uniform)
    for (int64_t k0 = 0; k0 < len; k0 += 32) {
      const int64_t k = k0 + lane;
      const int64_t pos = k < len ? in[k] : -1;
      const bool mine = pos >= 0 && pos < limit && (pos / p.interleave) % p.world == p.rank;
      const unsigned kept = __ballot_sync(0xffffffffu, mine);
      if (mine) o[n + __popc(kept & below)] = static_cast<int32_t>(pos / turn * p.interleave + pos % p.interleave);
      n += __popc(kept);
    }
    for (int64_t k = n + lane; k < p.topk; k += 32) o[k] = -1;
    if (lane == 0) p.valid_counts[t * p.vc_stride] = static_cast<int32_t>(n);
  }
}

}  // namespace

void dcp_compact_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                      const TensorView& topk_length, const TensorView& out, const TensorView& valid_counts,
                      int world_size, int rank, int interleave, const Context& ctx) {
  DeviceGuard guard(indices.device);
  CompactParams p{};
  p.req_id = static_cast<const int32_t*>(req_id.data);
  p.seq_lens = static_cast<const int32_t*>(seq_lens.data);
  p.indices = static_cast<const int32_t*>(indices.data);
  p.topk_length = topk_length.defined() ? static_cast<const int32_t*>(topk_length.data) : nullptr;
  p.out = static_cast<int32_t*>(out.data);
  p.valid_counts = static_cast<int32_t*>(valid_counts.data);
  p.req_stride = req_id.stride[0];
  p.len_stride = seq_lens.stride[0];
  p.in_stride = indices.stride[0];
  p.tl_stride = topk_length.defined() ? topk_length.stride[0] : 0;
  p.out_stride = out.stride[0];
  p.vc_stride = valid_counts.stride[0];
  p.num_tokens = indices.size(0);
  p.topk = indices.size(1);
  p.num_reqs = seq_lens.size(0);
  p.world = world_size;
  p.rank = rank;
  p.interleave = interleave;
  const int64_t blocks = std::min<int64_t>((p.num_tokens + kCompactWarps - 1) / kCompactWarps, 4096);
  compact_kernel<<<grid_for(blocks, 1, "dcp_compact_topk"), kCompactWarps * 32, 0, stream_of(ctx)>>>(p);
  check_launch("dcp_compact_topk");
}

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
