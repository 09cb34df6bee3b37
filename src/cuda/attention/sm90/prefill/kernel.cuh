// SPDX-License-Identifier: Apache-2.0
#pragma once
// sm90 mha_prefill: varlen multi-head attention over up-projected K/V (docs/SEMANTICS.md §9-10, ops.h;
// the same contract as the portable kernel, attention/portable/prefill/kernel.cuh), FlashAttention-3 style.
// Design note: docs/design/prefill_sm90.md.
//
// Work: one CTA per (128-query tile, head, request), heavy causal tiles of a head first. q rows are
// [nope 128 | rope 64] (192 columns), K rows [k_nope 128 | k_pe 64] (k_pe's head stride may be 0),
// v rows 128 columns. Causal is bottom-right aligned: query i of (sq, sk) sees keys j <= sk - sq + i.
// Key tiles of 128 run from the last visible one down to tile 0, so the tiles that need a mask
// (the causal diagonal, the request's partial last tile) come first and the rest run mask-free.
//
// Warp roles (384 threads, setmaxnreg 24 / 240 / 240):
//   warpgroup 0 (producer): one thread issues TMA: Q once (3 panels), then per key tile K (k_nope 2
//     panels + k_pe 1 panel, two tensor maps into one tile) and V (2 panels) into a 2-stage ring with
//     full / empty mbarriers per stage, K and V separately (the S product needs only K).
//   warpgroups 1, 2 (consumers): rows 64c .. 64c + 63 of the tile each, independent online softmax.
//     A warpgroup whose rows see none of the upper 64 keys of the first-processed tile (warpgroup 0 on
//     an aligned causal diagonal) runs that tile's S and P V on its lower 64 keys only (kHalfFirstTile).
//     Per key tile j (intra-warpgroup overlap, FA3's two-stage schedule):
//       issue S_j = Q K_j^T     wgmma m64n128k16 ss x 12 (fp32 S, 64 registers)
//       issue O += P_{j-1} V_{j-1}   wgmma m64n128k16 rs x 8 (P bf16 in registers, V MN-major)
//       wait S_j; release K_j; mask (diagonal / partial tiles only), row max (quad shuffles), exp2 in
//       the log2 domain (scale_log2 folded into one FFMA), per-thread row sums (reduced at the end)
//       wait P V; release V_{j-1}; O *= alpha; P_j = bf16(S_j) as the next rs A fragments.
//   Epilogue: row sums over the quad, O / l as bf16 straight from registers to out (any strides),
//   LSE = (m + log2 l) ln 2 into lse[h, t]. Rows with no visible key: out 0, LSE -inf.
//
// Varlen and bounds: TMA boxes start at the request's first row; rows past the request are other
// requests' rows (or zeros past the tensor): Q rows past sq only feed output rows that are never
// written, K keys >= sk are masked to -inf, and V rows >= sk of the request's partial last tile are
// zeroed in shared memory before P V (P is 0 there, but 0 * inf would be NaN). cu_seqlens values are
// clamped to the tensors, so no value makes the kernel read or write outside q, k, v or out.
//
// Shared memory (1024-aligned, 128-byte-swizzled panels of 64 columns x 128 rows = 16 KiB):
//   Q 3 panels 48 KiB | K 2 stages x 3 panels 96 KiB | V 2 stages x 2 panels 64 KiB | 9 mbarriers
//   = 208 KiB + 1 KiB alignment slack: one CTA per SM.
#include <cuda.h>

#include <cstdint>
#include <type_traits>

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
#include "cuda/attention/prefill_params.h"
#include "cuda/attention/sm90/prefill/traits.cuh"

namespace mla::cuda::prefill_sm90 {

inline constexpr int kConsumerBarrier = 1;  // named barrier of the two consumer warpgroups (2, 3: pingpong turns)

// Refinements (kernel template parameter kOpts, a bit set; launch.cu's kAllOpts is what
// the variants in use run: kHalfFirstTile; sm90_r0 runs none, sm90_loads all three, for A/Bs):
//   kHalfFirstTile: a consumer warpgroup whose rows see none of the upper 64 keys of the first-processed
//     (masked) key tile, e.g. warpgroup 0 on an aligned causal diagonal tile, computes only its lower
//     half (S m64n64, 4 P V k-steps): 1/4 of a tile less per causal unit;
//   kEarlyNext: produce()'s early next-unit loads (persistent only);
//   kWarpRelease: the consumers release Q / K / V stages once per warp (lane 0 after the warp's wgmma
//     wait; the empty barriers count 8 arrivals) instead of once per thread (256).
// Measured by interleaved A/B (docs/design/prefill_sm90.md): kHalfFirstTile gains on causal units; the other
// two together lose, down to -13% at h 16, so they are off in the variants in use.
inline constexpr int kHalfFirstTile = 1, kEarlyNext = 2, kWarpRelease = 4;

using prefill_io::clamp64;

// A unit of work: request b, head h, query rows [m0, m0 + m_rows) of the request, key tiles
// [0, n_tiles); keys < n_full are visible to every row of the tile (mask-free tiles end there).
// Unit x enumerates (request, head, query tile j) with j fastest. One unit per CTA (kPersistent
// false): tile q_tiles - 1 - j, the largest causal tiles of a head first, and the hardware hands the
// next CTA to the first free SM. Persistent: j runs zig-zag (q_tiles - 1, 0, q_tiles - 2, 1, ...) and a
// CTA takes units in pairs (2i, 2i + 1), (2i + 2G, 2i + 2G + 1), ... (G = gridDim.x): a causal pair
// (largest + smallest remaining tile of a head) costs q_tiles + 1 key tiles, so the static schedule
// is balanced and neighbouring CTAs still share a head's K / V in L2.
struct Unit {
  int64_t q_start, k_start;
  int h, sq, sk, m0, m_rows, n_tiles, n_full;

  __device__ Unit(const PrefillParams& p, int64_t x, bool zigzag) {
    using T = Traits;
    const int j = static_cast<int>(x % p.q_tiles);
    const int qt = !zigzag ? p.q_tiles - 1 - j : (j % 2 == 0 ? p.q_tiles - 1 - j / 2 : j / 2);
    h = static_cast<int>((x / p.q_tiles) % p.heads);
    const int64_t b = x / (static_cast<int64_t>(p.q_tiles) * p.heads);
    q_start = clamp64(__ldg(p.cu_q + b * p.cu_q_stride), 0, p.total_q);
    const int64_t q_end = clamp64(__ldg(p.cu_q + (b + 1) * p.cu_q_stride), q_start, p.total_q);
    k_start = clamp64(__ldg(p.cu_k + b * p.cu_k_stride), 0, p.total_k);
    const int64_t k_end = clamp64(__ldg(p.cu_k + (b + 1) * p.cu_k_stride), k_start, p.total_k);
    sq = static_cast<int>(q_end - q_start);
    sk = static_cast<int>(k_end - k_start);
    m0 = qt * T::kBlockM;
    m_rows = m0 < sq ? min(T::kBlockM, sq - m0) : 0;
    // Causal: row i sees keys < sk - sq + i + 1; the tile's last row sees the most, its first the fewest.
    const int n_end = p.causal ? static_cast<int>(clamp64(int64_t(sk) - sq + m0 + m_rows, 0, sk)) : sk;
    n_full = p.causal ? static_cast<int>(clamp64(int64_t(sk) - sq + m0 + 1, 0, sk)) : sk;
    n_tiles = (n_end + T::kBlockN - 1) / T::kBlockN;
  }
  // Units with key tiles load Q and K / V; the rest are skipped (m_rows 0) or written empty.
  __device__ bool loads() const { return m_rows > 0 && n_tiles > 0; }
};

using prefill_io::Schedule;

using Bars = prefill_io::Bars<Traits>;

// Producer thread: for every unit of the CTA that has keys, Q (once the consumers' last S of the
// previous unit has read the single Q buffer), then K / V of key tiles n_tiles - 1 down to 0 into the
// stage ring, whose stages and parities run on over units (it counts key tiles loaded so far).
// kEarlyNext (persistent): a unit's first K / V tile is issued before its Q (it waits only for a ring
// stage, which frees during the previous unit's last tiles, while Q waits for the previous unit's last
// S), and the next unit's Q is prefetched into L2 four tiles before the current unit's end, so that
// the Q load at the unit boundary is an L2 hit.
template <bool kPersistent, int kOpts>
__device__ __forceinline__ void produce(const PrefillParams& p, const Schedule<kPersistent>& sched,
                                        const CUtensorMap* q_map, const CUtensorMap* kn_map,
                                        const CUtensorMap* kp_map, const CUtensorMap* v_map, uint8_t* smem) {
  using T = Traits;
  constexpr bool kEarly = kPersistent && (kOpts & kEarlyNext);
  const Bars bar(smem);
  int it = 0, nu = 0;
  for (int64_t x = sched.first(); x < sched.units; x = sched.next(x)) {
    const Unit u(p, x, kPersistent);
    if (!u.loads()) continue;
    const int32_t kp_head = p.kp_stride_h == 0 ? 0 : u.h;  // one shared rope row: the map has one head
    // The next unit with keys (kEarly): its Q rows go to L2 while this unit still has 4 tiles to load.
    int64_t xn = sched.units;
    if constexpr (kEarly) {
      xn = sched.next(x);
      while (xn < sched.units && !Unit(p, xn, kPersistent).loads()) xn = sched.next(xn);
    }
    const int prefetch_at = u.n_tiles > 4 ? u.n_tiles - 4 : 0;
    auto load_kv = [&](int j) {  // processed tile j = key tile n_tiles - 1 - j
      const int stage = it % T::kStages;
      const uint32_t parity = (it / T::kStages) & 1;
      const int32_t krow = static_cast<int32_t>(u.k_start + (u.n_tiles - 1 - j) * T::kBlockN);
      uint8_t* k = smem + T::kOffK + stage * T::kKBytes;
      ptx::mbar_wait(&bar.k_empty[stage], parity ^ 1);
      ptx::mbar_arrive_expect_tx(&bar.k_full[stage], T::kKBytes);
      ptx::tma_load_3d(k, kn_map, &bar.k_full[stage], 0, u.h, krow);
      ptx::tma_load_3d(k + T::kPanelBytes, kn_map, &bar.k_full[stage], T::kPanelCols, u.h, krow);
      ptx::tma_load_3d(k + 2 * T::kPanelBytes, kp_map, &bar.k_full[stage], 0, kp_head, krow);
      uint8_t* v = smem + T::kOffV + stage * T::kVBytes;
      ptx::mbar_wait(&bar.v_empty[stage], parity ^ 1);
      ptx::mbar_arrive_expect_tx(&bar.v_full[stage], T::kVBytes);
      ptx::tma_load_3d(v, v_map, &bar.v_full[stage], 0, u.h, krow);
      ptx::tma_load_3d(v + T::kPanelBytes, v_map, &bar.v_full[stage], T::kPanelCols, u.h, krow);
      ++it;
      if (kEarly && j == prefetch_at && xn < sched.units) {
        const Unit n(p, xn, kPersistent);
        for (int c = 0; c < T::kQKPanels; ++c)
          ptx::tma_prefetch_l2_3d(q_map, c * T::kPanelCols, n.h, static_cast<int32_t>(n.q_start + n.m0));
      }
    };
    const int j0 = kEarly && nu > 0 ? 1 : 0;
    if (j0 == 1) load_kv(0);
    if (nu > 0) ptx::mbar_wait(bar.q_empty, (nu - 1) & 1);
    ptx::mbar_arrive_expect_tx(bar.q_full, T::kQBytes);
    for (int c = 0; c < T::kQKPanels; ++c)
      ptx::tma_load_3d(smem + T::kOffQ + c * T::kPanelBytes, q_map, bar.q_full, c * T::kPanelCols, u.h,
                       static_cast<int32_t>(u.q_start + u.m0));
    for (int j = j0; j < u.n_tiles; ++j) load_kv(j);
    ++nu;
  }
}

// Consumer state of one warpgroup: this thread's rows lo = 16w + g, hi = lo + 8 of the warpgroup's 64.
struct Consumer {
  float o[Traits::kDv / 2];  // O 64 x 128 fp32 (wgmma D layout)
  uint32_t pa[Traits::kBlockN / 16][4];  // P of the previous tile, bf16, as rs A fragments per k-step
  softmax::RowState st[2];
  int lim[2];  // largest visible key per row (-1: none)

  // S = Q K^T for this warpgroup's rows and the tile's first N keys (N 128: all; 64: the half a
  // warpgroup needs when its rows see none of the rest; s[N / 2 ..] are left as they were and masked):
  // 12 k-steps over the 3 panels.
  template <int N>
  __device__ __forceinline__ static void issue_s(float (&s)[Traits::kBlockN / 2], const uint8_t* sq,
                                                 const uint8_t* sk) {
    using T = Traits;
    float(&d)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(&s[0]);
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < T::kDqk / 16; ++ks) {
      const int off = (ks / 4) * T::kPanelBytes + (ks % 4) * 32;
      ptx::wgmma_bf16_ss<N>(d, ptx::desc_sw128_k_major(sq + off), ptx::desc_sw128_k_major(sk + off), ks > 0);
    }
    ptx::wgmma_commit_group();
  }
  // O += P V over the tile's first 16 kSteps keys (8: all); V MN-major, its two 64-column panels
  // kPanelBytes apart.
  template <int kSteps = Traits::kBlockN / 16>
  __device__ __forceinline__ void issue_pv(const uint8_t* sv) {
    ptx::wgmma_fence_operand(o);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) ptx::wgmma_fence_operand(pa[kk]);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
      ptx::wgmma_bf16_rs<Traits::kDv, ptx::Major::MN>(o, pa[kk],
                                                      ptx::desc_sw128_mn_major(sv + kk * 2048, Traits::kPanelBytes), true);
    ptx::wgmma_commit_group();
  }
  // Online softmax of key tile `tile` (prefill_io::softmax_tile): scores in s become probabilities; alpha: the O factors.
  __device__ __forceinline__ void softmax_tile(float (&s)[Traits::kBlockN / 2], int tile, bool mask, float scale_log2,
                                               int t4, float (&alpha)[2]) {
    prefill_io::softmax_tile<Traits::kBlockN, 0>(s, st, lim, tile, mask, scale_log2, t4, alpha);
  }
  __device__ __forceinline__ void to_pa(const float (&s)[Traits::kBlockN / 2]) {
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
      pa[kk][0] = ptx::pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = ptx::pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = ptx::pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = ptx::pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < Traits::kDv / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
  }
};

// Zeroes V rows [valid, 128) of the stage (keys past the request, loaded from its neighbour), by the
// 256 consumer threads (index ct), then hands the tile to wgmma (proxy fence + consumer barrier).
__device__ __forceinline__ void zero_v_tail(uint8_t* sv, int valid, int ct) {
  using T = Traits;
  const int rows = T::kBlockN - valid;
  for (int e = ct; e < T::kVPanels * rows * 8; e += T::kConsumerThreads) {
    const int panel = e / (rows * 8), rest = e % (rows * 8);
    *reinterpret_cast<uint4*>(sv + panel * T::kPanelBytes + (valid + rest / 8) * 128 + (rest % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
}

// kPingpong: the two consumer warpgroups take turns issuing their products (named barriers 2 and 3,
// FA3's inter-warpgroup schedule), so that one warpgroup's softmax runs under the other's wgmmas.
// kPersistent: gridDim.x <= #SMs CTAs loop over the units (Schedule); the next unit's Q and first
// K / V tiles load while the current one finishes. Else one CTA per unit.
// kOpts: the refinements (kHalfFirstTile, kEarlyNext, kWarpRelease), each selectable for an interleaved A/B.
template <bool kPingpong, bool kPersistent, int kOpts>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mha_prefill_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kn_map,
                            const __grid_constant__ CUtensorMap kp_map, const __grid_constant__ CUtensorMap v_map,
                            const PrefillParams p, const int64_t units) {
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
  constexpr int kReleases = (kOpts & kWarpRelease) ? T::kConsumerThreads / 32 : T::kConsumerThreads;  // per release
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar.q_full, 1);
    ptx::mbar_init(bar.q_empty, kReleases);
    for (int i = 0; i < T::kStages; ++i) {
      ptx::mbar_init(&bar.k_full[i], 1);
      ptx::mbar_init(&bar.v_full[i], 1);
      ptx::mbar_init(&bar.k_empty[i], kReleases);
      ptx::mbar_init(&bar.v_empty[i], kReleases);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_descriptor(&q_map);
      ptx::tma_prefetch_descriptor(&kn_map);
      ptx::tma_prefetch_descriptor(&kp_map);
      ptx::tma_prefetch_descriptor(&v_map);
      produce<kPersistent, kOpts>(p, sched, &q_map, &kn_map, &kp_map, &v_map, smem);
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
  // Turns (kPingpong): warpgroup c issues after barrier 2 + c and hands over on the other's; in every
  // unit warpgroup 1 opens warpgroup 0's first turn and skips its hand-over after its last turn
  // (arrivals match syncs unit by unit).
  auto turn_begin = [&] {
    if constexpr (kPingpong) ptx::named_barrier_sync(2 + c, T::kConsumerThreads);
  };
  auto turn_end = [&](bool last) {
    if constexpr (kPingpong)
      if (!(last && c == 1)) ptx::named_barrier_arrive(2 + (1 - c), T::kConsumerThreads);
  };

  // A stage or Q release after the warp's wgmma wait (kReleases arrivals complete it).
  auto release = [&](uint64_t* b) {
    if (!(kOpts & kWarpRelease) || lane == 0) ptx::mbar_arrive(b);
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
    // kHalfFirstTile: `half` when this warpgroup's last valid row (the one that sees the most keys) sees none of
    // keys 64..127 of the first-processed tile: its S and P V run on the lower 64 keys (the mask sets
    // the rest of S to -inf, so P is 0 there).
    bool half = false;  // constant false without kHalfFirstTile: one mainloop instance
    if constexpr ((kOpts & kHalfFirstTile) != 0) {
      const int i_first = u.m0 + 64 * c, i_last = min(i_first + 63, u.sq - 1);
      const int wg_lim = i_last < i_first ? -1 : p.causal ? min(u.sk - u.sq + i_last, u.sk - 1) : u.sk - 1;
      half = wg_lim < (u.n_tiles - 1) * T::kBlockN + T::kBlockN / 2;
    }
    // The first-processed tile (key tile n_tiles - 1, j = 0) holds keys past the request when
    // tail_valid < 128: its V rows from tail_valid on are zeroed before its P V (j = 1, or the last).
    const int tail_valid = u.sk - (u.n_tiles - 1) * T::kBlockN;
    auto zero_tail_if = [&](bool first_v) {
      if (first_v && tail_valid < T::kBlockN) {
        ptx::mbar_wait(&bar.v_full[stage_of(0)], parity_of(0));
        zero_v_tail(v_tile(stage_of(0)), tail_valid, ct);
      }
    };
    if (kPingpong && c == 1) ptx::named_barrier_arrive(2, T::kConsumerThreads);

    // The unit's products, as one straight pipeline per kHalf: a branch between a wgmma's issue and its
    // wait (e.g. choosing the first tile's P V length inside the loop) makes ptxas stall the products
    // it has in flight there, silently (a kHalfFirstTile built that way measured 22% slower).
    // So the choice is made once per unit, around a whole pipeline whose every branch point has no
    // product in flight.
    auto mainloop = [&](auto half_c) {
      constexpr bool kHalf = decltype(half_c)::value;
      float s[T::kBlockN / 2];
      float alpha[2];
      ptx::mbar_wait(bar.q_full, nu & 1);
      ptx::mbar_wait(&bar.k_full[stage_of(0)], parity_of(0));
      turn_begin();
      Consumer::issue_s<kHalf ? T::kBlockN / 2 : T::kBlockN>(s, sq, k_tile(stage_of(0)));
      turn_end(false);
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(s);
      release(&bar.k_empty[stage_of(0)]);
      if (u.n_tiles == 1) release(bar.q_empty);  // the unit's last S has read Q
      cs.softmax_tile(s, u.n_tiles - 1, needs_mask(u.n_tiles - 1), p.scale_log2, t4, alpha);
      cs.to_pa(s);

      // Processed tile j >= 1: S_j, and P V of tile j - 1 over its first 16 kPv keys.
      auto tile_step = [&](int j, auto pv_c) {
        constexpr int kPv = decltype(pv_c)::value;
        const int stage = stage_of(j), prev = stage_of(j - 1), tile = u.n_tiles - 1 - j;
        zero_tail_if(j == 1);
        ptx::mbar_wait(&bar.k_full[stage], parity_of(j));
        ptx::mbar_wait(&bar.v_full[prev], parity_of(j - 1));
        turn_begin();
        Consumer::issue_s<T::kBlockN>(s, sq, k_tile(stage));
        cs.template issue_pv<kPv>(v_tile(prev));
        turn_end(false);
        ptx::wgmma_wait_group<1>();
        ptx::wgmma_fence_operand(s);
        release(&bar.k_empty[stage]);
        if (tile == 0) release(bar.q_empty);
        cs.softmax_tile(s, tile, needs_mask(tile), p.scale_log2, t4, alpha);
        ptx::wgmma_wait_group<0>();
        ptx::wgmma_fence_operand(cs.o);
        release(&bar.v_empty[prev]);
        cs.rescale_o(alpha);
        cs.to_pa(s);
      };
      if (u.n_tiles > 1) tile_step(1, std::integral_constant<int, (kHalf ? T::kBlockN / 32 : T::kBlockN / 16)>{});
      for (int j = 2; j < u.n_tiles; ++j) tile_step(j, std::integral_constant<int, T::kBlockN / 16>{});

      // The last tile's P V (all 8 k-steps even after a half first tile: its upper P is 0 and its V rows
      // are real keys or zeroed, so the product is exact, and one sequence keeps this straight).
      const int last = stage_of(u.n_tiles - 1);
      zero_tail_if(u.n_tiles == 1);
      ptx::mbar_wait(&bar.v_full[last], parity_of(u.n_tiles - 1));
      turn_begin();
      cs.issue_pv(v_tile(last));
      turn_end(true);
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(cs.o);
      release(&bar.v_empty[last]);
    };
    if (half)
      mainloop(std::true_type{});
    else
      mainloop(std::false_type{});

    // Epilogue: full row sums, O / l, LSE.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      cs.st[hf].sum = softmax::quad_sum(cs.st[hf].sum);
      const int i = u.m0 + r_lo + 8 * hf;
      if (i >= u.sq) continue;
      prefill_io::store_row<Traits::kDv>(p, u, i, cs.o, hf, cs.st[hf].inv_sum(), t4, pairs);
      if (p.lse && t4 == 0) p.lse[u.h * p.lse_stride_h + (u.q_start + i) * p.lse_stride_t] = cs.st[hf].lse();
    }
    it0 += u.n_tiles;
    ++nu;
  }
}

}  // namespace mla::cuda::prefill_sm90
