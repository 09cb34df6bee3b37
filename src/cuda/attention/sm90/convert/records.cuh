// SPDX-License-Identifier: Apache-2.0
#pragma once
// The converter kernel's DeepSeek-V4 record decoders (mla/cache_format.h: v4, v41, v41_fp4): one key's record half
// from global memory into registers, then exactly into a stage of bf16 panels (docs/design/attention_sm90.md "The
// converter kernel", V4 records).
//
// Every record value code * scale is a bf16 number (SEMANTICS §3.5; v4 / v41: an e4m3 code, 4 significant bits,
// times a power of two 2^(b - 127); v41_fp4: an e2m1 code, 2 significant bits, times an e4m3 scale, 4 significant
// bits), so the stage holds the value itself and the consumers run plain bf16 products. The decoding:
//   e4m3: the code's bf16 bits times 2^-120 by integer ops (e4m3x2_tiny_bf16x2: exact, NaN codes stay NaN), one
//         bf16 multiply by 2^(b - 7) (a power of two: exact). b > 134 would overflow the multiplier: such a
//         thread's warp multiplies twice (2^127, then 2^(b - 134)); b = 255 is NaN.
//   e2m1: a nibble's sign and three magnitude bits placed at bf16 bits 15 and 6..8 are value * 2^-126 (e = 0, the
//         half, is a bf16 subnormal: exact), one bf16 multiply by 2^126 * scale (exact: 4 significant bits) when
//         |scale| < 4, else two (2^126, then the scale). A NaN scale (0x7f / 0xff) makes its 16 values NaN.
// Thread (key, half h) owns half of its key's columns: 256 h .. 256 h + 255 (latent panels 4 h .. 4 h + 3) for v41 /
// v41_fp4; for v4 codes 224 h .. 224 h + 223 and rope columns 448 + 32 h .. + 31 (18 chunks each).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/traits.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90::records {

using T = Traits;

// bf16 bits of 2^k (|k| <= 127 normal range: -126 .. 127).
__device__ __forceinline__ uint32_t bf16_pow2(int k) { return static_cast<uint32_t>(k + 127) << 7; }
__device__ __forceinline__ uint32_t splat(uint32_t h) { return h | h << 16; }
inline constexpr uint32_t kBf16Nan = 0x7fc0u;

// A ue8m0 scale byte b as the multiplier(s) of e4m3x2_tiny_bf16x2's value * 2^-120: m1 (and m2, 1.0 unless b > 134).
struct Ue8m0 {
  uint32_t m1, m2;
  __device__ __forceinline__ explicit Ue8m0(uint32_t b) {
    if (b == 255) {
      m1 = splat(kBf16Nan);
      m2 = splat(bf16_pow2(0));
    } else if (b <= 134) {
      m1 = splat(bf16_pow2(static_cast<int>(b) - 7));
      m2 = splat(bf16_pow2(0));
    } else {
      m1 = splat(bf16_pow2(127));
      m2 = splat(bf16_pow2(static_cast<int>(b) - 134));
    }
  }
  __device__ __forceinline__ bool two() const { return m2 != splat(bf16_pow2(0)); }
};

// An e4m3 scale byte as the multiplier(s) of the e2m1 decoding's value * 2^-126.
struct E4m3Scale {
  uint32_t m1, m2;
  __device__ __forceinline__ explicit E4m3Scale(uint32_t byte) {
    const __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
    const float f = __half2float(__half(hr));
    if (f != f || fabsf(f) < 4.0f) {
      m1 = splat(__bfloat16_as_ushort(__float2bfloat16_rn(f * 0x1p126f)));
      m2 = splat(bf16_pow2(0));
    } else {
      m1 = splat(bf16_pow2(126));
      m2 = splat(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
    }
  }
  __device__ __forceinline__ bool two() const { return m2 != splat(bf16_pow2(0)); }
};

// Sixteen e4m3 codes (byte i = column i) as bf16 code * 2^-120 into lo (columns 0..7) and hi (8..15).
__device__ __forceinline__ void e4m3x16_tiny(const uint4& raw, uint4& lo, uint4& hi) {
  const uint32_t n0 = (raw.x & 0x7f7f7f7fu) + 0x01010101u, n1 = (raw.y & 0x7f7f7f7fu) + 0x01010101u;
  const uint32_t n2 = (raw.z & 0x7f7f7f7fu) + 0x01010101u, n3 = (raw.w & 0x7f7f7f7fu) + 0x01010101u;
  lo = make_uint4(e4m3x2_tiny_bf16x2<0>(raw.x, n0), e4m3x2_tiny_bf16x2<2>(raw.x, n0), e4m3x2_tiny_bf16x2<0>(raw.y, n1),
                  e4m3x2_tiny_bf16x2<2>(raw.y, n1));
  hi = make_uint4(e4m3x2_tiny_bf16x2<0>(raw.z, n2), e4m3x2_tiny_bf16x2<2>(raw.z, n2), e4m3x2_tiny_bf16x2<0>(raw.w, n3),
                  e4m3x2_tiny_bf16x2<2>(raw.w, n3));
}

// The two e2m1 codes of byte kByte of w (low nibble: the lower column) as bf16 value * 2^-126; w4 = w << 4. PRMT
// puts each nibble in the high half of a byte (its sign at bit 7) with a sign-replicated byte above it; shifted by
// two, the magnitude lands on bf16 bits 6..8 and the replicated sign on bit 15.
template <int kByte>
__device__ __forceinline__ uint32_t e2m1x2_tiny(uint32_t w, uint32_t w4) {
  constexpr uint32_t kSel = kByte | (0x8u | kByte) << 4 | (4 + kByte) << 8 | (0x8u | (4 + kByte)) << 12;
  return (prmt(w4, w, kSel) << 2) & 0x81c081c0u;
}
// Eight e2m1 codes (one word) as one bf16 chunk times 2^-126.
__device__ __forceinline__ uint4 e2m1x8_tiny(uint32_t w) {
  const uint32_t w4 = w << 4;
  return make_uint4(e2m1x2_tiny<0>(w, w4), e2m1x2_tiny<1>(w, w4), e2m1x2_tiny<2>(w, w4), e2m1x2_tiny<3>(w, w4));
}

__device__ __forceinline__ uint4 mul4(const uint4& v, uint32_t m) {
  return make_uint4(bf16x2_mul(v.x, m), bf16x2_mul(v.y, m), bf16x2_mul(v.z, m), bf16x2_mul(v.w, m));
}
// Chunk n (columns 8 n .. 8 n + 7, n < 64) of row `key` into the stage: panel n / 8, chunk n % 8.
__device__ __forceinline__ void put(uint8_t* stage, int key, int n, const uint4& v) {
  *reinterpret_cast<uint4*>(stage + (n / 8) * T::kPanelBytes + swz(key, n % 8)) = v;
}

// The rare second multiply (a scale beyond one multiplier's range, Ue8m0 / E4m3Scale::two): stage chunk n of row
// `key` times m2, in place.
__device__ __forceinline__ void times(uint8_t* stage, int key, int n, uint32_t m2) {
  uint4* a = reinterpret_cast<uint4*>(stage + (n / 8) * T::kPanelBytes + swz(key, n % 8));
  *a = mul4(*a, m2);
}

// N consecutive 16-byte chunks from src (read-only path), zeros when !valid (nothing read).
template <int N>
__device__ __forceinline__ void load16(uint4 (&dst)[N], const uint8_t* src, bool valid, int n = N) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    dst[i] = valid && i < n ? __ldg(reinterpret_cast<const uint4*>(src + 16 * i)) : make_uint4(0, 0, 0, 0);
}

template <CacheFormat F>
struct Codes;

// v4 (584 bytes: a 576-byte body [448 e4m3 | 64 bf16 rope], its 8-byte slot of 7 ue8m0 scales, one per 64 codes, in
// the page's scale region). Half h: codes 224 h .. 224 h + 223 (raw 0..13, 16 codes each) into registers, the whole
// slot; its rope columns 448 + 32 h .. + 31 (bf16, 64 bytes) go straight into panel 7 by cp.async when the stage is
// written (no registers held across the stage's wait; the copies land before the stage is published).
template <>
struct Codes<CacheFormat::v4> {
  uint4 raw[14];
  uint2 slot;
  const uint8_t* rope;
  bool valid;
  __device__ __forceinline__ void load(const uint8_t* body, const uint8_t* slot_ptr, bool v, int half) {
    valid = v;
    load16(raw, body + 224 * half, valid);
    slot = valid ? __ldg(reinterpret_cast<const uint2*>(slot_ptr)) : make_uint2(0, 0);
    rope = body + 448 + 64 * half;
  }
  __device__ __forceinline__ uint32_t scale_byte(int g) const { return ((g < 4 ? slot.x : slot.y) >> (8 * (g & 3))) & 0xffu; }
  template <int half>
  __device__ __forceinline__ void store(uint8_t* stage, int key) const {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      ptx::cp_async_16_or_zero(stage + 7 * T::kPanelBytes + swz(key, 4 * half + i), rope + 16 * i, !valid);
#pragma unroll
    for (int i = 0; i < 14; ++i) {
      const int c = 14 * half + i;  // 16-code chunk of the row: columns 16 c .. 16 c + 15, scale c / 4
      const Ue8m0 s(scale_byte(c / 4));
      uint4 lo, hi;
      e4m3x16_tiny(raw[i], lo, hi);
      put(stage, key, 2 * c, mul4(lo, s.m1));
      put(stage, key, 2 * c + 1, mul4(hi, s.m1));
    }
    bool two = false;
#pragma unroll
    for (int g = 0; g < 7; ++g) two |= Ue8m0(scale_byte(g)).two();
    if (__any_sync(0xffffffffu, two)) {
#pragma unroll 1
      for (int c = 14 * half; c < 14 * half + 14; ++c) {
        const Ue8m0 s(scale_byte(c / 4));
        times(stage, key, 2 * c, s.m2);
        times(stage, key, 2 * c + 1, s.m2);
      }
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
  }
};

// v41 (528 bytes: 512 e4m3 codes | 16 ue8m0 scales, one per 32 codes). Half h: codes 256 h .. (raw 0..15), scales
// 8 h .. 8 h + 7.
template <>
struct Codes<CacheFormat::v41> {
  uint4 raw[16];
  uint2 slot;
  bool valid;
  __device__ __forceinline__ void load(const uint8_t* body, const uint8_t* slot_ptr, bool v, int half) {
    valid = v;
    load16(raw, body + 256 * half, valid);
    slot = valid ? __ldg(reinterpret_cast<const uint2*>(slot_ptr) + half) : make_uint2(0, 0);
  }
  template <int half>
  __device__ __forceinline__ void store(uint8_t* stage, int key) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const Ue8m0 s(scale_byte(i / 2));
      uint4 lo, hi;
      e4m3x16_tiny(raw[i], lo, hi);
      put(stage, key, 32 * half + 2 * i, mul4(lo, s.m1));
      put(stage, key, 32 * half + 2 * i + 1, mul4(hi, s.m1));
    }
    bool two = false;
#pragma unroll
    for (int g = 0; g < 8; ++g) two |= Ue8m0(scale_byte(g)).two();
    if (__any_sync(0xffffffffu, two)) {
#pragma unroll 1
      for (int i = 0; i < 16; ++i) {
        const Ue8m0 s(scale_byte(i / 2));
        times(stage, key, 32 * half + 2 * i, s.m2);
        times(stage, key, 32 * half + 2 * i + 1, s.m2);
      }
    }
  }
  __device__ __forceinline__ uint32_t scale_byte(int g) const { return ((g < 4 ? slot.x : slot.y) >> (8 * (g & 3))) & 0xffu; }
};

// v41_fp4 (288 bytes: 512 e2m1 codes in 256 bytes | 32 e4m3 scales, one per 16 codes). Half h: bytes 128 h ..
// (raw 0..7: 32 codes each), scales 16 h .. 16 h + 15.
template <>
struct Codes<CacheFormat::v41_fp4> {
  uint4 raw[8];
  uint4 slot;
  bool valid;
  __device__ __forceinline__ void load(const uint8_t* body, const uint8_t* slot_ptr, bool v, int half) {
    valid = v;
    load16(raw, body + 128 * half, valid);
    slot = valid ? __ldg(reinterpret_cast<const uint4*>(slot_ptr) + half) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ uint32_t scale_byte(int g) const {
    const uint32_t w = g < 4 ? slot.x : g < 8 ? slot.y : g < 12 ? slot.z : slot.w;
    return (w >> (8 * (g & 3))) & 0xffu;
  }
  template <int half>
  __device__ __forceinline__ void store(uint8_t* stage, int key) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // word k: codes 8k .. 8k + 7 of the chunk, scale 2 i + k / 2
        const E4m3Scale s(scale_byte(2 * i + k / 2));
        put(stage, key, 32 * half + 4 * i + k, mul4(e2m1x8_tiny(w[k]), s.m1));
      }
    }
    bool two = false;
#pragma unroll
    for (int g = 0; g < 16; ++g) two |= E4m3Scale(scale_byte(g)).two();
    if (__any_sync(0xffffffffu, two)) {
#pragma unroll 1
      for (int n = 0; n < 32; ++n) times(stage, key, 32 * half + n, E4m3Scale(scale_byte(n / 2)).m2);
    }
  }
};

// Codes::store with the half as a constant (every stage address a compile-time offset from the key's row).
template <class C>
__device__ __forceinline__ void store_half(const C& c, uint8_t* stage, int key, int half) {
  if (half) c.template store<1>(stage, key);
  else c.template store<0>(stage, key);
}

// One index list of a token: entries [0, len) of `row` name flat rows of its cache (block r / page_size, offset
// r % page_size; outside [0, num_slots) never read). The cache's geometry G (DecodeSm90Params::Gather or ::Extra:
// cache, strides, num_slots, page_size, page_div) is read from the kernel parameters where it is used.
struct List {
  const int32_t* row;
  int len;
};

// Entry j of the list: the flat row it names, or kNoRow past the list's length (the one global read a key needs,
// made a tile before its record is located).
__device__ __forceinline__ int32_t entry(const List& l, int j) { return j < l.len ? l.row[j] : kNoRow; }

// The record of flat row idx: its body and scale slot, and whether it is read (false: idx outside the cache,
// kNoRow included; body / slot then point at the cache base, never read).
template <CacheFormat F, class G>
__device__ __forceinline__ bool locate(const G& geo, int32_t idx, const uint8_t*& body, const uint8_t*& slot) {
  using Fmt = CacheFormatTraits<F>;
  body = slot = geo.cache;
  if (idx < 0 || idx >= geo.num_slots) return false;
  uint32_t blk, r;
  fast_divmod(static_cast<uint32_t>(idx), geo.page_div, blk, r);
  const uint8_t* page = geo.cache + static_cast<int64_t>(blk) * geo.stride_block_bytes;
  body = page + Fmt::body_offset(r, geo.stride_row_bytes);
  slot = page + Fmt::slot_offset(geo.page_size, r, geo.stride_row_bytes);
  return true;
}

}  // namespace mla::cuda::decode_sm90::records
