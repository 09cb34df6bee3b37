// SPDX-License-Identifier: Apache-2.0
#pragma once
// fp8_ds_mla and fp8 key source of the small sm90 kernel (kernel_small.cuh, h_q <= 32) with a raw-record
// stage in shared memory (docs/SPARSE.md "Raw stage"; fp8 per-tensor rows: StagedKeys<fp8> below). GatherKeys<fp8_ds_mla> (source.cuh) loads each record
// through registers, a few 16-byte loads per lane per round trip and five dependent round trips per tile;
// here each lane copies its record's bytes by 16-byte cp.async into a raw stage one tile ahead, so a
// tile's dequant is a shared -> shared pass and the copies of tile t + 1 are in flight while the
// consumers work on tile t (measured: 3-14% faster than the register path, docs/SPARSE.md).
//
// Producer warps (warpgroup 0, warp w = 0..3; all four work on every tile, in tile order):
//   part p = w / 2: key rows 32p .. 32p + 31 of the tile (lane l = row 32p + l: its key index, validity,
//                   record offset);
//   half h = w % 2: latent panels 4h .. 4h + 3 (codes 256h .. 256h + 255) of those rows.
// Raw slot of warp w (one per warp, shared memory after the kernel's own plan, L::kOffExtra):
//   32 rows x kRowBytes(h): the codes of its half (256 bytes) | the 16 bytes of scales (record bytes
//   512..527) [| h 1 with kRopeRaw: the bf16 rope, bytes 528..655]. The warp copies its 32 rows eight lanes
//   per row (128 contiguous bytes of four rows per cp.async; each lane its own row's scales), so a lane
//   converts rows other lanes copied: cp.async.wait_group and __syncwarp are the hand-over (no barrier).
//   Row strides 272 / 400 bytes (= 4 banks mod 32): a quarter-warp's 16-byte accesses of eight rows hit
//   distinct banks.
//   Without kRopeRaw (N = 32: the stage does not fit beside 36 KiB of Q) each half copies its four rope
//   chunks of the row straight into the swizzled stage by cp.async (completion: cp.async.mbarrier.arrive).
// Per tile t (stage t % 2), warp w:
//   1. reads the indices of tile t + 1's rows (and prefetches tile t + kPrefetch's records into L2);
//   2. waits for its copies of tile t (cp.async.wait_group 0), then empty[stage] (the consumer released it);
//   3. h 0: publishes its part's 32-bit key mask (one plain arrival on full[stage]);
//   4. converts its four latent panels raw -> bf16 (bf16(float(code) * scale), SEMANTICS 3.3) into the
//      swizzled stage, invalid rows as zeros; the rope: h 1 copies it raw -> stage (kRopeRaw) or both
//      halves cp.async it from global; fence.proxy.async, one arrival per lane on full[stage];
//   5. issues tile t + 1's copies into its raw row (one commit group). Invalid keys: nothing is copied or read.
// Barriers: full[stage] expects 2 (masks) + 128 (dequant) [+ 128 (cp.async rope)] arrivals per phase.
#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/decode_sm90/pipeline.cuh"
#include "cuda/decode_sm90/source.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

// A key source with its own producer loop and shared memory (kernel_small.cuh calls Src::produce).
template <class S>
concept StagedSource = S::kStaged;

// Rows (source.cuh): IndexedRows (sparse_mqa: top-k rows) or PagedRows (mqa_decode: the request's
// positions through its block table; the uniform schedule's one unit, no balanced schedule: its exchange
// region X does not fit beside the raw stage at N 16).
// F = fp8 (per-tensor, mqa_decode; kRopeRaw only): 576-byte rows of codes, the rope's 64 codes too; raw rows
// codes 0..255 | 16 bytes unused (h 0), codes 256..511 | 16 unused | rope codes 512..575 (h 1: 336 bytes,
// = 5 banks mod 32), converted as exact codes (source.cuh kExactCodes), h 1 also the rope panel.
template <CacheFormat F, bool kRopeRaw, class Rows = IndexedRows>
struct StagedKeys {
  static constexpr bool kDs = F == CacheFormat::fp8_ds_mla;
  static_assert(kDs || (F == CacheFormat::fp8 && kRopeRaw && Rows::kPaged), "fp8_ds_mla, or fp8 with the rope raw");
  using Fmt = CacheFormatTraits<F>;
  using RegisterPath = GatherKeys<F, Rows>;  // its conversion (store_codes)
  static constexpr bool kTma = false;
  static constexpr bool kIndexed = !Rows::kPaged;
  static constexpr bool kStaged = true;
  static constexpr bool kZeroFilled = true;
  static constexpr bool kGenericWrites = true;
  static constexpr bool kExactCodes = !kDs;
  // fp8 (N 8 / 16 under MLA_DECODE_SM90_STAGE=staged / ring only): 72 spilled 12 bytes with the warp-wide copies.
  __host__ __device__ static constexpr int producer_regs(bool) { return kDs ? 72 : 88; }
  __host__ __device__ static constexpr int full_arrivals(int, bool) { return 2 + 4 * 32 * (kRopeRaw ? 1 : 2); }

  static constexpr int kScaleOffset = kDs ? static_cast<int>(Fmt::scale_offset(512)) : 0;
  static constexpr int kRopeOffset = kDs ? static_cast<int>(Fmt::rope_offset(512)) : 512;
  static constexpr int kRopeBytes = kDs ? 128 : 64;  // record bytes of the rope: 64 bf16 or 64 codes
  static_assert(kDs ? kScaleOffset == 512 && kRopeOffset == 528 && Fmt::entry_bytes(576, 64) == 656
                    : Fmt::entry_bytes(576, 64) == 576,
                "fp8_ds_mla / fp8 record");
  static constexpr int kRowBytes0 = 256 + 16;                            // codes 0..255 | scales (fp8: unused)
  static constexpr int kRowBytes1 = 256 + 16 + (kRopeRaw ? kRopeBytes : 0);  // codes 256..511 | scales [| rope]
  __host__ __device__ static constexpr int row_bytes(int half) { return half ? kRowBytes1 : kRowBytes0; }
  static constexpr int kPartBytes = 32 * (kRowBytes0 + kRowBytes1);
  static constexpr int kExtraBytes = 2 * kPartBytes;
  static constexpr int kPrefetch = 3;  // tiles ahead prefetched into L2 (the raw copies run one tile ahead)
  __device__ static int slot_offset(int w) { return (w >> 1) * kPartBytes + (w & 1) * 32 * kRowBytes0; }

  // The start of a tile's stage writes (after the empty wait), shared with RingKeys: h 0 publishes its
  // part's 32-bit key mask (one plain arrival on full[stage]); without kRopeRaw both halves cp.async their
  // four rope chunks of the row (record offset o when ok, else zero-filled) straight into the stage's rope
  // panel, completing by cp.async.mbarrier.arrive on full[stage].
  __device__ static __forceinline__ void open_stage(const DecodeSm90Params::Gather& gp, uint32_t* mask_slot, uint64_t* full,
                                                    uint8_t* rope, int r, int half, int lane, bool ok, int64_t o) {
    if (half == 0) {
      const uint32_t m = __ballot_sync(0xffffffffu, ok);
      if (lane == 0) {
        *mask_slot = m;
        ptx::mbar_arrive(full);  // releases the mask
      }
    }
    if constexpr (!kRopeRaw) {
      copy_warp_rows<4>(gp.cache, rope, r - lane, ok ? o + kRopeOffset + 64 * half : -1, lane, 4 * half);
      ptx::cp_async_arrive_mbarrier(full);
    }
  }

  // Producer warp `warp` (0..3) of the small kernel with layout L (kOffBar: full[2], empty[2]; kOffMask;
  // kOffK; kOffExtra: this source's kExtraBytes).
  template <class L>
  __device__ static void produce(const DecodeSm90Params& p, const Unit& u, uint8_t* smem, int warp, int lane) {
    using T = Traits;
    static_assert(L::kStages == 2, "stage t % 2 feeds consumer t % 2");
    const DecodeSm90Params::Gather& gp = p.gather;
    const int part = warp >> 1, half = warp & 1, r = 32 * part + lane;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
    uint64_t* empty = full + L::kStages;
    uint32_t* mask = reinterpret_cast<uint32_t*>(smem + L::kOffMask);  // [stage][part]
    uint8_t* extra = smem + L::kOffExtra;
    uint8_t* raw0 = extra + slot_offset(warp);          // the warp's 32 raw rows
    uint8_t* raw = raw0 + lane * row_bytes(half);        // this lane's raw row (the one it converts)

    // The warp's copies of its 32 rows of the next tile (lane j's record at byte offset o when ok), one commit
    // group: eight lanes per row, four rows per instruction (128 contiguous bytes of each row: one shared-memory
    // wavefront per global line; a lane copying its own row cost 32 per instruction, copy_warp_rows); the scales
    // by each lane for its own row. A lane converts rows other lanes copied: __syncwarp after the wait, and
    // before these copies overwrite rows other lanes may still read.
    auto fetch = [&](bool ok, int64_t o) {
      const int64_t mine = ok ? o : -1;
      const int c8 = lane & 7;
#pragma unroll 1
      for (int q = 0; q < 8; ++q) {
        const int row = 4 * q + (lane >> 3);
        const int64_t oq = __shfl_sync(0xffffffffu, mine, row);
        if (oq >= 0) {
          const uint8_t* rec = gp.cache + oq;
          uint8_t* rw = raw0 + row * row_bytes(half);
#pragma unroll
          for (int i = 0; i < 2; ++i) ptx::cp_async_16(rw + 16 * (8 * i + c8), rec + 256 * half + 16 * (8 * i + c8));
          if (kRopeRaw && half == 1 && c8 < kRopeBytes / 16)
            ptx::cp_async_16(rw + 272 + 16 * c8, rec + kRopeOffset + 16 * c8);
        }
      }
      if constexpr (kDs)
        if (ok) ptx::cp_async_16(raw + 256, gp.cache + o + kScaleOffset);
      ptx::cp_async_commit();
    };

    int64_t off = 0;
    bool ok = Rows::row_offset(p, u, u.key_begin + r, off);
    fetch(ok, off);
    if (half == 0)
      for (int t = 1; t < kPrefetch; ++t) prefetch_row<F, Rows>(p, u, u.key_begin + t * T::kBlockN + r);
    for (int it = 0; it < u.n_tiles; ++it) {
      const int stage = it & 1, k0 = u.key_begin + it * T::kBlockN;
      int64_t off_next = 0;
      const bool ok_next = Rows::row_offset(p, u, k0 + T::kBlockN + r, off_next);  // false past the last tile
      if (half == 0) prefetch_row<F, Rows>(p, u, k0 + kPrefetch * T::kBlockN + r);
      ptx::cp_async_wait<0>();
      __syncwarp();  // the rows this lane converts were copied by other lanes of the warp (fetch)
      ptx::mbar_wait(&empty[stage], ((it >> 1) & 1) ^ 1);
      uint8_t* dst = smem + L::kOffK + stage * T::kTileBytes;
      uint8_t* rope = dst + (T::kPanels - 1) * T::kPanelBytes;
      open_stage(gp, &mask[2 * stage + part], &full[stage], rope, r, half, lane, ok, off);
#pragma unroll 1
      for (int j = 0; j < 4; j += 2) {  // latent panels 4 half + j, + 1 (one tile scale)
        uint4 v[8];
        float scale = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = ok ? *reinterpret_cast<const uint4*>(raw + 64 * j + 16 * i) : make_uint4(0, 0, 0, 0);
        if (kDs && ok) scale = *reinterpret_cast<const float*>(raw + 256 + 4 * (2 * half + j / 2));
        uint8_t* dp = dst + (4 * half + j) * T::kPanelBytes;
        RegisterPath::Tile::template store_codes<kExactCodes>(dp, r, v, scale);
        RegisterPath::Tile::template store_codes<kExactCodes>(dp + T::kPanelBytes, r, v + 4, scale);
      }
      if constexpr (!kDs) {  // fp8: h 1 converts the rope's 64 codes too
        if (half == 1) {
          uint4 v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = ok ? *reinterpret_cast<const uint4*>(raw + 272 + 16 * i) : make_uint4(0, 0, 0, 0);
          RegisterPath::Tile::template store_codes<true>(rope, r, v, 0.0f);
        }
      } else if constexpr (kRopeRaw) {
        if (half == 1) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<uint4*>(rope + swz(r, i)) =
                ok ? *reinterpret_cast<const uint4*>(raw + 272 + 16 * i) : make_uint4(0, 0, 0, 0);
        }
      }
      ptx::fence_proxy_async_smem();  // the stage for wgmma; this lane's raw reads before the copies below
      ptx::mbar_arrive(&full[stage]);
      __syncwarp();  // every lane's raw reads of this tile before the warp's copies overwrite the rows
      if (it + 1 < u.n_tiles) fetch(ok_next, off_next);
      ok = ok_next;
      off = off_next;
    }
  }
};

// ---- The raw ring (launch_kernels.cuh stage_choice: the default of the dense decode's N 16 kernel; GPU-tested
// and measured on nvidia-h200 2026-11-23, docs/DECODE.md "Raw ring") ----
// StagedKeys' cycle is serial per warp: a lane's one raw row is refilled (tile t + 1's copies issued) only
// after tile t's conversion, which itself waits for the stage's empty barrier, so every tile pays copy
// latency + empty wait + conversion in series (docs/DECODE.md "Next" 4 (c), docs/SPARSE.md "Next" 0 (c)).
// RingKeys gives each lane a ring of kSlots = 3 raw *chunks* instead: the same warp roles (part p = w / 2:
// rows 32p .. 32p + 31; half h = w % 2: latent panels 4h .. 4h + 3), each tile's work of a warp cut in two
// chunks k = 0, 1 (latent panels 4h + 2k, 4h + 2k + 1; for h 1 with kRopeRaw also half the rope), chunk
// j = 2 t + k of the warp's sequence in slot j % 3. After converting chunk j a lane refills its slot with
// chunk j + 3, so two chunks (one tile) are always in flight while one converts: the copies run 1.5 tiles
// ahead and wait for nothing but their slot (not for the stage's empty barrier).
// (The "two pairs alternating tiles, each with its own raw tile" of that Next item needs a whole raw tile
// per pair, 2 x 36-42 KiB: it fits at no N for fp8 and only at N 8 for fp8_ds_mla without the rope; and a
// stage would be filled by two warps instead of four, lengthening the stage cycle that the sparse
// diagnostics name as the other limit. The ring needs 1.5 raw tiles and keeps four warps per stage.)
//
// Slot row of a lane (bytes; strides an odd multiple of 16, so a quarter-warp's 16-byte accesses of eight
// rows hit distinct banks, except fp8 h 0's 128 bytes, whose eight 16-byte pieces are XOR-swizzled by lane % 8):
//   fp8         h 0: codes 128 (stride 128, swizzled)    h 1: codes 128 | rope codes 32k .. 32k + 31 (176)
//   fp8_ds_mla  h 0: codes 128 | scales 16 (144)         h 1: the same [| kRopeRaw: rope bytes 64k .. 64k + 63] (144 / 208)
// kExtraBytes = 2 parts x 3 slots x 32 rows x (stride h 0 + stride h 1): fp8 58,368; fp8_ds_mla 67,584 (rope
// raw) / 55,296 (rope by cp.async into the stage). Fits (kOffExtra + kExtraBytes + 1 KiB <= 227 KiB, kOffExtra
// 159,280 / 170,928 / 194,224 at N 8 / 16 / 32): fp8 at N 8 and 16; fp8_ds_mla with the rope raw at N 8, with
// the rope by cp.async at N 16; nothing at N 32 (37,200 bytes free: the default sources run there).
//
// Protocol per tile t (stage t % 2), lane of warp w; one cp.async commit group per chunk, committed even
// when nothing is copied (invalid row or a tile past the unit: Rows::row_offset is false there), so that
// group j is chunk j and wait_group 2 before converting chunk j means "chunks <= j landed" (j + 1, j + 2
// may be in flight). Prologue: chunks 0, 1 (tile 0) and 2 (tile 1, k 0) into slots 0, 1, 2.
//   1. row offset of tile t + 2 (!kRopeRaw: after step 3) and the L2 prefetch of tile t + kPrefetch (h 0);
//   2. wait_group 2 (chunk 2t landed); empty[stage] (parity (t / 2 + 1) & 1: consumer t % 2 released t - 2);
//   3. h 0: its part's 32-bit key mask, one plain arrival on full[stage];
//      !kRopeRaw: both halves cp.async their four rope chunks (zero-filled when invalid) straight into the
//      stage, cp.async.mbarrier.arrive on full[stage] (it tracks all prior copies of the lane: the
//      arrival also waits for chunks 2t + 1, 2t + 2 already in flight; N 16 fp8_ds_mla only);
//   4. converts chunk 2t (slot 2t % 3) into the stage, invalid rows as zeros (nothing of the slot is read);
//   5. refills that slot with chunk 2t + 3 (tile t + 1, k 1);
//   6. wait_group 2 (chunk 2t + 1 landed), converts it (slot (2t + 1) % 3);
//   7. fence.proxy.async (the stage for wgmma), one arrival per lane on full[stage];
//   8. refills that slot with chunk 2t + 4 (tile t + 2, k 0).
// A slot is rewritten only by the lane that read it, after its reads were consumed (their values feed the
// stores of step 4 / 6, issued before the refill), so cp.async.wait_group is the only raw hand-over; the
// stage barriers, their arrival counts (full: 2 + 128 [+ 128], empty: 128) and parities are StagedKeys'.
// Masked keys (invalid index, position >= the unit's key_end, page outside the cache) are never copied,
// arrive as zero rows with a clear mask bit (kZeroFilled), so NaN-poisoned rows never reach P V; the
// consumers are unchanged (kernel_small.cuh).
template <CacheFormat F, bool kRopeRaw, class Rows = IndexedRows>
struct RingKeys {
  using Staged = StagedKeys<F, kRopeRaw, Rows>;  // the record layout, the conversion and the consumer interface
  using RegisterPath = typename Staged::RegisterPath;
  static constexpr bool kDs = Staged::kDs;
  static constexpr bool kTma = false;
  static constexpr bool kIndexed = Staged::kIndexed;
  static constexpr bool kStaged = true;
  static constexpr bool kZeroFilled = true;
  static constexpr bool kGenericWrites = true;
  static constexpr bool kExactCodes = Staged::kExactCodes;
  __host__ __device__ static constexpr int producer_regs(bool s) { return Staged::producer_regs(s); }
  __host__ __device__ static constexpr int full_arrivals(int n, bool m) { return Staged::full_arrivals(n, m); }

  static constexpr int kSlots = 3;
  static constexpr int kCodeBytes = 128;                 // two 64-column panels of codes
  static constexpr int kScaleBytes = kDs ? 16 : 0;       // the record's four scales (one 16-byte copy)
  static constexpr int kRopeChunk = kRopeRaw ? Staged::kRopeBytes / 2 : 0;  // h 1: half the rope per chunk
  __host__ __device__ static constexpr int odd16(int b) { return b % 128 == 0 || (b / 16) % 2 == 1 ? b : b + 16; }
  static constexpr int kStride0 = odd16(kCodeBytes + kScaleBytes);
  static constexpr int kStride1 = odd16(kCodeBytes + kScaleBytes + kRopeChunk);
  static constexpr bool kSwizzled0 = kStride0 == 128;  // fp8 h 0: pieces XOR lane % 8
  static_assert(kStride0 % 16 == 0 && kStride1 % 16 == 0 && (kStride1 / 16) % 2 == 1, "conflict-free slot rows");
  static constexpr int kPartBytes = kSlots * 32 * (kStride0 + kStride1);
  static constexpr int kExtraBytes = 2 * kPartBytes;
  static constexpr int kPrefetch = 4;  // tiles ahead prefetched into L2 (the copies run 1.5 tiles ahead)
  __device__ static int region_offset(int w) { return (w >> 1) * kPartBytes + (w & 1) * kSlots * 32 * kStride0; }

  template <class L>
  __device__ static void produce(const DecodeSm90Params& p, const Unit& u, uint8_t* smem, int warp, int lane) {
    using T = Traits;
    static_assert(L::kStages == 2, "stage t % 2 feeds consumer t % 2");
    const int part = warp >> 1, half = warp & 1, r = 32 * part + lane;
    const int stride = half ? kStride1 : kStride0, slot_bytes = 32 * stride;  // this warp's slot rows
    const bool swizzled = kSwizzled0 && half == 0;
    const DecodeSm90Params::Gather& gp = p.gather;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
    uint64_t* empty = full + L::kStages;
    uint32_t* mask = reinterpret_cast<uint32_t*>(smem + L::kOffMask);  // [stage][part]
    uint8_t* ring = smem + L::kOffExtra + region_offset(warp) + lane * stride;  // slot s at ring + s * slot_bytes
    auto piece = [&](int i) { return swizzled ? (i ^ (lane & 7)) << 4 : 16 * i; };  // code piece i of a slot row

    // Chunk k of the row at record offset o (when ok) into slot s; one commit group.
    auto fetch = [&](int s, bool ok, int64_t o, int k) {
      if (ok) {
        uint8_t* dst = ring + s * slot_bytes;
        const uint8_t* rec = gp.cache + o;
#pragma unroll
        for (int i = 0; i < 8; ++i) ptx::cp_async_16(dst + piece(i), rec + 256 * half + 128 * k + 16 * i);
        if constexpr (kDs) ptx::cp_async_16(dst + kCodeBytes, rec + Staged::kScaleOffset);
        if constexpr (kRopeRaw) {
          if (half == 1)
#pragma unroll
            for (int i = 0; i < kRopeChunk / 16; ++i)
              ptx::cp_async_16(dst + kCodeBytes + kScaleBytes + 16 * i, rec + Staged::kRopeOffset + kRopeChunk * k + 16 * i);
        }
      }
      ptx::cp_async_commit();
    };
    // Chunk k of this lane's row of the tile in slot s into the stage at dst (zeros when !ok).
    auto convert = [&](int s, bool ok, int k, uint8_t* dst) {
      const uint8_t* src = ring + s * slot_bytes;
      float scale = 0.0f;
      if (kDs && ok) scale = *reinterpret_cast<const float*>(src + kCodeBytes + 4 * (2 * half + k));
#pragma unroll
      for (int pn = 0; pn < 2; ++pn) {  // one panel at a time (16 registers of codes: 72 per producer thread)
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          v[i] = ok ? *reinterpret_cast<const uint4*>(src + piece(4 * pn + i)) : make_uint4(0, 0, 0, 0);
        RegisterPath::Tile::template store_codes<kExactCodes>(dst + (4 * half + 2 * k + pn) * T::kPanelBytes, r, v, scale);
      }
      if constexpr (kRopeRaw) {
        if (half == 1) {
          uint8_t* rope = dst + (T::kPanels - 1) * T::kPanelBytes;
          const uint8_t* rs = src + kCodeBytes + kScaleBytes;
          if constexpr (!kDs) {  // fp8: rope codes 32k .. 32k + 31 -> chunks 4k .. 4k + 3
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const uint4 c = ok ? *reinterpret_cast<const uint4*>(rs + 16 * i) : make_uint4(0, 0, 0, 0);
              *reinterpret_cast<uint4*>(rope + swz(r, 4 * k + 2 * i)) = e4m3x8_exact_to_bf16(c.x, c.y);
              *reinterpret_cast<uint4*>(rope + swz(r, 4 * k + 2 * i + 1)) = e4m3x8_exact_to_bf16(c.z, c.w);
            }
          } else {  // fp8_ds_mla: bf16 rope bytes 64k .. 64k + 63 -> chunks 4k .. 4k + 3
#pragma unroll
            for (int i = 0; i < 4; ++i)
              *reinterpret_cast<uint4*>(rope + swz(r, 4 * k + i)) =
                  ok ? *reinterpret_cast<const uint4*>(rs + 16 * i) : make_uint4(0, 0, 0, 0);
          }
        }
      }
    };

    int64_t off0 = 0, off1 = 0;
    bool ok0 = Rows::row_offset(p, u, u.key_begin + r, off0);               // tile t
    bool ok1 = Rows::row_offset(p, u, u.key_begin + T::kBlockN + r, off1);  // tile t + 1
    fetch(0, ok0, off0, 0);
    fetch(1, ok0, off0, 1);
    fetch(2, ok1, off1, 0);
    if (half == 0)
      for (int t = 1; t < kPrefetch; ++t) prefetch_row<F, Rows>(p, u, u.key_begin + t * T::kBlockN + r);
    int s0 = 0;  // slot of chunk 2t: (2t) % 3
    for (int it = 0; it < u.n_tiles; ++it) {
      const int stage = it & 1, k0 = u.key_begin + it * T::kBlockN;
      const int s1 = s0 == 2 ? 0 : s0 + 1;  // slot of chunk 2t + 1
      // Row of tile t + 2 (false past the last tile): computed before the waits (its index / block-table load
      // in flight meanwhile), or with the rope by cp.async after the rope's copies (off0 dead: 16 bytes of
      // spills at 72 registers otherwise).
      int64_t off2 = 0;
      bool ok2 = false;
      if constexpr (kRopeRaw) ok2 = Rows::row_offset(p, u, k0 + 2 * T::kBlockN + r, off2);
      if (half == 0) prefetch_row<F, Rows>(p, u, k0 + kPrefetch * T::kBlockN + r);
      ptx::cp_async_wait<2>();
      ptx::mbar_wait(&empty[stage], ((it >> 1) & 1) ^ 1);
      uint8_t* dst = smem + L::kOffK + stage * T::kTileBytes;
      Staged::open_stage(gp, &mask[2 * stage + part], &full[stage], dst + (T::kPanels - 1) * T::kPanelBytes, r, half, lane,
                         ok0, off0);
      if constexpr (!kRopeRaw) ok2 = Rows::row_offset(p, u, k0 + 2 * T::kBlockN + r, off2);
      convert(s0, ok0, 0, dst);
      fetch(s0, ok1, off1, 1);  // chunk 2t + 3
      ptx::cp_async_wait<2>();
      convert(s1, ok0, 1, dst);
      ptx::fence_proxy_async_smem();  // the stage for wgmma
      ptx::mbar_arrive(&full[stage]);
      fetch(s1, ok2, off2, 0);  // chunk 2t + 4
      ok0 = ok1;
      off0 = off1;
      ok1 = ok2;
      off1 = off2;
      s0 = s1 == 2 ? 0 : s1 + 1;
    }
  }
};

// The staged source for a small kernel whose own shared memory ends at kOffExtra. fp8_ds_mla: the rope in
// the raw stage where it fits (N 8, 16), else by cp.async (N 32). fp8: the staged source where it fits (N 8,
// 16), else the register path (GatherKeys, N 32).
template <int kOffExtra, class Rows = IndexedRows>
using StagedDsMlaKeysFor =
    StagedKeys<CacheFormat::fp8_ds_mla,
               kOffExtra + StagedKeys<CacheFormat::fp8_ds_mla, true>::kExtraBytes + 1024 <= 227 * 1024, Rows>;
template <CacheFormat F, int kOffExtra, class Rows>
struct SmallKeysChoice {
  using type = StagedDsMlaKeysFor<kOffExtra, Rows>;
};
template <int kOffExtra, class Rows>
struct SmallKeysChoice<CacheFormat::fp8, kOffExtra, Rows> {
  using type = std::conditional_t<kOffExtra + StagedKeys<CacheFormat::fp8, true, Rows>::kExtraBytes + 1024 <= 227 * 1024,
                                  StagedKeys<CacheFormat::fp8, true, Rows>, GatherKeys<CacheFormat::fp8, Rows>>;
};
// The small kernel's source for the row-copied format F (fp8_ds_mla, fp8).
template <CacheFormat F, int kOffExtra, class Rows>
using SmallKeysFor = typename SmallKeysChoice<F, kOffExtra, Rows>::type;

// The ring variant for the small kernel (launch_kernels.cuh, MLA_DECODE_SM90_STAGE=ring): RingKeys where it
// fits (fp8_ds_mla: the rope raw, else by cp.async), else SmallKeysFor (N 32: the default source).
template <class S, int kOffExtra>
inline constexpr bool kRingFits = kOffExtra + S::kExtraBytes + 1024 <= 227 * 1024;
template <CacheFormat F, int kOffExtra, class Rows>
struct SmallRingChoice {
  using Raw = RingKeys<CacheFormat::fp8_ds_mla, true, Rows>;
  using Direct = RingKeys<CacheFormat::fp8_ds_mla, false, Rows>;
  using type = std::conditional_t<kRingFits<Raw, kOffExtra>, Raw,
                                  std::conditional_t<kRingFits<Direct, kOffExtra>, Direct, SmallKeysFor<F, kOffExtra, Rows>>>;
};
template <int kOffExtra, class Rows>
struct SmallRingChoice<CacheFormat::fp8, kOffExtra, Rows> {
  using Ring = RingKeys<CacheFormat::fp8, true, Rows>;
  using type = std::conditional_t<kRingFits<Ring, kOffExtra>, Ring, SmallKeysFor<CacheFormat::fp8, kOffExtra, Rows>>;
};
template <CacheFormat F, int kOffExtra, class Rows>
using SmallRingKeysFor = typename SmallRingChoice<F, kOffExtra, Rows>::type;

}  // namespace mla::cuda::decode_sm90
