// SPDX-License-Identifier: Apache-2.0
#pragma once
// Quantisation of bf16 chunks to e4m3 codes for the cache writers: q8 = e4m3_satfinite(x / s), bit
// for bit the CPU's (src/cpu/cache_ops.cpp: IEEE float x / scale, then num::float_to_e4m3).
//
// The division. IEEE `div.rn.f32` costs about ten instructions and a slow-path branch per value, which
// made the quantising writes instruction-bound. Here r = RN(1/s) is computed once per scale and each
// value takes three operations (Markstein's correction with an exact FMA remainder):
//
//   q0 = RN(x r);   n = RN(q0 s - x);   q = RN(q0 - n r)
//
// Claim: for s in [kRecipScaleMin, kRecipScaleMax] and bf16 x, e4m3(q) == e4m3(RN(x / s)). Argument:
//  (a) |x/s| in [2^-12, 2^11]: q == RN(x/s) exactly. Proved by exhaustion for x, s in [1, 2): every
//      one of the 2^23 significands of s against every one of the 128 bf16 significands of x
//      (tests/gpu/cache_quant_check.cu runs it on the GPU for the shipped device code, at several
//      exponents of s and x). The sequence is invariant under x -> 2^a x, s -> 2^b s as long as every
//      intermediate stays normal or exact: r is normal (s <= 2^100), q0 is normal, x is normal
//      (|x| >= 2^-12 s >= 2^-76), and the remainder n, a multiple of 2^(e(q0) + e(s) - 46) >=
//      2^(-13 - 64 - 46) = 2^-123 when nonzero, is never subnormal. So the exhaustive case covers the
//      whole range. (Outside [1, 2) nothing new happens: the quotient's significand is that of
//      m_x / m_s, and both binades of it, (1/2, 1) and [1, 2), occur in the exhaustive case.)
//  (b) |x/s| < 2^-12: e4m3 rounds everything of magnitude <= 2^-10 to a signed zero (2^-10 is the
//      tie between 0 and the smallest subnormal 2^-9; ties go to the even code 0). q differs from
//      x r by a relative 2^-23 plus at most 2^-150 r (a remainder rounded to a subnormal), which is
//      at most 2^-17 |x r| because a nonzero bf16 is at least 2^-133 in magnitude. So |q| < 2^-10
//      and q has the sign of x (x = +-0 included: q0 = +-0, n = +0 and
//      q = RN(-0 + q0) = q0 keeps the sign; that is why the remainder is taken as q0 s - x and
//      subtracted, not as x - q0 s and added, which turns -0 into +0).
//  (c) The clamped form (per-tensor scales, where |x/s| is unbounded and x may be +-inf; a ds_mla
//      tile scale bounds |x/s| by 448 (1 + 2^-23), and an infinite x makes its tile scale infinite)
//      limits q0 to +-kClamp before the correction, so nothing overflows and inf - inf cannot occur.
//      The clamp acts only when |x r| > kClamp, i.e. |x/s| > kClamp (1 - 2^-23) > 432, where the IEEE
//      quotient saturates to +-448 (432 is the tie between 416 and 448, going to 448). Then
//      q = RN(+-kClamp - n r) with n = RN(+-kClamp s - x): |q| >= kClamp (1 - 2^-22) > 432 (or
//      +-inf for x = +-inf), so q saturates to the same code.
//  (d) x = NaN: q0 is NaN (or -kClamp after the clamp, which ignores NaN), n = NaN through -x, q = NaN
//      (the GPU's canonical NaN), code 0x7f like the CPU's for every NaN.
// Scales outside the range (below 2^-64: a per-tensor scale that small, or a ds_mla tile whose amax
// is under 448 * 2^-64; above 2^100, or infinite) take the IEEE division.
#include <cfloat>
#include <cstdint>

#include "cuda/common/convert.cuh"

namespace mla::cuda::cache {

inline constexpr float kRecipScaleMin = 0x1p-64f;
inline constexpr float kRecipScaleMax = 0x1p100f;
inline constexpr float kClamp = 1024.0f;  // > 432, the largest value that does not round to 448

__host__ __device__ inline bool recip_scale_ok(float s) { return s >= kRecipScaleMin && s <= kRecipScaleMax; }

// x / s by IEEE division (scales outside the reciprocal's range; kept as the reference variant).
struct IeeeDiv {
  float s;
  __device__ __forceinline__ float operator()(float x) const { return __fdiv_rn(x, s); }
};

// x / s through r = RN(1/s), for s in [kRecipScaleMin, kRecipScaleMax]. kClamped: any bf16 x
// (per-tensor scale); otherwise |x / s| <= kClamp must hold (ds_mla tiles: <= 448 (1 + 2^-23)).
// __fmul_rn / __fmaf_rn: no contraction or reassociation by the compiler.
template <bool kClamped>
struct RecipDiv {
  float s, r;
  __device__ static RecipDiv make(float scale) { return {scale, __frcp_rn(scale)}; }
  __device__ __forceinline__ float operator()(float x) const {
    float q0 = __fmul_rn(x, r);
    if constexpr (kClamped) q0 = fminf(fmaxf(q0, -kClamp), kClamp);
    const float n = __fmaf_rn(q0, s, -x);
    return __fmaf_rn(-n, r, q0);
  }
};

// q[i] = RN(v[i] / s) for N bf16 values v (as floats): the reciprocal form where s is in its range (kClamped as
// RecipDiv's), IEEE division otherwise.
template <bool kClamped, int N>
__device__ __forceinline__ void bf16_quotients(const float (&v)[N], float s, float (&q)[N]) {
  if (recip_scale_ok(s)) {
    const auto div = RecipDiv<kClamped>::make(s);
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = div(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = __fdiv_rn(v[i], s);
  }
}

// Eight bf16 values (four 32-bit words, element 0 in the low half of word 0) -> eight e4m3 codes
// (two words, element 0 in the low byte), each x / s rounded as above.
template <class Div>
__device__ __forceinline__ uint2 quantise8(const uint4& w, const Div& div) {
  const uint32_t in[4] = {w.x, w.y, w.z, w.w};
  uint32_t pair[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = __uint_as_float(in[i] << 16), hi = __uint_as_float(in[i] & 0xffff0000u);
    pair[i] = dev::float2_to_e4m3x2(div(lo), div(hi));
  }
  return make_uint2(__byte_perm(pair[0], pair[1], 0x5410), __byte_perm(pair[2], pair[3], 0x5410));
}

}  // namespace mla::cuda::cache
