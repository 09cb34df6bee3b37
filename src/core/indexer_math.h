// SPDX-License-Identifier: Apache-2.0
#pragma once
// Scalar rules of the lightning indexer shared bit for bit by the CPU backend and the CUDA kernels
// (docs/INDEXER.md): the writer's scale, relu with NaN propagation, and the top-k order key.
// Host and device code (MLA_HD); no CUDA headers.
#include <cstdint>
#include <cstring>

#include "mla/dtype.h"

namespace mla::indexer {

MLA_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MLA_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// The writer's per-token scale from amax = max |k| (NaN values do not count: fmax drops them):
//   s = max(amax, 1e-4) / 448 (fp32 division); ue8m0: the smallest power of two >= s, found on the
//   bits (exact; vLLM's exp2f(ceilf(log2f(s))) gives the same except where log2f rounds).
MLA_HD inline float writer_scale(float amax, bool ue8m0) {
  const float s = (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
  if (!ue8m0) return s;
  uint32_t u = float_bits(s);  // s is normal and positive, or +inf
  if ((u & 0x7fffffu) != 0) u = (u & 0xff800000u) + 0x800000u;
  return bits_float(u);
}

// relu that keeps NaN (torch.relu semantics): NaN -> NaN, x <= 0 -> 0 (device: one max.NaN).
MLA_HD inline float relu_nan(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
#else
  return x > 0.0f ? x : (x != x ? x : 0.0f);
#endif
}
MLA_HD inline double relu_nan(double x) { return x > 0.0 ? x : (x != x ? x : 0.0); }

// Top-k order: larger key = ranked first. The IEEE total order of the bits (so -0 ranks just below +0),
// with every NaN mapped to 0, below -inf (whose key is 0x007fffff).
MLA_HD inline uint32_t topk_key(float v) {
  if (v != v) return 0u;
  const uint32_t u = float_bits(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace mla::indexer
