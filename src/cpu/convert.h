// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row conversions between activation dtypes (bf16 / f16 / f32 / f64) and an accumulation type T (float
// or double), shared by the CPU attention ops and gemm. Inputs are converted once per row into T
// buffers; results are rounded once to the output dtype.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "mla/types.h"

namespace mla::cpu {

// n contiguous elements of a floating dtype -> T.
template <class T>
inline void load_row(const void* src, DType dt, T* dst, int64_t n) {
  switch (dt) {
    case DType::f32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::f64: {
      const double* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::bf16: {  // possibly at an odd address (the rope of an fp8_ds_mla row, odd row stride)
      const char* s = static_cast<const char*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(num::bf16_to_float(num::load_as<uint16_t>(s + 2 * i)));
      return;
    }
    default: {  // f16 (validated callers pass floating dtypes only)
      const char* s = static_cast<const char*>(src);
      const int64_t es = static_cast<int64_t>(dtype_size(dt));
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(num::load(s + i * es, dt));
      return;
    }
  }
}

// double -> float rounded *to odd* (truncate, then set the last bit if anything was lost). float keeps
// at least 13 more bits than bf16 / f16, so rounding this float to nearest even gives the same result as
// rounding the double directly: reference-mode outputs are correctly rounded, not rounded twice.
inline float to_float_odd(double x) {
  float f = static_cast<float>(x);
  if (std::isfinite(f) && static_cast<double>(f) != x) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::fabs(static_cast<double>(f)) > std::fabs(x)) --u;  // magnitude toward zero, same sign
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return f;
}
inline float to_float_odd(float x) { return x; }

// n values of T -> contiguous elements of dtype dt, rounded to nearest even.
template <class T>
inline void store_row(void* dst, DType dt, const T* src, int64_t n) {
  switch (dt) {
    case DType::f32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(src[i]);
      return;
    }
    case DType::f64: {
      double* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(src[i]);
      return;
    }
    default: {  // bf16 / f16
      char* d = static_cast<char*>(dst);
      const int64_t es = static_cast<int64_t>(dtype_size(dt));
      for (int64_t i = 0; i < n; ++i) num::store(d + i * es, dt, to_float_odd(src[i]));
      return;
    }
  }
}

}  // namespace mla::cpu
