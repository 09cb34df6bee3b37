// SPDX-License-Identifier: Apache-2.0
#pragma once
// CrossKeys<F, Rows>: the seesaw kernel's fp8_ds_mla / fp8 key source for requests of two 64-row tiles
// (h 128 at s_q 1, any even m_tiles) with the expansion shared by the two row-tile CTAs of a request: the
// "crossover" of FlashMLA's Hopper fp8 decode (its published description: each of the two CTAs that
// attend the same keys dequantises half of every K/V tile and writes it into both CTAs' shared memory
// through the cluster). Without it both CTAs expand the same tile (InplaceKeys, source_inplace.cuh), and
// the expansion by the producer warps bounds the kernel (measured under ncu: no pipe busy, half of the stall
// cycles on shared-memory loads of the producers' convert loop; docs/design/attention_sm90.md "6. The seesaw's
// key sources").
//
// Launch: clusters of two CTAs along x (launch_cluster), i.e. row tiles 2k and 2k + 1 of one (split,
// request) of the uniform schedule (Unit: the row tile is blockIdx.x's fastest index), so both CTAs see
// the same keys, the same loaded-key masks and the same tile count; cluster rank = row tile parity.
// Protocol (InplaceKeys' otherwise; produce_seesaw's V halves with kGroupFull):
//   - rope group (panel 8, and the key mask): as InplaceKeys, each CTA for all 64 rows itself (fp8_ds_mla:
//     cp.async of the bf16 rope; fp8: exact codes expanded in place); nothing crosses the cluster;
//   - a V-half group (4 panels): CTA rank k expands key rows 32k .. 32k + 31 only, for both CTAs; of a
//     stage's two producer warps, part p takes panels first + 2p, first + 2p + 1 (lane = row 32k + lane):
//     lane 0 first announces on full[first] the 8 KiB the peer's counterpart warp will send; the raw codes
//     (both panels loaded into registers before the half's empty wait, with the scale; fp8_ds_mla: both
//     panels share scale (first + 2p) / 2) expanded into its rows panel by panel, each
//     panel followed by the proxy fence and lane 0's bulk copy of the warp's 32-row block of it (4 KiB: the
//     rows of a panel are contiguous under the row-wise swizzle) into the same place in the peer,
//     completing on the peer's full[first] (async proxy, as TMA); then every lane arrives on full[first]
//     here. full[first] thus completes when this
//     CTA's 64 lanes have arrived and the peer's 16 KiB have landed; the consumers wait on it with acquire
//     at cluster scope (wait_full).
//   - releases: a consumer's release of a V-half group (empty[1], empty[2]) is one arrival per thread
//     here, as for InplaceKeys, plus one cluster-scope arrival per warp (lane 0, after __syncwarp) on the peer's
//     same barrier: the peer's producer writes into this CTA's stage too (kPeerReleases = 4 per group);
//     the producer waits its empty barriers with acquire at cluster scope (wait_empty).
//   - cluster_sync after the barriers' initialisation (before any remote access) and before any thread of
//     either CTA exits (a peer's last releases arrive on this CTA's barriers): start_roles and the kernel.
// Work per CTA and tile: half the expansion (32 rows x 8 panels) and half the raw reads; per producer
// warp and group 2 panels, not 4 (the critical path from a group's release to its last arrival).
// DSMEM traffic: 32 KiB per tile each way, by 4 bulk copies per warp and tile. Registers: producers 56, 0 spills
// (ptxas -v; the cluster rank is re-read where needed).
#include <cstdint>

#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/attention/sm90/seesaw/source_inplace.cuh"

namespace mla::cuda::decode_sm90 {

// Each producer warp loads its whole share of a V half (its two panels of its 32 rows: 128 code bytes per lane, 32
// registers, and the rows' tile scale) into registers before that half's empty wait, so that after the release no
// global round trip is left on the path, only the expansion and the copies into both CTAs (as FlashMLA's Hopper
// fp8 kernels load the codes into registers, never into shared memory). Producers take 56 registers (consumers
// 224).
template <CacheFormat F, class Rows = IndexedRows>
struct CrossKeys : InplaceKeys<F, Rows> {
  using Base = InplaceKeys<F, Rows>;
  using G = GatherKeys<F, Rows>;
  static constexpr bool kCrossover = true;
  static constexpr int kClusterSize = 2;
  static constexpr int kPeerReleases = 4;  // per V-half group and phase: lane 0 of each peer consumer warp
  __host__ __device__ static constexpr int producer_regs(bool) { return 56; }
  // Arrivals per phase: InplaceKeys' (every lane of the stage's two producer warps here; a V half's barrier
  // also counts the peer's bulk copies as transaction bytes, source comment).

  struct Tile : Base::Tile {
    using BT = typename Base::Tile;
    // Byte offset of the row this lane expands for both CTAs (key k0 + 32 rank + lane, rank = this CTA's
    // cluster rank), -1 when it is not loaded. (The rank is re-read where needed: the 40-register producer
    // spills with it held.)
    int64_t xoff;

    __device__ Tile(const DecodeSm90Params& p, const Unit& u, int k0, int part_, int lane_)
        : BT(p, u, k0, part_, lane_) {
      const int rank = static_cast<int>(ptx::cluster_ctarank());
      if (this->part == rank) xoff = (this->mask32 >> this->lane) & 1 ? this->off[0] : -1;
      else xoff = row_offset_or_none<Rows>(p, u, k0 + 32 * rank + this->lane);
    }

    template <int N, bool kGroupFull = false>
    __device__ void group(const DecodeSm90Params& p, uint8_t* dst, uint64_t* full, int first) const {
      if constexpr (N == 1) {
        BT::template group<1, kGroupFull>(p, dst, full, first);  // the rope panel: each CTA its own
      } else {
        static_assert(N == 4 && kGroupFull, "crossover: a V half completes on one full barrier (kGroupFull)");
        cross(p, dst, full, first);
      }
    }

    // The codes of panels c0, c0 + 1 (c0 = first + 2 part) of this lane's row (pre, pre1) and their
    // tile scale (pre_scale), issued before the empty wait of the V half starting at panel `first`
    // (produce_seesaw); zeros for a key that is not loaded (nothing read).
    __device__ void prefetch_group(const DecodeSm90Params& p, int first) const {
      const int c0 = first + 2 * this->part;
#pragma unroll
      for (int i = 0; i < 4; ++i) this->pre[i] = this->pre1[i] = make_uint4(0, 0, 0, 0);
      this->pre_scale = 0.0f;
      if (xoff >= 0) {
        const uint8_t* src = p.gather.cache + xoff + 64 * c0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          this->pre[i] = __ldg(reinterpret_cast<const uint4*>(src + 16 * i));
          this->pre1[i] = __ldg(reinterpret_cast<const uint4*>(src + 64 + 16 * i));
        }
        if constexpr (Base::kDs) this->pre_scale = __ldg(reinterpret_cast<const float*>(src - 64 * c0 + G::kScaleOffset) + c0 / 2);
      }
    }

    // Panels c0, c0 + 1 (c0 = first + 2 part) of key rows 32 rank .. + 31 (lane l: row r = 32 rank + l):
    // expanded from the prefetched codes, then the warp's two 4 KiB row blocks bulk-
    // copied into the peer (completing on its full[first]); one arrival per lane on full[first] here, whose
    // phase also waits for the peer's two blocks (announced first: the barrier is already in this tile's phase,
    // its previous one completed before the empty wait that let this group start).
    __device__ void cross(const DecodeSm90Params& p, uint8_t* dst, uint64_t* full, int first) const {
      constexpr uint32_t kBlock = 32 * 128;  // 32 rows of one panel: contiguous under the row-wise swizzle
      const uint32_t peer = ptx::cluster_ctarank() ^ 1u;
      const int c0 = first + 2 * this->part;
      const int r = 32 * static_cast<int>(peer ^ 1u) + this->lane;
      if (this->lane == 0) ptx::mbar_expect_tx(&full[first], 2 * kBlock);  // the peer's counterpart warp's
      // Panel c0 + k's 32 rows into the peer (async proxy: after the proxy fence of every lane's stores).
      auto send = [&](int k) {
        ptx::fence_proxy_async_smem();
        __syncwarp();
        if (this->lane == 0) {
          const uint32_t block = ptx::smem_addr(dst + (c0 + k) * Traits::kPanelBytes + (r - this->lane) * 128);
          ptx::bulk_copy_to_peer(ptx::map_peer(block, peer), block, kBlock,
                                 ptx::map_peer(ptx::smem_addr(&full[first]), peer));
        }
      };
      // The codes are in registers (prefetch_group): expand, store, send, per panel.
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        BT::expand_row(dst + (c0 + k) * Traits::kPanelBytes, r, k == 0 ? this->pre : this->pre1, this->pre_scale);
        send(k);
      }
      ptx::mbar_arrive(&full[first]);
    }
  };
};

}  // namespace mla::cuda::decode_sm90
