// SPDX-License-Identifier: Apache-2.0
#pragma once
// Exact readings of e4m3 codes and queries for the f16 tensor-core products of the sm90 kernels (raw/, convert/):
// two codes to an exact f16 pair (one F2FP), and the per-row power of two that makes a bf16 query row's f16 copy
// exact (docs/SEMANTICS.md, the exact-code numerics).
#include <cstdint>

namespace mla::cuda::decode_sm90 {

// Two e4m3 codes (the low or high 16 bits of w) as an f16 pair: exact (every e4m3 value, subnormals included, is
// a normal f16), NaN codes to NaN. One F2FP per pair.
__device__ __forceinline__ uint32_t e4m3x2_lo_to_f16x2(uint32_t w) {
  uint32_t d;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(d) : "r"(w));
  return d;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t w) {
  uint32_t d;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi;}" : "=r"(d) : "r"(w));
  return d;
}
// Sixteen codes (byte i of the chunk = column i) as exact f16: columns 0..7 into lo, 8..15 into hi.
__device__ __forceinline__ void e4m3x16_to_f16(const uint4& raw, uint4& lo, uint4& hi) {
  lo = make_uint4(e4m3x2_lo_to_f16x2(raw.x), e4m3x2_hi_to_f16x2(raw.x), e4m3x2_lo_to_f16x2(raw.y), e4m3x2_hi_to_f16x2(raw.y));
  hi = make_uint4(e4m3x2_lo_to_f16x2(raw.z), e4m3x2_hi_to_f16x2(raw.z), e4m3x2_lo_to_f16x2(raw.w), e4m3x2_hi_to_f16x2(raw.w));
}

// The power-of-two exponent that brings a query row of largest magnitude `amax_bits` (fp32 bits of max |q|)
// into [2^14, 2^15): every bf16 value within 2^28 of the row's largest is then a normal f16, so the f16 copy is
// exact there and the rest are off by at most 2^-39 of the largest (far below fp32 accumulation error). Zero,
// inf and NaN rows keep 0; the clamp keeps 2^e and 2^-e normal fp32.
__device__ __forceinline__ int q_row_exponent(uint32_t amax_bits) {
  const int biased = static_cast<int>(amax_bits >> 23);
  if (amax_bits == 0 || biased == 255) return 0;
  const int e = 14 - (biased - 127);
  return e < -120 ? -120 : e > 120 ? 120 : e;
}
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((127 + e) << 23); }

}  // namespace mla::cuda::decode_sm90
