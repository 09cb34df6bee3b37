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
//   512..527) [| h 1 with kRopeRaw: the bf16 rope, bytes 528..655]; 17 (or 25) cp.async per lane and tile.
//   Row strides 272 / 400 bytes (= 4 banks mod 32): a quarter-warp's 16-byte accesses of eight rows hit
//   distinct banks. Each lane reads only the row it copied, so its own cp.async.wait_group is the
//   hand-over (no barrier).
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
  __host__ __device__ static constexpr int producer_regs(bool) { return 72; }
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
    uint8_t* raw = extra + slot_offset(warp) + lane * row_bytes(half);  // this lane's raw row

    // This lane's copies of its row of the next tile (record at byte offset o when ok), one commit group.
    auto fetch = [&](bool ok, int64_t o) {
      if (ok) {
        const uint8_t* rec = gp.cache + o;
#pragma unroll
        for (int i = 0; i < 16; ++i) ptx::cp_async_16(raw + 16 * i, rec + 256 * half + 16 * i);
        if constexpr (kDs) ptx::cp_async_16(raw + 256, rec + kScaleOffset);
        if (kRopeRaw && half == 1)
#pragma unroll
          for (int i = 0; i < kRopeBytes / 16; ++i) ptx::cp_async_16(raw + 272 + 16 * i, rec + kRopeOffset + 16 * i);
      }
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
      ptx::mbar_wait(&empty[stage], ((it >> 1) & 1) ^ 1);
      uint8_t* dst = smem + L::kOffK + stage * T::kTileBytes;
      uint8_t* rope = dst + (T::kPanels - 1) * T::kPanelBytes;
      if (half == 0) {
        const uint32_t m = __ballot_sync(0xffffffffu, ok);
        if (lane == 0) {
          mask[2 * stage + part] = m;
          ptx::mbar_arrive(&full[stage]);  // releases the mask
        }
      }
      if constexpr (!kRopeRaw) {
        copy_row_chunks<4>(gp.cache, rope, r, ok, off + kRopeOffset + 64 * half, 4 * half);
        ptx::cp_async_arrive_mbarrier(&full[stage]);
      }
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
      if (it + 1 < u.n_tiles) fetch(ok_next, off_next);
      ok = ok_next;
      off = off_next;
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

}  // namespace mla::cuda::decode_sm90
