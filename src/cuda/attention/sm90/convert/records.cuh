// SPDX-License-Identifier: Apache-2.0
#pragma once
// The converter kernel's DeepSeek-V4 record decoders (mla/cache_format.h: v4, v41, v41_fp4): one key's record half
// from global memory into registers, then into a stage of f16 panels relative to the unit's running power-of-two
// reference 2^r (docs/design/attention_sm90.md "DeepSeek-V4 records on the converter kernel").
//
// The stage of a tile holds f16(value * 2^-r), r the reference the converter warpgroup set for the tile (the largest
// scale exponent of the unit's keys so far: exponent() below, convert/kernel.cuh next_reference), each value rounded
// once: exact when value * 2^-r is a normal f16 or a subnormal one without lost bits (every e4m3 value from
// 2^(r - 21), every v41_fp4 value from 2^(r - 19), every bf16 rope value from 2^(r - 17)), otherwise off by at most
// 2^(r - 25) (SEMANTICS §3.5). The decoding:
//   e4m3: one F2FP per pair (e4m3x2_lo_to_f16x2: exact, NaN codes stay NaN), one f16 multiply by 2^k, k = b - 127 - r
//         <= 0 (a power of two: one rounding, none while the product is normal). 2^k for k < -24 is no f16 number:
//         for -33 <= k < -24 the warp multiplies twice (2^-12, exact, then 2^(k + 12)); below, every product rounds to
//         0 and f16(2^k) = 0 gives it. b = 255 is NaN.
//   e2m1: a nibble's sign and three magnitude bits placed at f16 bits 15 and 9..11 are value * 2^-14 (e = 0, the
//         half, is an f16 subnormal: exact), one f16 multiply by f16(2^14 * scale * 2^-r) <= 2^14: exact whenever
//         the product is not 0 after rounding (the multiplier is exact from scale * 2^-r >= 2^-35; below, both round
//         to 0). A NaN scale (0x7f / 0xff) makes its 16 values NaN.
//   bf16 (v4's rope): to f32, times 2^-r, F2FP.
// Loads are coalesced: converter warp w owns keys 16 w .. 16 w + 15 of a tile, and lane l of the warp owns the l-th
// 16 codes of every one of them (one 16-byte chunk of e4m3 codes, or 8 bytes of e2m1 pairs), so that a warp's load
// instruction reads one record's contiguous bytes (4 or 2 lines) instead of one chunk of 32 records (32 lines: the
// L1 then tracks 32 partial-line misses per instruction and the converter waits on them). Lane l writes the row's
// f16 chunks 2 l and 2 l + 1 (columns 16 l .. 16 l + 15). v4's 36-chunk body takes eight lanes a record (Warp<v4>:
// four records a load, its rope by cp.async into shared memory).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/attention/sm90/common/exact_codes.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/traits.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90::records {

using T = Traits;

// The reference's range: r never below kRefFloor (a tile of no loaded key keeps it; a ue8m0 byte 0, 2^-127, then
// reads as 0: below 448 * 2^-127, inside the bound's 2^(r - 25)) nor above kRefCeil (a ue8m0 scale up to 2^127
// then multiplies by at most 2^7: 448 * 2^7 is an f16 number), so that 2^r, 2^-r and 2^(r - 6) are normal floats.
inline constexpr int kRefFloor = -64, kRefCeil = 120;
inline constexpr uint32_t kF16x2Nan = 0x7e007e00u;

// f16x2 of 2^k in both halves (k <= 15; 2^-24 .. 2^-15 subnormal, 0 below 2^-24: 2^-25 rounds to even).
__device__ __forceinline__ uint32_t f16x2_pow2(int k) {
  const float f = exp2i(k < -40 ? -40 : k);
  return ptx::pack_f16x2(f, f);
}
__device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Scale exponents (the reference's candidates) from four scale bytes at once: a rank per byte, the largest rank's
// exponent below. ue8m0: rank (b + 1) & 0xff (the NaN byte ranks 0, b = 0, 2^-127, ranks 1: both below the floor),
// exponent rank - 128. e4m3 scale: rank (m + 1) & 0x7f of its magnitude bits m (NaN 0x7f ranks 0, zero 1: no
// exponent), exponent ceil(log2 |scale|) = ((m + 7) >> 3) - 7 for normal m (an upper bound for subnormal ones).
__device__ __forceinline__ uint32_t ue8m0_rank4(uint32_t w) { return ((w & 0x7f7f7f7fu) + 0x01010101u) ^ (w & 0x80808080u); }
__device__ __forceinline__ int ue8m0_exponent(uint32_t rank) { return static_cast<int>(rank) - 128; }
__device__ __forceinline__ uint32_t e4m3_rank4(uint32_t w) { return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x7f7f7f7fu; }
__device__ __forceinline__ int e4m3_exponent(uint32_t rank) {
  return rank <= 1u ? kRefFloor - 1 : static_cast<int>((rank + 6u) >> 3) - 7;
}
__device__ __forceinline__ uint32_t byte_max(uint32_t w) {
  return max(max(w & 0xffu, (w >> 8) & 0xffu), max((w >> 16) & 0xffu, w >> 24));
}
// The exponent of a v4 rope's largest magnitude (bf16 bits; NaN ignored, an infinity gives the ceiling), less 8:
// its values times 2^-r stay below 2^9, as an e4m3 code's 448.
__device__ __forceinline__ uint32_t bf16x2_absmax(uint32_t acc, uint32_t w) {
  uint32_t d;
  asm("{.reg .b32 a; and.b32 a, %2, 0x7fff7fff; max.bf16x2 %0, %1, a;}" : "=r"(d) : "r"(acc), "r"(w));
  return d;
}
__device__ __forceinline__ int bf16_rope_exponent(uint32_t absmax2) {
  const uint32_t h = max(absmax2 & 0xffffu, absmax2 >> 16);
  return static_cast<int>(h >> 7) - 127 - 8;
}

// A ue8m0 scale byte b against the reference r as the f16 multipliers of an e4m3 code: m1, and m2 (1.0 unless
// two: 2^k is below f16's range while some code * 2^k is not 0 after rounding). The rare second multiply computes
// m2 in its own loop (no value of the first kept for it).
struct Ue8m0 {
  __device__ __forceinline__ static bool two(uint32_t b, int r) {
    const int k = static_cast<int>(b) - 127 - r;
    return b != 255u && k < -24 && k >= -33;
  }
  // m1 by integer ops (Warp<v4>) or through a float (f16x2_pow2: Warp<v41>). The same bits.
  __device__ __forceinline__ static uint32_t m1_f32(uint32_t b, int r) {
    const int k = static_cast<int>(b) - 127 - r;
    return b == 255u ? kF16x2Nan : f16x2_pow2(two(b, r) ? -12 : k);
  }
  __device__ __forceinline__ static uint32_t m1(uint32_t b, int r) {
    const int k = static_cast<int>(b) - 127 - r;
    // f16 bits of 2^k: normal from 2^-14, subnormal 2^-24 .. 2^-15, 0 below; 2^-12 for the first of two.
    const uint32_t h = k >= -14 ? static_cast<uint32_t>(k + 15) << 10 : k >= -24 ? 1u << (k + 24) : 0u;
    return b == 255u ? kF16x2Nan : (two(b, r) ? 0x0c000c00u : h * 0x10001u);
  }
  __device__ __forceinline__ static uint32_t m2(uint32_t b, int r) {
    return f16x2_pow2(two(b, r) ? static_cast<int>(b) - 115 - r : 0);
  }
};

// An e4m3 scale byte against the reference r as the multiplier of the e2m1 decoding's value * 2^-14:
// f16(2^14 * scale * 2^-r), <= 2^14 (r covers the scale); NaN for the NaN scale.
__device__ __forceinline__ uint32_t e4m3_scale_f16x2(uint32_t byte, int r) {
  const uint32_t h = e4m3x2_lo_to_f16x2(byte);
  const float x = __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu))) * exp2i(14 - r);
  return ptx::pack_f16x2(x, x);
}

// The two e2m1 codes of byte kByte of w (low nibble: the lower column) as f16 value * 2^-14; w4 = w << 4. PRMT puts
// each nibble in the high half of a byte (its sign at bit 7) with a sign-replicated byte above it; shifted by five,
// the magnitude lands on f16 bits 9..11 (mantissa bit 9, exponent bits 10..11) and the replicated sign on bit 15.
template <int kByte>
__device__ __forceinline__ uint32_t e2m1x2_f16(uint32_t w, uint32_t w4) {
  constexpr uint32_t kSel = kByte | (0x8u | kByte) << 4 | (4 + kByte) << 8 | (0x8u | (4 + kByte)) << 12;
  return (prmt(w4, w, kSel) << 5) & 0x8e008e00u;
}
// Eight e2m1 codes (one word) as one f16 chunk times 2^-14.
__device__ __forceinline__ uint4 e2m1x8_f16(uint32_t w) {
  const uint32_t w4 = w << 4;
  return make_uint4(e2m1x2_f16<0>(w, w4), e2m1x2_f16<1>(w, w4), e2m1x2_f16<2>(w, w4), e2m1x2_f16<3>(w, w4));
}

__device__ __forceinline__ uint4 mul4(const uint4& v, uint32_t m) {
  return make_uint4(f16x2_mul(v.x, m), f16x2_mul(v.y, m), f16x2_mul(v.z, m), f16x2_mul(v.w, m));
}
// Stage chunk n of row `key` (n < 64: panel n / 8, chunk n % 8).
__device__ __forceinline__ uint8_t* chunk_at(uint8_t* stage, int key, int n) {
  return stage + (n / 8) * T::kPanelBytes + swz(key, n % 8);
}

// Chunk n (columns 8 n .. 8 n + 7, n < 64) of row `key` into the stage: panel n / 8, chunk n % 8.
__device__ __forceinline__ void put(uint8_t* stage, int key, int n, const uint4& v) {
  *reinterpret_cast<uint4*>(stage + (n / 8) * T::kPanelBytes + swz(key, n % 8)) = v;
}

// The rare second multiply (Ue8m0::two): stage chunk n of row `key` times m2, in place.
__device__ __forceinline__ void times(uint8_t* stage, int key, int n, uint32_t m2) {
  uint4* a = reinterpret_cast<uint4*>(stage + (n / 8) * T::kPanelBytes + swz(key, n % 8));
  *a = mul4(*a, m2);
}

// A lane's pointer, from lane src (every lane of the warp takes part).
__device__ __forceinline__ const uint8_t* shfl_ptr(const uint8_t* ptr, int src) {
  return reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(ptr), src));
}

// Eight bf16 values (one 16-byte chunk) times f as one f16 chunk (each product rounded once).
__device__ __forceinline__ uint4 bf16x8_scaled_f16(const uint4& v, float f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    h[e] = ptx::pack_f16x2(__uint_as_float(w[e] << 16) * f, __uint_as_float(w[e] & 0xffff0000u) * f);
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// Per format: what lane l of a warp reads of a record.
//   kBytes       bytes per lane from the body (16: e4m3 codes; 8: e2m1 pairs)
//   scale_at(l)  the lane's scale byte in the record
template <CacheFormat F>
struct Lane;
// v41 (528 bytes: 512 e4m3 codes | 16 ue8m0 scales, one per 32 codes): lane l codes 16 l .., scale l / 2.
template <>
struct Lane<CacheFormat::v41> {
  static constexpr int kBytes = 16;
  static __device__ __forceinline__ int scale_at(int l) { return l / 2; }
};
// v41_fp4 (288 bytes: 512 e2m1 codes in 256 bytes | 32 e4m3 scales, one per 16 codes): lane l bytes 8 l .. (codes
// 16 l ..), scale l.
template <>
struct Lane<CacheFormat::v41_fp4> {
  static constexpr int kBytes = 8;
  static __device__ __forceinline__ int scale_at(int l) { return l; }
};

// One converter warp's share of a tile (v41, v41_fp4): keys 16 w + j (j < 16), lane l's bytes of each and its scale
// byte. Key j's record is located by lane j (and lane j + 16, the same): its body broadcast by shuffles, its scale
// slot at a fixed offset in it.
template <CacheFormat F>
struct Warp {
  static_assert(F == CacheFormat::v41 || F == CacheFormat::v41_fp4, "the warp layout's formats");
  static constexpr bool kFp4 = F == CacheFormat::v41_fp4;
  using L = Lane<F>;
  using Fmt = CacheFormatTraits<F>;
  static_assert(!Fmt::kPageScales, "the warp layout's records hold their scale slot");
  static constexpr int kSlotAt = static_cast<int>(Fmt::scale_offset(Fmt::kDqk - Fmt::kDrope));
  uint4 raw[16];
  uint32_t sb4[4];       // key j's scale byte in byte j % 4 of sb4[j / 4] (0: key not read): packed by exponent()
  uint32_t byte[16];     // key j's scale byte as loaded, untouched until exponent() (no wait inside load())
  uint32_t valid;        // bit j: key j read (every lane the same)
  uint4 slot;            // the early path's scale words (slot_words): the tile's reference without its codes
  __device__ __forceinline__ void load(const uint8_t* body_j, const uint8_t* /*slot_j: body_j + kSlotAt*/, bool v_j,
                                       int lane) {
    valid = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      take<false>(j, shfl_ptr(body_j, j), (valid >> j) & 1u, lane);
  }
  // The same from shared memory (the N 16 tile's ring: key j's record at at(j)); vb bit j: key j's record is there.
  template <class At>
  __device__ __forceinline__ void load_ring(const At& at, uint32_t vb, int lane) {
    valid = vb & 0xffffu;
#pragma unroll
    for (int j = 0; j < 16; ++j) take<true>(j, at(j), (valid >> j) & 1u, lane);
  }
  // A key's record at b (kShared: in shared memory; else global, read-only path) into slot n of raw / byte: lane l's
  // codes and scale byte, zeros when the key is not read (v false). The slot ends the record, so one pointer locates
  // both.
  template <bool kShared, class V>
  __device__ __forceinline__ static V ld(const V* at) {
    if constexpr (kShared) return *at;
    else return __ldg(at);
  }
  template <bool kShared>
  __device__ __forceinline__ void take(int n, const uint8_t* b, bool v, int lane) {
    if constexpr (L::kBytes == 16) {
      raw[n] = v ? ld<kShared>(reinterpret_cast<const uint4*>(b) + lane) : make_uint4(0, 0, 0, 0);
    } else {
      const uint2 x = v ? ld<kShared>(reinterpret_cast<const uint2*>(b) + lane) : make_uint2(0, 0);
      raw[n] = make_uint4(x.x, x.y, 0, 0);
    }
    byte[n] = v ? uint32_t{ld<kShared>(b + kSlotAt + L::scale_at(lane))} : 0u;
  }
  __device__ __forceinline__ uint32_t sb(int j) const { return (sb4[j / 4] >> (8 * (j % 4))) & 0xffu; }
  // This lane's largest scale exponent over its 16 keys (keys not read: scale byte 0, below the floor).
  __device__ __forceinline__ int exponent() {
#pragma unroll
    for (int q = 0; q < 4; ++q)
      sb4[q] = prmt(prmt(byte[4 * q], byte[4 * q + 1], 0x0040u), prmt(byte[4 * q + 2], byte[4 * q + 3], 0x0040u), 0x5410u);
    uint32_t m = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) m = max(m, byte_max(kFp4 ? e4m3_rank4(sb4[q]) : ue8m0_rank4(sb4[q])));
    return kFp4 ? e4m3_exponent(m) : ue8m0_exponent(m);
  }
  // The early path (convert/kernel.cuh EarlyFeed, v41_fp4 lists): a tile's records are loaded during the previous
  // tile's stores. Its reference comes from the scale slots alone: lanes j and j + 16 take key j's slot (v41_fp4: 32
  // bytes, a half each; v41: the 16 bytes, both), so the warp holds every scale of its 16 keys, the set exponent()
  // reduces (zeros for a key not read).
  __device__ __forceinline__ static uint4 slot_words(const uint8_t* body, bool v, int lane) {
    const uint8_t* at = body + kSlotAt + (kFp4 ? 16 * (lane >> 4) : 0);
    return v ? __ldg(reinterpret_cast<const uint4*>(at)) : make_uint4(0, 0, 0, 0);
  }
  // This lane's largest scale exponent over `slot` (the ranks' bytes as 16-bit pairs, a packed max a pair).
  __device__ __forceinline__ int slot_exponent() const {
    const uint32_t w[4] = {slot.x, slot.y, slot.z, slot.w};
    uint32_t m2 = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t rk = kFp4 ? e4m3_rank4(w[q]) : ue8m0_rank4(w[q]);
      m2 = __vmaxu2(m2, __vmaxu2(rk & 0x00ff00ffu, (rk >> 8) & 0x00ff00ffu));
    }
    const uint32_t m = max(m2 & 0xffffu, m2 >> 16);
    return kFp4 ? e4m3_exponent(m) : ue8m0_exponent(m);
  }
  // raw[jj] (v41_fp4: 16 e2m1 codes, scale byte b) into the stage's row 16 w + row: this lane's chunks at lo_at /
  // hi_at (the odd panels' lanes swapped: store()); jj is the row's swizzle phase.
  __device__ __forceinline__ void put_key(int jj, int row, uint32_t b, int r, bool odd, uint8_t* lo_at, uint8_t* hi_at,
                                          int c_lo, int c_hi) const {
    const uint4& c = raw[jj];
    const uint32_t m = e4m3_scale_f16x2(b, r);
    const uint4 lo = mul4(e2m1x8_f16(odd ? c.y : c.x), m);
    const uint4 hi = mul4(e2m1x8_f16(odd ? c.x : c.y), m);
    *reinterpret_cast<uint4*>(lo_at + row * 128 + ((c_lo ^ jj) << 4)) = lo;
    *reinterpret_cast<uint4*>(hi_at + row * 128 + ((c_hi ^ jj) << 4)) = hi;
  }
  // store() for the early path (v41_fp4): the same stores, from byte[] (a half's bytes are used at once, no packing),
  // and after each half refill(half) loads the next tile's keys 8 half .. 8 half + 7 into raw / byte 8 .. 15. The two
  // halves are unrolled: rolled, the moves of the refilled registers between the passes made ptxas wait for the
  // loads at the loop's back edge (a warp's global loads share one scoreboard). Leaves raw / byte holding the next
  // tile's keys.
  template <class Refill>
  __device__ __forceinline__ void store_refill(uint8_t* stage, int w, int lane, int r, Refill&& refill) {
    static_assert(kFp4, "v41's 16-byte chunks stay on store(): held across the refill they spilled");
    const bool odd = (lane >> 2) & 1;
    const int n_lo = 2 * lane + (odd ? 1 : 0), n_hi = 2 * lane + (odd ? 0 : 1);
    uint8_t* const lo_at = chunk_at(stage, 16 * w, n_lo) - swz(0, n_lo % 8);
    uint8_t* const hi_at = chunk_at(stage, 16 * w, n_hi) - swz(0, n_hi % 8);
    const int c_lo = n_lo % 8, c_hi = n_hi % 8;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) put_key(jj, 8 * half + jj, byte[jj], r, odd, lo_at, hi_at, c_lo, c_hi);
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        raw[jj] = raw[jj + 8];
        byte[jj] = byte[jj + 8];
      }
      refill(half);
    }
  }
  // Into the stage: rows 16 w + j, lane l's chunks 2 l, 2 l + 1, relative to the reference r. Two passes of one
  // eight-key body (a loop, not unrolled: half the code per tile, and with the scale bytes packed in exponent() the
  // shorter live ranges keep the 64-row kernels free of spills), the second half's codes and scale words moved down
  // between the passes.
  // Leaves raw and sb4 spent (the next load refills them); valid stays.
  __device__ __forceinline__ void store(uint8_t* stage, int w, int lane, int r) {
    // Lanes 4 q .. 4 q + 3 write panel q's row; every panel's row spans the same 32 banks, and a row's even chunks
    // (swizzled by the row) the same 16 of them. So that a store instruction covers each bank four times (four
    // wavefronts, not eight), the lanes of odd panels store their higher chunk first (`odd`: the codes swapped here,
    // at the store, where the loads have landed; lo / hi below are the first / second store).
    const bool odd = (lane >> 2) & 1;
    const int n_lo = 2 * lane + (odd ? 1 : 0), n_hi = 2 * lane + (odd ? 0 : 1);
    uint8_t* const lo_at = chunk_at(stage, 16 * w, n_lo) - swz(0, n_lo % 8);  // row 16 w's, unswizzled
    uint8_t* const hi_at = chunk_at(stage, 16 * w, n_hi) - swz(0, n_hi % 8);
    const int c_lo = n_lo % 8, c_hi = n_hi % 8;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      bool two_any = false;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int row = 8 * half + jj;  // the row's swizzle phase is jj (rows 16 w + 8 half + jj)
        const uint32_t b = sb(jj);
        uint4 lo, hi;
        const uint4& c = raw[jj];
        if constexpr (kFp4) {
          const uint32_t m = e4m3_scale_f16x2(b, r);
          lo = mul4(e2m1x8_f16(odd ? c.y : c.x), m);
          hi = mul4(e2m1x8_f16(odd ? c.x : c.y), m);
        } else {
          const uint32_t m = Ue8m0::m1_f32(b, r);
          e4m3x16_to_f16(odd ? make_uint4(c.z, c.w, c.x, c.y) : c, lo, hi);
          lo = mul4(lo, m);
          hi = mul4(hi, m);
          two_any |= Ue8m0::two(b, r);
        }
        *reinterpret_cast<uint4*>(lo_at + row * 128 + ((c_lo ^ jj) << 4)) = lo;
        *reinterpret_cast<uint4*>(hi_at + row * 128 + ((c_hi ^ jj) << 4)) = hi;
      }
      if constexpr (!kFp4) {
        if (__any_sync(0xffffffffu, two_any)) {  // rare: a scale more than 2^24 below the reference
#pragma unroll 1
          for (int jj = 0; jj < 8; ++jj) {
            const uint32_t m = Ue8m0::m2(((jj < 4 ? sb4[0] : sb4[1]) >> (8 * (jj & 3))) & 0xffu, r);
            times(stage, 16 * w + 8 * half + jj, 2 * lane, m);
            times(stage, 16 * w + 8 * half + jj, 2 * lane + 1, m);
          }
        }
      }
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) raw[jj] = raw[jj + 8];
      sb4[0] = sb4[2];
      sb4[1] = sb4[3];
    }
  }
};

// v4 a warp per 16 keys (the warp layout's coalescing for v4's 576-byte body [448 e4m3 | 64 bf16 rope], its 8-byte
// slot of 7 ue8m0 scales, one per 64 codes, in the page's scale region). Lane l, q = l / 8, c8 = l % 8, holds
//   raw[3 g + k]  key 4 g + q's code chunk c = 8 k + c8 (g < 4, k < 3: columns 16 c .., scale group 2 k + c8 / 4,
//                 stage panel 2 k + c8 / 4): a load instruction reads four records' 128 bytes, one line each;
//   tail[h]       key 2 (l / 8) + (l / 4) % 2 + 8 h's code chunk 24 + l % 4 (group 6, panel 6): a quarter warp's two
//                 keys are adjacent rows of opposite swizzle parity, so their eight chunks of a store are distinct;
//   sw            word l % 2 of key l / 2's scale slot (a warp's load: the 16 slots); exponent() gathers each lane's
//                 bytes from it by shuffles once the loads landed (sbp[g]: key 4 g + q's groups c8 / 4, 2 + c8 / 4,
//                 4 + c8 / 4; tail_sb[h]: the tail key's group 6);
//   the rope      key l / 8 + 4 i's rope chunk l % 8 (i < 4) by cp.async into the lane's own copy in shared memory
//                 (`rope`, chunk i at rope + 2048 i: the converter's rope_copy), read there for the exponent and again
//                 for the store, so that no rope register lives from the load to the store (14 code chunks a lane).
// Stores: a quarter warp writes one row's panels 2 k, 2 k + 1; the lanes of the odd panel (c8 / 4 = 1) store their
// hi chunk first (words swapped before the conversion), so that the quarter's eight chunks of a store instruction are
// distinct. `valid` (bit j: key j read) as Warp's; a key not read has zeros, nothing read.
template <>
struct Warp<CacheFormat::v4> {
  uint4 raw[12];
  uint4 tail[2];
  uint32_t sw;          // word l % 2 of key l / 2's scale slot (groups 0..3, or 4..6 and the unused byte)
  uint32_t sbp[4];      // by exponent(): key 4 g + q's scale bytes of groups odd, 2 + odd, 4 + odd (bytes 0, 1, 2)
  uint32_t tail_sb[2];  // by exponent(): the tail keys' group-6 bytes
  uint32_t valid;
  uint8_t* rope;  // this thread's rope copy (set once by the converter)

  static __device__ __forceinline__ int tail_key(int h, int lane) {
    return 2 * (lane >> 3) + ((lane >> 2) & 1) + 8 * h;
  }

  // body_j / slot_j / v_j: lane j's (and j + 16's) key j of the warp.
  __device__ __forceinline__ void load(const uint8_t* body_j, const uint8_t* slot_j, bool v_j, int lane) {
    valid = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
    const int q = lane >> 3, c8 = lane & 7;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int key = 4 * g + q;
      const bool v = (valid >> key) & 1u;
      const uint8_t* b = shfl_ptr(body_j, key);
#pragma unroll
      for (int k = 0; k < 3; ++k)
        raw[3 * g + k] = v ? __ldg(reinterpret_cast<const uint4*>(b) + 8 * k + c8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = tail_key(h, lane);
      const bool v = (valid >> key) & 1u;
      const uint4* b = reinterpret_cast<const uint4*>(shfl_ptr(body_j, key)) + 24 + (lane & 3);  // every lane shuffles
      tail[h] = v ? __ldg(b) : make_uint4(0, 0, 0, 0);
    }
    {
      const int key = lane >> 1;
      const uint32_t* b = reinterpret_cast<const uint32_t*>(shfl_ptr(slot_j, key)) + (lane & 1);
      sw = (valid >> key) & 1u ? __ldg(b) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = q + 4 * i;
      ptx::cp_async_16_or_zero(rope + 2048 * i, shfl_ptr(body_j, key) + 448 + 16 * c8, !((valid >> key) & 1u));
    }
    ptx::cp_async_commit();
  }

  // The lane's largest exponent: every scale of its four keys (any real scale of the tile bounds the reference from
  // below, as the warp's maximum does) and its rope chunks (the copies landed).
  // Also gathers the lane's scale bytes from the slot words (sbp, tail_sb).
  __device__ __forceinline__ int exponent() {
    const int lane = threadIdx.x & 31, q = lane >> 3;
    const uint32_t sel = (lane >> 2) & 1 ? 0x0531u : 0x0420u;  // the lane's groups' bytes of (x, y)
    const uint32_t m = byte_max(ue8m0_rank4(lane & 1 ? sw & 0x00ffffffu : sw));
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int key = 4 * g + q;
      sbp[g] = prmt(__shfl_sync(0xffffffffu, sw, 2 * key), __shfl_sync(0xffffffffu, sw, 2 * key + 1), sel);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) tail_sb[h] = (__shfl_sync(0xffffffffu, sw, 2 * tail_key(h, lane) + 1) >> 16) & 0xffu;
    ptx::cp_async_wait<0>();
    uint32_t a = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = *reinterpret_cast<const uint4*>(rope + 2048 * i);
      a = bf16x2_absmax(bf16x2_absmax(bf16x2_absmax(bf16x2_absmax(a, v.x), v.y), v.z), v.w);
    }
    return max(ue8m0_exponent(m), bf16_rope_exponent(a));
  }

  // Sixteen codes (one chunk, its words swapped for an odd-panel lane) of scale byte b against the reference r into
  // two stage chunks at first / second: times m1, and where some lane of the warp needs it (Ue8m0::two, rare: a scale
  // more than 2^24 below the reference) times m2 (1.0 for the other lanes) in a second rounding.
  static __device__ __forceinline__ void put_codes(const uint4& c, int odd, uint32_t b, int r, uint8_t* first_at,
                                                   uint8_t* second_at) {
    uint4 first, second;
    e4m3x16_to_f16(odd ? make_uint4(c.z, c.w, c.x, c.y) : c, first, second);
    const uint32_t m = Ue8m0::m1(b, r);
    first = mul4(first, m);
    second = mul4(second, m);
    if (__any_sync(0xffffffffu, Ue8m0::two(b, r))) {
      const uint32_t m2 = Ue8m0::m2(b, r);
      first = mul4(first, m2);
      second = mul4(second, m2);
    }
    *reinterpret_cast<uint4*>(first_at) = first;
    *reinterpret_cast<uint4*>(second_at) = second;
  }

  // Into the stage: rows 16 w .. 16 w + 15, relative to the reference r. Leaves raw spent; valid stays. Key 4 g + q's
  // row has the swizzle phase q + 4 (g & 1), so each store's address is a lane offset (by g's parity) plus a
  // compile-time one.
  __device__ __forceinline__ void store(uint8_t* stage, int w, int lane, int r) const {
    const int q = lane >> 3, c8 = lane & 7, odd = c8 >> 2, c4 = c8 & 3;
    uint8_t* const base = stage + (16 * w + q) * 128 + odd * T::kPanelBytes;
    int at_first[2], at_second[2];
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      at_first[par] = ((2 * c4 + odd) ^ (q + 4 * par)) << 4;
      at_second[par] = ((2 * c4 + 1 - odd) ^ (q + 4 * par)) << 4;
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint8_t* const row = base + 512 * g;
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        put_codes(raw[3 * g + k], odd, (sbp[g] >> (8 * k)) & 0xffu, r, row + 2 * k * T::kPanelBytes + at_first[g & 1],
                  row + 2 * k * T::kPanelBytes + at_second[g & 1]);
      }
    }
    // Code chunks 24..27 (panel 6): key tail_key(h) = 2 q + odd + 8 h, phase 2 q + odd; lane chunks 2 c4, 2 c4 + 1.
    const int tail_phase = 2 * q + odd;
    uint8_t* const tail_row = stage + 6 * T::kPanelBytes + (16 * w + tail_phase) * 128;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      put_codes(tail[h], 0, tail_sb[h], r, tail_row + 1024 * h + (((2 * c4) ^ tail_phase) << 4),
                tail_row + 1024 * h + (((2 * c4 + 1) ^ tail_phase) << 4));
    }
    // The rope (panel 7, chunk c8 of key q + 4 i: phase q + 4 (i & 1)): bf16 * 2^-r as f16.
    const float f = exp2i(-r);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      put(stage, 16 * w + q + 4 * i, 56 + c8, bf16x8_scaled_f16(*reinterpret_cast<const uint4*>(rope + 2048 * i), f));
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
