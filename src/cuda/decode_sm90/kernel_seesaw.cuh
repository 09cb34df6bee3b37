#pragma once
// sm90 mqa_decode for more than 32 query rows: 64-row tiles (h 64 at s_q 1 = one tile, h 128 = two), the
// "seesaw" schedule (FlashMLA's Hopper decode design, written here from its published description): the
// output O [64 x 512] fp32 is too large for one warpgroup's registers next to S, so it is split by
// columns, O_L = columns 0..255 in consumer 0, O_R = 256..511 in consumer 1, and the two consumers take
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
// Pipeline: 2 stages, one per consumer. A stage's nine 64-column panels each have their own `full`
// mbarrier, so S starts on the first panel to land; they are released in three groups as soon as no
// one reads them any more (empty barriers, one warpgroup arrives): panel 8 (rope: only the owner's S),
// the owner's V half (its S and its local P V) and the other V half (the owner's S and the other
// consumer's remote P V). The producer loads the groups in that order and the owner's S walks the
// panels in the same order (8, own half, other half), so the next tile streams in while the current
// one is still being read. Keys that were not loaded (past the split, pages outside the cache, rows
// past seq_len in the last page) are zero-filled by the owner before any wgmma reads the tile.
//
// Consumer hand-overs through named barriers (one warpgroup arrives, the other syncs; 256 threads):
//   kBarM0 (m0 published), kBarM1 (m1), kBarP0 / kBarP1 (P in smem), kBarP0Free / kBarP1Free (the
//   other consumer's remote P V retired: the P buffer may be rewritten). Arrivals and syncs are matched
//   one to one (no arrival is left pending at exit).
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
#include "cuda/decode_sm90/tile_io.cuh"
#include "cuda/decode_sm90/pipeline.cuh"
#include "cuda/decode_sm90/source.cuh"

namespace mla::cuda::decode_sm90 {

struct SeesawTraits {
  using T = Traits;
  static constexpr int kStages = 2;  // stage s: the tiles of consumer s
  static constexpr int kQPanels = 8;  // Q columns 0..511 in smem; 512..575 (rope) in registers
  static constexpr int kGroups = 3;   // release groups of a stage: rope panel, owner's V half, other V half
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kQPanels * T::kPanelBytes;           // 65,536
  static constexpr int kOffP = kOffK + kStages * T::kTileBytes;     // P_c [64 rows][64 keys] bf16, 8 KiB each
  static constexpr int kOffM = kOffP + 2 * T::kPanelBytes;          // [2 consumers][64] fp32 published maxes
  static constexpr int kOffL = kOffM + 2 * T::kBlockM * 4;          // [2 consumers][64] fp32 row sums
  static constexpr int kOffMask = kOffL + 2 * T::kBlockM * 4;       // [kStages] u64 loaded keys
  static constexpr int kOffBar = kOffMask + kStages * 8;            // full[kStages][9], empty[kStages][3]
  static constexpr int kFullBarriers = kStages * T::kPanels;
  static constexpr int kEmptyBarriers = kStages * kGroups;
  static constexpr int kEmptyArrivals = 128;                        // one warpgroup releases a group
  static constexpr bool kSeesaw = true;  // register split key (source.cuh producer_regs)
  static constexpr int kPanelsPerFull = 1;                          // full[s][c]: panel c of stage s
  __host__ __device__ static constexpr bool mask_barrier(int i) { return i % T::kPanels == T::kPanels - 1; }
  static constexpr int kSmemBytes = kOffBar + (kFullBarriers + kEmptyBarriers) * 8 + 1024;
  static_assert(kOffK % 1024 == 0 && kOffP % 1024 == 0, "swizzled tiles are 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

  // Named barriers (1 is kConsumerBarrier); 8 + c: consumer c alone (128 threads).
  static constexpr int kBarM0 = 2, kBarM1 = 3, kBarP0 = 4, kBarP1 = 5, kBarP0Free = 6, kBarP1Free = 7;
};

// First panel of V half `h` (columns 256h..256h+255) and the panel order of the owner's S for stage s.
__device__ __forceinline__ int half_panel(int h) { return 4 * h; }

// Producer warp w of stage s = w % 2 (paged: warps 0, 1; gathered: warps 0..3, part w / 2 of each tile):
// the tiles s, s + 2, ... of the unit into stage s, one release group at a time.
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
  for (int t = s; t < u.n_tiles; t += 2) {
    const uint32_t parity = (t / 2) & 1;
    const int k0 = u.key_begin + t * T::kBlockN;
    const typename Src::Tile tl(p, u, k0, part, lane);
    tl.preload(p, 8);  // register-path sources: panel 8's loads before the wait (source.cuh)
    // Group 0: the rope panel (and the key mask, read by the owner after this panel's barrier).
    ptx::mbar_wait(&empty[0], parity ^ 1);
    tl.begin(mask, &full[8]);
    tl.announce(p, &full[8], 1);
    __syncwarp();
    tl.panel(p, map, dst, &full[8], 8, half_panel(s));
    // Groups 1 and 2: the owner's V half, then the other half.
#pragma unroll 1
    for (int g = 1; g <= 2; ++g) {
      const int first = half_panel(g == 1 ? s : 1 - s);
      ptx::mbar_wait(&empty[g], parity ^ 1);
      for (int c = first; c < first + 4; ++c) tl.announce(p, &full[c], 1);
      __syncwarp();
#pragma unroll 1
      for (int c = first; c < first + 4; ++c)
        tl.panel(p, map, dst, &full[c], c, c + 1 < first + 4 ? c + 1 : g == 1 ? half_panel(1 - s) : -1);
    }
  }
}

// One consumer warpgroup (C = 0: O_L, owner of stage 0; C = 1: O_R, owner of stage 1). Written per
// consumer and per pair kind (both tiles present or only K0) so that every wgmma sequence is straight-line
// code: accumulators merged across branches (phi nodes) make ptxas copy or spill them.
template <int C, class Src>
struct SeesawConsumer {
  using T = Traits;
  using L = SeesawTraits;
  const DecodeSm90Params& p;
  const Unit& u;
  uint8_t* smem;
  int w, t4, r_lo, r_hi, lim_lo, lim_hi;
  const uint16_t *q_lo, *q_hi;  // rope columns (576 - 64 ..) of this thread's query rows; nullptr past the rows
  bool q_pairs;                 // 4-byte loads of column pairs are aligned
  float o[T::kDvHalf / 2];
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  __device__ __forceinline__ SeesawConsumer(const DecodeSm90Params& p_, const Unit& u_, uint8_t* smem_)
      : p(p_), u(u_), smem(smem_) {
    w = ptx::warp_idx_in_warpgroup();
    const int lane = threadIdx.x & 31;
    t4 = lane & 3;
    r_lo = 16 * w + (lane >> 2);
    r_hi = r_lo + 8;
    lim_lo = limit_of(r_lo);
    lim_hi = limit_of(r_hi);
    q_lo = rope_row(r_lo);
    q_hi = rope_row(r_hi);
    q_pairs = p.rows.q_vec16;
#pragma unroll
    for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  }
  __device__ __forceinline__ int limit_of(int r) const {  // largest visible key of tile row r, -1 for none
    const int row = u.row0 + r;
    if (row >= u.m_rows) return -1;
    const int lim = p.causal ? u.seq_len - p.rows.s_q + row / p.rows.h_q : u.seq_len - 1;
    return lim < -1 ? -1 : lim;
  }
  __device__ __forceinline__ const uint16_t* rope_row(int r) const {
    const int row = u.row0 + r;
    if (row >= u.m_rows) return nullptr;
    const MqaRowParams& rp = p.rows;
    return static_cast<const uint16_t*>(rp.q) + u.g * rp.q_stride_g + (row / rp.h_q) * rp.q_stride_i +
           (row % rp.h_q) * rp.q_stride_h + (T::kDqk - 64);  // bf16 q (supports() admits no other)
  }
  __device__ __forceinline__ uint64_t* full(int stage) const {
    return reinterpret_cast<uint64_t*>(smem + L::kOffBar) + stage * T::kPanels;
  }
  __device__ __forceinline__ uint64_t* empty(int stage) const {
    return reinterpret_cast<uint64_t*>(smem + L::kOffBar) + L::kFullBarriers + stage * L::kGroups;
  }
  __device__ __forceinline__ uint8_t* stage_tile(int stage) const { return smem + L::kOffK + stage * T::kTileBytes; }
  __device__ __forceinline__ float* sM() const { return reinterpret_cast<float*>(smem + L::kOffM); }
  static __device__ __forceinline__ float factor(float from, float to) {
    return to == -INFINITY ? 1.0f : softmax::exp2_approx(from - to);
  }
  __device__ __forceinline__ void scale_o(float f_lo, float f_hi) {
#pragma unroll
    for (int jj = 0; jj < T::kDvHalf / 8; ++jj) {
      o[4 * jj] *= f_lo;
      o[4 * jj + 1] *= f_lo;
      o[4 * jj + 2] *= f_hi;
      o[4 * jj + 3] *= f_hi;
    }
  }

  // S = Q K^T of this consumer's tile of pair j (keys k0..k0+63) in the log2 domain, masked; row maxes.
  __device__ __forceinline__ void s_product(float (&s)[32], int j, float& mx_lo, float& mx_hi) {
    const uint32_t parity = j & 1;
    const int k0 = u.key_begin + (2 * j + C) * T::kBlockN;
    uint8_t* sK = stage_tile(C);
    uint64_t* fb = full(C);
    // The rope columns as rs A fragments, re-read (L1 / L2 hits) per tile: registers are the scarce resource.
    uint32_t qr[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint16_t* row = (e & 1) ? q_hi : q_lo;
        const int col = 16 * kk + 8 * (e >> 1) + 2 * t4;
        qr[kk][e] = row == nullptr ? 0u
                    : q_pairs   ? *reinterpret_cast<const uint32_t*>(row + col)
                                : row[col] | uint32_t(row[col + 1]) << 16;
      }
    const MqaRowParams& rp = p.rows;
    const float sl2 = rp.scale_log2 * code_scale<Src>(p);  // exact-code sources: S times scale * 2^56
    wait_full<Src>(&fb[8], parity);
    const uint64_t mask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask)[C];
    if (!Src::kZeroFilled && mask != ~uint64_t(0)) {  // keys not loaded: zero them in every panel first
      for (int pc = 0; pc < T::kPanels; ++pc) ptx::mbar_wait(&fb[pc], parity);
      zero_unloaded_rows(sK, mask, threadIdx.x & 127, 128);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(8 + C, 128);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_fence_operand(qr[kk]);
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ptx::wgmma_bf16_rs<T::kBlockN>(s, qr[kk], ptx::desc_sw128_k_major(sK + 8 * T::kPanelBytes + kk * 32), kk > 0);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int first = half_panel(hh == 0 ? C : 1 - C);
#pragma unroll
      for (int pc = first; pc < first + 4; ++pc) {
        wait_full<Src>(&fb[pc], parity);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int off = pc * T::kPanelBytes + ks * 32;
          ptx::wgmma_bf16_ss<T::kBlockN>(s, ptx::desc_sw128_k_major(smem + L::kOffQ + off),
                                         ptx::desc_sw128_k_major(sK + off), true);
        }
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(s);
    ptx::mbar_arrive(&empty(C)[0]);  // rope panel read
    mx_lo = -INFINITY;
    mx_hi = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < T::kBlockN / 8; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kk = 8 * jj + 2 * t4 + e, key = k0 + kk;
        const bool in = (mask >> kk) & 1;
        float& a = s[4 * jj + e];
        float& b = s[4 * jj + 2 + e];
        a = in && key <= lim_lo ? a * sl2 : -INFINITY;
        b = in && key <= lim_hi ? b * sl2 : -INFINITY;
        mx_lo = fmaxf(mx_lo, a);
        mx_hi = fmaxf(mx_hi, b);
      }
    mx_lo = softmax::quad_max(mx_lo);
    mx_hi = softmax::quad_max(mx_hi);
  }

  // P = 2^(S - base) in place, returns the row sums; pa = P as bf16 rs A fragments (k-steps of 16 keys).
  __device__ __forceinline__ void exponentiate(float (&s)[32], uint32_t (&pa)[4][4], float base_lo, float base_hi,
                                               float& sum_lo, float& sum_hi) {
    base_lo = base_lo == -INFINITY ? 0.0f : base_lo;
    base_hi = base_hi == -INFINITY ? 0.0f : base_hi;
    sum_lo = 0.0f;
    sum_hi = 0.0f;
#pragma unroll
    for (int jj = 0; jj < T::kBlockN / 8; ++jj) {
      s[4 * jj] = softmax::exp2_approx(s[4 * jj] - base_lo);
      s[4 * jj + 1] = softmax::exp2_approx(s[4 * jj + 1] - base_lo);
      s[4 * jj + 2] = softmax::exp2_approx(s[4 * jj + 2] - base_hi);
      s[4 * jj + 3] = softmax::exp2_approx(s[4 * jj + 3] - base_hi);
      sum_lo += s[4 * jj] + s[4 * jj + 1];
      sum_hi += s[4 * jj + 2] + s[4 * jj + 3];
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * (2 * ks + (e >> 1)) + 2 * (e & 1);  // (e & 1): row hi; (e >> 1): keys + 8
        pa[ks][e] = ptx::pack_bf16x2(s[i], s[i + 1]);
      }
  }

  // O += P V of this consumer's V half of its own tile, P from registers. Committed, not waited.
  __device__ __forceinline__ void local_pv(uint32_t (&pa)[4][4]) {
    uint8_t* sV = stage_tile(C) + half_panel(C) * T::kPanelBytes;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) ptx::wgmma_fence_operand(pa[ks]);
    ptx::wgmma_fence_operand(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ptx::wgmma_bf16_rs<T::kDvHalf, ptx::Major::MN>(o, pa[ks], ptx::desc_sw128_mn_major(sV + ks * 2048, T::kPanelBytes),
                                                    true);
    ptx::wgmma_commit_group();
  }
  __device__ __forceinline__ void retire() {
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
  }

  // O += P_other V of this consumer's V half of the other consumer's tile of pair j, P from smem.
  __device__ __forceinline__ void remote_pv(int j) {
    constexpr int so = 1 - C;
    ptx::named_barrier_sync(C == 0 ? L::kBarP1 : L::kBarP0, T::kConsumerThreads);
    uint64_t* fb = full(so);
    for (int pc = half_panel(C); pc < half_panel(C) + 4; ++pc) wait_full<Src>(&fb[pc], j & 1);
    const uint8_t* sP = smem + L::kOffP + so * T::kPanelBytes;
    const uint8_t* sV = stage_tile(so) + half_panel(C) * T::kPanelBytes;
    ptx::wgmma_fence_operand(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ptx::wgmma_bf16_ss<T::kDvHalf, ptx::Major::K, ptx::Major::MN>(
          o, ptx::desc_sw128_k_major(sP + ks * 32), ptx::desc_sw128_mn_major(sV + ks * 2048, T::kPanelBytes), true);
    ptx::wgmma_commit_group();
    retire();
    ptx::mbar_arrive(&empty(so)[2]);  // the other stage's second V half read
  }

  // One pair of tiles (j): kHas1 = consumer 1 has a tile too (false only for an odd last tile).
  template <bool kHas1>
  __device__ __forceinline__ void pair(int j, bool more) {
    float s[32];
    uint32_t pa[4][4];
    float mx_lo = -INFINITY, mx_hi = -INFINITY, sum_lo = 0.0f, sum_hi = 0.0f;
    float* m = sM();
    if constexpr (C == 0) {
      s_product(s, j, mx_lo, mx_hi);
      const float n_lo = fmaxf(m_lo, mx_lo), n_hi = fmaxf(m_hi, mx_hi);  // m0
      const float a0_lo = factor(m_lo, n_lo), a0_hi = factor(m_hi, n_hi);
      if (t4 == 0) {
        m[r_lo] = n_lo;
        m[r_hi] = n_hi;
      }
      ptx::named_barrier_arrive(L::kBarM0, T::kConsumerThreads);
      exponentiate(s, pa, n_lo, n_hi, sum_lo, sum_hi);
      scale_o(a0_lo, a0_hi);
      local_pv(pa);
      // a1 from consumer 1's max; P0 <- a1 P0 into smem for consumer 1's remote product.
      ptx::named_barrier_sync(L::kBarM1, T::kConsumerThreads);
      const float m1_lo = m[T::kBlockM + r_lo], m1_hi = m[T::kBlockM + r_hi];
      const float a1_lo = factor(n_lo, m1_lo), a1_hi = factor(n_hi, m1_hi);
      if (j > 0) ptx::named_barrier_sync(L::kBarP0Free, T::kConsumerThreads);
      store_p(smem + L::kOffP, s, a1_lo, a1_hi, r_lo, r_hi, t4);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_arrive(L::kBarP0, T::kConsumerThreads);
      retire();
      ptx::mbar_arrive(&empty(0)[1]);  // own V half of stage 0 read
      scale_o(a1_lo, a1_hi);
      l_lo = (l_lo * a0_lo + sum_lo) * a1_lo;
      l_hi = (l_hi * a0_hi + sum_hi) * a1_hi;
      m_lo = m1_lo;
      m_hi = m1_hi;
      if constexpr (kHas1) {
        remote_pv(j);
        if (more) ptx::named_barrier_arrive(L::kBarP1Free, T::kConsumerThreads);  // consumer 1 may rewrite P1
      }
    } else {
      if constexpr (kHas1) s_product(s, j, mx_lo, mx_hi);
      ptx::named_barrier_sync(L::kBarM0, T::kConsumerThreads);
      const float m0_lo = m[r_lo], m0_hi = m[r_hi];
      const float n_lo = fmaxf(m0_lo, mx_lo), n_hi = fmaxf(m0_hi, mx_hi);  // m1
      const float a_lo = factor(m_lo, m0_lo) * factor(m0_lo, n_lo), a_hi = factor(m_hi, m0_hi) * factor(m0_hi, n_hi);
      if (t4 == 0) {
        m[T::kBlockM + r_lo] = n_lo;
        m[T::kBlockM + r_hi] = n_hi;
      }
      ptx::named_barrier_arrive(L::kBarM1, T::kConsumerThreads);
      scale_o(a_lo, a_hi);
      if constexpr (kHas1) {
        exponentiate(s, pa, n_lo, n_hi, sum_lo, sum_hi);
        local_pv(pa);
        if (j > 0) ptx::named_barrier_sync(L::kBarP1Free, T::kConsumerThreads);
        store_p(smem + L::kOffP + T::kPanelBytes, s, 1.0f, 1.0f, r_lo, r_hi, t4);
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_arrive(L::kBarP1, T::kConsumerThreads);
        retire();
        ptx::mbar_arrive(&empty(1)[1]);  // own V half of stage 1 read
      }
      l_lo = l_lo * a_lo + sum_lo;
      l_hi = l_hi * a_hi + sum_hi;
      m_lo = n_lo;
      m_hi = n_hi;
      remote_pv(j);
      if (more) ptx::named_barrier_arrive(L::kBarP0Free, T::kConsumerThreads);  // consumer 0 may rewrite P0
    }
  }

  __device__ __forceinline__ void run() {
    const int n_pairs = (u.n_tiles + 1) / 2, full_pairs = u.n_tiles / 2;
    // P1Free is owed only when consumer 1 writes P1 again (the next pair has its tile); P0Free whenever a
    // next pair exists. Arrivals and syncs stay matched one to one.
    for (int j = 0; j < full_pairs; ++j) pair<true>(j, C == 0 ? j + 1 < full_pairs : j + 1 < n_pairs);
    if (n_pairs > full_pairs) pair<false>(full_pairs, false);
    // Epilogue: l = l0 + l1 per row, normalise, write this consumer's 256 columns.
    float* sL = reinterpret_cast<float*>(smem + L::kOffL);
    const float q_lo = softmax::quad_sum(l_lo), q_hi = softmax::quad_sum(l_hi);
    if (t4 == 0) {
      sL[C * T::kBlockM + r_lo] = q_lo;
      sL[C * T::kBlockM + r_hi] = q_hi;
    }
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    write_rows_half(p, u, o, m_lo, m_hi, sL[r_lo] + sL[T::kBlockM + r_lo], sL[r_hi] + sL[T::kBlockM + r_hi], C, r_lo,
                    r_hi, t4, code_scale<Src>(p));
  }
};

// Src: the key source (source.cuh): PagedKeys (mqa_decode bf16) or GatherKeys<F, Rows> (sparse_mqa; mqa_decode fp8 / fp8_ds_mla).
template <class Src>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_seesaw_kernel(const __grid_constant__ CUtensorMap kv_map, const DecodeSm90Params p) {
  using T = Traits;
  using L = SeesawTraits;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  const Unit u(p, Src::kIndexed);
  if (!start_roles<L, Src>(p, &kv_map, u, true, smem,
                           [&](int warp, int lane) { produce_seesaw<Src>(p, &kv_map, u, smem, warp, lane); }))
    return;
  // Q columns 0..511 into 8 swizzled panels, by both consumers.
  load_q_panels(p.rows, u.g, u.row0, u.m_rows, T::kBlockM, L::kQPanels, T::kPanelBytes, smem + L::kOffQ, static_cast<int>(threadIdx.x) - 128,
                T::kConsumerThreads);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  if (ptx::warpgroup_index() == 1) SeesawConsumer<0, Src>(p, u, smem).run();
  else SeesawConsumer<1, Src>(p, u, smem).run();
}

}  // namespace mla::cuda::decode_sm90
