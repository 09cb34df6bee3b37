// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host decisions of the sm90_fp8 mha_prefill launcher (launch.cu; docs/design/prefill_fp8_sm90.md): the quantise
// pass's reciprocal (the schedule: common/prefill_schedule.h, the bf16 kernel's rule). Plain C++, no CUDA: the CPU
// unit tests check it.
#include <cmath>
#include <cstdint>

namespace mla::cuda::prefill_sm90_fp8 {

// How the quantise pass computes q = RN(x / s) for a bf16 x and a positive finite scale s, bit for bit the fp32
// division of the CPU backend:
//   multiply  recip = 1 / s exactly (s a power of two whose reciprocal is a float): q = RN(x * recip), the same
//             real number rounded once.
//   correct   recip = RN(1 / s), s in [2^-32, 2^32]: q0 = RN(x * recip), rem = fma(-q0, s, x) (exact), q = fma(rem,
//             recip, q0) (Markstein's correction; q0 is within about 1.5 ulp, one correction rounds correctly:
//             checked for every float mantissa of s against every bf16 mantissa of x, and the steps scale by
//             powers of two while x, q0 and rem stay normal, which holds wherever |x / s| >= 2^-12 and s is in
//             range). Below 2^-12 every result rounds to an e4m3 zero, so only the sign must survive: the pass
//             takes copysign(q, x), and q0 itself when it is not finite (x infinite, or x / s past the float range:
//             both saturate).
//   divide    any other scale: the fp32 division.
enum class QuantDivision : int32_t { divide = 0, multiply = 1, correct = 2 };

struct QuantScale {
  QuantDivision division = QuantDivision::divide;
  float recip = 0.0f;
};

inline QuantScale quant_scale(float s) {
  if (!(s > 0) || !std::isfinite(s)) return {};
  int e = 0;
  if (std::frexp(s, &e) == 0.5f) {  // a power of two: 1 / s is exact in double
    const double r = 1.0 / static_cast<double>(s);
    const float rf = static_cast<float>(r);
    if (std::isfinite(rf) && static_cast<double>(rf) == r) return {QuantDivision::multiply, rf};
  }
  if (s >= std::ldexp(1.0f, -32) && s <= std::ldexp(1.0f, 32)) return {QuantDivision::correct, 1.0f / s};
  return {};
}

// The correct division's steps as the device runs them (std::fma rounds once, as FFMA does): the CPU tests
// compare it with x / s.
inline float corrected_quotient(float x, float s, float recip) {
  const float q0 = x * recip;
  const float rem = std::fma(-q0, s, x);
  const float q = std::isfinite(q0) ? std::fma(rem, recip, q0) : q0;
  return std::copysign(q, x);
}

}  // namespace mla::cuda::prefill_sm90_fp8
