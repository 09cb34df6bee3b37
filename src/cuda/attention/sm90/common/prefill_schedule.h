// SPDX-License-Identifier: Apache-2.0
#pragma once
// The schedule rule of the sm90 prefill kernels (bf16: prefill/launch.cu, fp8: prefill_fp8/launch.cu): persistent
// pairs of units (kernel.cuh kPersistent: min(#SMs, units / 2) CTAs, a head's largest and smallest remaining query
// tiles together) or one CTA per unit. Plain C++, no CUDA: the CPU unit tests check it.
#include <cstdint>

namespace mla::cuda::prefill_io {

// Query tiles of the longest request up to which a causal launch runs as persistent pairs of units.
inline constexpr int64_t kPersistentMaxQTiles = 32;

// Persistent pairs need two units per SM to fill the machine, and they pay where the units are short and uneven:
// causal launches of at most 32 query tiles (s_q <= 4096: per-CTA start-up and the causal imbalance matter; bf16
// +2-26%, fp8 +5% at h 16). Longer causal requests (within -1.5% / +2%) and non-causal launches (context chunks: a
// head's units run two by two on one CTA, so fewer CTAs share its K / V tiles in L2; bf16 -0-14%) run one CTA per
// unit. Measured by interleaved A/Bs: docs/design/prefill_sm90.md and prefill_fp8_sm90.md "Schedule rule".
constexpr bool use_persistent(bool causal, int64_t q_tiles, int64_t units, int64_t sms) {
  return causal && q_tiles <= kPersistentMaxQTiles && sms > 0 && units >= 2 * sms;
}

}  // namespace mla::cuda::prefill_io
