// SPDX-License-Identifier: Apache-2.0
#pragma once
// Key sources of the sm90 kernels (small/kernel.cuh, seesaw/kernel.cuh take one as a template
// parameter): where the nine 64-column panels of a 64-key tile come from. Both fill the same layout,
// the 128-byte-swizzled K-major panels TMA writes (row r, 16-byte chunk c of a panel at r * 128 +
// ((c ^ (r % 8)) << 4), swz() in pipeline.cuh), which the consumers' wgmma descriptors read.
//
//   PagedKeys       mqa_decode: TMA boxes of the paged cache through the block table (one producer warp
//                   per stage; the consumers zero the keys that were not loaded).
//   GatherKeys<F>   sparse_mqa: key j of token g is cache row indices[g][j]. Two producer warps per stage,
//                   32 keys each (Tile). F = bf16: cp.async 16 B straight into the swizzled panel; invalid keys
//                   (index < 0 or >= num_slots, position >= the token's length) are zero-filled by the
//                   copy itself (src-size 0: nothing is read). F = fp8_ds_mla (656-byte records): the
//                   latent codes go through registers (16-byte loads), times their tile's fp32 scale,
//                   rounded to bf16 (the §3.3 upconvert: bf16(float(code) * scale)), stored swizzled;
//                   the bf16 rope by cp.async. No staging copy in global memory. The small kernel runs
//                   GatherKeys<bf16> (sparse bf16 rows, h <= 32); the code formats' row locating, masks and
//                   conversions are the base of InplaceKeys (the seesaw kernel's code-format source).
//   GatherKeys<F, PagedRows>  the paged twin (mqa_decode, fp8_ds_mla): key j of request g is position j,
//                   at slot block_table[g][j / page_size] * page_size + j % page_size (Rows below); the
//                   same copies, conversion and masking (positions past the unit's range or pages outside
//                   [0, num_blocks) are not loaded: zeros, nothing read).
//   GatherKeys<fp8, PagedRows>  mqa_decode, fp8 per-tensor cache (576 e4m3 codes a row, one scale for the
//                   cache): every panel, the rope's too, through registers as the fp8_ds_mla latent panels,
//                   but as exact codes (kExactCodes: code * 2^-56 in bf16, integer work and one bf16 multiply
//                   per pair; the cache scale and 2^56 are applied by the consumers to S and to the output,
//                   code_scale below); the base of InplaceKeys<fp8, PagedRows>.
//   InplaceKeys<F, Rows>  (source_inplace.cuh; the seesaw kernel over fp8 / fp8_ds_mla): GatherKeys' rows and
//                   numerics, but each release group's raw codes cp.async'd into the upper half of their own
//                   panel rows and expanded in place (one round trip per group). CrossKeys (source_cross.cuh)
//                   and GroupRows (source_inplace.cuh) build on it.
// (The code-format kernel, raw/kernel.cuh, takes no key source: its rows are located by IndexedRows /
// PagedRows below and copied raw by raw/parts.cuh.)
//
// Interface (PagedKeys / GatherKeys):
//   kTma                 the source issues TMA (the tensor map is real)
//   kIndexed             keys come from index rows (sparse_mqa: a unit's request is a token, its length
//                        its top-k length); else from the block table (mqa_decode: seq_lens)
//   kWarpsPerStage       producer warps streaming one stage (tile parts)
//   kZeroFilled          keys that were not loaded arrive as zeros (else the consumer zero-fills them)
//   kExactCodes          the tile holds e4m3 codes times 2^-56 (exact); the consumers multiply S (before the
//                        softmax) and O (at the end) by code_scale(p) = cache scale * 2^56
//   producer_regs(seesaw)   setmaxnreg of the producer warpgroup (consumers: (504 - it) / 2)
//   kGenericWrites       shared memory is written by the generic proxy (cp.async, st.shared): a consumer
//                        issues fence.proxy.async after each full-barrier wait, before its wgmma reads
//   full_arrivals(n, m)  arrivals per phase of a full barrier carrying n panels (m: and the key mask)
//   Tile(p, u, k0, part, lane)          this warp's part of the tile at key k0
//     begin(mask, bar)   publishes the tile's loaded-key mask (u64 per stage) before `bar` completes
//     announce(bar, n)   n panels will complete on bar (TMA: the transaction bytes)
//     preload(p, c)      issues the register loads of panel c (GatherKeys<fp8>'s code panels; else nothing)
//     panel(p, map, dst, bar, c, next)  loads panel c of the tile at dst, completing on bar; `next` (-1: none)
//                        is the panel the warp loads after c: its register loads are issued (preload)
//                        before c's conversion, so one round trip overlaps the other's dequant
#include <cuda.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "core/fast_div.h"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/common/trace.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

// Paged cache through the block table, TMA boxes of 64 columns x min(page, 64) rows. kPanels: the seesaw kernel's
// stage 1 completes each panel on its own full barrier (PagedPanelKeys, seesaw/base.cuh kPanelFull).
template <bool kPanels = false>
struct PagedKeysT {
  static constexpr bool kTma = true;
  static constexpr bool kCrossover = false;
  static constexpr bool kStage1Panels = kPanels;  // stage 1's panels on their own barriers (seesaw/base.cuh)
  static constexpr int kClusterSize = 1;
  static constexpr int kPeerReleases = 0;
  static constexpr bool kIndexed = false;
  static constexpr int kWarpsPerStage = 1;
  static constexpr bool kZeroFilled = false;
  static constexpr bool kGenericWrites = false;
  static constexpr bool kExactCodes = false;
  __host__ __device__ static constexpr int full_arrivals(int, bool) { return 1; }  // one arrive.expect_tx
  __host__ __device__ static constexpr int producer_regs(bool) { return 40; }

  // Which keys of the 64-key tile starting at k0 the producer loads: boxes j = lane, lane + 32 (first
  // key k0 + j * box_rows) with their page ids, rows in the page and shared-memory offsets (computed once
  // per tile: the nine panels reuse them; an integer division per panel on the producer's issue path cost
  // ~300 cycles a panel under ncu), the number of boxes loaded, and the 64-bit mask of loaded
  // keys (pages outside [0, num_blocks) and keys past the unit's range are not loaded).
  struct Tile {
    int32_t blk[2], row[2], off[2];  // page id (< 2^31: supports()), row in the page, byte offset in a panel
    bool load[2];
    int loaded, lane;
    uint64_t mask;

    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int /*part*/, int lane_) : lane(lane_) {
      const int32_t* table = p.block_table + u.g * p.block_table_stride;
      const int br = p.box_rows, boxes = Traits::kBlockN / br;
      auto page_of = [&](int key) -> int64_t {  // block id of key's page, -1 when not loadable
        if (key >= u.key_end) return -1;
        const int64_t b = table[key / p.page_size];
        return b >= 0 && b < p.num_blocks ? b : -1;
      };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = lane + 32 * h, key = k0 + j * br;
        const int64_t b = j < boxes ? page_of(key) : -1;
        blk[h] = static_cast<int32_t>(b);
        load[h] = b >= 0;
        row[h] = key % p.page_size;
        off[h] = j * br * 128;
      }
      loaded = __popc(__ballot_sync(0xffffffffu, load[0])) + __popc(__ballot_sync(0xffffffffu, load[1]));
      const uint32_t lo = __ballot_sync(0xffffffffu, page_of(k0 + lane) >= 0);
      const uint32_t hi = __ballot_sync(0xffffffffu, page_of(k0 + lane + 32) >= 0);
      mask = static_cast<uint64_t>(hi) << 32 | lo;
    }
    __device__ void begin(uint64_t* mask_slot, uint64_t*) const {
      if (lane == 0) *mask_slot = mask;  // released by announce's arrive
    }
    // Bytes of n panels of the tile; one arrival with them.
    __device__ void announce(const DecodeSm90Params& p, uint64_t* bar, int n) const {
      if (lane == 0) ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(n * loaded * p.box_rows * 128));
    }
    __device__ void preload(const DecodeSm90Params&, int) const {}
    __device__ void prefetch_group(const DecodeSm90Params&, int) const {}  // CrossoverSource hook: nothing
    // This lane's TMA boxes of panel `c` (64 columns) into the tile at `dst`, completing on `bar`.
    __device__ void panel(const DecodeSm90Params& p, const CUtensorMap* map, uint8_t* dst, uint64_t* bar, int c,
                          int /*next*/) const {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!load[h]) continue;
        ptx::tma_load_3d(dst + c * Traits::kPanelBytes + off[h], map, bar, c * Traits::kPanelCols, row[h], blk[h]);
      }
    }
  };
};
using PagedKeys = PagedKeysT<false>;
using PagedPanelKeys = PagedKeysT<true>;  // the seesaw kernel at more than 16 rows (core/decode_regime.h)

// Eight e4m3 codes (byte i = code i) times `scale`, each rounded to bf16: one 16-byte chunk.
__device__ __forceinline__ uint4 e4m3x8_scaled_to_bf16(uint32_t w0, uint32_t w1, float scale) {
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = dev::e4m3x2_to_float2(static_cast<uint16_t>((i < 2 ? w0 : w1) >> (16 * (i & 1))));
    o[i] = ptx::pack_bf16x2(f.x * scale, f.y * scale);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Exact codes (kExactCodes sources). Every e4m3 value is a bf16 value, so a code converts without rounding:
// in a 16-bit half holding the code sign-extended (PRMT's sign mode), shifting by 4 puts the code's
// exponent and mantissa (bits 0..6) at bf16 bits 4..10 and its sign at bit 15; masked, that is the bf16 of
// value * 2^-120 (the exponent biases differ by 120; e4m3 subnormals land on bf16 subnormals, exactly).
// The NaN codes (0x7f, 0xff: bits 0..6 all set) get every bit outside that mask set (a NaN). One bf16
// multiply by 2^64 (exact: a power of two, subnormals supported by fma.rn.bf16x2) leaves value * 2^-56,
// whose products with q or P stay far from fp32 subnormals in the tensor cores. kExactCodeFactor undoes it.
// Integer pipes and one FMA-pipe op per pair, no conversion-pipe work (the cvt path: two per pair).
inline constexpr float kExactCodeFactor = 0x1p56f;
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// Codes of bytes kByte, kByte + 1 of w as bf16x2 (times 2^-56); nan: (w & 0x7f7f7f7f) + 0x01010101 (bit 7
// of a byte set for a NaN code).
// The same pair before the multiply: the bf16 bits of value * 2^-120 (exact; e4m3 subnormals as bf16 subnormals).
template <int kByte>
__device__ __forceinline__ uint32_t e4m3x2_tiny_bf16x2(uint32_t w, uint32_t nan) {
  // halves: [code, sign(code)] of bytes kByte, kByte + 1; the NaN flags' signs over whole halves
  constexpr uint32_t kCode = kByte | (0x8u | kByte) << 4 | (kByte + 1) << 8 | (0x8u | (kByte + 1)) << 12;
  constexpr uint32_t kNan = (0x8u | kByte) * 0x11u | ((0x8u | (kByte + 1)) * 0x11u) << 8;
  constexpr uint32_t kKeep = 0x87f087f0u;
  return (prmt(w, 0, kCode) << 4 & kKeep) | (prmt(nan, 0, kNan) & ~kKeep);
}
// a * m + (-0) on bf16 pairs: exact when m is a power of two (or a short significand) and the products stay normal
// or are exact subnormals (fma.rn.bf16x2 keeps subnormals).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t m) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(m), "r"(0x80008000u));
  return d;
}
template <int kByte>
__device__ __forceinline__ uint32_t e4m3x2_exact_bf16x2(uint32_t w, uint32_t nan) {
  return bf16x2_mul(e4m3x2_tiny_bf16x2<kByte>(w, nan), 0x5f805f80u);  // * 2^64
}
// Eight codes (byte i = code i) as bf16 times 2^-56: one 16-byte chunk.
__device__ __forceinline__ uint4 e4m3x8_exact_to_bf16(uint32_t w0, uint32_t w1) {
  const uint32_t n0 = (w0 & 0x7f7f7f7fu) + 0x01010101u, n1 = (w1 & 0x7f7f7f7fu) + 0x01010101u;
  return make_uint4(e4m3x2_exact_bf16x2<0>(w0, n0), e4m3x2_exact_bf16x2<2>(w0, n0), e4m3x2_exact_bf16x2<0>(w1, n1),
                    e4m3x2_exact_bf16x2<2>(w1, n1));
}

// Where key j of unit u lives, for the sources and kernels that copy rows themselves (GatherKeys and the sources
// built on it, the code-format kernel's producer):
//   IndexedRows  sparse_mqa: flat cache row indices[g][j], valid when j < the token's length and
//                0 <= index < num_slots (nothing read beyond the index);
//   PagedRows    mqa_decode: position j of request g, page block_table[g][j / page_size], valid when j is
//                in the unit's range (j < key_end <= seq_len: rows past seq_len are never read, as invalid
//                indices) and the page id is in [0, num_blocks).
// row_offset(p, u, j, o): true with the byte offset of the row in o when valid; else false.
// The page split (row / page_size, row % page_size) by the launch's multiply-shift divisor (gather.page_div,
// core/fast_div.h: rows and positions are < 2^31): three instructions instead of the ~25 of a division by a
// run-time int32, which the producer paid per row (ncu).
// Each splits into fetch (the one global read a key needs: its index, or its page's block id; kNoRow past the
// unit's keys) and locate (that value to the row's byte offset, false when the key is not valid), so that a
// producer can issue the reads of a later tile before it needs them (raw/parts.cuh produce_raw).
inline constexpr int32_t kNoRow = INT32_MIN;
struct IndexedRows {
  static constexpr bool kPaged = false;
  __device__ static __forceinline__ int32_t fetch(const DecodeSm90Params& p, const Unit& u, int j) {
    return j >= u.key_end ? kNoRow : p.gather.indices[u.g * p.gather.indices_stride + j];
  }
  __device__ static __forceinline__ bool locate(const DecodeSm90Params& p, int j, int32_t idx, int64_t& o) {
    const DecodeSm90Params::Gather& gp = p.gather;
    (void)j;
    if (idx < 0 || idx >= gp.num_slots) return false;  // kNoRow included
    uint32_t blk, row;
    fast_divmod(static_cast<uint32_t>(idx), gp.page_div, blk, row);
    o = static_cast<int64_t>(blk) * gp.stride_block_bytes + static_cast<int64_t>(row) * gp.stride_row_bytes;
    return true;
  }
  __device__ static __forceinline__ bool row_offset(const DecodeSm90Params& p, const Unit& u, int j, int64_t& o) {
    return locate(p, j, fetch(p, u, j), o);
  }
};
struct PagedRows {
  static constexpr bool kPaged = true;
  __device__ static __forceinline__ int32_t fetch(const DecodeSm90Params& p, const Unit& u, int j) {
    if (j >= u.key_end) return kNoRow;
    uint32_t page, row;
    fast_divmod(static_cast<uint32_t>(j), p.gather.page_div, page, row);
    return p.block_table[u.g * p.block_table_stride + page];
  }
  __device__ static __forceinline__ bool locate(const DecodeSm90Params& p, int j, int32_t blk, int64_t& o) {
    const DecodeSm90Params::Gather& gp = p.gather;
    if (blk < 0 || blk >= p.num_blocks) return false;  // kNoRow included
    uint32_t page, row;
    fast_divmod(static_cast<uint32_t>(j), gp.page_div, page, row);
    o = static_cast<int64_t>(blk) * gp.stride_block_bytes + static_cast<int64_t>(row) * gp.stride_row_bytes;
    return true;
  }
  __device__ static __forceinline__ bool row_offset(const DecodeSm90Params& p, const Unit& u, int j, int64_t& o) {
    return locate(p, j, fetch(p, u, j), o);
  }
};
// The same as one value: key j's row byte offset from its entry idx (fetched earlier: GroupRows' index ahead), -1
// when the key is not valid.
template <class Rows>
__device__ __forceinline__ int64_t row_offset_or_none(const DecodeSm90Params& p, int j, int32_t idx) {
  int64_t o = -1;
  return Rows::locate(p, j, idx, o) ? o : -1;
}
// The same with key j's entry fetched here (Rows::fetch).
template <class Rows>
__device__ __forceinline__ int64_t row_offset_or_none(const DecodeSm90Params& p, const Unit& u, int j) {
  return row_offset_or_none<Rows>(p, j, Rows::fetch(p, u, j));
}

// The kBytes-byte record at rec (16-byte aligned) into L2: one prefetch.global.L2 per cache line it
// touches, from this lane (addresses rec + 128 i, the last clamped to the record's last byte: every line of
// [rec, rec + kBytes) is hit; fp8_ds_mla's 656 bytes: 6 lines). No uniform operand, so a warp's 32 rows cost
// 6 instructions per lane (the bulk prefetch, whose address must be warp-uniform, compiled to a waterfall
// loop over the lanes: ~14.5 R2UR / UBLKPF rounds per warp and call under ncu).
template <int kBytes>
__device__ __forceinline__ void prefetch_record_l2(const uint8_t* rec) {
  constexpr int kLines = (kBytes + 112 + 127) / 128;  // at most, for a start 16 bytes short of a line end
#pragma unroll
  for (int i = 0; i < kLines; ++i) ptx::prefetch_l2(rec + (128 * i < kBytes ? 128 * i : kBytes - 1));
}

// Key j's whole cache row into L2 when it is valid; nothing otherwise, by per-lane line prefetches
// (prefetch_record_l2).
template <CacheFormat F, class Rows>
__device__ __forceinline__ void prefetch_row(const DecodeSm90Params& p, const Unit& u, int j) {
  constexpr int kBytes = static_cast<int>(CacheFormatTraits<F>::entry_bytes(576, 64));
  int64_t o = 0;
  if (!Rows::row_offset(p, u, j, o)) return;
  prefetch_record_l2<kBytes>(p.gather.cache + o);
}

// The index line (32 keys) of key j into L2 when j is in the token's range (lane 0 of a warp; nothing
// waits for it).
__device__ __forceinline__ void prefetch_index_line(const DecodeSm90Params::Gather& gp, const Unit& u, int j) {
  if (j < u.key_end) ptx::prefetch_l2(gp.indices + u.g * gp.indices_stride + j);
}

// cp.async of kN 16-byte chunks of each of a warp's 32 rows, all 32 lanes together: panel row r0 + j (the row
// of lane j) gets its chunks first_chunk + i (i < kN) of the swizzled panel at dp from cache + off + 16 i, `off`
// being lane j's value (negative: zero-filled, nothing read). kN lanes per row and 32 / kN rows per instruction,
// so every instruction reads kN x 16 contiguous bytes of each of its rows: the copy of a global line lands in
// shared memory in one wavefront (a lane copying its own row touches 32 lines per instruction and costs 32
// wavefronts: docs/design/attention_sm90.md "4. The code-format kernel", warp roles). kN 4: the rows of a
// quarter-warp differ in bit 2, so their chunks (swizzled by row % 8) fall into complementary halves of the
// banks. A lane's copies are other lanes' rows: a reader of a row in this warp waits (cp.async.wait_group) and
// __syncwarp()s; an mbarrier that every lane arrives on (cp.async.mbarrier.arrive) covers them all.
template <int kN>
__device__ __forceinline__ void copy_warp_rows(const uint8_t* cache, uint8_t* dp, int r0, int64_t off, int lane,
                                               int first_chunk) {
  static_assert(kN == 4 || kN == 8, "lanes per row");
  constexpr int kRowsPer = 32 / kN;
  const int c = lane % kN, j = lane / kN;
  const int jr = kN == 4 ? (j >> 1) | ((j & 1) << 2) : j;
#pragma unroll 1
  for (int q = 0; q < kN; ++q) {
    const int row = kRowsPer * q + jr;
    const int64_t o = __shfl_sync(0xffffffffu, off, row);
    const bool ok = o >= 0;
    ptx::cp_async_16_or_zero(dp + swz(r0 + row, first_chunk + c), ok ? cache + o + 16 * c : cache, !ok);
  }
}

// One 16-byte raw chunk (16 e4m3 codes) as its two bf16 chunks: kExact, exact codes times 2^-56
// (e4m3x8_exact_to_bf16, `scale` unused); else each code times `scale`, rounded to bf16 (the pinned upconvert).
template <bool kExact>
__device__ __forceinline__ void expand_chunk(const uint4& raw, float scale, uint4& lo, uint4& hi) {
  if constexpr (kExact) {
    lo = e4m3x8_exact_to_bf16(raw.x, raw.y);
    hi = e4m3x8_exact_to_bf16(raw.z, raw.w);
  } else {
    lo = e4m3x8_scaled_to_bf16(raw.x, raw.y, scale);
    hi = e4m3x8_scaled_to_bf16(raw.z, raw.w, scale);
  }
}

// Rows copied by the producer warps: top-k rows through the token's index row (sparse_mqa, IndexedRows)
// or a request's positions through its block table (mqa_decode, PagedRows). F: bf16, fp8_ds_mla or fp8.
template <CacheFormat F, class Rows = IndexedRows>
struct GatherKeys {
  static_assert(F == CacheFormat::bf16 || F == CacheFormat::fp8_ds_mla || F == CacheFormat::fp8, "gathered formats");
  static_assert(F != CacheFormat::bf16 || !Rows::kPaged, "paged bf16 keys: PagedKeys (TMA)");
  static_assert(F != CacheFormat::fp8 || Rows::kPaged, "fp8 per-tensor: mqa_decode only");
  using Fmt = CacheFormatTraits<F>;
  static constexpr bool kTma = false;
  static constexpr bool kIndexed = !Rows::kPaged;
  static constexpr int kWarpsPerStage = 2;
  static constexpr bool kZeroFilled = true;
  static constexpr bool kGenericWrites = true;
  static constexpr bool kExactCodes = F == CacheFormat::fp8;
  // setmaxnreg split (producer P, consumers (504 - P) / 2: 168 x 3 of __launch_bounds__(384, 1)). ptxas -v:
  // the gathering producers spill at 40 (bf16 4-16 bytes, fp8_ds_mla 20-80); 0 spills at 56 / 224 (the
  // fp8_ds_mla seesaw's consumers spill 32 bytes at 216).
  __host__ __device__ static constexpr int producer_regs(bool) { return 56; }
  static constexpr int kScaleOffset = F == CacheFormat::fp8_ds_mla ? static_cast<int>(Fmt::scale_offset(512)) : 0;
  static constexpr int kRopeOffset = F == CacheFormat::fp8_ds_mla ? static_cast<int>(Fmt::rope_offset(512)) : 1024;
  static_assert(F != CacheFormat::fp8_ds_mla || (kScaleOffset == 512 && kRopeOffset == 528), "fp8_ds_mla record");
  static constexpr int kIndexAhead = 6;  // bf16: tiles ahead whose index lines are prefetched into L2
  // Per panel every lane of both warps arrives once; the mask barrier also gets one plain arrival per
  // warp (lane 0, after publishing its half of the mask: a release the cp.async arrivals do not give).
  __host__ __device__ static constexpr int full_arrivals(int panels, bool mask) {
    return 32 * kWarpsPerStage * panels + (mask ? kWarpsPerStage : 0);
  }

  // Warp `part` of a stage owns keys k0 + 32 part .. + 31; lane l reads the index of key 32 part + l.
  //   bf16: lane l = 4k + q copies the 32 bytes 32q .. 32q + 31 of each panel row of rows k + 8i (i < 4)
  //     of the part (the four lanes of a row: its 128 contiguous bytes, so one cp.async instruction makes 8
  //     requests of 64 bytes; lane pairs with 64 bytes of two rows each would make 16 of 32); invalid keys
  //     zero-filled by the copy (nothing read). The index
  //     line kIndexAhead tiles ahead is prefetched into L2, so a tile's index load is an L2 hit.
  //   fp8_ds_mla: lane l owns its own key row: per latent panel four 16-byte loads (64 codes) in one
  //     round trip, converted into the row's eight swizzled chunks; the rope panel by eight cp.async. The
  //     loads are latency-bound (a few in flight per lane), so each tile also prefetches the rows of the
  //     stage's next tile (k0 + 128) into L2 with one bulk prefetch per row. (Loads spread over four lanes
  //     per row as for bf16 measured 1.1-1.3x slower here: docs/LAB.md, sparse attention.)
  struct Tile {
    int64_t off[4];      // bf16: rows k + 8i (-1: not loaded); fp8_ds_mla: off[0] = own row
    uint32_t mask32;     // loaded keys of the part
    int part, lane;
    mutable uint4 pre[4];     // code panels: the codes of the preloaded panel (preload)
#if defined(MLA_DECODE_TRACE) && MLA_DECODE_TRACE
    mutable int trace_slot = -1;  // trace build: the producer slot this tile's group stamps (trace.cuh)
#endif
    mutable float pre_scale;  // and its tile scale

    // This lane's key of the tile at k0: its index entry (bf16; fetched a tile ahead by the seesaw's producer,
    // so that the load's latency is not paid between a release and the refill: the constructor below).
    __device__ static int32_t fetch(const DecodeSm90Params& p, const Unit& u, int k0, int part, int lane) {
      return Rows::fetch(p, u, k0 + 32 * part + lane);
    }
    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_) : part(part_), lane(lane_) {
      if constexpr (F == CacheFormat::bf16) {
        init_bf16(p, u, k0, fetch(p, u, k0, part, lane));
      } else {
        const int key = k0 + 32 * part + lane;
        int64_t o = 0;
        mask32 = __ballot_sync(0xffffffffu, Rows::row_offset(p, u, key, o));
        off[0] = o;
        prefetch_row<F, Rows>(p, u, key + 2 * Traits::kBlockN);
      }
    }
    // bf16, the index entry given (fetch above, issued earlier).
    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_, int32_t idx)
        : part(part_), lane(lane_) {
      static_assert(F == CacheFormat::bf16, "index ahead: bf16 rows");
      init_bf16(p, u, k0, idx);
    }
    __device__ void init_bf16(const DecodeSm90Params& p, const Unit& u, int k0, int32_t idx) {
      if (lane == 0) prefetch_index_line(p.gather, u, k0 + kIndexAhead * Traits::kBlockN + 32 * part);
      const int64_t o = row_offset_or_none<Rows>(p, k0 + 32 * part + lane, idx);
      mask32 = __ballot_sync(0xffffffffu, o >= 0);
#pragma unroll
      for (int i = 0; i < 4; ++i) off[i] = __shfl_sync(0xffffffffu, o, (lane >> 2) + 8 * i);
    }
    __device__ void begin(uint64_t* mask_slot, uint64_t* bar) const {
      if (lane == 0) {
        reinterpret_cast<uint32_t*>(mask_slot)[part] = mask32;
        ptx::mbar_arrive(bar);
      }
    }
    __device__ void announce(const DecodeSm90Params&, uint64_t*, int) const {}
    __device__ void prefetch_group(const DecodeSm90Params&, int) const {}  // code formats' register prefetch: none

    // bf16: cp.async of the chunks 2q, 2q + 1 of this lane's four rows of kPanels consecutive panels from the one
    // at dp, from the row bytes at src_off (+ 32 q); zero-filled for rows not loaded (nothing read). The rows
    // k + 8i of a part are all k mod 8, so a chunk's swizzled place is the same in each (row base + (chunk ^ k) x
    // 16): one shared address per chunk and one source pointer per row, every copy of the panels at a
    // compile-time offset from them (8 cp.async and no address arithmetic per panel; the loop with both
    // addresses recomputed per copy and a run-time src-size ran 86 instructions per 8 copies under ncu),
    // each with the L2 256-byte prefetch hint (the row's next line comes with the first).
    template <int kPanels = 1>
    __device__ void copy_rows(const uint8_t* cache, uint8_t* dp, int src_off) const {
      const int k = lane >> 2, q = lane & 3;
      const uint32_t row = ptx::smem_addr(dp) + static_cast<uint32_t>((32 * part + k) * 128);
      const uint32_t d[2] = {row + static_cast<uint32_t>(((2 * q) ^ k) << 4),
                             row + static_cast<uint32_t>(((2 * q + 1) ^ k) << 4)};
      const uint8_t* src[4];
      bool zero[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        zero[i] = off[i] < 0;
        src[i] = cache + (zero[i] ? 0 : off[i] + src_off + 32 * q);
      }
#pragma unroll
      for (int c = 0; c < kPanels; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            ptx::cp_async_16_or_zero_pf256(d[j] + static_cast<uint32_t>(c * Traits::kPanelBytes + i * 1024),
                                           src[i] + c * 128 + 16 * j, zero[i]);
    }

    // The register loads of code panel c, issued ahead (kPreload: fp8, exact codes; the fp8_ds_mla seesaw
    // spills 56 bytes at 56 registers with them, its conversion holds more: it loads each panel at its turn).
    static constexpr bool kPreload = kExactCodes;
    __device__ void preload(const DecodeSm90Params& p, int c) const {
      if constexpr (kPreload) pre_scale = load_codes<1>(p.gather, (mask32 >> lane) & 1, c, pre);
    }

    __device__ void panel(const DecodeSm90Params& p, const CUtensorMap*, uint8_t* dst, uint64_t* bar, int c,
                          int next) const {
      const uint8_t* cache = p.gather.cache;
      uint8_t* dp = dst + c * Traits::kPanelBytes;
      if constexpr (F == CacheFormat::bf16) {
        copy_rows(cache, dp, c * 128);
        ptx::cp_async_arrive_mbarrier(bar);
      } else {
        const int r = 32 * part + lane;
        const bool ok = (mask32 >> lane) & 1;
        if (F == CacheFormat::fp8_ds_mla && c == Traits::kPanels - 1) {  // rope: bf16 bytes 528 .. 655, copied
          copy_warp_rows<8>(cache, dp, 32 * part, ok ? off[0] + kRopeOffset : -1, lane, 0);
          ptx::cp_async_arrive_mbarrier(bar);
        } else {  // codes 64c .. 64c + 63 (preloaded) times the tile scale as bf16 (fp8: exact codes, kExactCodes)
          uint4 raw[4];
          float scale;
          if constexpr (kPreload) {
#pragma unroll
            for (int i = 0; i < 4; ++i) raw[i] = pre[i];
            scale = pre_scale;
            if (next >= 0) preload(p, next);
          } else {
            scale = load_codes<1>(p.gather, ok, c, raw);
          }
          store_codes<kExactCodes>(dp, r, raw, scale);
          ptx::fence_proxy_async_smem();
          ptx::mbar_arrive(bar);
        }
      }
    }

    // This lane's row: the codes of kPanels panels from panel c (64 each, 16 bytes per raw entry) and
    // their tile scale (fp8: the cache's); zeros and scale 0 for a key that is not loaded (nothing read).
    template <int kPanels>
    __device__ float load_codes(const DecodeSm90Params::Gather& gp, bool ok, int c, uint4* raw) const {
#pragma unroll
      for (int i = 0; i < 4 * kPanels; ++i) raw[i] = make_uint4(0, 0, 0, 0);
      if (!ok) return 0.0f;
      const uint8_t* src = gp.cache + off[0];
#pragma unroll
      for (int i = 0; i < 4 * kPanels; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(src + 64 * c + 16 * i));
      if constexpr (F == CacheFormat::fp8) return gp.scale;
      else return __ldg(reinterpret_cast<const float*>(src + kScaleOffset) + c / 2);
    }
    // 64 codes into the eight swizzled chunks of row r of the panel at dp: times `scale`, rounded to bf16;
    // kExact: exact codes times 2^-56 (`scale` unused).
    template <bool kExact>
    __device__ static void store_codes(uint8_t* dp, int r, const uint4* raw, float scale) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 lo, hi;
        expand_chunk<kExact>(raw[i], scale, lo, hi);
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i)) = lo;
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 1)) = hi;
      }
    }

  };
};

// Producer of the kernels with one full / one empty barrier per stage (layout L: kStages 2, kOffK,
// kOffMask, kOffBar = full[kStages] then empty[kStages]) over the CTA's units in order (Units: one for
// the uniform schedule, the window's segments for the balanced one). The tiles of all units form one
// sequence: tile `it` of it goes to stage it % 2. Paged: warp 0 streams every tile; gathered: warps s
// and s + 2 stream the tiles of stage s, one part each. one / have_one: the uniform unit as the kernel read it
// (Units).
template <class L, class Src>
__device__ __forceinline__ void produce(const DecodeSm90Params& p, const CUtensorMap* map, const balance::Window* win,
                                        uint8_t* smem, int warp, int lane, const Unit& one = Unit{},
                                        bool have_one = false) {
  using T = Traits;
  static_assert(L::kStages == 2, "stage s feeds consumer s");
  constexpr bool kOneWarp = Src::kWarpsPerStage == 1;
  if (kOneWarp ? warp != 0 : warp >= 2 * Src::kWarpsPerStage) return;
  const int part = kOneWarp ? 0 : warp >> 1;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kStages;
  uint64_t* mask = reinterpret_cast<uint64_t*>(smem + L::kOffMask);
  Units<Src::kIndexed> units(p, win, one, have_one);
  Unit u;
  balance::Segment seg;
  for (int base = 0; units.next(p, win, u, seg); base += u.n_tiles) {
    if (base == 0) MLA_DECODE_TRACE_EVENT(kTracePrologueBase + 3, 0);
    for (int it = kOneWarp ? base : base + (((warp & 1) - base) & 1); it < base + u.n_tiles; it += kOneWarp ? 1 : 2) {
      const int stage = it % L::kStages;
      const uint32_t parity = (it / L::kStages) & 1;
      const int k0 = u.key_begin + (it - base) * T::kBlockN;
      const typename Src::Tile tl(p, u, k0, part, lane);
      if (it - base < 2) MLA_DECODE_TRACE_EVENT(kTraceProducerBase + 2 * (it - base), 0);
      tl.preload(p, 0);  // register loads need no free stage
      ptx::mbar_wait(&empty[stage], parity ^ 1);
      if (it - base < 2) MLA_DECODE_TRACE_EVENT(kTraceProducerStepBase + 3 * (it - base), 0);
      tl.begin(&mask[stage], &full[stage]);
      tl.announce(p, &full[stage], T::kPanels);
      __syncwarp();
      if (it - base < 2) MLA_DECODE_TRACE_EVENT(kTraceProducerStepBase + 3 * (it - base) + 1, 0);
      uint8_t* dst = smem + L::kOffK + stage * T::kTileBytes;
#pragma unroll 1
      for (int c = 0; c < T::kPanels; ++c) {
        tl.panel(p, map, dst, &full[stage], c, c + 1 < T::kPanels ? c + 1 : -1);
        if (c == 0 && it - base < 2) MLA_DECODE_TRACE_EVENT(kTraceProducerStepBase + 3 * (it - base) + 2, 0);
      }
      if (it - base < 2) MLA_DECODE_TRACE_EVENT(kTraceProducerBase + 2 * (it - base) + 1, 0);
    }
  }
}

// What the consumers multiply S and O by: the cache scale times 2^56 for exact-code sources, else 1.
template <class Src>
__device__ __forceinline__ float code_scale(const DecodeSm90Params& p) {
  if constexpr (Src::kExactCodes) return p.gather.scale * kExactCodeFactor;
  else return 1.0f;
}

// A consumer's wait for a full barrier: with generically written tiles, the proxy fence that lets the
// wgmma (async proxy) see the bytes the barrier made visible.
// Crossover sources (CrossKeys): the peer CTA's producers write this CTA's tiles and arrive at cluster
// scope, so the wait acquires at cluster scope.
template <class Src>
__device__ __forceinline__ void wait_full(uint64_t* bar, uint32_t parity) {
  if constexpr (CrossoverSource<Src>) ptx::mbar_wait_cluster(bar, parity);
  else ptx::mbar_wait(bar, parity);
  MLA_DECODE_TRACE_EVENT(4, 128, true);
  if constexpr (Src::kGenericWrites) ptx::fence_proxy_async_smem();
}
// A producer's wait for an empty barrier (crossover sources: the peer's consumers release too, at cluster
// scope).
template <class Src>
__device__ __forceinline__ void wait_empty(uint64_t* bar, uint32_t parity) {
  if constexpr (CrossoverSource<Src>) ptx::mbar_wait_cluster(bar, parity);
  else ptx::mbar_wait(bar, parity);
}

}  // namespace mla::cuda::decode_sm90
