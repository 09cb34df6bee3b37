// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element conversions on the device, with the rounding the numerical contract names (and that
// src/core/numeric.h implements on the host, bit for bit):
//   float -> bf16   round to nearest even (cvt.rn.bf16.f32)
//   float -> e4m3   round to nearest even, saturating finite values and +-inf to +-448, NaN -> NaN
//                   (cvt.rn.satfinite.e4m3x2.f32, i.e. __nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, __NV_E4M3))
//   e4m3 -> float   exact (through f16, which holds every e4m3 value)
//   bf16 -> float   exact (a shift)
// Values are carried as raw storage (uint16_t for bf16, uint8_t for e4m3) so that copies stay
// bit-exact and no CUDA half/bfloat16 class semantics leak into the kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/vec.cuh"

namespace mla::cuda::dev {

__device__ __forceinline__ float bf16_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Two floats -> two e4m3 codes (lo in the low byte).
__device__ __forceinline__ uint16_t float2_to_e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint8_t float_to_e4m3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

// Two e4m3 codes (lo in the low byte) -> two floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float e4m3_to_float(uint8_t code) { return e4m3x2_to_float2(code).x; }

// ---- whole chunks (N even) ----------------------------------------------------------------

template <int N>
__device__ __forceinline__ void bf16_to_float(const Array<uint16_t, N>& in, float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = bf16_to_float(in.v[i]);
}

template <int N>
__device__ __forceinline__ void float_to_bf16(const float (&in)[N], Array<uint16_t, N>& out) {
#pragma unroll
  for (int i = 0; i < N; ++i) out.v[i] = float_to_bf16(in[i]);
}

template <int N>
__device__ __forceinline__ void e4m3_to_float(const Array<uint8_t, N>& in, float (&out)[N]) {
  static_assert(N % 2 == 0, "e4m3 chunks convert in pairs");
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const float2 f = e4m3x2_to_float2(static_cast<uint16_t>(in.v[i] | (in.v[i + 1] << 8)));
    out[i] = f.x;
    out[i + 1] = f.y;
  }
}

template <int N>
__device__ __forceinline__ void float_to_e4m3(const float (&in)[N], Array<uint8_t, N>& out) {
  static_assert(N % 2 == 0, "e4m3 chunks convert in pairs");
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const uint16_t c = float2_to_e4m3x2(in[i], in[i + 1]);
    out.v[i] = static_cast<uint8_t>(c & 0xff);
    out.v[i + 1] = static_cast<uint8_t>(c >> 8);
  }
}

}  // namespace mla::cuda::dev
