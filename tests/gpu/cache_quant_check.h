// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device-side checks of the cache writers' reciprocal division (src/cuda/cache/quant.cuh) against
// IEEE division on the same GPU (cache_quant_check.cu; gtest cases in test_cache_ops_gpu.cpp).
#include <cstdint>
#include <vector>

namespace mla::test {

struct RecipCheck {
  uint64_t checked = 0, mismatches = 0;
  float s = 0, x = 0;  // one mismatching pair, when any
};

// Quotient bits: every scale significand s = 2^e_s * 1.m (all 2^23 m) against every bf16 x = +-2^e_x * 1.m
// (128 significands, both signs): RecipDiv(x) must equal IEEE x / s bit for bit.
RecipCheck recip_div_exhaustive(int e_s, int e_x, bool clamped);

// e4m3 codes: every one of the 65536 bf16 patterns x (zeros, subnormals, infinities, NaNs) against each
// scale: e4m3(RecipDiv(x)) must equal e4m3(IEEE x / s). clamped = false checks only the x a ds_mla tile
// with that scale can hold (finite, |x / s| <= 449).
RecipCheck recip_div_codes(const std::vector<float>& scales, bool clamped);

}  // namespace mla::test
