// SPDX-License-Identifier: Apache-2.0
#pragma once
// The seesaw kernel's shared-memory plan (SeesawTraits) and the state and steps its two consumers share
// (SeesawBase: this thread's rows, O half, running max and row sums; S, the max hand-over, P, the local and remote
// products, the epilogue). The algorithm, warp roles, hand-over protocol and the schedule that orders these steps
// are in seesaw/kernel.cuh, which includes this file.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/acc_frag.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/seesaw/source_cross.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/attention/sm90/seesaw/traits.cuh"

namespace mla::cuda::decode_sm90 {

// PagedPanelKeys (PagedKeysT's kStage1Panels; core/decode_regime.h picks it above 16 rows): stage 1's panels each on
// their own full barrier (the producer announces and completes them one by one), so that consumer 1's S starts on
// each panel of the V half refilled last (after consumer 0's remote product) as it lands, FlashMLA's granularity,
// instead of on the half's last panel; its panels' products are then each their own wgmma commit group, as
// FlashMLA's are. Stage 0 keeps one barrier per V half: per-panel waits in consumer 0's S, issued while its remote
// product is in flight, spilled 48 bytes (ptxas, 232 consumer registers). A kernel parameter choosing between the
// two orders at run time spilled 76..188 bytes (ptxas): hence a source type per order.
template <class Src>
inline constexpr bool kPanelFull = [] {
  if constexpr (requires { Src::kStage1Panels; }) return Src::kTma && !CrossoverSource<Src> && Src::kStage1Panels;
  else return false;
}();
// Whether stage `stage`'s V-half panels complete on their own full barriers (else on the half's first panel's).
template <class Src>
__host__ __device__ constexpr bool panel_barriers(int stage) { return kPanelFull<Src> && stage == 1; }

// First panel of V half `h` (columns 256h..256h+255) and the panel order of the owner's S for stage s.
__device__ __forceinline__ int half_panel(int h) { return 4 * h; }

// State and pieces shared by the two consumers (C = 0: O_L, owner of stage 0; C = 1: O_R, owner of
// stage 1): this thread's rows, their visible limits and rope pointers, O half, running max and row sums.
// A V half's panels complete on one full barrier (produce_seesaw: one wait per release group; stage 1 of
// PagedPanelKeys per panel), and the wgmma descriptors are the shared-memory base's (>> 4, computed once: base4)
// plus compile-time offsets (one add each, no rebuild from the address).
template <int C, class Src>
struct SeesawBase {
  using T = Traits;
  using L = SeesawTraits;
  // O's fragment: query rows r_lo / r_hi as M, the half's 256 value columns as N.
  using OFrag = AccFrag<T::kDvHalf>;
  const DecodeSm90Params& p;
  const Unit& u;
  uint8_t* smem;
  int w, t4, r_lo, r_hi, lim_lo, lim_hi;
  const uint16_t *q_lo, *q_hi;  // rope columns (576 - 64 ..) of this thread's query rows; nullptr past the rows
  bool q_pairs;                 // 4-byte loads of column pairs are aligned
  float o[T::kDvHalf / 2];
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  // The descriptors' 14-bit start-address field of smem (1024-aligned; plus the offsets below it stays
  // under 2^14: no carry into the next field). Masked: in a cluster launch (CrossKeys) the shared address of
  // CTA rank r carries the rank above bit 18 (measured: unmasked, rank 1's leading byte offsets were
  // corrupted, its P V read the wrong panels).
  uint32_t base4;

  __device__ __forceinline__ SeesawBase(const DecodeSm90Params& p_, const Unit& u_, uint8_t* smem_)
      : p(p_), u(u_), smem(smem_) {
    base4 = (ptx::smem_addr(smem_) >> 4) & 0x3FFFu;
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
    return query_row_limit(p, u, u.row0 + r);
  }
  __device__ __forceinline__ const uint16_t* rope_row(int r) const {
    const int row = u.row0 + r;
    if (row >= u.m_rows) return nullptr;
    return q_row_ptr(p.rows, u.g, row, T::kDqk - 64);
  }
  __device__ __forceinline__ uint64_t* full(int stage) const {
    return reinterpret_cast<uint64_t*>(smem + L::kOffBar) + stage * T::kPanels;
  }
  __device__ __forceinline__ uint64_t* empty(int stage) const {
    return reinterpret_cast<uint64_t*>(smem + L::kOffBar) + L::kFullBarriers + stage * L::kGroups;
  }
  __device__ __forceinline__ uint8_t* stage_tile(int stage) const { return smem + L::kOffK + stage * T::kTileBytes; }
  // Release group g of a stage (0: rope panel and mask, 1: the owner's V half, 2: the other V half): one
  // arrival per thread; crossover sources (CrossKeys): a V half also by one cluster-scope arrival per warp
  // on the peer CTA's same barrier, whose producer writes this CTA's rows of it too.
  __device__ __forceinline__ void release(int stage, int g) const {
    uint64_t* bar = &empty(stage)[g];
    ptx::mbar_arrive(bar);
    if constexpr (CrossoverSource<Src>) {
      if (g != 0) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) ptx::mbar_arrive_cluster(ptx::map_peer(ptx::smem_addr(bar), ptx::cluster_ctarank() ^ 1u));
      }
    }
  }
  // The full barrier that panel `pc` of a stage completes on (its release group's first panel, or its own).
  static __device__ __forceinline__ int full_of(int stage, int pc) {
    return panel_barriers<Src>(stage) || pc >= 8 ? pc : pc & ~3;
  }
  // Stage 1's panel barriers: each panel of consumer 1's S its own commit group (issue_s).
  static constexpr bool kPanelGroups = panel_barriers<Src>(C) && C == 1;
  // 128-byte-swizzled descriptors of the tile at `tile` (inside smem): K-major, and MN-major with 64-column
  // panels `panel_bytes` apart (from base4, SBO 1024, swizzle 128B).
  __device__ __forceinline__ uint64_t desc_k(const void* tile) const { return desc_at(tile, 16); }
  __device__ __forceinline__ uint64_t desc_mn(const void* tile, uint32_t panel_bytes) const {
    return desc_at(tile, panel_bytes);
  }
  __device__ __forceinline__ uint64_t desc_at(const void* tile, uint32_t lbo_bytes) const {
    const uint32_t off = static_cast<uint32_t>(static_cast<const uint8_t*>(tile) - smem);
    return uint64_t{(1024u >> 4) | (1u << 30)} << 32 | (base4 + (off >> 4) + ((lbo_bytes >> 4) << 16));
  }
  __device__ __forceinline__ float* sM() const { return reinterpret_cast<float*>(smem + L::kOffM); }
  // The lazy maximum (next_ref) is compiled in unless the source opts out with kRunningMax (GroupRows: measured, its
  // code cost the sparse prefill row more than it saved, while the dense bf16 / code-format rows gained or stayed
  // even: docs/design/attention_sm90.md "2. What every kernel shares", softmax). Without it the kernel keeps the
  // running maximum exactly (factor, next_ref and rescale_o below).
  static constexpr bool kLazy = !requires { requires Src::kRunningMax; };
  // The factor that takes a row's O and sum from reference maximum `from` to `to`; under kLazy exactly 1 when it
  // did not move (rescale_o tests for 1).
  static __device__ __forceinline__ float factor(float from, float to) {
    return to == -INFINITY || (kLazy && from == to) ? 1.0f : softmax::exp2_approx(from - to);
  }
  // The lazy maximum's threshold tau (log2 domain; FlashAttention-4's rescale threshold).
  static constexpr float kLazyLog2 = 8.0f;
  // The reference maximum a row's P, O and sum are kept relative to, after a tile whose row max is mx (log2
  // domain). Under kLazy the reference moves to mx only when mx exceeds it by more than tau, so P = 2^(S - ref)
  // stays below 2^tau (bf16 P and the fp32 sums and O hold that with the same relative precision; LSE = ref +
  // log2 l is exact whatever the reference), and after the first tiles O keeps its scale: rescale_o skips the
  // 128 multiplies per consumer thread that sit on both consumers' chains (seesaw/kernel.cuh). A NaN mx keeps
  // ref (the comparison is false), as fmaxf's running maximum does.
  __device__ __forceinline__ float next_ref(float ref, float mx) const {
    if constexpr (kLazy) return mx > ref + kLazyLog2 ? mx : ref;
    else return fmaxf(ref, mx);
  }
  // O *= f, under kLazy skipped when no row of this warp moved its reference (f == 1 in every lane: the common
  // case under the lazy maximum, next_ref). O is never in flight here (every caller retired its products first).
  // The skip is ptx::wgmma_scale_rows_if's asm branch: the same branch in C++ spilled 41..62 bytes in every seesaw
  // kernel.
  __device__ __forceinline__ void rescale_o(float f_lo, float f_hi) {
    if constexpr (kLazy) {
      ptx::wgmma_scale_rows_if<T::kDvHalf>(o, __any_sync(0xffffffffu, f_lo != 1.0f || f_hi != 1.0f), f_lo, f_hi);
    } else {
#pragma unroll
      for (int i = 0; i < OFrag::kRegs; ++i) o[i] *= OFrag::at_hi(i) ? f_hi : f_lo;
    }
  }
  // The rope columns of Q as rs A fragments, re-read (L1 / L2 hits) per tile: registers are the scarce resource.
  __device__ __forceinline__ void load_rope(uint32_t (&qr)[4][4]) const {
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
  }
  // Waits for the rope panel of this consumer's stage (it carries the tile's key mask) and returns the
  // mask; keys that were not loaded are zero-filled in every panel first (sources that do not zero them).
  __device__ __forceinline__ uint64_t tile_mask(uint32_t parity) {
    uint64_t* fb = full(C);
    wait_full<Src>(&fb[8], parity);
    const uint64_t mask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask)[C];
    if (!Src::kZeroFilled && mask != ~uint64_t(0)) {
      for (int pc = 0; pc < T::kPanels; ++pc)
        if (full_of(C, pc) == pc) ptx::mbar_wait(&fb[pc], parity);
      zero_unloaded_rows(stage_tile(C), mask, threadIdx.x & 127, 128);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(8 + C, 128);
    }
    return mask;
  }
  // Issues S (+)= Q K^T over the panels of this consumer's stage as one commit group: kRope, the rope
  // panel (rs, zero-initialising S); kOwn, the owner's V half; kOther, the other V half. Each panel after
  // its full barrier. Not waited.
  template <bool kRope, bool kOwn, bool kOther>
  __device__ __forceinline__ void issue_s(float (&s)[32], const uint32_t (&qr)[4][4], uint32_t parity) {
    uint8_t* sK = stage_tile(C);
    uint64_t* fb = full(C);
    ptx::wgmma_fence();
    if constexpr (kRope) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::wgmma_bf16_rs<T::kBlockN>(s, qr[kk], desc_k(sK + 8 * T::kPanelBytes + kk * 32), kk > 0);
    }
    bool open = kRope;  // kPanelGroups: a group is open (committed before the next panel's wait)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if ((hh == 0 && !kOwn) || (hh == 1 && !kOther)) continue;
      const int first = half_panel(hh == 0 ? C : 1 - C);
#pragma unroll
      for (int pc = first; pc < first + 4; ++pc) {
        if constexpr (kPanelGroups) {
          if (open) ptx::wgmma_commit_group();
          wait_full<Src>(&fb[pc], parity);
          ptx::wgmma_fence_operand(s);
          ptx::wgmma_fence();
          open = true;
        } else if (full_of(C, pc) == pc) {
          wait_full<Src>(&fb[pc], parity);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int off = pc * T::kPanelBytes + ks * 32;
          ptx::wgmma_bf16_ss<T::kBlockN>(s, desc_k(smem + SeesawTraits::kOffQ + off), desc_k(sK + off), true);
        }
      }
    }
    ptx::wgmma_commit_group();
  }
  // The max hand-over of a pair (both schedules). Consumer 0: m0 = next_ref(m, its row max) published
  // (kBarM0), a0 = 2^(m - m0). Consumer 0 then reads m1 (kBarM1): a1 = 2^(m0 - m1). Consumer 1: reads m0,
  // publishes m1 = next_ref(m0, its row max) (kBarM1), a = 2^(m - m0) 2^(m0 - m1), O_R *= a.
  __device__ __forceinline__ void publish_m0(float mx_lo, float mx_hi, float& n_lo, float& n_hi, float& a0_lo,
                                             float& a0_hi) {
    float* m = sM();
    n_lo = next_ref(m_lo, mx_lo);
    n_hi = next_ref(m_hi, mx_hi);
    a0_lo = factor(m_lo, n_lo);
    a0_hi = factor(m_hi, n_hi);
    if (t4 == 0) {
      m[r_lo] = n_lo;
      m[r_hi] = n_hi;
    }
    ptx::named_barrier_arrive(L::kBarM0, T::kConsumerThreads);
  }
  __device__ __forceinline__ void read_m1(float n_lo, float n_hi, float& m1_lo, float& m1_hi, float& a1_lo,
                                          float& a1_hi) {
    float* m = sM();
    ptx::named_barrier_sync(L::kBarM1, T::kConsumerThreads);
    m1_lo = m[T::kBlockM + r_lo];
    m1_hi = m[T::kBlockM + r_hi];
    a1_lo = factor(n_lo, m1_lo);
    a1_hi = factor(n_hi, m1_hi);
  }
  __device__ __forceinline__ void publish_m1(float mx_lo, float mx_hi, float& n_lo, float& n_hi, float& a_lo,
                                             float& a_hi) {
    float* m = sM();
    ptx::named_barrier_sync(L::kBarM0, T::kConsumerThreads);
    const float m0_lo = m[r_lo], m0_hi = m[r_hi];
    n_lo = next_ref(m0_lo, mx_lo);
    n_hi = next_ref(m0_hi, mx_hi);
    a_lo = factor(m_lo, m0_lo) * factor(m0_lo, n_lo);
    a_hi = factor(m_hi, m0_hi) * factor(m0_hi, n_hi);
    if (t4 == 0) {
      m[T::kBlockM + r_lo] = n_lo;
      m[T::kBlockM + r_hi] = n_hi;
    }
    ptx::named_barrier_arrive(L::kBarM1, T::kConsumerThreads);
    rescale_o(a_lo, a_hi);
  }

  // Row sums and max after a pair: l = (l a + sum) b, m = n (consumer 0: a0, a1, m1; consumer 1: a0 a1, 1, m1).
  __device__ __forceinline__ void advance(float a_lo, float a_hi, float sum_lo, float sum_hi, float b_lo, float b_hi,
                                          float n_lo, float n_hi) {
    l_lo = (l_lo * a_lo + sum_lo) * b_lo;
    l_hi = (l_hi * a_hi + sum_hi) * b_hi;
    m_lo = n_lo;
    m_hi = n_hi;
  }
  // S of the tile starting at key k0 (retired) in the log2 domain, masked; row maxes.
  __device__ __forceinline__ void mask_max(float (&s)[32], uint64_t mask, int k0, float& mx_lo, float& mx_hi) const {
    const float scale = p.rows.scale_log2 * code_scale<Src>(p);  // exact-code sources: times scale * 2^56
    // Clean tiles for every source but PagedKeys (the paged TMA source for at most 16 rows): measured, at b 4 h 16
    // the longer pair cost more in instruction fetch than it saved (docs/design/attention_sm90.md "5. The seesaw
    // kernel", clean tiles); consumer 0's mask and max are on the pair's loop.
    mask_scale_max<!std::is_same_v<Src, PagedKeys>>(s, mask, k0, t4, lim_lo, lim_hi, scale, scale, mx_lo, mx_hi);
  }

  // S = Q K^T of this consumer's tile of pair j (keys k0..k0+63) in one group, retired, the rope panel
  // released; in the log2 domain, masked; row maxes.
  // The rope A fragments come in registers (loaded once per unit: SeesawConsumer::run).
  __device__ __forceinline__ void s_product(float (&s)[32], uint32_t (&qr)[4][4], int j, float& mx_lo, float& mx_hi) {
    const int k0 = u.key_begin + (2 * j + C) * T::kBlockN;
    const uint64_t mask = tile_mask(j & 1);
    // Consumer 1: its S is issued only once consumer 0's remote product of the
    // previous pair retired (stage 1's other V half released: empty[1][2], the producer's wait for the refill),
    // so that its rope and own-half products do not share the tensor pipe with that remote product, the one on
    // the pair's loop (release -> refill -> this S -> P1 -> the remote product); its S then runs while the half
    // is refilled. No product is in flight here.
    if constexpr (C == 1) ptx::mbar_wait(&empty(1)[2], (j & 1) ^ 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_fence_operand(qr[kk]);
    ptx::wgmma_fence_operand(s);
    issue_s<true, true, true>(s, qr, j & 1);
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(s);
    release(C, 0);  // rope panel read
    mask_max(s, mask, k0, mx_lo, mx_hi);
  }

  // P = 2^(S - base) in place, returns the row sums; pa = P as bf16 rs A fragments (k-steps of 16 keys).
  __device__ __forceinline__ void exponentiate(float (&s)[32], uint32_t (&pa)[4][4], float base_lo, float base_hi,
                                               float& sum_lo, float& sum_hi) {
    exp2_rows(s, base_lo, base_hi, sum_lo, sum_hi);
    p_fragments_bf16(s, pa);
  }

  // O += P V of this consumer's V half of its own tile, P from registers. Committed, not waited.
  __device__ __forceinline__ void local_pv(uint32_t (&pa)[4][4]) {
    uint8_t* sV = stage_tile(C) + half_panel(C) * T::kPanelBytes;
    issue_pv_rs<T::kDvHalf>(o, pa, [&](int ks) { return desc_mn(sV + ks * 2048, T::kPanelBytes); });
    ptx::wgmma_commit_group();
  }
  // O += P_other V of this consumer's V half of the other consumer's tile (P from smem, panels of the other
  // stage waited with `parity`). Committed, not waited.
  // real false (consumer 0 before its first pair): the same four products on zeros, so that no branch
  // merges the accumulators (ptxas serialises wgmma when a branch or a predicate defines accumulators of
  // an open group): A = the zeroed P of the other consumer, B = the zeroed P buffers read with 2 KiB
  // between 64-column panels (all reads inside the 16 KiB of P0 and P1). Nothing is waited then.
  __device__ __forceinline__ void issue_remote_pv(uint32_t parity, bool real = true) {
    constexpr int so = 1 - C;
    uint64_t* fb = full(so);
    if (real)
      for (int pc = half_panel(C); pc < half_panel(C) + 4; ++pc)
        if (full_of(so, pc) == pc) wait_full<Src>(&fb[pc], parity);
    const uint8_t* sP = smem + L::kOffP + so * T::kPanelBytes;
    const uint8_t* sV = real ? stage_tile(so) + half_panel(C) * T::kPanelBytes : smem + L::kOffP;
    const uint32_t panel_bytes = real ? T::kPanelBytes : 2048;
    ptx::wgmma_fence_operand(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ptx::wgmma_bf16_ss<T::kDvHalf, ptx::Major::K, ptx::Major::MN>(
          o, desc_k(sP + ks * 32), desc_mn(sV + ks * 2048, panel_bytes), true);
    ptx::wgmma_commit_group();
  }
  __device__ __forceinline__ void retire() {
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
  }
  // Epilogue: l = l0 + l1 per row, normalise, write this consumer's 256 columns.
  __device__ __forceinline__ void finish() {
    MLA_DECODE_TRACE_EVENT(5, 128);
    float* sL = reinterpret_cast<float*>(smem + L::kOffL);
    const float q_lo = softmax::quad_sum(l_lo), q_hi = softmax::quad_sum(l_hi);
    if (t4 == 0) {
      sL[C * T::kBlockM + r_lo] = q_lo;
      sL[C * T::kBlockM + r_hi] = q_hi;
    }
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    // Cluster merge: the partial into the KV stages, which no one reads any more (both consumers' products
    // retired before the barrier above, every tile's bytes landed before its products).
    write_rows_half(p, u, o, m_lo, m_hi, sL[r_lo] + sL[T::kBlockM + r_lo], sL[r_hi] + sL[T::kBlockM + r_hi], C, r_lo,
                    r_hi, t4, code_scale<Src>(p), kClusterMerged<Src> && p.cluster_merge ? smem + L::kOffK : nullptr);
    MLA_DECODE_TRACE_EVENT(6, 128);
  }
};

}  // namespace mla::cuda::decode_sm90
