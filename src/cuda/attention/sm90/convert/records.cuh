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
// Loads are coalesced: converter warp w owns keys 16 w .. 16 w + 15 of a tile, and lane l of the warp owns the l-th
// 16 codes of every one of them (one 16-byte chunk of e4m3 codes, or 8 bytes of e2m1 pairs), so that a warp's load
// instruction reads one record's contiguous bytes (4 or 2 lines) instead of one chunk of 32 records (32 lines: the
// L1 then tracks 32 partial-line misses per instruction and the converter waits on them). Lane l writes the row's
// bf16 chunks 2 l and 2 l + 1 (columns 16 l .. 16 l + 15). v4 keeps the by-key layout (Codes<v4>: thread (key, half)
// owns 18 chunks of its key): its 36-chunk body leaves lanes of the warp layout idle and measured slower there
// (convert/kernel.cuh convert_records).
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

// A ue8m0 scale byte b as the multiplier(s) of e4m3x2_tiny_bf16x2's value * 2^-120: m1 (and m2, 1.0 unless b > 134),
// without branches.
struct Ue8m0 {
  uint32_t m1, m2;
  __device__ __forceinline__ explicit Ue8m0(uint32_t b) {
    const bool big = b > 134;
    const uint32_t h1 = b == 255 ? kBf16Nan : big ? bf16_pow2(127) : bf16_pow2(static_cast<int>(b) - 7);
    const uint32_t h2 = big && b != 255 ? bf16_pow2(static_cast<int>(b) - 134) : bf16_pow2(0);
    m1 = splat(h1);
    m2 = splat(h2);
  }
  __device__ __forceinline__ static bool two(uint32_t b) { return b > 134 && b != 255; }
};

// An e4m3 scale byte as the multiplier(s) of the e2m1 decoding's value * 2^-126.
struct E4m3Scale {
  uint32_t m1, m2;
  __device__ __forceinline__ explicit E4m3Scale(uint32_t byte) {
    const __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
    const float f = __half2float(__half(hr));
    const bool big = two(byte);
    m1 = splat(big ? bf16_pow2(126) : __bfloat16_as_ushort(__float2bfloat16_rn(f * 0x1p126f)));
    m2 = splat(big ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : bf16_pow2(0));
  }
  // |scale| >= 4 (not NaN): e4m3 magnitudes from 4.0 are bytes 0x48 .. 0x7e.
  __device__ __forceinline__ static bool two(uint32_t byte) {
    const uint32_t m = byte & 0x7fu;
    return m >= 0x48u && m != 0x7fu;
  }
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

// v4 by key (the layout v4 measured faster in: see Warp): thread (key, half h), 584 bytes: a 576-byte body [448 e4m3 | 64 bf16 rope], its 8-byte slot of 7 ue8m0 scales, one per 64 codes, in
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
    for (int g = 0; g < 7; ++g) two |= Ue8m0::two(scale_byte(g));
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

// Codes::store with the half as a constant (every stage address a compile-time offset from the key's row).
template <class C>
__device__ __forceinline__ void store_half(const C& c, uint8_t* stage, int key, int half) {
  if (half) c.template store<1>(stage, key);
  else c.template store<0>(stage, key);
}

__device__ __forceinline__ uint32_t ldg_u8(const uint8_t* p) { return __ldg(p); }

// Per format: what lane l of a warp reads of a record and how it decodes it.
//   kBytes   bytes per lane from the body (16: e4m3 codes; 8: e2m1 pairs)
//   coded(l) whether lane l's bytes are codes (v4: lanes 28..31 read the first half of the bf16 rope, copied)
//   scale_at(l)  the lane's scale byte in the slot
template <CacheFormat F>
struct Lane;
// v4 (584 bytes: a 576-byte body [448 e4m3 | 64 bf16 rope]; the slot of 7 ue8m0 scales, one per 64 codes, in the
// page's scale region): lanes 0..27 codes 16 l .., scale l / 4; lanes 28..31 rope columns 8 (l - 28) .. (bytes 448 ..
// 511 of the body), copied; the rope's second half (bytes 512 .. 575) by cp.async at the store (Warp::store).
template <>
struct Lane<CacheFormat::v4> {
  static constexpr int kBytes = 16;
  static __device__ __forceinline__ bool coded(int l) { return l < 28; }
  static __device__ __forceinline__ int scale_at(int l) { return l < 28 ? l / 4 : 0; }
};
// v41 (528 bytes: 512 e4m3 codes | 16 ue8m0 scales, one per 32 codes): lane l codes 16 l .., scale l / 2.
template <>
struct Lane<CacheFormat::v41> {
  static constexpr int kBytes = 16;
  static __device__ __forceinline__ bool coded(int) { return true; }
  static __device__ __forceinline__ int scale_at(int l) { return l / 2; }
};
// v41_fp4 (288 bytes: 512 e2m1 codes in 256 bytes | 32 e4m3 scales, one per 16 codes): lane l bytes 8 l .. (codes
// 16 l ..), scale l.
template <>
struct Lane<CacheFormat::v41_fp4> {
  static constexpr int kBytes = 8;
  static __device__ __forceinline__ bool coded(int) { return true; }
  static __device__ __forceinline__ int scale_at(int l) { return l; }
};

// Stage chunk n of row `key` (n < 64: panel n / 8, chunk n % 8).
__device__ __forceinline__ uint8_t* chunk_at(uint8_t* stage, int key, int n) {
  return stage + (n / 8) * T::kPanelBytes + swz(key, n % 8);
}

// One converter warp's share of a tile: keys 16 w + j (j < 16), lane l's bytes of each and its scale byte. Key j's
// record is located by lane j (and lane j + 16, the same): body / slot, broadcast by shuffles.
template <CacheFormat F>
struct Warp {
  using L = Lane<F>;
  uint4 raw[16];
  uint32_t sb4[4];       // key j's scale byte in byte j % 4 of sb4[j / 4]
  uint32_t valid;        // bit j: key j read (every lane the same)
  const uint8_t* body;   // lane j: key j's body (v4's rope tail at the store)
  __device__ __forceinline__ void load(const uint8_t* body_j, const uint8_t* slot_j, bool v_j, int lane) {
    body = body_j;
    valid = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
#pragma unroll
    for (int q = 0; q < 4; ++q) sb4[q] = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(body_j), j));
      const uint8_t* sl = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(slot_j), j));
      const bool v = (valid >> j) & 1u;
      if constexpr (L::kBytes == 16) {
        raw[j] = v ? __ldg(reinterpret_cast<const uint4*>(b) + lane) : make_uint4(0, 0, 0, 0);
      } else {
        const uint2 x = v ? __ldg(reinterpret_cast<const uint2*>(b) + lane) : make_uint2(0, 0);
        raw[j] = make_uint4(x.x, x.y, 0, 0);
      }
      const uint32_t b8 = v && L::coded(lane) ? ldg_u8(sl + L::scale_at(lane)) : 0u;
      sb4[j / 4] |= b8 << (8 * (j % 4));
    }
  }
  __device__ __forceinline__ uint32_t sb(int j) const { return (sb4[j / 4] >> (8 * (j % 4))) & 0xffu; }
  // Lane l's two bf16 chunks of key j: 16 codes times their scale (first multiply).
  __device__ __forceinline__ void decode(int j, uint4& lo, uint4& hi) const {
    if constexpr (F == CacheFormat::v41_fp4) {
      const E4m3Scale s(sb(j));
      lo = mul4(e2m1x8_tiny(raw[j].x), s.m1);
      hi = mul4(e2m1x8_tiny(raw[j].y), s.m1);
    } else {
      const Ue8m0 s(sb(j));
      e4m3x16_tiny(raw[j], lo, hi);
      lo = mul4(lo, s.m1);
      hi = mul4(hi, s.m1);
    }
  }
  __device__ __forceinline__ static bool two(uint32_t b) {
    if constexpr (F == CacheFormat::v41_fp4) return E4m3Scale::two(b);
    else return Ue8m0::two(b);
  }
  __device__ __forceinline__ static uint32_t m2(uint32_t b) {
    if constexpr (F == CacheFormat::v41_fp4) return E4m3Scale(b).m2;
    else return Ue8m0(b).m2;
  }
  // Into the stage: rows 16 w + j, lane l's chunks 2 l, 2 l + 1 (v4 lanes 28..31: rope chunk 56 + l - 28, and the
  // rope's chunks 60..63 by cp.async, landed before return).
  __device__ __forceinline__ void store(uint8_t* stage, int w, int lane) const {
    if constexpr (F == CacheFormat::v4) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {  // keys l / 4 + 8 i, rope chunk 4 + l % 4 (bytes 512 + 16 (l % 4) of the body)
        const int j = lane / 4 + 8 * i;
        const uint8_t* b = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(body), j));
        ptx::cp_async_16_or_zero(chunk_at(stage, 16 * w + j, 60 + lane % 4), b + 512 + 16 * (lane % 4),
                                 !((valid >> j) & 1u));
      }
    }
    bool two_any = false;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int key = 16 * w + j;
      if (L::coded(lane)) {
        uint4 lo, hi;
        decode(j, lo, hi);
        *reinterpret_cast<uint4*>(chunk_at(stage, key, 2 * lane)) = lo;
        *reinterpret_cast<uint4*>(chunk_at(stage, key, 2 * lane + 1)) = hi;
        two_any |= two(sb(j));
      } else {
        *reinterpret_cast<uint4*>(chunk_at(stage, key, 56 + lane - 28)) = raw[j];
      }
    }
    if (__any_sync(0xffffffffu, two_any) && L::coded(lane)) {  // rare: a scale beyond one multiplier's range
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const uint32_t m = m2(sb(j));
        times(stage, 16 * w + j, 2 * lane, m);
        times(stage, 16 * w + j, 2 * lane + 1, m);
      }
    }
    if constexpr (F == CacheFormat::v4) {
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
    }
  }
};

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
