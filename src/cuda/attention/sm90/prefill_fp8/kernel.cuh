// SPDX-License-Identifier: Apache-2.0
#pragma once
// sm90 fp8 mha_prefill: varlen multi-head attention on the e4m3 tensor cores (SEMANTICS §10.1), FlashAttention-3
// style, over the codes the quantise pass wrote (quantize.cuh; layout core/prefill_fp8.h). Design note:
// docs/design/prefill_fp8_sm90.md. The schedules are the bf16 kernel's (sm90/prefill/kernel.cuh) with pingpong
// consumers: one CTA per unit, or persistent pairs of units (kPersistent).
//
// Work: one CTA per (128-query tile, head, request), heavy causal tiles of a head first (or, persistent, pairs of
// a head's largest and smallest remaining tiles per CTA). Causal is bottom-right
// aligned: query i of (sq, sk) sees keys j <= sk - sq + i. Key tiles of 128 run from the last visible one down to
// tile 0 (the masked tiles first).
//
// Warp roles (384 threads, setmaxnreg 24 / 240 / 240):
//   warpgroup 0 (producer): one thread issues TMA: Q once (2 panels of q8), then per key tile K (2 panels of k8)
//     and V^T (1 panel of vt8) into a 2-stage ring with full / empty mbarriers per stage, K and V separately.
//   warpgroups 1, 2 (consumers): rows 64c .. 64c + 63 of the tile each, independent online softmax. Per key tile j:
//       issue S_j = Q K_j^T          wgmma m64n128k32 e4m3 ss x 6 (both K-major; fp32 S, 64 registers)
//       issue O += P_{j-1} V_{j-1}   wgmma m64n128k32 e4m3 rs x 4 (P e4m3 in 16 registers, V^T K-major)
//       wait S_j; release K_j; mask (diagonal / partial tiles only), row max (quad shuffles), p = exp2(S scale_log2
//       - max + 8) = 256 exp(...), per-thread row sums of those (reduced at the end)
//       wait P V; release V_{j-1}; O *= alpha; P_j = e4m3(p) packed as the next rs A fragments.
//   The consumers take turns issuing (named barriers 2 and 3; FA3's pingpong).
//   Epilogue: row sums over the quad, out = O * v_scale / l as bf16, LSE = (m + log2 l - 8) ln 2.
//
// The P fragment without shuffles: the e4m3 register A of m64nNk32 holds, per thread, positions 4t..4t+3 and
// 16+4t..16+4t+3 of its rows (wgmma.cuh), while the S accumulators of the step's 32 keys are keys 2t, 2t+1,
// 8+2t, 9+2t, 16+2t, 17+2t, 24+2t, 25+2t. The quantise pass stores V^T with the keys of each 16 in that order
// (traits.cuh vt_position), so position 4t+i of the A fragment and column 4t+i of V^T are the same key, and the
// thread packs its own accumulators (to_pa). The row sums and the mask use the true key index.
//
// Bounds: every tile a request reads holds its keys or zero codes (the workspace pads each request to 128 keys);
// keys >= sk are masked to -inf (P 0, and their V codes are 0: no 0 * NaN); Q rows past sq only feed rows that are
// never written. cu_seqlens are clamped to the tensors.
//
// Shared memory (1024-aligned, 128-byte-swizzled panels of 128 codes x 128 rows = 16 KiB):
//   Q 2 panels 32 KiB | K 2 stages x 2 panels 64 KiB | V^T 2 stages x 1 panel 32 KiB | 10 mbarriers = 128 KiB.
#include <cuda.h>

#include <cstdint>

#include "cuda/attention/sm90/prefill_fp8/params.h"
#include "cuda/attention/sm90/prefill_fp8/traits.cuh"
#include "cuda/attention/sm90/common/prefill_io.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/smem.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"

namespace mla::cuda::prefill_sm90_fp8 {

// Named barriers 2 and 3: the consumers' pingpong turns (1 is the bf16 kernel's V-tail barrier, not needed here:
// the quantise pass pads each request's tiles with zero codes).

using prefill_io::clamp64;

// A unit of work: request b, head h, query rows [m0, m0 + m_rows) of the request, key tiles [0, n_tiles);
// keys < n_full are visible to every row of the tile. Unit x enumerates (request, head, query tile j) with j
// fastest. One unit per CTA: tile q_tiles - 1 - j (the largest causal tiles of a head first). Persistent
// (`zigzag`): j runs q_tiles - 1, 0, q_tiles - 2, 1, ..., so a CTA's pair (2i, 2i + 1) of a causal head costs
// q_tiles + 1 key tiles (the bf16 kernel's schedule, docs/design/prefill_sm90.md). k_row: the request's first row
// in k8 / vt8 (core/prefill_fp8.h pad_start).
struct Unit {
  int64_t q_start, k_row;
  int h, sq, sk, m0, m_rows, n_tiles, n_full;

  __device__ Unit(const AttnParams& p, int64_t x, bool zigzag) {
    using T = Traits;
    const int j = static_cast<int>(x % p.q_tiles);
    const int qt = !zigzag ? p.q_tiles - 1 - j : (j % 2 == 0 ? p.q_tiles - 1 - j / 2 : j / 2);
    h = static_cast<int>((x / p.q_tiles) % p.heads);
    const int64_t b = x / (static_cast<int64_t>(p.q_tiles) * p.heads);
    q_start = clamp64(__ldg(p.cu_q + b * p.cu_q_stride), 0, p.total_q);
    const int64_t q_end = clamp64(__ldg(p.cu_q + (b + 1) * p.cu_q_stride), q_start, p.total_q);
    const int64_t k_start = clamp64(__ldg(p.cu_k + b * p.cu_k_stride), 0, p.total_k);
    const int64_t k_end = clamp64(__ldg(p.cu_k + (b + 1) * p.cu_k_stride), k_start, p.total_k);
    k_row = (k_start + 15) / 16 * 16 + 128 * b;
    sq = static_cast<int>(q_end - q_start);
    sk = static_cast<int>(k_end - k_start);
    m0 = qt * T::kBlockM;
    m_rows = m0 < sq ? min(T::kBlockM, sq - m0) : 0;
    const int n_end = p.causal ? static_cast<int>(clamp64(int64_t(sk) - sq + m0 + m_rows, 0, sk)) : sk;
    n_full = p.causal ? static_cast<int>(clamp64(int64_t(sk) - sq + m0 + 1, 0, sk)) : sk;
    n_tiles = (n_end + T::kBlockN - 1) / T::kBlockN;
  }
  // Units with key tiles load Q and K / V; the rest are skipped (m_rows 0) or written empty.
  __device__ bool loads() const { return m_rows > 0 && n_tiles > 0; }
};

using prefill_io::Schedule;

using Bars = prefill_io::Bars<Traits>;

// Producer thread: for every unit of the CTA that has keys, Q (once the consumers' last S of the previous unit
// has read the single Q buffer, mbarrier q_empty), then K / V^T of key tiles n_tiles - 1 down to 0 into the stage
// ring, whose stages and parities run on over units (`it` counts the key tiles loaded so far).
template <bool kPersistent>
__device__ __forceinline__ void produce(const AttnParams& p, const Schedule<kPersistent>& sched,
                                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        uint8_t* smem) {
  using T = Traits;
  const Bars bar(smem);
  int it = 0, nu = 0;
  for (int64_t x = sched.first(); x < sched.units; x = sched.next(x)) {
    const Unit u(p, x, kPersistent);
    if (!u.loads()) continue;
    if (nu > 0) ptx::mbar_wait(bar.q_empty, (nu - 1) & 1);
    ptx::mbar_arrive_expect_tx(bar.q_full, T::kQBytes);
    for (int c = 0; c < T::kQKPanels; ++c)
      ptx::tma_load_3d(smem + T::kOffQ + c * T::kPanelBytes, q_map, bar.q_full, c * T::kPanelCols,
                       static_cast<int32_t>(u.q_start + u.m0), u.h);
    for (int j = 0; j < u.n_tiles; ++j, ++it) {
      const int stage = it % T::kStages;
      const uint32_t parity = (it / T::kStages) & 1;
      const int32_t krow = static_cast<int32_t>(u.k_row + int64_t(u.n_tiles - 1 - j) * T::kBlockN);
      uint8_t* k = smem + T::kOffK + stage * T::kKBytes;
      ptx::mbar_wait(&bar.k_empty[stage], parity ^ 1);
      ptx::mbar_arrive_expect_tx(&bar.k_full[stage], T::kKBytes);
      for (int c = 0; c < T::kQKPanels; ++c)
        ptx::tma_load_3d(k + c * T::kPanelBytes, k_map, &bar.k_full[stage], c * T::kPanelCols, krow, u.h);
      uint8_t* v = smem + T::kOffV + stage * T::kVBytes;
      ptx::mbar_wait(&bar.v_empty[stage], parity ^ 1);
      ptx::mbar_arrive_expect_tx(&bar.v_full[stage], T::kVBytes);
      ptx::tma_load_3d(v, v_map, &bar.v_full[stage], krow, 0, u.h);
    }
    ++nu;
  }
}

// Consumer state of one warpgroup: this thread's rows lo = 16w + g, hi = lo + 8 of the warpgroup's 64.
struct Consumer {
  float o[Traits::kDv / 2];              // O 64 x 128 fp32 (wgmma D layout), in units of 256 p . v8
  uint32_t pa[Traits::kBlockN / 32][4];  // P of the previous tile, e4m3, as rs A fragments per k32 step
  softmax::RowState st[2];               // max in the log2 domain; sum of 256 p
  int lim[2];                            // largest visible key per row (-1: none)

  // S = Q K^T for this warpgroup's rows and the tile's 128 keys: 6 k32 steps, 4 in panel 0 and 2 in panel 1.
  __device__ __forceinline__ static void issue_s(float (&s)[Traits::kBlockN / 2], const uint8_t* sq,
                                                 const uint8_t* sk) {
    using T = Traits;
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      const int off = (ks / 4) * T::kPanelBytes + (ks % 4) * 32;
      ptx::wgmma_e4m3_ss<T::kBlockN>(s, ptx::desc_sw128_k_major(sq + off), ptx::desc_sw128_k_major(sk + off), ks > 0);
    }
    ptx::wgmma_commit_group();
  }
  // O += P V over the tile's 128 keys: 4 k32 steps, V^T K-major (keys contiguous, permuted per 16).
  __device__ __forceinline__ void issue_pv(const uint8_t* sv) {
    ptx::wgmma_fence_operand(o);
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 32; ++kk) ptx::wgmma_fence_operand(pa[kk]);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 32; ++kk)
      ptx::wgmma_e4m3_rs<Traits::kDv>(o, pa[kk], ptx::desc_sw128_k_major(sv + kk * 32), true);
    ptx::wgmma_commit_group();
  }
  // Online softmax of key tile `tile` (prefill_io::softmax_tile): scores in s become 256 p; alpha: the O factors.
  __device__ __forceinline__ void softmax_tile(float (&s)[Traits::kBlockN / 2], int tile, bool mask, float scale_log2,
                                               int t4, float (&alpha)[2]) {
    prefill_io::softmax_tile<Traits::kBlockN, 8>(s, st, lim, tile, mask, scale_log2, t4, alpha);
  }
  // P as e4m3 register-A fragments (wgmma.cuh), in the key order of V^T (see the file comment): for k32 step kk,
  // a[0] = row lo keys {2t, 2t+1, 8+2t, 9+2t}, a[1] = the same of row hi, a[2] / a[3] = keys 16 + those.
  __device__ __forceinline__ void to_pa(const float (&s)[Traits::kBlockN / 2]) {
    auto pack4 = [](float a, float b, float c, float d) {
      return static_cast<uint32_t>(dev::float2_to_e4m3x2(a, b)) |
             (static_cast<uint32_t>(dev::float2_to_e4m3x2(c, d)) << 16);
    };
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 32; ++kk) {
      const float* x = s + 16 * kk;
      pa[kk][0] = pack4(x[0], x[1], x[4], x[5]);
      pa[kk][1] = pack4(x[2], x[3], x[6], x[7]);
      pa[kk][2] = pack4(x[8], x[9], x[12], x[13]);
      pa[kk][3] = pack4(x[10], x[11], x[14], x[15]);
    }
  }
  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < Traits::kDv / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
  }
};

// kPersistent: gridDim.x <= #SMs CTAs loop over pairs of units (Schedule); the next unit's Q loads as soon as the
// current unit's last S has read Q, its K / V tiles as ring stages free up. Else one CTA per unit.
template <bool kPersistent>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mha_prefill_sm90_fp8_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const AttnParams p, const int64_t units) {
  using T = Traits;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = ptx::align_smem_1024(smem_raw);
  const Schedule<kPersistent> sched{units};
  if constexpr (!kPersistent) {  // the CTA's one unit: without keys it exits before any barrier or load
    const Unit u(p, blockIdx.x, false);
    if (u.m_rows == 0) return;
    if (u.n_tiles == 0) {
      prefill_io::write_empty_unit<Traits::kDv>(p, u, threadIdx.x, blockDim.x);
      return;
    }
  }
  const Bars bar(smem);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar.q_full, 1);
    ptx::mbar_init(bar.q_empty, T::kConsumerThreads);
    for (int i = 0; i < T::kStages; ++i) {
      ptx::mbar_init(&bar.k_full[i], 1);
      ptx::mbar_init(&bar.v_full[i], 1);
      ptx::mbar_init(&bar.k_empty[i], T::kConsumerThreads);
      ptx::mbar_init(&bar.v_empty[i], T::kConsumerThreads);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_descriptor(&q_map);
      ptx::tma_prefetch_descriptor(&k_map);
      ptx::tma_prefetch_descriptor(&v_map);
      produce<kPersistent>(p, sched, &q_map, &k_map, &v_map, smem);
    }
    return;
  }
  ptx::setmaxnreg_inc<T::kConsumerRegs>();

  const int c = ptx::warpgroup_index() - 1, ct = threadIdx.x - 128;
  const int w = ptx::warp_idx_in_warpgroup(), lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  const int r_lo = 64 * c + 16 * w + g8;  // tile row of o[4j], o[4j + 1]; r_lo + 8: o[4j + 2], o[4j + 3]
  const uint8_t* sq = smem + T::kOffQ + c * 64 * 128;  // this warpgroup's 64 rows of each Q panel
  auto k_tile = [&](int stage) { return smem + T::kOffK + stage * T::kKBytes; };
  auto v_tile = [&](int stage) { return smem + T::kOffV + stage * T::kVBytes; };
  const bool pairs = (reinterpret_cast<uintptr_t>(p.out) % 4 == 0) && p.out_stride_t % 2 == 0 && p.out_stride_h % 2 == 0;
  // Turns: warpgroup c issues after barrier 2 + c and hands over on the other's; in every unit warpgroup 1 opens
  // warpgroup 0's first turn and skips its hand-over after its last turn (arrivals match syncs unit by unit).
  auto turn_begin = [&] { ptx::named_barrier_sync(2 + c, T::kConsumerThreads); };
  auto turn_end = [&](bool last) {
    if (!(last && c == 1)) ptx::named_barrier_arrive(2 + (1 - c), T::kConsumerThreads);
  };

  int it0 = 0, nu = 0;  // key tiles and units consumed so far (ring stages and parities, as produce())
  for (int64_t x = sched.first(); x < units; x = sched.next(x)) {
    const Unit u(p, x, kPersistent);
    if (u.m_rows == 0) continue;
    if (u.n_tiles == 0) {
      prefill_io::write_empty_unit<Traits::kDv>(p, u, ct, T::kConsumerThreads);
      continue;
    }
    Consumer cs;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = u.m0 + r_lo + 8 * hf;
      cs.lim[hf] = i >= u.sq ? -1 : p.causal ? min(u.sk - u.sq + i, u.sk - 1) : u.sk - 1;
    }
#pragma unroll
    for (int i = 0; i < T::kDv / 2; ++i) cs.o[i] = 0.0f;
    auto stage_of = [&](int j) { return (it0 + j) % T::kStages; };
    auto parity_of = [&](int j) { return static_cast<uint32_t>(((it0 + j) / T::kStages) & 1); };
    auto needs_mask = [&](int tile) { return (tile + 1) * T::kBlockN > u.n_full; };
    if (c == 1) ptx::named_barrier_arrive(2, T::kConsumerThreads);

    // One straight pipeline per unit: no branch between a wgmma's issue and its wait (docs/design/prefill_sm90.md,
    // invariant 1). Q is released (q_empty) once the unit's last S has read it.
    float s[T::kBlockN / 2];
    float alpha[2];
    ptx::mbar_wait(bar.q_full, nu & 1);
    ptx::mbar_wait(&bar.k_full[stage_of(0)], parity_of(0));
    turn_begin();
    Consumer::issue_s(s, sq, k_tile(stage_of(0)));
    turn_end(false);
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(s);
    ptx::mbar_arrive(&bar.k_empty[stage_of(0)]);
    if (u.n_tiles == 1) ptx::mbar_arrive(bar.q_empty);
    cs.softmax_tile(s, u.n_tiles - 1, needs_mask(u.n_tiles - 1), p.scale_log2, t4, alpha);
    cs.to_pa(s);

    for (int j = 1; j < u.n_tiles; ++j) {
      const int stage = stage_of(j), prev = stage_of(j - 1), tile = u.n_tiles - 1 - j;
      ptx::mbar_wait(&bar.k_full[stage], parity_of(j));
      ptx::mbar_wait(&bar.v_full[prev], parity_of(j - 1));
      turn_begin();
      Consumer::issue_s(s, sq, k_tile(stage));
      cs.issue_pv(v_tile(prev));
      turn_end(false);
      ptx::wgmma_wait_group<1>();
      ptx::wgmma_fence_operand(s);
      ptx::mbar_arrive(&bar.k_empty[stage]);
      if (tile == 0) ptx::mbar_arrive(bar.q_empty);
      cs.softmax_tile(s, tile, needs_mask(tile), p.scale_log2, t4, alpha);
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(cs.o);
      ptx::mbar_arrive(&bar.v_empty[prev]);
      cs.rescale_o(alpha);
      cs.to_pa(s);
    }

    const int last = stage_of(u.n_tiles - 1);
    ptx::mbar_wait(&bar.v_full[last], parity_of(u.n_tiles - 1));
    turn_begin();
    cs.issue_pv(v_tile(last));
    turn_end(true);
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(cs.o);
    ptx::mbar_arrive(&bar.v_empty[last]);

    // Epilogue: full row sums (of 256 p), out = O * v_scale / l, LSE = (m + log2 l - 8) ln 2.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      cs.st[hf].sum = softmax::quad_sum(cs.st[hf].sum);
      const int i = u.m0 + r_lo + 8 * hf;
      if (i >= u.sq) continue;
      prefill_io::store_row<Traits::kDv>(p, u, i, cs.o, hf, cs.st[hf].inv_sum() * p.v_scale, t4, pairs);
      if (p.lse && t4 == 0)
        p.lse[u.h * p.lse_stride_h + (u.q_start + i) * p.lse_stride_t] = cs.st[hf].lse() - 8.0f * softmax::kLn2;
    }
    it0 += u.n_tiles;
    ++nu;
  }
}

}  // namespace mla::cuda::prefill_sm90_fp8
