// SPDX-License-Identifier: Apache-2.0
// 1 x 128 fp8 activation quantisation on CUDA (mla::quantize_fp8_groups), DeepSeek's act_quant:
// scale = amax / 448 of each row's group of 128 columns (1 for an all-zero group), codes =
// e4m3(x / scale) (round to nearest even, saturating), scales stored group-major [K / 128, M_pad]
// (cuBLASLt's VEC128_32F layout for the token operand of gemm_fp8_block).
//
// Algorithm: one warp per (row, group): each lane holds 4 consecutive values (one vector load when
// the rows are aligned), the amax is a shuffle
// max, lane 0 writes the scale; padding rows M .. M_pad - 1 get zero codes and scale 1. The division
// is IEEE (no fast math), so the codes equal the CPU backend's bit for bit. 8 warps per CTA, no shared
// memory. Templated on the activation type.
#include "cuda/block/params.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kWarps = 8;

// kVec: each lane's 4 values are one aligned vector load (the host checks base and row stride).
template <class In, bool kVec>
__global__ void __launch_bounds__(kWarps * 32) quantize_kernel(block::QuantParams p) {
  const int64_t groups = p.K / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= p.M_pad * groups) return;
  const int64_t t = item / groups, g = item % groups;
  uint8_t* out = p.codes + t * p.codes_stride + g * 128 + lane * 4;
  if (t >= p.M) {
    *reinterpret_cast<uint32_t*>(out) = 0u;
    if (lane == 0) p.scales[g * p.M_pad + t] = 1.0f;
    return;
  }
  const auto* x = static_cast<const typename In::Storage*>(p.x) + t * p.x_stride + g * 128 + lane * 4;
  dev::Array<typename In::Storage, 4> raw;
  if constexpr (kVec) {
    raw = *reinterpret_cast<const dev::Array<typename In::Storage, 4>*>(x);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) raw.v[i] = x[i];
  }
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = In::to_float(raw.v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(dev::float_to_e4m3(__fdiv_rn(v[i], s))) << (8 * i);
  *reinterpret_cast<uint32_t*>(out) = packed;
  if (lane == 0) p.scales[g * p.M_pad + t] = s;
}

}  // namespace

// Row starts of codes are 16-byte aligned (front end), so each lane's 4-byte store is aligned.
void quantize_fp8_groups(const TensorView& x, const TensorView& codes, const TensorView& scales, const Context& ctx) {
  block::QuantParams p{x.data, static_cast<uint8_t*>(codes.data), static_cast<float*>(scales.data), x.size(0),
                       codes.size(0), x.size(1), x.stride[0], codes.stride[0]};
  DeviceGuard guard(x.device);
  const unsigned grid = grid_for(p.M_pad * (p.K / 128), kWarps, "quantize_fp8_groups");
  const auto vec_bytes = static_cast<int64_t>(4 * x.element_size());
  const bool vec = reinterpret_cast<uintptr_t>(x.data) % vec_bytes == 0 &&
                   (p.M <= 1 || (p.x_stride * static_cast<int64_t>(x.element_size())) % vec_bytes == 0);
  dispatch_activation(x.dtype, "quantize_fp8_groups", [&](auto in) {
    if (vec)
      quantize_kernel<decltype(in), true><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
    else
      quantize_kernel<decltype(in), false><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
  });
  check_launch("quantize_fp8_groups");
}

}  // namespace mla::cuda
