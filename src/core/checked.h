// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checked size arithmetic (issue 14): every size, stride, offset and count that user input reaches is
// combined through these, so that a product or sum past int64 (or size_t) throws mla::Error naming
// what was being computed instead of wrapping into a small number that a later write then overruns.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "mla/error.h"

namespace mla::detail {

// a * b; throws "<what>: <a> x <b> overflows int64" when it does not fit.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(fmt::format("{}: {} x {} overflows int64", what, a, b));
  return r;
}
// a + b; throws when it does not fit int64.
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Error(fmt::format("{}: {} + {} overflows int64", what, a, b));
  return r;
}
// A non-negative int64 as size_t (byte counts for allocation and copies).
inline std::size_t checked_size(int64_t v, const char* what) {
  if (v < 0) throw Error(fmt::format("{}: negative size {}", what, v));
  return static_cast<std::size_t>(v);
}
// n bytes rounded up to a multiple of `align` plus `extra`, as size_t; throws instead of wrapping.
inline std::size_t checked_round_up(std::size_t n, std::size_t align, std::size_t extra, const char* what) {
  std::size_t r;
  if (__builtin_add_overflow(n, align - 1 + extra, &r))
    throw Error(fmt::format("{}: {} bytes round past the address space", what, n));
  return r / align * align;
}

}  // namespace mla::detail
