// SPDX-License-Identifier: Apache-2.0
// RoPE on CUDA (mla::apply_rope): dst = src with rotary embedding on the last rope_dim columns of
// each group, the first D - rope_dim copied (rope_dim 0: a converting copy).
//
// Algorithm: one 256-thread CTA per token. Threads < rope_dim / 2 compute the pair's angle
// pos * inv_freq[i] and its cos / sin in float64 (as the CPU oracle), times the attention factor,
// into shared memory (2 * 32 floats for DeepSeek's 64 rope columns; rope_dim / 2 <= kMaxPairs). Then
// the CTA walks the token's G groups in units: a unit is one copied column or one rope pair; each
// unit is read and written by one thread, so dst == src (in place) is safe. Templated on the source
// and destination activation types.
#include "cuda/block/params.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPairs = 256;  // rope_dim <= 512 (DeepSeek: 64)

template <class In, class Out>
__global__ void __launch_bounds__(kThreads) rope_kernel(block::RopeParams p) {
  __shared__ float cs[kMaxPairs], sn[kMaxPairs];
  const int64_t t = blockIdx.x;
  const int64_t half = p.rope_dim / 2, nope = p.D - p.rope_dim, units = nope + half;
  if (half > 0) {
    const int64_t pos = p.pos_i64 ? static_cast<const int64_t*>(p.positions)[t]
                                  : static_cast<const int32_t*>(p.positions)[t];
    for (int64_t i = threadIdx.x; i < half; i += kThreads) {
      double s, c;
      sincos(static_cast<double>(pos) * p.inv_freq[i], &s, &c);
      cs[i] = static_cast<float>(c * p.factor);
      sn[i] = static_cast<float>(s * p.factor);
    }
    __syncthreads();
  }
  const auto* src = static_cast<const typename In::Storage*>(p.src) + t * p.src_s0;
  auto* dst = static_cast<typename Out::Storage*>(p.dst) + t * p.dst_s0;
  for (int64_t u = threadIdx.x; u < p.G * units; u += kThreads) {
    const int64_t g = u / units, j = u % units;
    const auto* s = src + g * p.src_s1;
    auto* d = dst + g * p.dst_s1;
    if (j < nope) {
      d[j] = Out::from_float(In::to_float(s[j]));
      continue;
    }
    const int64_t i = j - nope;
    const int64_t ia = nope + (p.interleave ? 2 * i : i), ib = nope + (p.interleave ? 2 * i + 1 : i + half);
    const float a = In::to_float(s[ia]), b = In::to_float(s[ib]);
    d[ia] = Out::from_float(a * cs[i] - b * sn[i]);
    d[ib] = Out::from_float(b * cs[i] + a * sn[i]);
  }
}

}  // namespace

void apply_rope(const TensorView& src, const TensorView& dst, const TensorView& positions, const TensorView& inv_freq,
                double factor, int64_t rope_dim, bool interleave, const Context& ctx) {
  if (rope_dim / 2 > kMaxPairs)
    throw Error("apply_rope: rope_dim up to " + std::to_string(2 * kMaxPairs) + " on CUDA, got " +
                std::to_string(rope_dim));
  block::RopeParams p{src.data, dst.data, positions.data, static_cast<const double*>(inv_freq.data),
                      src.size(0), src.size(1), src.size(2), rope_dim, src.stride[0], src.stride[1],
                      dst.stride[0], dst.stride[1], factor, interleave, positions.dtype == DType::i64};
  DeviceGuard guard(src.device);
  const unsigned grid = grid_for(p.T, 1, "apply_rope");
  dispatch_activation(src.dtype, "apply_rope", [&](auto in) {
    dispatch_activation(dst.dtype, "apply_rope", [&](auto out) {
      rope_kernel<decltype(in), decltype(out)><<<grid, kThreads, 0, stream_of(ctx)>>>(p);
    });
  });
  check_launch("apply_rope");
}

}  // namespace mla::cuda
