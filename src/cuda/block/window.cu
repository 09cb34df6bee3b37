// SPDX-License-Identifier: Apache-2.0
// DeepSeek-V4's sliding-window positions on CUDA (mla::sliding_window_positions): out[t, j] = positions[t] - W + 1 + j,
// or -1 below 0 or above 2^31 - 1. One thread per output element, a token's row contiguous; positions are not
// checked on the device (a negative one gives a row of -1).
#include <climits>
#include <cstdint>

#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;

template <class Pos>
__global__ void __launch_bounds__(kThreads) window_kernel(const Pos* positions, int64_t pos_stride, int32_t* out, int64_t T,
                                                          int64_t W, int64_t out_stride) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= T * W) return;
  const int64_t t = i / W, j = i % W;
  const int64_t pos = static_cast<int64_t>(positions[t * pos_stride]) - W + 1 + j;
  out[t * out_stride + j] = pos < 0 || pos > INT32_MAX ? -1 : static_cast<int32_t>(pos);
}

}  // namespace

void sliding_window_positions(const TensorView& positions, const TensorView& out, const Context& ctx) {
  const int64_t T = out.size(0), W = out.size(1);
  DeviceGuard guard(out.device);
  const unsigned grid = grid_for(T * W, kThreads, "sliding_window_positions");
  auto* o = static_cast<int32_t*>(out.data);
  if (positions.dtype == DType::i64)
    window_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(static_cast<const int64_t*>(positions.data),
                                                         positions.stride[0], o, T, W, out.stride[0]);
  else
    window_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(static_cast<const int32_t*>(positions.data),
                                                         positions.stride[0], o, T, W, out.stride[0]);
  check_launch("sliding_window_positions");
}

}  // namespace mla::cuda
