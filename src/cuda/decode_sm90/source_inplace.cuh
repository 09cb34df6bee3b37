#pragma once
// InplaceKeys<F, Rows>: the seesaw kernel's (kernel_seesaw.cuh, 64-row tiles) fp8_ds_mla / fp8 key source
// with the codes expanded in place (docs/SPARSE.md "Next" 2, docs/DECODE.md "In-place expansion").
// GatherKeys<F, Rows> (source.cuh) loads each latent panel's codes into registers and converts them: per
// stage tile and producer warp nine dependent global round trips (eight latent panels + the rope). The
// seesaw kernel has no room for a raw stage (0.8 KiB spare), but each 8 KiB stage panel has room for its
// own raw codes: a key row's 64 codes of panel c (64 bytes) are half of the 128 bytes its bf16 values take.
//
// Protocol (warp roles, tiles, key masks and full-barrier arrival counts are GatherKeys': two producer warps
// per stage, part p = keys 32p .. 32p + 31, lane l = key row r = 32p + l; produce_seesaw calls group<N>()
// once per release group, rope (N 1) then the owner's V half then the other (N 4), each after its empty wait):
//   1. copy: lane l cp.async's the four 16-byte code chunks i = 0..3 of each panel c of the group into the
//      upper half of its OWN output row r of panel c, logical chunks 4 + i (swz(r, 4 + i)); a key that is
//      not loaded (GatherKeys' mask) is zero-filled by the copy, nothing read. One commit group, then
//      cp.async.wait_group 0: one global round trip per release group (four panels at once).
//      fp8_ds_mla: the group's two tile scales (record bytes 512 + 8 h, h = the V half) by one 8-byte load
//      issued behind the copies (0 for a key that is not loaded).
//   2. convert in place, panel by panel, chunk by chunk: raw chunk i is loaded (ld.shared) and becomes the
//      bf16 chunks 2i, 2i + 1; every store lands on chunks 0..3 (free) or on a raw chunk this lane has
//      already loaded (i = 2, 3 overwrite raw chunks 0..3), and a lane touches only its own row, so program
//      order is the only hand-over (no warp barrier). Then fence.proxy.async and the lane's arrival: on
//      each panel's full barrier (serial schedule), or once per group on full[first] (kGroupFull, the next
//      schedule: one arrival per lane and phase, as full_arrivals counts).
//   fp8_ds_mla: values bf16(float(code) * scale) (SEMANTICS 3.3, the pinned upconvert: GatherKeys'
//   e4m3x8_scaled_to_bf16); the rope panel (bf16 bytes 528..655) is cp.async'd into its swizzled place and
//   completes on full[8] by cp.async.mbarrier.arrive (no wait, no conversion). fp8 per-tensor: every
//   panel, the rope's too, as exact codes (source.cuh kExactCodes, e4m3x8_exact_to_bf16: code * 2^-56;
//   the consumers apply scale * 2^56 to S and O).
// Round trips per stage tile and warp: fp8_ds_mla two dependent ones (the V halves; the rope copy overlaps),
// fp8 three, instead of nine. Shared memory: none beyond the stages (the raw codes live in the rows they
// expand into; SeesawTraits' 231,632 bytes unchanged). Registers: producer 40 (setmaxnreg; consumers 232,
// which the next schedule needs): one raw chunk live, the chunk loop not unrolled (unrolled, ptxas kept 12
// chunk addresses live: 20 bytes of spills at 40, 8-24 at 56 with all 16 raw registers loaded first).
// Bank conflicts: none (a quarter warp's 16-byte accesses are eight rows r .. r + 7 at one logical chunk:
// distinct physical chunks under the XOR swizzle).
// Measured (nvidia-h200, 2026-11-23, docs/DECODE.md "In-place expansion"): 0-6% faster on the dense h 128
// rows, 10-24% on sparse h 64, mixed at sparse h 128: not the default (launch_kernels.cuh seesaw_expand).
#include <cstdint>

#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/decode_sm90/pipeline.cuh"
#include "cuda/decode_sm90/source.cuh"
#include "cuda/decode_sm90/trace.cuh"
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
  // setmaxnreg: producers 40, consumers 232 (the next schedule's consumers need 232; ptxas -v 0 spills).
  __host__ __device__ static constexpr int producer_regs(bool) { return 40; }

  struct Tile : Base::Tile {
    using BT = typename Base::Tile;

    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_)
        : BT(p, u, k0, part_, lane_) {}
    __device__ void preload(const DecodeSm90Params&, int) const {}

    // Release group `first` .. first + N - 1 (N 1: the rope panel 8, always the tile's first group; N 4: a
    // V half) of the tile at dst; panel c completes on full[c]. Steps: file comment.
    // kGroupFull (the next schedule, produce_seesaw): a V half's four panels complete on ONE full barrier,
    // full[first]: one arrival per lane after all four are converted (so one arrival per phase, whatever
    // the panel count, as full_arrivals counts it).
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
      } else {
        convert<N, kGroupFull>(dst, full, first, r, ok, src);
      }
    }
    // The copies of the group's panels into their own rows, then their conversion in place (steps 1, 2).
    template <int N, bool kGroupFull>
    __device__ void convert(uint8_t* dst, uint64_t* full, int first, int r, bool ok, const uint8_t* src) const {
      // (a key that is not loaded: src is the cache base, these offsets stay inside its first row; nothing read)
      // Each lane copies its own row: 16 cp.async per V half back to back. copy_warp_rows (four lanes per row,
      // one shuffle per row group and panel) measured 13-14% slower here (h 64, nvidia-h200, 2026-11-24): the
      // shuffles sit on this 40-register producer's critical path, where CrossKeys copies one panel.
      // The zero-fill by the ignore-src predicate (cp_async_16_or_zero): a run-time src-size costs ~5 instructions per
      // copy (ptx/cp_async.cuh).
      const uint8_t* gs = src + 64 * first;
#pragma unroll 1
      for (int k = 0; k < N; ++k) {
        uint8_t* dp = dst + (first + k) * Traits::kPanelBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) ptx::cp_async_16_or_zero(dp + swz(r, 4 + i), gs + 64 * k + 16 * i, !ok);
      }
      ptx::cp_async_commit();
      // fp8_ds_mla: the scales of the group's panels (2j, 2j + 1 share scale j; first is 0 or 4: a V half),
      // one 8-byte load in flight with the copies; 0 for a key that is not loaded.
      float2 sc = make_float2(0.0f, 0.0f);
      if constexpr (kDs)
        if (ok) sc = __ldg(reinterpret_cast<const float2*>(src + Base::kScaleOffset) + first / 4);
      ptx::cp_async_wait<0>();
      MLA_DECODE_TRACE_PROD(this->trace_slot, 1);
#pragma unroll 1
      for (int k = 0; k < N; ++k) {
        uint8_t* dp = dst + (first + k) * Traits::kPanelBytes;
        const float scale = k < 2 ? sc.x : sc.y;
        // raw chunk i (logical chunk 4 + i) becomes chunks 2i, 2i + 1: each write lands on a raw chunk this
        // lane has already read (i = 2, 3 overwrite raw chunks 0..3), so one raw chunk is live at a time.
        // Not unrolled: the chunk addresses are recomputed (unrolled, ptxas keeps 12 of them live and the
        // 40-register producer spills).
#pragma unroll 1
        for (int i = 0; i < 4; ++i) {
          const uint4 raw = *reinterpret_cast<const uint4*>(dp + swz(r, 4 + i));
          uint4 lo, hi;
          expand_chunk<Base::kExactCodes>(raw, scale, lo, hi);
          *reinterpret_cast<uint4*>(dp + swz(r, 2 * i)) = lo;
          *reinterpret_cast<uint4*>(dp + swz(r, 2 * i + 1)) = hi;
        }
        if constexpr (!kGroupFull) {
          ptx::fence_proxy_async_smem();
          ptx::mbar_arrive(&full[first + k]);
        }
      }
      if constexpr (kGroupFull) {
        ptx::fence_proxy_async_smem();
        ptx::mbar_arrive(&full[first]);
      }
    }
  };
};

// GroupRows<Rows>: bf16 rows through the index list (sparse_mqa and its prefill at h > 32) copied a release group
// at a time, so that GatherKeys<bf16>'s rows (four lanes per row, 32 bytes each of a panel row, source.cuh) run the
// next schedule (one full barrier per V half, the rope of Q in registers, precomputed descriptors) instead of
// the serial one. Each lane's copies of a group's panels complete on the group's barrier by one
// cp.async.mbarrier.arrive (it fires when this lane's earlier copies have landed): one arrival per lane and phase
// whatever the panel count, as full_arrivals(1, ...) counts (the rope's barrier also gets the mask arrivals of
// GatherKeys' begin()). Rows not loaded are zero-filled by the copies. Registers: GatherKeys' 56 / 224.
template <class Rows = IndexedRows>
struct GroupRows : GatherKeys<CacheFormat::bf16, Rows> {
  using Base = GatherKeys<CacheFormat::bf16, Rows>;
  static constexpr bool kGroupwise = true;  // produce_seesaw: one group() per release group
  static constexpr bool kFetchAhead = true;  // produce_seesaw: the stage's next tile's index entry loaded ahead

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
