// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.cpp, docs/DEVELOPING.md "Hostile input"):
// a reader that turns the fuzzer's bytes into sizes, indices and edge values; FUZZ_REQUIRE, which
// prints the broken contract and aborts (libFuzzer then saves the input as a reproducer); and the
// all-or-nothing contract of a call run twice over destinations filled with two different poisons.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mla/error.h"
#include "mla/tensor.h"

namespace mla::fuzz {

#define FUZZ_REQUIRE(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "\nFUZZ CONTRACT BROKEN at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// Consumes the input front to back; past its end every read gives 0 (so short inputs are valid too).
class Input {
 public:
  Input(const uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  uint8_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  template <class T>
  T raw() {
    T v{};
    uint8_t b[sizeof(T)] = {};
    for (auto& x : b) x = byte();
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  bool flag() { return byte() & 1; }
  // An integer in [lo, hi] (lo when hi < lo; spans past 2^32 draw from the first 2^32 values).
  int64_t range(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;  // 0: all of int64
    const uint64_t r = raw<uint32_t>();
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + (span == 0 ? r : r % span));
  }
  // Mostly a small value in [lo, hi]; one time in eight an edge value that hostile callers pass
  // (negative, zero, int32 / int64 limits, powers of two near them).
  int64_t hostile(int64_t lo, int64_t hi) {
    const uint8_t k = byte();
    if (k % 8 != 0) return range(lo, hi);
    static constexpr int64_t kEdges[] = {0,
                                         -1,
                                         1,
                                         -2,
                                         std::numeric_limits<int32_t>::max(),
                                         std::numeric_limits<int32_t>::min(),
                                         int64_t{1} << 31,
                                         int64_t{1} << 32,
                                         int64_t{1} << 40,
                                         int64_t{1} << 55,
                                         int64_t{1} << 62,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::min() + 1,
                                         -(int64_t{1} << 40)};
    return kEdges[(k / 8) % (sizeof(kEdges) / sizeof(kEdges[0]))];
  }
  template <class T, std::size_t N>
  T pick(const T (&options)[N]) {
    return options[byte() % N];
  }
  std::size_t left() const { return n_ - i_; }

 private:
  const uint8_t* p_;
  std::size_t n_, i_ = 0;
};

// Runs `call` and says whether it rejected the input with mla::Error (printed when FUZZ_VERBOSE is set). Any other exception escapes
// (libFuzzer reports it as a crash): hostile input must give mla::Error, never bad_alloc & co.
template <class F>
bool rejects(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    if (std::getenv("FUZZ_VERBOSE")) std::fprintf(stderr, "rejected: %s\n", e.what());
    return true;
  }
  return false;
}

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}
inline void fill(const Tensor& t, uint8_t poison) { std::memset(t.data(), poison, t.nbytes()); }

// The two-poison contract for buffers that held different contents before the same call in each run
// (before0 / before1, e.g. a cache whose unreadable rows carry the two poisons): rejected, every byte
// is unchanged in both runs; accepted, every byte is either unchanged in both runs or written with the
// same value in both. Returns the index of the first offending byte, or -1.
// It compares 64-byte blocks with memcmp first (a block untouched in both runs, or equal in
// both, satisfies the contract byte by byte) and looks at single bytes only in the other blocks: the
// byte loop under coverage instrumentation was a seventh of fuzz_layer's time.
inline int64_t change_violation(const std::vector<uint8_t>& before0, const std::vector<uint8_t>& after0,
                                const std::vector<uint8_t>& before1, const std::vector<uint8_t>& after1,
                                bool rejected) {
  constexpr std::size_t kBlock = 64;
  const std::size_t n = after0.size();
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t len = std::min(kBlock, n - b);
    const bool untouched = std::memcmp(&after0[b], &before0[b], len) == 0 && std::memcmp(&after1[b], &before1[b], len) == 0;
    if (untouched || (!rejected && std::memcmp(&after0[b], &after1[b], len) == 0)) continue;
    for (std::size_t i = b; i < b + len; ++i) {
      const bool same = after0[i] == before0[i] && after1[i] == before1[i];
      if (rejected ? !same : !(same || after0[i] == after1[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}
// The same for destinations filled with poison a (run 1, bytes `x`) and poison b (run 2, bytes `y`).
inline int64_t poison_violation(const std::vector<uint8_t>& x, uint8_t a, const std::vector<uint8_t>& y, uint8_t b,
                                bool rejected) {
  return change_violation(std::vector<uint8_t>(x.size(), a), x, std::vector<uint8_t>(y.size(), b), y, rejected);
}

// x + y modulo 2^64 (hostile edits of int64 fields must not overflow in the harness itself).
inline int64_t wrap_add(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
}

inline constexpr uint8_t kPoisonA = 0xA5, kPoisonB = 0x5A;

// |got - want| within tol, NaN only where both are NaN, equal infinities.
inline bool close(double got, double want, double tol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= tol;
}

}  // namespace mla::fuzz
