// SPDX-License-Identifier: Apache-2.0
// RMSNorm on CUDA (mla::rms_norm): y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w.
//
// Algorithm: one warp per row (8 rows per 256-thread CTA); lanes stride the row (coalesced), sum
// x^2 in float, reduce by shuffles, then a second pass (the row is in L1 / L2) writes x * r * w rounded
// once into y's dtype. A lane reads and writes only its own columns, so y == x (in place) is safe.
// No shared memory. Templated on the input and output activation types (bf16 / f16 / f32).
#include "cuda/block/params.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kWarps = 8;

template <class In, class Out>
__global__ void __launch_bounds__(kWarps * 32) rms_norm_kernel(block::RmsNormParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const auto* x = static_cast<const typename In::Storage*>(p.x) + row * p.x_stride;
  auto* y = static_cast<typename Out::Storage*>(p.y) + row * p.y_stride;
  float ss = 0.f;
  for (int64_t i = lane; i < p.n; i += 32) {
    const float v = In::to_float(x[i]);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / static_cast<float>(p.n) + p.eps);
  for (int64_t i = lane; i < p.n; i += 32) y[i] = Out::from_float(In::to_float(x[i]) * r * p.w[i]);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& w, const TensorView& y, double eps, const Context& ctx) {
  block::RmsNormParams p{x.data, static_cast<const float*>(w.data), y.data, x.size(0), x.size(1),
                         x.stride[0], y.stride[0], static_cast<float>(eps)};
  DeviceGuard guard(x.device);
  const unsigned grid = grid_for(p.rows, kWarps, "rms_norm");
  dispatch_activation(x.dtype, "rms_norm", [&](auto in) {
    dispatch_activation(y.dtype, "rms_norm", [&](auto out) {
      rms_norm_kernel<decltype(in), decltype(out)><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
    });
  });
  check_launch("rms_norm");
}

}  // namespace mla::cuda
