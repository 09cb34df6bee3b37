// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host-side scalar conversions with the exact rounding the contract names: bf16 and f16 round to
// nearest even; e4m3 (OCP e4m3fn) rounds to nearest even and saturates to +-448 (satfinite), NaN stays
// NaN. Used by the CPU backend and by tests; the CUDA backend uses the hardware conversions, which
// round the same way (tests compare both). The rules CUDA code must reproduce bit for bit in integer
// arithmetic (bf16_bits_rn, e2m1_bits) are constexpr and free of library calls, written once here and
// compiled for the device too (--expt-relaxed-constexpr; tests/gpu/test_ptx_convert.cu pins device = host).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "mla/types.h"

namespace mla::num {

inline constexpr float kFp8Max = 448.0f;

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The bf16 bits of f (in the low 16 bits) rounded to nearest even, a NaN quietened (bit 6 of its bf16
// mantissa set, the rest of the payload kept), in 32-bit integer arithmetic. The CUDA cache writer stores
// the fp8_ds_mla rope through it (src/cuda/cache/write_kernel.cuh): the bytes of a cvt.rn.bf16 result stored
// one by one came out wrong on sm_90a (CUDA 13.0), the bits of a plain 32-bit integer do not.
constexpr uint32_t bf16_bits_rn(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
constexpr uint16_t float_to_bf16(float f) { return static_cast<uint16_t>(bf16_bits_rn(f)); }

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
inline uint16_t float_to_f16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (std::isnan(f)) return 0x7e00u;
  double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00u;  // rounds to inf
  if (a < std::ldexp(1.0, -14)) {            // subnormal: quantum 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
  }
  int e;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint(m * 2048.0);  // 11 significant bits
  if (q == 2048.0) { q = 1024.0; ++e; }
  const uint32_t exp_field = static_cast<uint32_t>(e - 1 + 15);
  return sign | static_cast<uint16_t>((exp_field << 10) | (static_cast<uint32_t>(q) - 1024u));
}

inline float e4m3_to_float(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, man = b & 0x7u;
  float v;
  if (exp == 0xf && man == 0x7) v = NAN;
  else if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);
  else v = std::ldexp(static_cast<float>(man | 0x8u), static_cast<int>(exp) - 10);
  return sign ? -v : v;
}
// Round to nearest even, saturate finite values and infinities to +-448, NaN -> 0x7f.
inline uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80u : 0u;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 448.0) return sign | 0x7eu;
  if (a < std::ldexp(1.0, -6)) {  // subnormal, quantum 2^-9; q == 8 is the smallest normal 0x08
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  int e;
  double m = std::frexp(a, &e);       // m in [0.5, 1)
  double q = std::nearbyint(m * 16.0);  // 4 significant bits
  if (q == 16.0) { q = 8.0; ++e; }
  const uint32_t exp_field = static_cast<uint32_t>(e - 1 + 7);
  uint8_t bits = static_cast<uint8_t>((exp_field << 3) | (static_cast<uint32_t>(q) - 8u));
  if ((bits & 0x7f) == 0x7f) bits = 0x7e;  // 480 is NaN's code: saturate to 448
  return sign | bits;
}
// e2m1 (NVFP4's element, a 4-bit code: sign in bit 3, then 2 exponent bits and 1 mantissa bit):
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0..7. float -> e2m1 rounds to nearest even (ties
// 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturates beyond 6 and
// +-inf to +-6, keeps the sign bit of every value (zero included) and maps NaN to 0x7 (+6): e2m1 has no NaN
// code, so writers whose NaN must read back as NaN mark it elsewhere (the V4.1 record's NaN scale).
// The magnitude code (0..7) of a non-negative float; NaN -> 7. It and e2m1_bits are constexpr and free of
// library calls: the CUDA output quantiser calls e2m1_bits itself (src/cuda/block/quantize_output.cu).
constexpr uint8_t e2m1_magnitude(float a) {
  return a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
}
// The e2m1 code of f in the low 4 bits of a 32-bit word (the form device code packs two per byte from).
constexpr uint32_t e2m1_bits(float f) {
  if (f != f) return 0x7u;  // NaN
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return (u >> 31) << 3 | e2m1_magnitude(std::bit_cast<float>(u & 0x7fffffffu));
}
constexpr uint8_t float_to_e2m1(float f) { return static_cast<uint8_t>(e2m1_bits(f)); }
// The value of an e2m1 code (low 4 bits; code 8 is -0), constexpr for the device's record readers.
constexpr float e2m1_value(uint32_t code) {
  const uint32_t e = code >> 1 & 3u, m = code & 1u;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m) : static_cast<float>(2u + m) * static_cast<float>(1u << e) * 0.25f;
  return (code & 8u) ? -mag : mag;
}
inline float e2m1_to_float(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 0x7u];
  return (code & 0x8u) ? -v : v;
}
// Value of e4m3 rounding as a float (quantise and back).
inline float round_e4m3(float f) { return e4m3_to_float(float_to_e4m3(f)); }

// UE8M0 (an unsigned power-of-two exponent byte): 2^(b - 127); 0xff is NaN.
inline double ue8m0_to_double(uint8_t b) { return b == 0xffu ? NAN : std::ldexp(1.0, static_cast<int>(b) - 127); }
// The same as a float, exactly (b = 0 is the subnormal 2^-127), in integer arithmetic: device code reads
// record scales through it.
constexpr float ue8m0_to_float(uint32_t b) {
  return b >= 0xffu ? std::bit_cast<float>(0x7fc00000u)
         : b == 0u  ? std::bit_cast<float>(0x00400000u)
                    : std::bit_cast<float>(b << 23);
}
// The power-of-two record scale 2^ceil(log2(max(amax / 448, 1e-4))) as its UE8M0 byte, computed
// exactly from the float's exponent field; a non-finite scale (amax infinite) gives 0xff (NaN: the block
// reads back NaN). amax is never NaN (writers skip NaN inputs). amax / 448 is one correctly rounded float
// division on the host and the device alike (nvcc's default -prec-div=true); the CPU and the CUDA
// writers both call this.
constexpr uint32_t pow2_scale_ue8m0_bits(float amax) {
  const float q = amax / 448.0f;
  const float s = q > 1e-4f ? q : 1e-4f;
  const uint32_t u = std::bit_cast<uint32_t>(s);
  const uint32_t e = u >> 23 & 0xffu;  // s >= 1e-4 is normal and positive
  if (e == 0xffu) return 0xffu;
  return (u & 0x7fffffu) ? e + 1 : e;  // s = 1.m * 2^(e - 127): ceil(log2 s) = e - 127 (+1 unless m == 0)
}
constexpr uint8_t pow2_scale_ue8m0(float amax) { return static_cast<uint8_t>(pow2_scale_ue8m0_bits(amax)); }
// Reciprocal of a writer's scale byte (e in [1, 253]: 2^(127 - (e - 127)) is a normal float; 0xff -> NaN):
// x * ue8m0_recip(e) equals the IEEE quotient x / 2^(e - 127) for every float x, both being x * 2^-k rounded
// once.
constexpr float ue8m0_recip(uint32_t e) {
  return e >= 0xffu ? std::bit_cast<float>(0x7fc00000u) : std::bit_cast<float>((254u - e) << 23);
}
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// Load / store one element of any floating (or integer) dtype as double. The address need not be
// aligned to the element (issue 14: bf16 values inside byte-addressed fp8_ds_mla rows sit at odd
// addresses when the row stride is odd): memcpy, which compiles to the same single move.
template <class T>
inline T load_as(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
inline void store_as(void* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
inline double load(const void* p, DType t) {
  switch (t) {
    case DType::f32: return load_as<float>(p);
    case DType::f64: return load_as<double>(p);
    case DType::bf16: return bf16_to_float(load_as<uint16_t>(p));
    case DType::f16: return f16_to_float(load_as<uint16_t>(p));
    case DType::fp8_e4m3: return e4m3_to_float(*static_cast<const uint8_t*>(p));
    case DType::u8: return *static_cast<const uint8_t*>(p);
    case DType::i32: return load_as<int32_t>(p);
    case DType::i64: return static_cast<double>(load_as<int64_t>(p));
  }
  return NAN;
}
inline void store(void* p, DType t, double v) {
  switch (t) {
    case DType::f32: store_as(p, static_cast<float>(v)); return;
    case DType::f64: store_as(p, v); return;
    case DType::bf16: store_as(p, float_to_bf16(static_cast<float>(v))); return;
    case DType::f16: store_as(p, float_to_f16(static_cast<float>(v))); return;
    case DType::fp8_e4m3: *static_cast<uint8_t*>(p) = float_to_e4m3(static_cast<float>(v)); return;
    case DType::u8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); return;
    case DType::i32: store_as(p, static_cast<int32_t>(v)); return;
    case DType::i64: store_as(p, static_cast<int64_t>(v)); return;
  }
}
// Index load (i32 or i64) as int64.
inline int64_t load_index(const void* p, DType t) {
  return t == DType::i64 ? load_as<int64_t>(p) : load_as<int32_t>(p);
}

}  // namespace mla::num
