// SPDX-License-Identifier: Apache-2.0
#pragma once
// sm90 mqa_decode and sparse_mqa for more than 32 query rows: 64-row tiles (h 64 at s_q 1 = one tile, h 128 =
// two; bf16 mqa_decode at 9..32 rows on one padded tile where core/decode_regime.h says so), the "seesaw"
// schedule (FlashMLA's Hopper decode design, written here from its published description): the output
// O [64 x 512] fp32 is too large for one warpgroup's registers next to S, so it is split by columns, O_L = columns 0..255 in consumer 0, O_R = 256..511 in consumer 1, and the two consumers take
// alternate KV tiles for S, so that one warpgroup's softmax runs while the other's products keep the
// tensor cores busy. Per pair of tiles (K0 owned by consumer 0, K1 by consumer 1; V = K's first 512
// columns, V0L / V0R its halves), with m the running row max (the same in both warpgroups):
//
//   [0] S0 = Q K0^T; m0 = max(m, rowmax S0); a0 = 2^(m - m0); P0 = 2^(S0 - m0); O_L = a0 O_L + P0 V0L
//   [1] S1 = Q K1^T; m1 = max(m0, rowmax S1); a1 = 2^(m0 - m1); P1 = 2^(S1 - m1)
//       O_R = a0 a1 O_R + P1 V1R                                     (P1 from registers: wgmma rs)
//   [0] P0 <- a1 P0 to smem;  [1] O_R += P0 V0R                      (P0 from smem: wgmma ss)
//   [1] P1 to smem;           [0] O_L = a1 O_L + P1 V1L;  m = m1
// Row sums: consumer 0 keeps l0 = a1 (a0 l0 + sum P0), consumer 1 l1 = a0 a1 l1 + sum P1; l = l0 + l1.
// Both halves are then relative to the same max. An odd last tile has no K1: m1 = m0, a1 = 1, no P1.
//
// Warp roles (384 threads, __launch_bounds__(384, 1)): warpgroup 0 = producers (40 registers), warp s
// streams the tiles of stage s (tiles s, s + 2, ...: those of consumer s); warpgroups 1 and 2 =
// consumers 0 and 1 (232 registers: O half 128, S 32, P fragments 16, rope part of Q 16).
//
// Pipeline: 2 stages, one per consumer, each nine 64-column panels. A stage's panels are released in
// three groups as soon as no one reads them any more (empty barriers, one warpgroup arrives): panel 8
// (rope: only the owner's S), the owner's V half (its S and its local P V) and the other V half (the owner's S and the other
// consumer's remote P V). The producer loads the groups in that order and the owner's S walks the
// panels in the same order (8, own half, other half), so the next tile streams in while the current
// one is still being read. Keys that were not loaded (past the split, pages outside the cache, rows
// past seq_len in the last page) are zero-filled by the owner before any wgmma reads the tile.
//
// The order of these steps (SeesawConsumer below; the math above is the same in any order) is FlashMLA's:
// consumer 0's remote P V of a pair runs behind the S of its next tile. Per unit and tile:
//   - the rope part of Q is loaded into registers once per unit (16 per consumer thread; ptxas fits them
//     at the 232 consumer registers, 0 spills);
//   - consumer 0 issues rope S and the previous pair's remote P V as two groups and retires them together
//     (wait_group 0), releases stage 1's other half, and only then issues the own and other halves' S (their
//     wait for the own half's refill must not delay that release); consumer 1 issues its S only after that
//     release, so that its products stay out of the tensor pipe while the remote product runs;
//   - a V half's four panels complete on ONE full barrier (full[s][4h], the group's first panel; the
//     producer announces the four panels' bytes there in one arrive.expect_tx: produce_seesaw),
//     so an S waits three times (rope, own half, other half) and a remote product once (full[s][4h + 1..3]
//     are initialised and never used); the price: S starts on a V half only when all its four panels landed.
//     Exception: PagedPanelKeys' stage 1 completes each panel on its own barrier (seesaw/base.cuh kPanelFull);
//   - wgmma descriptors are base4 (the shared address of smem >> 4, once) + compile-time offsets.
// The hand-over protocol: per stage s and tile t = s + 2i, phase
// parity i & 1 on full[s][8] (rope panel + key mask), full[s][4s] (owner's half), full[s][4(1 - s)] (other
// half); empty[s][0] released by the owner after its S (mask read), empty[s][1] by the owner after its
// local P V retired, empty[s][2] by the other consumer after its remote P V retired; the producer waits
// empty[s][g] with parity (i & 1) ^ 1 before refilling group g. Between the consumers, per pair j: kBarM0
// (C0 -> C1: m0 in smem), kBarM1 (C1 -> C0: m1), kBarP1 (C1 -> C0: P1 in smem), kBarP0 (C0 -> C1: a1 P0 in
// smem), kBarRemote (C1 -> C0: C1's remote P0 V0R issued, so that stage 0's other half is freed before C0's
// next S needs it); C0 syncs kBarP1 and kBarRemote of pair j - 1 at the top of pair j (after issuing its
// rope product) and those of the last full pair after its loop. P0 is rewritten (pair j + 1) only after C0
// synced kBarM1 of pair j + 1, which C1 arrives after its remote P0 V0R of pair j retired; P1 likewise only
// after C1 synced kBarM0 of pair j + 1, which C0 arrives after its remote P1 V1L of pair j retired
// (the wait for rope and remote in pair j + 1 precedes mask_max / publish_m0).
//
// Consumer hand-overs through named barriers (one warpgroup arrives, the other syncs; 256 threads):
//   kBarM0 (m0 published), kBarM1 (m1), kBarP0 / kBarP1 (P in smem), kBarRemote (consumer 1's remote P V
//   issued). Arrivals and syncs are matched one to one (no arrival is left pending at exit).
//
// SeesawTraits (the plan below) and SeesawBase (the consumers' shared state and steps) are in seesaw/base.cuh.
//
// Shared memory (SeesawTraits): Q without rope 64 KiB (8 panels; the rope panel lives in registers as
// the A operand of a register-sourced wgmma) + 2 KV stages x 72 KiB + P0, P1 2 x 8 KiB + maxes, sums,
// masks and 24 barriers < 1 KiB = 226.2 KiB, + 1 KiB alignment slack, of the 227 KiB.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/seesaw/source_cross.cuh"
#include "cuda/attention/sm90/seesaw/source_inplace.cuh"
#include "cuda/attention/sm90/seesaw/base.cuh"

namespace mla::cuda::decode_sm90 {

// Producer warp w of stage s = w % 2 (paged: warps 0, 1; gathered: warps 0..3, part w / 2 of each tile):
// the tiles s, s + 2, ... of the unit into stage s, one release group at a time. A V-half group's four
// panels complete on one full barrier, that of the group's first panel (full[4h]): one arrival per phase whatever
// the panel count (TMA, or InplaceKeys' one arrival per lane after the group's conversion); PagedPanelKeys' stage 1
// completes each panel on its own (kPanelFull). GroupwiseSource (InplaceKeys): the source's
// group<N>() copies and converts a whole release group after its empty wait (source_inplace.cuh).
template <class Src>
__device__ __forceinline__ void produce_seesaw(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                               uint8_t* smem, int warp, int lane) {
  using T = Traits;
  using L = SeesawTraits;
  if (warp >= 2 * Src::kWarpsPerStage) return;
  const int s = warp & 1, part = warp >> 1;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar) + s * T::kPanels;
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kOffBar) + L::kFullBarriers + s * L::kGroups;
  uint64_t* mask = reinterpret_cast<uint64_t*>(smem + L::kOffMask) + s;
  uint8_t* dst = smem + L::kOffK + s * T::kTileBytes;
  // kFetchAhead (GroupRows): this lane's index entry of the stage's next tile is loaded while the current one is
  // produced, so its latency (an L2 hit: the line was prefetched) is not paid between a release and the refill
  // (ncu of the sparse prefill: the use of a just-loaded index was the producer's first stall site).
  constexpr bool kAhead = IndexAheadSource<Src>;
  [[maybe_unused]] int32_t ahead = 0;
  if constexpr (kAhead)
    if (s < u.n_tiles) ahead = Src::Tile::fetch(p, u, u.key_begin + s * T::kBlockN, part, lane);
  for (int t = s; t < u.n_tiles; t += 2) {
    const uint32_t parity = (t / 2) & 1;
    const int k0 = u.key_begin + t * T::kBlockN;
    auto make_tile = [&] {
      if constexpr (kAhead) {
        const int32_t idx = ahead;
        ahead = Src::Tile::fetch(p, u, k0 + 2 * T::kBlockN, part, lane);  // past the unit: kNoRow, nothing read
        return typename Src::Tile(p, u, k0, part, lane, idx);
      } else {
        return typename Src::Tile(p, u, k0, part, lane);
      }
    };
    const typename Src::Tile tl = make_tile();
    tl.preload(p, 8);  // Tile::preload (source.cuh): register loads before the wait; nothing in the seesaw's sources
    // Group 0: the rope panel (and the key mask, read by the owner after this panel's barrier).
    [[maybe_unused]] int tslot = trace_prod_slot(s, part, 0, t);  // trace build: this group's stamps
    wait_empty<Src>(&empty[0], parity ^ 1);
    MLA_DECODE_TRACE_PROD(tslot, 0);
    if constexpr (GroupwiseSource<Src>) MLA_DECODE_TRACE_SLOT(tl, tslot);
    tl.begin(mask, &full[8]);
    tl.announce(p, &full[8], 1);
    __syncwarp();
    if constexpr (GroupwiseSource<Src>) tl.template group<1>(p, dst, full, 8);
    else tl.panel(p, map, dst, &full[8], 8, half_panel(s));
    MLA_DECODE_TRACE_PROD(tslot, 2);
    // Groups 1 and 2: the owner's V half, then the other half.
#pragma unroll 1
    for (int g = 1; g <= 2; ++g) {
      const int first = half_panel(g == 1 ? s : 1 - s);
      tl.prefetch_group(p, first);  // code formats: the half's codes into registers (they need no free stage)
      wait_empty<Src>(&empty[g], parity ^ 1);
      tslot = trace_prod_slot(s, part, g, t);
      MLA_DECODE_TRACE_PROD(tslot, 0);
      if constexpr (GroupwiseSource<Src>) MLA_DECODE_TRACE_SLOT(tl, tslot);
      // PagedPanelKeys' stage 1: a barrier per panel (seesaw/base.cuh panel_barriers).
      const bool group_full = !(kPanelFull<Src> && s == 1);
      if (group_full) tl.announce(p, &full[first], 4);
      else
        for (int c = first; c < first + 4; ++c) tl.announce(p, &full[c], 1);
      __syncwarp();
      if constexpr (GroupwiseSource<Src>) {  // InplaceKeys (source_inplace.cuh): the four panels at once
        tl.template group<4, true>(p, dst, full, first);
      } else {
#pragma unroll 1
        for (int c = first; c < first + 4; ++c)
          tl.panel(p, map, dst, &full[group_full ? first : c], c,
                   c + 1 < first + 4 ? c + 1 : g == 1 ? half_panel(1 - s) : -1);
      }
      MLA_DECODE_TRACE_PROD(tslot, 2);
    }
  }
}

// The consumers' schedule (FlashMLA's order of the seesaw steps, with the per-tile overheads taken out: the file
// comment). Per pair j (C0: tile 2j, C1: 2j + 1):
//   C0: S rope part | remote P1 V1L of pair j - 1 | retire both (other half of stage 1 free) | S own half, other
//       half | mask, max, publish m0 | P0, O_L *= a0, local P0 V0L | (kP0Early: m1 -> a1, a1 P0 to smem) | retire
//       (own half of stage 0 free) | (else: m1 -> a1, a1 P0 to smem) | O_L *= a1.  After the last pair: its remote.
//   C1: (wait for stage 1's other half's release) S | mask, max | m0 -> m1, publish | O_R *= a0 a1, P1 |
//       (kP1First: P1 to smem) local P1 V1R (else P1 to smem after) | remote P0 V0R | retire local (own half of
//       stage 1 free), remote (other half of stage 0 free).
// The S of C0's tile needs the other V half (freed last, by C1's remote product) only after its rope and own-half
// products, so that refill overlaps them. What ptxas needs (each checked with -Xptxas -v): S stays local to a pair
// (an S carried across iterations, or a peeled first pair, spilled); o is never in flight across the loop's back
// edge or a branch (C7514 / C7515: ptxas serialises every wgmma), hence the remote product at the top of the next
// pair and pair 0's stand-in product on zeros; the key mask is re-read from shared memory. Hand-overs: kBarM0,
// kBarM1, kBarP0, kBarP1, and kBarRemote (C1's remote P V is issued before C0's, so that stage 0's other half,
// which C0's next S waits for, is freed first). The P buffers need no "free" barriers: a consumer publishes its
// next max only after its remote product of the pair retired, and the other writes its P only after syncing on
// that max.
template <int C, class Src>
struct SeesawConsumer : SeesawBase<C, Src> {
  using B = SeesawBase<C, Src>;
  using T = Traits;
  using L = SeesawTraits;
  using B::B;
  uint32_t qr[4][4];  // the rope columns of Q as rs A fragments, loaded once per unit (prologue)

  // Consumer 0's S of pair j (tile 2j) with the previous pair's remote product beside it: rope S | remote P1 V1L of
  // pair j - 1 (pair 0: the stand-in on zeros) | retire both, release stage 1's other V half | S over the own and
  // the other half, retired. The rope A fragments stay in registers (qr: ptxas fits them at 232, 0 spills): the
  // rope product is not retired on its own; it runs while this consumer waits for consumer 1's P1 and remote
  // product (no accumulator is touched by anything but wgmma while the groups are open).
  __device__ __forceinline__ void scores0(float (&s)[32], uint32_t par, int j) {
    this->tile_mask(par);
    MLA_DECODE_TRACE_PAIR(C, 1, j);  // rope panel (and mask) landed
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_fence_operand(qr[kk]);
    ptx::wgmma_fence_operand(s);
    this->template issue_s<true, false, false>(s, qr, par);
    if (j > 0) {
      ptx::named_barrier_sync(L::kBarP1, T::kConsumerThreads);
      ptx::named_barrier_sync(L::kBarRemote, T::kConsumerThreads);
    }
    MLA_DECODE_TRACE_PAIR(C, 2, j);  // consumer 1's P1 stored and its remote product issued
    this->issue_remote_pv(par ^ 1, j > 0);
    // The rope and remote products retired before the own half's S is issued: that issue waits for the own
    // half's refill (released by the previous pair's local product), and stage 1's other half, released below,
    // is on the pair's loop (its refill feeds consumer 1's S); waiting for the own half first delayed that
    // release by up to the refill's latency (docs/design/attention_sm90.md "5. The seesaw kernel", consumer
    // order).
    ptx::wgmma_wait_group<0>();
    MLA_DECODE_TRACE_PAIR(C, 3, j);

    if (j > 0) this->release(1, 2);  // stage 1's other V half read
    this->template issue_s<false, true, true>(s, qr, par);  // own, then other half
    ptx::wgmma_wait_group<0>();
    MLA_DECODE_TRACE_PAIR(C, 4, j);  // S complete
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence_operand(this->o);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_fence_operand(qr[kk]);
  }

  // Consumer 0's softmax step: mask and row max of S0, the rope panel released, m0 published (n = m0, a0 = 2^(m -
  // m0)), P0 = 2^(S0 - m0) in s and as rs fragments pa with its row sums, O_L *= a0.
  __device__ __forceinline__ void softmax0(float (&s)[32], uint32_t (&pa)[4][4], int j, int k0, float& n_lo,
                                           float& n_hi, float& a0_lo, float& a0_hi, float& sum_lo, float& sum_hi) {
    float mx_lo, mx_hi;
    // The key mask again from shared memory (registers are scarce while o is in flight); the producer
    // rewrites it only after the rope panel's release below.
    this->mask_max(s, reinterpret_cast<const uint64_t*>(this->smem + L::kOffMask)[0], k0, mx_lo, mx_hi);
    this->release(0, 0);  // rope panel read
    this->publish_m0(mx_lo, mx_hi, n_lo, n_hi, a0_lo, a0_hi);
    MLA_DECODE_TRACE_PAIR(C, 5, j);  // masked, row max, m0 published
    this->exponentiate(s, pa, n_lo, n_hi, sum_lo, sum_hi);
    this->rescale_o(a0_lo, a0_hi);
  }

  // Consumer 0, pair j: scores0 | softmax0 | local P0 V0L | (kP0Early: m1 -> a1, a1 P0 to smem) | retire (own half
  // of stage 0 free) | (else: m1 -> a1, a1 P0 to smem) | O_L *= a1, row sums and max advanced. Its remote product
  // P1 V1L is issued by the next pair (or by mainloop after the last).
  __device__ __forceinline__ void pair0(int j) {
    float s[32];
    uint32_t pa[4][4];
    float sum_lo = 0.0f, sum_hi = 0.0f;
    const int r_lo = this->r_lo, r_hi = this->r_hi;
    const int k0 = this->u.key_begin + (2 * j + C) * T::kBlockN;
    const uint32_t par = j & 1;
    MLA_DECODE_TRACE_PAIR(C, 0, j);
    scores0(s, par, j);
    float n_lo, n_hi, a0_lo, a0_hi;  // m0, a0
    softmax0(s, pa, j, k0, n_lo, n_hi, a0_lo, a0_hi, sum_lo, sum_hi);
    MLA_DECODE_TRACE_PAIR(C, 6, j);  // P0 and O_L a0
    this->local_pv(pa);
    // a1 from consumer 1's max; a1 P0 into smem for consumer 1's remote product. kP0Early (the paged TMA sources):
    // while the local product runs (it reads pa, not s), so that consumer 1's remote P0 V0R, whose retirement
    // releases stage 0's other V half for this consumer's next S, is issued right behind consumer 1's local product
    // rather than after this one's local product retired (a product of ~1400 cycles in the pair trace of dense bf16
    // h 128); the own half's release then waits for m1, its refill being needed only by the next pair's own-half S.
    // Not for the other sources: ptxas spills 8..12 bytes there (224-register consumers, CrossKeys).
    constexpr bool kP0Early = Src::kTma && !CrossoverSource<Src>;
    float m1_lo, m1_hi, a1_lo, a1_hi;
    auto publish_p0 = [&] {
      this->read_m1(n_lo, n_hi, m1_lo, m1_hi, a1_lo, a1_hi);
      MLA_DECODE_TRACE_PAIR(C, 8, j);  // m1 read
      store_p(this->smem + L::kOffP, s, a1_lo, a1_hi, r_lo, r_hi, this->t4);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_arrive(L::kBarP0, T::kConsumerThreads);
    };
    if constexpr (kP0Early) publish_p0();
    this->retire();
    MLA_DECODE_TRACE_PAIR(C, 7, j);  // local P V retired
    this->release(0, 1);  // own V half of stage 0 read
    if constexpr (!kP0Early) publish_p0();
    this->rescale_o(a1_lo, a1_hi);
    this->advance(a0_lo, a0_hi, sum_lo, sum_hi, a1_lo, a1_hi, m1_lo, m1_hi);
    MLA_DECODE_TRACE_PAIR(C, 9, j);
  }

  // Consumer 1, pair j (kHas1: it has a tile, false only for an odd last tile): S (s_product) | softmax step:
  // m0 -> m1 published, O_R *= a0 a1, P1 | (kP1First: P1 to smem) local P1 V1R (else P1 to smem after) | remote
  // P0 V0R | retire local (own half of stage 1 free), remote (other half of stage 0 free).
  template <bool kHas1>
  __device__ __forceinline__ void pair1(int j) {
    float s[32];
    uint32_t pa[4][4];
    float mx_lo = -INFINITY, mx_hi = -INFINITY, sum_lo = 0.0f, sum_hi = 0.0f;
    const int r_lo = this->r_lo, r_hi = this->r_hi;
    const uint32_t par = j & 1;
    MLA_DECODE_TRACE_PAIR(C, 0, j);
    if constexpr (kHas1) this->s_product(s, qr, j, mx_lo, mx_hi);
    MLA_DECODE_TRACE_PAIR(C, 1, j);  // S complete, masked, row max
    float n_lo, n_hi, a_lo, a_hi;  // m1, a0 a1
    this->publish_m1(mx_lo, mx_hi, n_lo, n_hi, a_lo, a_hi);
    MLA_DECODE_TRACE_PAIR(C, 2, j);  // m0 read, m1 published, O_R a0 a1
    if constexpr (kHas1) {
      this->exponentiate(s, pa, n_lo, n_hi, sum_lo, sum_hi);
      auto publish_p1 = [&] {  // P1 for consumer 0's remote product (kBarP1)
        store_p(this->smem + L::kOffP + T::kPanelBytes, s, 1.0f, 1.0f, r_lo, r_hi, this->t4);
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_arrive(L::kBarP1, T::kConsumerThreads);
      };
      // kP1First: P1 goes to smem before the local product is issued (FlashMLA's order), since consumer 0's
      // remote product waits for it and a wgmma issue can stall behind consumer 0's products in the tensor
      // pipe (measured faster on the dense h 128 rows, even elsewhere: docs/LAB.md, the seesaw kernel).
      // Not for the 224-register consumers of InplaceKeys / GroupRows: ptxas spills 4 bytes there.
      constexpr bool kP1First = Src::kTma || CrossoverSource<Src>;
      if constexpr (kP1First) publish_p1();
      this->local_pv(pa);
      if constexpr (!kP1First) publish_p1();
    }
    MLA_DECODE_TRACE_PAIR(C, 3, j);  // P1 stored and local P V issued
    this->advance(a_lo, a_hi, sum_lo, sum_hi, 1.0f, 1.0f, n_lo, n_hi);
    ptx::named_barrier_sync(L::kBarP0, T::kConsumerThreads);
    MLA_DECODE_TRACE_PAIR(C, 4, j);  // consumer 0's a1 P0 stored
    this->issue_remote_pv(par);
    if constexpr (kHas1) {
      ptx::named_barrier_arrive(L::kBarRemote, T::kConsumerThreads);  // consumer 0 issues its remote product now
      ptx::wgmma_wait_group<1>();
      MLA_DECODE_TRACE_PAIR(C, 5, j);  // local P V retired
      this->release(1, 1);  // own V half of stage 1 read (local product retired)
    }
    this->retire();
    MLA_DECODE_TRACE_PAIR(C, 6, j);  // remote P V retired
    this->release(0, 2);  // stage 0's other V half read
  }

  // The rope fragments of Q (the 512 other columns are in shared memory: load_seesaw_q); consumer 0 zeroes P0 and
  // P1 for pair 0's stand-in remote product (issue_remote_pv).
  __device__ __forceinline__ void prologue() {
    this->load_rope(qr);
    if constexpr (C == 0) {
      for (int e = threadIdx.x & 127; e < 2 * T::kPanelBytes / 16; e += 128)
        reinterpret_cast<uint4*>(this->smem + L::kOffP)[e] = make_uint4(0, 0, 0, 0);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(8, 128);
    }
  }

  // The unit's pairs (n_pairs; full_pairs of them with both tiles). Consumer 0's pair does not depend on whether consumer 1 has a tile (its remote product is
  // the next pair's business): one loop, and the last remote product after it. Branches around different wgmma
  // sequences of the same accumulators make ptxas spill: one loop and at most one tail per consumer.
  __device__ __forceinline__ void mainloop(int n_pairs, int full_pairs) {
    if constexpr (C == 0) {
#pragma unroll 1
      for (int j = 0; j < n_pairs; ++j) pair0(j);
      if (n_pairs == full_pairs) {  // the last pair's remote product (an odd last pair issued the previous one)
        ptx::named_barrier_sync(L::kBarP1, T::kConsumerThreads);
        ptx::named_barrier_sync(L::kBarRemote, T::kConsumerThreads);
        this->issue_remote_pv((full_pairs - 1) & 1);
        this->retire();
        this->release(1, 2);
      }
    } else {
#pragma unroll 1
      for (int j = 0; j < full_pairs; ++j) pair1<true>(j);
      if (n_pairs > full_pairs) pair1<false>(full_pairs);
    }
  }

  // l = l0 + l1, O normalised, this consumer's 256 columns written (SeesawBase::finish).
  __device__ __forceinline__ void epilogue() { this->finish(); }

  __device__ __forceinline__ void run() {
    const int n_pairs = (this->u.n_tiles + 1) / 2, full_pairs = this->u.n_tiles / 2;
    prologue();
    mainloop(n_pairs, full_pairs);
    epilogue();
  }
};

// Q columns 0..511 of the unit's 64-row tile into the 8 swizzled Q panels, by both consumer warpgroups, the 16
// loads of each thread in flight together (one global round trip).
__device__ __forceinline__ void load_seesaw_q(const DecodeSm90Params& p, const Unit& u, uint8_t* smem) {
  using T = Traits;
  using L = SeesawTraits;
  const int ct = static_cast<int>(threadIdx.x) - 128;
  load_q_panels_batched<T::kBlockM, T::kConsumerThreads, 16, L::kQPanels>(p.rows, u.g, u.row0, u.m_rows,
                                                                         T::kPanelBytes, smem + L::kOffQ, ct);
}

// p.cluster_merge (cluster_merge.cuh): the merge of the cluster's split partials after the unit, with both
// cluster barriers passed by every thread of the CTA. empty_unit(): before the roles, a unit without keys
// contributes LSE -inf and merges its columns (true: the kernel returns); consumers(): the consumer warpgroups
// after their epilogue; producers(): warpgroup 0 after its loop, only the barriers (it runs at 40 registers).
template <class Src>
struct SeesawMerge {
  __device__ __forceinline__ static bool empty_unit(const DecodeSm90Params& p, const Unit& u, uint8_t* smem) {
    if constexpr (!kClusterMerged<Src>) return false;
    if (!p.cluster_merge || u.n_tiles > 0) return false;
    using L = SeesawTraits;
    if (threadIdx.x < Traits::kBlockM)
      reinterpret_cast<float*>(smem + L::kOffK + ClusterMerge::kPartialLse)[threadIdx.x] = -INFINITY;
    consumers(p, u, smem);
    return true;
  }
  __device__ __forceinline__ static void consumers(const DecodeSm90Params& p, const Unit& u, uint8_t* smem) {
    using L = SeesawTraits;
    if constexpr (kClusterMerged<Src>)
      if (p.cluster_merge)
        cluster_merge_protocol(p, u, smem + L::kOffK, static_cast<int>(threadIdx.x) - 128, Traits::kConsumerThreads);
  }
  __device__ __forceinline__ static void producers(const DecodeSm90Params& p) {
    if constexpr (kClusterMerged<Src>)
      if (p.cluster_merge) cluster_merge_pass();
  }
};

// The seesaw kernel (the "next" in its name is historical; it has one schedule, the file comment's): the rope part
// of Q in registers for the whole unit, one full barrier per V half (one wait per release group) and descriptors
// from a precomputed base (SeesawConsumer). Registers: producers 40 (TMA) or 56, consumers 232 or 224 (source.cuh
// producer_regs; a 24 / 240 split spilled 8 bytes in the producer). Sources: PagedKeys / PagedPanelKeys (TMA),
// InplaceKeys, CrossKeys and GroupRows (generic writes: the consumers' full waits fence the proxy, wait_full).
template <class Src>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_seesaw_kernel(const __grid_constant__ CUtensorMap kv_map, const DecodeSm90Params p) {
  using T = Traits;
  using L = SeesawTraits;
  static_assert((Src::kTma && !Src::kGenericWrites && Src::full_arrivals(4, false) == Src::full_arrivals(1, false)) ||
                    GroupwiseSource<Src>,
                "one full barrier per V half needs one arrival per phase whatever the panel count (TMA: one "
                "arrive.expect_tx; InplaceKeys: one arrival per lane and group)");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();  // the combine (a dependent launch) may take the SMs this grid leaves free
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  const Unit u(p, Src::kIndexed);
  if (SeesawMerge<Src>::empty_unit(p, u, smem)) return;
  if (!start_roles<L, Src>(p, &kv_map, u, true, smem, [&](int warp, int lane) {
        produce_seesaw<Src>(p, &kv_map, u, smem, warp, lane);
      })) {
    SeesawMerge<Src>::producers(p);
    return;
  }
  load_seesaw_q(p, u, smem);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  MLA_DECODE_TRACE_EVENT(3, 128);
  if (ptx::warpgroup_index() == 1) SeesawConsumer<0, Src>(p, u, smem).run();
  else SeesawConsumer<1, Src>(p, u, smem).run();
  if constexpr (CrossoverSource<Src>) ptx::cluster_sync();  // the peer's last releases have arrived here
  SeesawMerge<Src>::consumers(p, u, smem);
  MLA_DECODE_TRACE_EVENT(7, 128);
}

}  // namespace mla::cuda::decode_sm90
