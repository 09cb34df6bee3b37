// SPDX-License-Identifier: Apache-2.0
#pragma once
// InplaceKeys<F, Rows>: the seesaw kernel's (seesaw/kernel.cuh, 64-row tiles) fp8_ds_mla / fp8 key source
// with the codes expanded in place (docs/design/attention_sm90.md "6. The seesaw's key sources").
// GatherKeys<F, Rows> (source.cuh) loads each latent panel's codes into registers and converts them: per
// stage tile and producer warp nine dependent global round trips (eight latent panels + the rope). The
// seesaw kernel has no room for a raw stage (0.8 KiB spare), but each 8 KiB stage panel has room for its
// own raw codes: a key row's 64 codes of panel c (64 bytes) are half of the 128 bytes its bf16 values take.
//
// Protocol (warp roles, tiles, key masks and full-barrier arrival counts are GatherKeys': two producer warps
// per stage, part p = keys 32p .. 32p + 31, lane l = key row r = 32p + l; produce_seesaw calls group<N>()
// once per release group, rope (N 1) then the owner's V half then the other (N 4), each after its empty wait):
//   0. V halves: before the half's empty wait (prefetch_group) lane l loads its row's codes of the half's first
//      panel (four 16-byte chunks) into registers and the half's two tile scales (fp8_ds_mla: record bytes
//      512 + 8 h, h = the V half); zeros for a key that is not loaded. This round trip then runs during the
//      wait (`half`).
//   1. copy: lane l cp.async's the four 16-byte code chunks i = 0..3 of each remaining panel c of the group
//      (a V half's last three; the fp8 rope panel) into the upper half of its OWN output row r of panel c,
//      logical chunks 4 + i (swz(r, 4 + i)); a key that is not loaded (GatherKeys' mask) is zero-filled by
//      the copy, nothing read. One commit group; a V half's first panel is expanded from the registers
//      meanwhile; then cp.async.wait_group 0: one global round trip per release group.
//   2. convert in place, panel by panel, chunk by chunk: raw chunk i is loaded (ld.shared) and becomes the
//      bf16 chunks 2i, 2i + 1; every store lands on chunks 0..3 (free) or on a raw chunk this lane has
//      already loaded (i = 2, 3 overwrite raw chunks 0..3), and a lane touches only its own row, so program
//      order is the only hand-over (no warp barrier). Then fence.proxy.async and the lane's arrival, once per
//      group on full[first] (one arrival per lane and phase, as full_arrivals counts: group<1> for the rope
//      panel, group<4, kGroupFull = true> for a V half).
//   fp8_ds_mla: values bf16(float(code) * scale) (SEMANTICS 3.3, the pinned upconvert: GatherKeys'
//   e4m3x8_scaled_to_bf16); the rope panel (bf16 bytes 528..655) is cp.async'd into its swizzled place and
//   completes on full[8] by cp.async.mbarrier.arrive (no wait, no conversion). fp8 per-tensor: every
//   panel, the rope's too, as exact codes (source.cuh kExactCodes, e4m3x8_exact_to_bf16: code * 2^-56;
//   the consumers apply scale * 2^56 to S and O).
// Round trips per stage tile and warp: fp8_ds_mla two dependent ones (the V halves; the rope copy overlaps),
// fp8 three (GatherKeys' panel-by-panel conversion would take nine). Shared memory: none beyond the stages (the
// raw codes live in the rows they expand into; SeesawTraits' 231,632 bytes). Registers: producer 56 (setmaxnreg; consumers 224,
// 0 spills): 16 for the prefetched panel, one raw chunk live in the in-place loop, which is not unrolled
// (unrolled, ptxas kept 12 chunk addresses live: spills at 40). Two panels in registers spilled 52-60 bytes.
// Bank conflicts: none (a quarter warp's 16-byte accesses are eight rows r .. r + 7 at one logical chunk:
// distinct physical chunks under the XOR swizzle).
// The code formats' seesaw source wherever the crossover does not run (an odd number of row tiles:
// seesaw/launch.cuh launch_seesaw_codes). Chosen by measurement over converting through registers, and the
// register-prefetched first panel over copying it too (docs/design/attention_sm90.md "6. The seesaw's key
// sources"; the figures in docs/LAB.md, code formats on the seesaw tile).
#include <cstdint>

#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/common/trace.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

// A source whose seesaw producer works per release group (produce_seesaw calls Tile::group<N>).
template <class S>
concept GroupwiseSource = requires { requires S::kGroupwise; };
// Sources whose tile takes its index entry loaded ahead (GroupRows: Src::Tile::fetch and a Tile(..., idx)).
template <class S>
concept IndexAheadSource = requires { requires S::kFetchAhead; };

template <CacheFormat F, class Rows = IndexedRows>
struct InplaceKeys : GatherKeys<F, Rows> {
  static_assert(F == CacheFormat::fp8_ds_mla || F == CacheFormat::fp8, "code formats only");
  using Base = GatherKeys<F, Rows>;
  static constexpr bool kGroupwise = true;  // produce_seesaw: one group() per release group
  static constexpr bool kDs = F == CacheFormat::fp8_ds_mla;
  // setmaxnreg: producers 56 (a V half's first panel of codes in registers: 16), consumers 224 (ptxas -v: 0
  // spills).
  __host__ __device__ static constexpr int producer_regs(bool) { return 56; }

  struct Tile : Base::Tile {
    using BT = typename Base::Tile;
    mutable uint4 pre1[4];       // CrossKeys' prefetch_group: its second panel's codes (pre: the first)
    mutable float pre_scale_hi;  // fp8_ds_mla: the scale of the half's last two panels (pre_scale: first two)

    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_)
        : BT(p, u, k0, part_, lane_) {}
    __device__ void preload(const DecodeSm90Params&, int) const {}

    // The codes of panel `first` of this lane's row (pre) and the half's two tile scales, issued before the empty
    // wait of the V half at panel `first` (produce_seesaw): registers need no free stage, so that panel's round
    // trip runs during the wait; zeros for a key that is not loaded (nothing read).
    __device__ void prefetch_group(const DecodeSm90Params& p, int first) const {
      const bool ok = (this->mask32 >> this->lane) & 1;
      const uint8_t* src = p.gather.cache + (ok ? this->off[0] : 0);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        this->pre[i] = ok ? __ldg(reinterpret_cast<const uint4*>(src + 64 * first + 16 * i)) : make_uint4(0, 0, 0, 0);
      float2 sc = make_float2(0.0f, 0.0f);
      if constexpr (kDs)
        if (ok) sc = __ldg(reinterpret_cast<const float2*>(src + Base::kScaleOffset) + first / 4);
      this->pre_scale = sc.x;
      pre_scale_hi = sc.y;
    }

    // Row r of the panel at dp from its four raw 16-byte chunks `raw` (registers) into its eight bf16 chunks.
    __device__ static void expand_row(uint8_t* dp, int r, const uint4 (&raw)[4], float scale) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 lo, hi;
        expand_chunk<Base::kExactCodes>(raw[i], scale, lo, hi);
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i)) = lo;
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 1)) = hi;
      }
    }
    // Row r of the panel at dp expanded in place from the raw codes in its upper half: raw chunk i (logical chunk
    // 4 + i) becomes chunks 2i, 2i + 1. Two raw chunks per iteration, both read before either is expanded (two
    // independent load -> expand -> store chains: with one chain at a time the trace put this loop at ~1150
    // cycles per panel); every write lands on a raw chunk already read (iteration 0 writes chunks
    // 0..3, free; iteration 1 writes 4..7 = raw chunks 0..3, the last two read at its start). Not unrolled further:
    // the chunk addresses are recomputed (fully unrolled, ptxas kept 12 of them live and the then 40-register
    // producer spilled).
    __device__ static void expand_row_in_place(uint8_t* dp, int r, float scale) {
#pragma unroll 1
      for (int i = 0; i < 4; i += 2) {
        const uint4 raw0 = *reinterpret_cast<const uint4*>(dp + swz(r, 4 + i));
        const uint4 raw1 = *reinterpret_cast<const uint4*>(dp + swz(r, 5 + i));
        uint4 lo0, hi0, lo1, hi1;
        expand_chunk<Base::kExactCodes>(raw0, scale, lo0, hi0);
        expand_chunk<Base::kExactCodes>(raw1, scale, lo1, hi1);
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i)) = lo0;
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 1)) = hi0;
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 2)) = lo1;
        *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 3)) = hi1;
      }
    }

    // Release group `first` .. first + N - 1 (N 1: the rope panel 8, always the tile's first group; N 4: a
    // V half) of the tile at dst; panel c completes on full[c]. Steps: file comment.
    // kGroupFull (produce_seesaw's V halves): the four panels complete on ONE full barrier, full[first]: one
    // arrival per lane after all four are converted (so one arrival per phase, whatever the panel count, as
    // full_arrivals counts it).
    template <int N, bool kGroupFull = false>
    __device__ void group(const DecodeSm90Params& p, uint8_t* dst, uint64_t* full, int first) const {
      const uint8_t* cache = p.gather.cache;
      const int r = 32 * this->part + this->lane;
      const bool ok = (this->mask32 >> this->lane) & 1;
      const uint8_t* src = ok ? cache + this->off[0] : cache;
      if constexpr (kDs && N == 1) {  // rope: bf16, copied where it goes
        copy_warp_rows<8>(cache, dst + 8 * Traits::kPanelBytes, r - this->lane,
                          ok ? this->off[0] + Base::kRopeOffset : -1, this->lane, 0);
        ptx::cp_async_arrive_mbarrier(&full[8]);
      } else if constexpr (N == 4) {
        half<kGroupFull>(dst, full, first, r, ok, src);
      } else {
        convert<N, kGroupFull>(dst, full, first, r, ok, src);
      }
    }
    // A V half (panels first .. first + 3): the raw codes of its last three panels cp.async'd into their rows'
    // upper halves, its first panel expanded from the registers prefetch_group loaded while those copies fly,
    // then the other three expanded in place (convert's steps). (Two panels in registers spilled 52-60 bytes at
    // 56 producer registers, with the copies issued before or between their expansions: ptxas -v.)
    template <bool kGroupFull>
    __device__ void half(uint8_t* dst, uint64_t* full, int first, int r, bool ok, const uint8_t* src) const {
      const uint8_t* gs = src + 64 * first;
#pragma unroll 1
      for (int k = 1; k < 4; ++k) {
        uint8_t* dp = dst + (first + k) * Traits::kPanelBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) ptx::cp_async_16_or_zero(dp + swz(r, 4 + i), gs + 64 * k + 16 * i, !ok);
      }
      ptx::cp_async_commit();
      expand_row(dst + first * Traits::kPanelBytes, r, this->pre, this->pre_scale);
      if constexpr (!kGroupFull) {
        ptx::fence_proxy_async_smem();
        ptx::mbar_arrive(&full[first]);
      }
      ptx::cp_async_wait<0>();
      MLA_DECODE_TRACE_PROD(this->trace_slot, 1);
      expand_in_place<kGroupFull>(dst, full, first, 1, 2, r, this->pre_scale);
      expand_in_place<kGroupFull>(dst, full, first, 2, 4, r, pre_scale_hi);
      if constexpr (kGroupFull) {
        ptx::fence_proxy_async_smem();
        ptx::mbar_arrive(&full[first]);
      }
    }
    // The fp8 per-tensor rope panel (N 1; fp8_ds_mla's rope is bf16, copied): its raw codes copied into their own
    // rows, then expanded in place (steps 1, 2). Each lane copies its own row. (copy_warp_rows, four lanes per row,
    // measured 13-14% slower for the V halves at h 64 when they were copied that way.)
    // The zero-fill by the ignore-src predicate (cp_async_16_or_zero): a run-time src-size costs ~5 instructions
    // per copy (ptx/cp_async.cuh).
    template <int N, bool kGroupFull>
    __device__ void convert(uint8_t* dst, uint64_t* full, int first, int r, bool ok, const uint8_t* src) const {
      static_assert(N == 1 && !kDs, "the exact-code rope panel only");
      // (a key that is not loaded: src is the cache base, these offsets stay inside its first row; nothing read)
      uint8_t* dp = dst + first * Traits::kPanelBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) ptx::cp_async_16_or_zero(dp + swz(r, 4 + i), src + 64 * first + 16 * i, !ok);
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      MLA_DECODE_TRACE_PROD(this->trace_slot, 1);
      expand_in_place<kGroupFull>(dst, full, first, 0, 1, r, 0.0f);
      if constexpr (kGroupFull) {
        ptx::fence_proxy_async_smem();
        ptx::mbar_arrive(&full[first]);
      }
    }
    // Panels first + k0 .. first + k1 - 1, whose raw codes have landed in their rows' upper halves, expanded in
    // place with one tile scale; kGroupFull false: each panel's arrival on its own full barrier.
    template <bool kGroupFull>
    __device__ void expand_in_place(uint8_t* dst, uint64_t* full, int first, int k0, int k1, int r, float scale) const {
#pragma unroll 1
      for (int k = k0; k < k1; ++k) {
        expand_row_in_place(dst + (first + k) * Traits::kPanelBytes, r, scale);
        if constexpr (!kGroupFull) {
          ptx::fence_proxy_async_smem();
          ptx::mbar_arrive(&full[first + k]);
        }
      }
    }
  };
};

// GroupRows<Rows>: bf16 rows through the index list (sparse_mqa and its prefill at h > 32) copied a release group
// at a time, so that GatherKeys<bf16>'s rows (four lanes per row, 32 bytes each of a panel row, source.cuh) feed the
// seesaw kernel's schedule (one full barrier per V half, the rope of Q in registers, precomputed descriptors).
// Each lane's copies of a group's panels complete on the group's barrier by one
// cp.async.mbarrier.arrive (it fires when this lane's earlier copies have landed): one arrival per lane and phase
// whatever the panel count, as full_arrivals(1, ...) counts (the rope's barrier also gets the mask arrivals of
// GatherKeys' begin()). Rows not loaded are zero-filled by the copies. Registers: GatherKeys' 56 / 224.
template <class Rows = IndexedRows>
struct GroupRows : GatherKeys<CacheFormat::bf16, Rows> {
  using Base = GatherKeys<CacheFormat::bf16, Rows>;
  static constexpr bool kGroupwise = true;  // produce_seesaw: one group() per release group
  static constexpr bool kFetchAhead = true;  // produce_seesaw: the stage's next tile's index entry loaded ahead
  static constexpr bool kRunningMax = true;  // seesaw/base.cuh kLazy: the lazy maximum's code cost more than it saved

  struct Tile : Base::Tile {
    using BT = typename Base::Tile;
    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_, int32_t idx)
        : BT(p, u, k0, part_, lane_, idx) {}
    // Release group `first` .. first + N - 1 into the tile at dst (kGroupFull: one arrival on full[first]).
    template <int N, bool kGroupFull = false>
    __device__ void group(const DecodeSm90Params& p, uint8_t* dst, uint64_t* full, int first) const {
      if constexpr (kGroupFull) {  // the group's panels at once (one source pointer per row for all of them)
        this->template copy_rows<N>(p.gather.cache, dst + first * Traits::kPanelBytes, first * 128);
        ptx::cp_async_arrive_mbarrier(&full[first]);
      } else {
#pragma unroll 1
        for (int k = 0; k < N; ++k) {
          this->copy_rows(p.gather.cache, dst + (first + k) * Traits::kPanelBytes, (first + k) * 128);
          ptx::cp_async_arrive_mbarrier(&full[first + k]);
        }
      }
    }
  };
};

}  // namespace mla::cuda::decode_sm90
