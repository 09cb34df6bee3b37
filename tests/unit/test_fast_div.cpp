// SPDX-License-Identifier: Apache-2.0
// core/fast_div.h: the host-built (m, s) and the host emulation of the device formula against n / d, for
// every page size 1..512, a set of large divisors, and numerators at both sides of every multiple near the
// ends of the range, 2^31 - 1 included, plus pseudo-random ones.
#include "core/fast_div.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

// The numerators checked for d: 0..min(2 d + 1, 4096), q d - 1 / q d / q d + 1 around the last multiples below 2^31,
// the powers of two and their neighbours, 2^31 - 1, and 2000 random values.
std::vector<uint32_t> numerators(uint32_t d, std::mt19937& rng) {
  constexpr uint32_t kMax = 0x7fffffffu;
  std::vector<uint32_t> n;
  for (uint64_t i = 0; i <= 2ull * d + 1 && i <= 4096; ++i) n.push_back(static_cast<uint32_t>(i));
  const uint64_t top = kMax / d;
  for (uint64_t q = top >= 64 ? top - 64 : 0; q <= top; ++q)
    for (int64_t dv = -1; dv <= 1; ++dv) {
      const int64_t v = static_cast<int64_t>(q * d) + dv;
      if (v >= 0 && v <= kMax) n.push_back(static_cast<uint32_t>(v));
    }
  for (int b = 1; b < 31; ++b)
    for (int64_t dv = -1; dv <= 1; ++dv) n.push_back(static_cast<uint32_t>((int64_t{1} << b) + dv));
  n.push_back(kMax);
  std::uniform_int_distribution<uint32_t> any(0, kMax);
  for (int i = 0; i < 2000; ++i) n.push_back(any(rng));
  return n;
}

void check_divisor(uint32_t d, std::mt19937& rng) {
  const mla::FastDivisor f = mla::make_fast_divisor(d);
  ASSERT_EQ(f.d, d);
  // The exactness condition of the header: m d - 2^(31 + s) in [0, 2^s], and 2^(s-1) < d <= 2^s.
  const uint64_t md = static_cast<uint64_t>(f.m) * d, p = uint64_t{1} << (31 + f.s);
  ASSERT_GE(md, p) << d;
  ASSERT_LE(md - p, uint64_t{1} << f.s) << d;
  ASSERT_LE(d, uint64_t{1} << f.s) << d;
  if (f.s > 0) {
    ASSERT_GT(d, uint64_t{1} << (f.s - 1)) << d;
  }
  for (uint32_t n : numerators(d, rng)) {
    uint32_t q = 0, r = 0;
    mla::fast_divmod(n, f, q, r);
    ASSERT_EQ(q, n / d) << "n " << n << " d " << d;
    ASSERT_EQ(r, n % d) << "n " << n << " d " << d;
  }
}

TEST(FastDiv, PageSizes1To512) {
  std::mt19937 rng(7);
  for (uint32_t d = 1; d <= 512; ++d) check_divisor(d, rng);
}

TEST(FastDiv, LargeDivisors) {
  std::mt19937 rng(11);
  for (uint32_t d : {513u, 641u, 1000u, 1023u, 1024u, 1025u, 4096u, 65535u, 65536u, 65537u, 1000003u, (1u << 29) - 1,
                     (1u << 29) + 1, (1u << 30) - 1, 1u << 30, (1u << 30) + 1, 0x7fffffffu, 0x80000000u})
    check_divisor(d, rng);
  std::uniform_int_distribution<uint32_t> any(1, 0x80000000u);
  for (int i = 0; i < 200; ++i) check_divisor(any(rng), rng);
}

}  // namespace
