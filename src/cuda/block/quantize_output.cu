// SPDX-License-Identifier: Apache-2.0
// Output quantisation on CUDA (mla::quantize_output, docs/SEMANTICS.md §15) and the abs-max reduction
// of the layer's KV-scale calibration (mla::abs_max).
//
// Algorithm, one kernel per key family, templated on the activation type:
//   fp8 (static scale)   one thread per element: code = e4m3(x / scale)
//   fp8_group128 / 64    one warp per (row, group of G columns), G / 32 values per lane; the group's
//                        abs-max is a shuffle reduction that propagates NaN; lane 0 writes the scale
//                        (group-major [K / G, M_pad] with row stride scales_stride >= M_pad,
//                        gemm_fp8_block's token-scale layout or a column slice of it)
//   nvfp4                one thread per 16-value block: scale code = e4m3(global * (amax / 6)), then
//                        e2m1(x / (scale / global)) for each element, two codes per byte
// Padding rows M .. M_pad - 1 get zero codes (scale 1, or scale code 0 for nvfp4). Every float
// operation is IEEE round-to-nearest (__fdiv_rn / __fmul_rn, no contraction), in the CPU backend's
// order, so the bytes equal the CPU's (src/cpu/block_ops.cpp). No shared memory.
// The fp8 keys' quotient x / s over bf16 activations takes the reciprocal form of the cache writers
// (cuda/cache/quant.cuh RecipDiv: three operations, equal to IEEE division for bf16 x and scales in
// [2^-64, 2^100], proved there; group scales bound |x / s| by 448 (1 + 2^-23), the static scale is
// clamped); other activation types and scales out of that range divide (__fdiv_rn).
#include <algorithm>

#include "core/numeric.h"
#include "cuda/cache/quant.cuh"
#include "cuda/block/params.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float nan_max(float a, float b) { return (a != a) ? a : ((b != b) ? b : fmaxf(a, b)); }

template <class In>
__device__ __forceinline__ float load_x(const block::OutQuantParams& p, int64_t t, int64_t j) {
  return In::to_float(static_cast<const typename In::Storage*>(p.x)[t * p.x_stride + j]);
}

// The e4m3 codes of v[i] / s, i < N (IEEE quotients; see the header for the reciprocal form). kClamped: |v / s| may
// exceed 448 (the static scale); otherwise it is at most 448 (1 + 2^-23) (a group's abs-max scale).
template <class In, bool kClamped, int N>
__device__ __forceinline__ void e4m3_quotients(const float (&v)[N], float s, uint8_t (&code)[N]) {
  float q[N];
  if constexpr (In::kDType == DType::bf16) {
    cache::bf16_quotients<kClamped>(v, s, q);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = __fdiv_rn(v[i], s);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) code[i] = dev::float_to_e4m3(q[i]);
}

template <class In>
__global__ void __launch_bounds__(kThreads) quant_fp8_kernel(block::OutQuantParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item >= p.M_pad * p.K) return;
  const int64_t t = item / p.K, j = item % p.K;
  if (t >= p.M) {
    p.codes[t * p.codes_stride + j] = 0;
    return;
  }
  const float v[1] = {load_x<In>(p, t, j)};
  uint8_t code[1];
  e4m3_quotients<In, true>(v, p.scale, code);
  p.codes[t * p.codes_stride + j] = code[0];
}

template <class In, int G>
__global__ void __launch_bounds__(kThreads) quant_group_kernel(block::OutQuantParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  constexpr int kPerLane = G / 32;
  const int64_t groups = p.K / G;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= p.M_pad * groups) return;
  const int64_t t = item / groups, g = item % groups;
  uint8_t* out = p.codes + t * p.codes_stride + g * G + lane * kPerLane;
  float* scales = static_cast<float*>(p.scales);
  if (t >= p.M) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) out[i] = 0;
    if (lane == 0) scales[g * p.scales_stride + t] = 1.0f;
    return;
  }
  float v[kPerLane];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    v[i] = load_x<In>(p, t, g * G + lane * kPerLane + i);
    amax = nan_max(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax == 0.f ? 1.0f : __fdiv_rn(amax, 448.0f);
  uint8_t code[kPerLane];
  e4m3_quotients<In, false>(v, s, code);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) out[i] = code[i];
  if (lane == 0) scales[g * p.scales_stride + t] = s;
}

template <class In>
__global__ void __launch_bounds__(kThreads) quant_nvfp4_kernel(block::OutQuantParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int64_t blocks = p.K / 16;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item >= p.M_pad * blocks) return;
  const int64_t t = item / blocks, b = item % blocks;
  uint8_t* out = p.codes + t * p.codes_stride + b * 8;
  uint8_t* sc = static_cast<uint8_t*>(p.scales) + t * p.scales_stride + b;
  if (t >= p.M) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = 0;
    *sc = 0;
    return;
  }
  float v[16];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = load_x<In>(p, t, b * 16 + i);
    amax = nan_max(amax, fabsf(v[i]));
  }
  const uint8_t s_code = dev::float_to_e4m3(__fmul_rn(p.scale, __fdiv_rn(amax, 6.0f)));
  *sc = s_code;
  const float s = dev::e4m3_to_float(s_code);
  const float m = __fdiv_rn(s, p.scale);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = s == 0.f ? 0u : num::e2m1_bits(__fdiv_rn(v[2 * i], m));
    const uint32_t hi = s == 0.f ? 0u : num::e2m1_bits(__fdiv_rn(v[2 * i + 1], m));
    out[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Non-negative floats order like their bit patterns as int32 (NaN with the sign cleared above +inf), so
// an atomicMax on the bits is a NaN-propagating float max. out starts at 0.
template <class In>
__global__ void __launch_bounds__(kThreads) abs_max_kernel(const void* x, int64_t M, int64_t K, int64_t stride,
                                                           float* out) {
  float m = 0.f;
  const int64_t n = M * K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = i / K, j = i % K;
    m = nan_max(m, fabsf(In::to_float(static_cast<const typename In::Storage*>(x)[t * stride + j])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));
}

}  // namespace

void quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                     float scale, const Context& ctx) {
  block::OutQuantParams p{x.data, static_cast<uint8_t*>(codes.data), scales.defined() ? scales.data : nullptr,
                          x.size(0), codes.size(0), x.size(1), x.stride[0], codes.stride[0],
                          scales.defined() ? scales.stride[0] : 0, scale};
  DeviceGuard guard(x.device);
  const cudaStream_t st = stream_of(ctx);
  dispatch_activation(x.dtype, "quantize_output", [&](auto in) {
    using In = decltype(in);
    switch (key) {
      case OutputQuant::fp8:
        launch_kernel(quant_fp8_kernel<In>, grid_for(p.M_pad * p.K, kThreads, "quantize_output"), kThreads, 0, st,
                      ctx.pdl, "quantize_output", p);
        break;
      case OutputQuant::fp8_group128:
        launch_kernel(quant_group_kernel<In, 128>, grid_for(p.M_pad * (p.K / 128), kThreads / 32, "quantize_output"),
                      kThreads, 0, st, ctx.pdl, "quantize_output", p);
        break;
      case OutputQuant::fp8_group64:
        launch_kernel(quant_group_kernel<In, 64>, grid_for(p.M_pad * (p.K / 64), kThreads / 32, "quantize_output"),
                      kThreads, 0, st, ctx.pdl, "quantize_output", p);
        break;
      case OutputQuant::nvfp4:
        launch_kernel(quant_nvfp4_kernel<In>, grid_for(p.M_pad * (p.K / 16), kThreads, "quantize_output"), kThreads, 0,
                      st, ctx.pdl, "quantize_output", p);
        break;
      case OutputQuant::none: throw Error("quantize_output: key none has no quantised form");
    }
  });
  check_launch("quantize_output");
}

void abs_max(const TensorView& x, const TensorView& out, const Context& ctx) {
  DeviceGuard guard(x.device);
  const cudaStream_t st = stream_of(ctx);
  check_cuda(cudaMemsetAsync(out.data, 0, sizeof(float), st), "abs_max");
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned grid = std::min<unsigned>(grid_for(n, kThreads, "abs_max"), 1024u);
  dispatch_activation(x.dtype, "abs_max", [&](auto in) {
    abs_max_kernel<decltype(in)><<<grid, kThreads, 0, st>>>(x.data, x.size(0), x.size(1), x.stride[0],
                                                            static_cast<float*>(out.data));
  });
  check_launch("abs_max");
}

}  // namespace mla::cuda
