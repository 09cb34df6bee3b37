// SPDX-License-Identifier: Apache-2.0
#pragma once
// Division by a run-time constant with a multiply and a shift (Granlund-Montgomery, round-up multiplier),
// for numerators 0 <= n < 2^31 and divisors 1 <= d <= 2^31. The sm90 row-copying producers divide every
// key's cache row index (or position) by the page size (src/cuda/attention/sm90/common/source.cuh IndexedRows,
// PagedRows); a division by a run-time int32 compiles to ~25 instructions (IABS, I2F.RP, MUFU.RCP, F2I,
// IMAD.HI, corrections), this to three (SHF/IADD, IMAD.HI, SHF). Pure code: the host builds the divisor
// (the launchers, beside page_size), the device divides, the CPU unit tests check the host emulation
// (tests/unit/test_fast_div.cpp).
//
// l = ceil(log2 d), m = ceil(2^(31 + l) / d) (< 2^32 for every d <= 2^31), q = floor(n m / 2^(31 + l))
// = (umulhi(2n, m)) >> l. Exact for n < 2^31: m d = 2^(31 + l) + e with 0 <= e < d <= 2^l, so
// n m / 2^(31 + l) = n / d + n e / (d 2^(31 + l)), the second term < 1 / d, which never crosses the next
// integer above n / d (at most (d - 1) / d past floor(n / d)).
#include <cstdint>

#if defined(__CUDACC__)
#define MLA_FASTDIV_HD __host__ __device__ __forceinline__
#else
#define MLA_FASTDIV_HD inline
#endif

namespace mla {

struct FastDivisor {
  uint32_t d;  // the divisor, 1 .. 2^31
  uint32_t m;  // ceil(2^(31 + s) / d)
  uint32_t s;  // ceil(log2 d)
};

// The divisor for d (1 <= d <= 2^31; d 0 yields the divisor 1's data: the callers validate d first).
constexpr FastDivisor make_fast_divisor(uint32_t d) {
  if (d == 0) d = 1;
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint64_t m = ((uint64_t{1} << (31 + l)) + d - 1) / d;
  return {d, static_cast<uint32_t>(m), l};
}

// floor(n / f.d) for 0 <= n < 2^31.
MLA_FASTDIV_HD uint32_t fast_div(uint32_t n, const FastDivisor& f) {
#if defined(__CUDA_ARCH__)
  return __umulhi(n << 1, f.m) >> f.s;
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(n << 1) * f.m) >> 32) >> f.s;
#endif
}

// n = q d + r with q = floor(n / f.d), 0 <= r < d, for 0 <= n < 2^31.
MLA_FASTDIV_HD void fast_divmod(uint32_t n, const FastDivisor& f, uint32_t& q, uint32_t& r) {
  q = fast_div(n, f);
  r = n - q * f.d;
}

}  // namespace mla
