// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element types (split out of types.h so that the cache-format description, which device code
// includes, needs nothing else). Values are stable (used in JSON records and the Python binding).
#include <cstddef>
#include <cstdint>

// Functions usable from host and device code (constexpr helpers of the format description).
#if defined(__CUDACC__)
#define MLA_HD __host__ __device__
#else
#define MLA_HD
#endif

namespace mla {

enum class DType : uint8_t {
  f32 = 0,
  f64 = 1,
  bf16 = 2,
  f16 = 3,
  fp8_e4m3 = 4,  // OCP e4m3fn: bias 7, max 448, no inf, NaN = 0x7f/0xff
  u8 = 5,        // raw bytes (fp8_ds_mla cache records)
  i32 = 6,
  i64 = 7,
};

// Bytes per element, usable in constant expressions and device code (0 for a value outside the enum;
// dtype_size() throws instead).
constexpr MLA_HD int dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::bf16: case DType::f16: return 2;
    case DType::fp8_e4m3: case DType::u8: return 1;
  }
  return 0;
}

std::size_t dtype_size(DType t);
const char* to_string(DType t);
bool is_floating(DType t);  // f32, f64, bf16, f16, fp8_e4m3

}  // namespace mla
