// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host decisions of the sm90_fp8 mha_prefill launcher (launch.cu; docs/design/prefill_fp8_sm90.md): the schedule
// and the quantise pass's reciprocal. Plain C++, no CUDA: the CPU unit tests check both.
#include <cmath>
#include <cstdint>

namespace mla::cuda::prefill_sm90_fp8 {

// Query tiles of the longest request up to which a causal launch runs as persistent pairs of units.
inline constexpr int64_t kPersistentMaxQTiles = 32;

// Persistent pairs of units (kernel.cuh kPersistent: min(#SMs, units / 2) CTAs, a head's largest and smallest
// remaining query tiles together) or one CTA per unit. Persistent pairs need two units per SM to fill the
// machine, and they pay where the units are short and uneven: causal launches of at most 32 query tiles
// (s_q <= 4096). Longer causal requests and non-causal launches (context chunks) run one CTA per unit.
constexpr bool use_persistent(bool causal, int64_t q_tiles, int64_t units, int64_t sms) {
  return causal && q_tiles <= kPersistentMaxQTiles && sms > 0 && units >= 2 * sms;
}

// 1 / s when it is a float (s a positive power of two whose reciprocal is representable, subnormals included),
// else 0. Then x * (1 / s) and x / s are the same real number, rounded once each: the same float for every x, so
// the quantise pass may multiply instead of divide.
inline float exact_reciprocal(float s) {
  if (!(s > 0) || !std::isfinite(s)) return 0.0f;
  int e = 0;
  if (std::frexp(s, &e) != 0.5f) return 0.0f;
  const double r = 1.0 / static_cast<double>(s);  // a power of two: exact in double
  const float rf = static_cast<float>(r);
  return std::isfinite(rf) && static_cast<double>(rf) == r ? rf : 0.0f;
}

}  // namespace mla::cuda::prefill_sm90_fp8
