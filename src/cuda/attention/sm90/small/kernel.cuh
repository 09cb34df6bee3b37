// SPDX-License-Identifier: Apache-2.0
#pragma once
// sm90 mqa_decode for s_q * h_q <= 32 query rows (h 8 / 16 / 32 at s_q 1, h 16 at s_q 2, ...): the
// swapped products, so that the rows are wgmma's N (8, 16 or 32) and pay no padding to 64.
//
//   S^T[64 keys x N] = K Q^T          wgmma m64nNk16 x 36, A = the KV tile (K-major), B = Q (K-major)
//   O^T[512 x N]    += V^T P^T        8 x wgmma m64nNk16 x 4, A = V^T (the same tile, MN-major),
//                                     B = P^T (bf16 [N rows][64 keys], K-major, this warpgroup's smem)
//
// Warp roles: warpgroup 0 is the producer (source.cuh's produce: TMA from warp 0, or gathering warps
// s and s + 2 for stage s); the consumer warpgroups c = 0, 1
// take alternate KV tiles (stage c) and run independent online softmaxes (their own
// running max, sum and O^T: 4N fp32 registers) with no per-tile synchronisation between them; the row
// max of a tile is reduced over its 64 keys = 4 warps through smem (named barrier 2 + c). The epilogue
// merges the two states (m, l, O) through smem (tile_io.cuh small_epilogue: both warpgroups' scaled O^T staged in
// X, 8 rows per round, then all 256 threads write the rows), or, under p.wg_partials (a split unit of the uniform
// schedule), each warpgroup writes its own state as a partial of the combine (tile_io.cuh small_wg_partial).
//
// Units (pipeline.cuh Units): with the uniform split-KV schedule the CTA runs one (split, request); with
// the balanced schedule (p.balanced, core/decode_balance.h) it first finds its window of the cost line
// (a block scan over the device seq_lens) and then runs its segments one after the other: the tiles of
// all its segments form one sequence for the producer (tile `it` into stage it % 2, so the next
// segment's tiles stream in during an epilogue), and the consumers reload Q and reset their softmax
// state per segment.
//
// Shared memory: Q 9 * N * 128 (<= 36 KiB) + 2 KV stages x 72 KiB + P^T 2 x max(N * 128, 1 KiB) + small
// tables, then the source's own region: paged: X (16 / 32 / 32 KiB for N 8 / 16 / 32) + the schedule
// window (<= 223 KiB in all). Each stage feeds one warpgroup:
// the producer refills stage c while warpgroup 1 - c computes.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/acc_frag.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/small/traits.cuh"

namespace mla::cuda::decode_sm90 {

// The query rows by TMA (p.q_tma; issue_q_rows) exist for N 32 over TMA keys, which otherwise load them by the
// consumers' row loop; N <= 16 keeps the consumers' batched loads, which measured faster than the copy there (the
// copy's wait sits in front of the first product; docs/design/attention_sm90.md, the row-stationary kernel).
template <int N, class Src>
inline constexpr bool kQByTma = Src::kTma && N > 16;

// One consumer warpgroup c of the row-stationary kernel, in phases: prologue (the unit's Q rows and limits, the
// softmax state reset), mainloop (consumer c's tiles c, c + 2, ... of the unit: per tile wait_tile, scores, softmax,
// pv) and epilogue (tile_io.cuh small_epilogue, merging both warpgroups' states). The thread's fixed addresses are
// members, set once per CTA; the softmax state (m_run, l_part, O^T) is reset per unit. Fragments (S^T, O^T: A rows
// = keys or value columns, query rows as wgmma N) through AccFrag<N>.
template <int N, class Src>
struct SmallConsumer {
  using T = Traits;
  using L = SmallTraits<N>;
  using Frag = AccFrag<N>;
  static constexpr int kRows = Frag::kRows;  // query row slots per thread

  uint64_t* full;
  uint64_t* empty;
  int c, ct, wt, w, lane, g8, t4;
  int wg_bar;  // named barrier of this warpgroup alone
  uint8_t* sQ;
  uint8_t* sP;
  float* sRed;
  float* sML;
  float* xo;  // epilogue exchange X: its own region for the paged source, else the drained KV stage 1
  int* sLim;  // each query row's largest visible key (shared memory: registers are the scarce resource at N 32)
  const uint64_t* sMask;
  uint8_t* sK;
  int key_lo, key_hi;  // this thread's keys of a tile (S^T rows rho_lo, rho_hi)
  // The unit's softmax state: running maximum and sums, O^T. A local of run_unit passed to the phases (as members of
  // the consumer the same code compiled to different SASS).
  struct State {
    float m_run[kRows], l_part[kRows];
    float sl2;  // the softmax scale (log2); exact-code sources: times scale * 2^56
    float o[8][N / 2];
  };

  __device__ __forceinline__ SmallConsumer(uint8_t* smem, uint64_t* full_, uint64_t* empty_)
      : full(full_), empty(empty_) {
    c = ptx::warpgroup_index() - 1;
    ct = threadIdx.x - 128;
    wt = threadIdx.x & 127;
    w = ptx::warp_idx_in_warpgroup();
    lane = threadIdx.x & 31;
    g8 = lane >> 2;
    t4 = lane & 3;
    wg_bar = 2 + c;
    sQ = smem + L::kOffQ;
    sP = smem + L::kOffP + c * L::kPBytes;
    sRed = reinterpret_cast<float*>(smem + L::kOffRed) + c * 4 * N;
    sML = reinterpret_cast<float*>(smem + L::kOffML);
    xo = reinterpret_cast<float*>(smem + (Src::kTma ? L::kOffX : L::kOffK + T::kTileBytes));
    sLim = reinterpret_cast<int*>(smem + L::kOffLim);
    sMask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask);
    sK = smem + L::kOffK + c * T::kTileBytes;
    key_lo = 16 * w + g8;
    key_hi = key_lo + 8;
  }

  // Q rows [row0, row0 + N) into N-row swizzled panels (zeros past the rows), the rows' limits, the softmax state.
  // Both warpgroups left the previous unit's products (the epilogue's last barrier), so sQ is free.
  __device__ __forceinline__ void prologue(const DecodeSm90Params& p, const Unit& u, State& st) {
    const MqaRowParams& rp = p.rows;
    if (kQByTma<N, Src> && p.q_tma)  // the producer's boxes (issue_q_rows): one phase, the uniform unit
      ptx::mbar_wait(reinterpret_cast<uint64_t*>(sQ - L::kOffQ + L::kOffQBar), 0);
    else if (Src::kTma && N <= 16)  // N 32 keeps the loop: batched (groups of 3 or 5) it spilled 116 bytes
      load_q_panels_batched<N, T::kConsumerThreads>(rp, u.g, u.row0, u.m_rows, L::kQPanelBytes, sQ, ct);
    else load_q_panels(rp, u.g, u.row0, u.m_rows, N, T::kPanels, L::kQPanelBytes, sQ, ct, T::kConsumerThreads);
    if (ct < N) sLim[ct] = query_row_limit(p, u, u.row0 + ct);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    MLA_DECODE_TRACE_EVENT(3, 128, true);
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      st.m_run[rr] = -INFINITY;
      st.l_part[rr] = 0.0f;
    }
    st.sl2 = rp.scale_log2 * code_scale<Src>(p);
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) st.o[mb][i] = 0.0f;
  }

  // Waits for the tile in stage c and returns its key mask; keys not loaded are zeroed before any wgmma reads the
  // tile (sources that do not zero-fill them).
  __device__ __forceinline__ uint64_t wait_tile(uint32_t parity) {
    wait_full<Src>(&full[c], parity);
    const uint64_t mask = sMask[c];
    if (!Src::kZeroFilled && mask != ~uint64_t(0)) {
      zero_unloaded_rows(sK, mask, wt, 128);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(wg_bar, 128);
    }
    return mask;
  }

  // S^T = K Q^T over the 36 k-steps, retired.
  __device__ __forceinline__ void scores(float (&s)[N / 2]) {
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < T::kDqk / 16; ++ks) {
      const uint64_t da = ptx::desc_sw128_k_major(sK + (ks / 4) * T::kPanelBytes + (ks % 4) * 32);
      const uint64_t db = ptx::desc_sw128_k_major(sQ + (ks / 4) * L::kQPanelBytes + (ks % 4) * 32);
      ptx::wgmma_bf16_ss<N>(s, da, db, ks > 0);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(s);
  }

  // The online-softmax step of the tile at key k0: mask (loaded and visible keys), column (= query row) max over
  // the 64 keys, P^T into this warpgroup's panel, O^T rescaled; P^T published to the warpgroup's async proxy.
  __device__ __forceinline__ void softmax(State& st, float (&s)[N / 2], uint64_t mask, int k0) {
    const bool in_lo = (mask >> key_lo) & 1, in_hi = (mask >> key_hi) & 1;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int i = Frag::lo(rr);  // s[lo]: (key_lo, row rr), s[hi]: (key_hi, row rr)
      const int lim = sLim[Frag::row(rr, t4)];
      s[i] = in_lo && k0 + key_lo <= lim ? s[i] * st.sl2 : -INFINITY;
      s[Frag::hi(rr)] = in_hi && k0 + key_hi <= lim ? s[Frag::hi(rr)] * st.sl2 : -INFINITY;
    }
    float alpha[kRows], p_lo[kRows], p_hi[kRows];
    small_tile_softmax<N>(s, st.m_run, st.l_part, alpha, p_lo, p_hi, sRed, w, g8, t4, wg_bar);
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {  // P^T [n][key] bf16 in the swizzled K-major panel: key k at chunk k / 8
      const int n = Frag::row(rr, t4);
      *reinterpret_cast<uint16_t*>(sP + swz(n, key_lo >> 3) + 2 * (key_lo & 7)) = dev::float_to_bf16(p_lo[rr]);
      *reinterpret_cast<uint16_t*>(sP + swz(n, key_hi >> 3) + 2 * (key_hi & 7)) = dev::float_to_bf16(p_hi[rr]);
    }
    small_rescale_o<N>(st.o, alpha);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(wg_bar, 128);
  }

  // O^T += V^T P^T: 8 blocks of 64 value columns, retired; stage c released.
  __device__ __forceinline__ void pv(State& st) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) ptx::wgmma_fence_operand(st.o[mb]);
    ptx::wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
      for (int ks = 0; ks < T::kBlockN / 16; ++ks) {
        const uint64_t da = ptx::desc_sw128_mn_major(sK + mb * T::kPanelBytes + ks * 2048, T::kPanelBytes);
        const uint64_t db = ptx::desc_sw128_k_major(sP + ks * 32);
        ptx::wgmma_bf16_ss<N, ptx::Major::MN, ptx::Major::K>(st.o[mb], da, db, true);
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) ptx::wgmma_fence_operand(st.o[mb]);
    ptx::mbar_arrive(&empty[c]);
  }

  // Tiles base .. base + u.n_tiles - 1 of the CTA's tile sequence (tile `it` in stage it % 2 = consumer c's).
  __device__ __forceinline__ void mainloop(const Unit& u, int base, State& st) {
    for (int it = base + ((c - base) & 1); it < base + u.n_tiles; it += 2) {
      const uint32_t parity = (it / 2) & 1;
      const int k0 = u.key_begin + (it - base) * T::kBlockN;
      const uint64_t mask = wait_tile(parity);
      float s[N / 2];
      scores(s);
      softmax(st, s, mask, k0);
      pv(st);
    }
  }

  __device__ __forceinline__ void epilogue(const DecodeSm90Params& p, const Unit& u, const State& st) {
    MLA_DECODE_TRACE_EVENT(5, 128);
    const auto col_of = [rho_lo = key_lo](int mb, int i) {  // value column = A row
      return 64 * mb + rho_lo + 8 * Frag::at_hi(i);
    };
    if (p.wg_partials && u.ws_slot >= 0)
      small_wg_partial<N>(p, u, st.o, st.m_run, st.l_part, sRed, code_scale<Src>(p), c, wg_bar, col_of);
    else
      small_epilogue<N, L::kStageRows>(p, u, st.o, st.m_run, st.l_part, sRed, sML, xo, code_scale<Src>(p), c, wg_bar,
                                       col_of);
    MLA_DECODE_TRACE_EVENT(6, 128);
  }

  // One unit (seg: its segment of the balanced schedule), its tiles from `base` of the CTA's tile sequence.
  __device__ __forceinline__ void run_unit(const DecodeSm90Params& p, const Unit& u, const balance::Segment& seg,
                                           int base, bool balanced) {
    if (balanced && ct == 0 && seg.t0 == 0) {  // the request's first CTA: its partial slots for the combine
      p.ws_meta[2 * u.g] = static_cast<int32_t>(seg.first_slot);
      p.ws_meta[2 * u.g + 1] = static_cast<int32_t>(seg.splits);
    }
    if (u.n_tiles == 0) {  // balanced schedule: an empty request (out 0, lse -inf)
      if (c == 0) write_empty_unit(p, u, wt, 128);
      return;
    }
    State st;
    prologue(p, u, st);
    mainloop(u, base, st);
    epilogue(p, u, st);
  }
};

// The small kernel's tensor maps (a __grid_constant__ parameter; TMA takes their addresses): the paged cache, and the
// query rows as [b][s_q][h_q][576] bf16 boxes of 64 columns x Hb heads x Ib query positions (Hb Ib = N; mqa_decode.cu
// small_q_map), used when p.q_tma.
struct SmallMaps {
  CUtensorMap kv;
  CUtensorMap q;
};

// The unit's N query rows by TMA into the nine Q panels (p.q_tma: the uniform schedule, row tiles that are whole
// heads x positions rectangles), completing on the Q barrier with the full boxes' bytes (rows past the request's
// positions are zero-filled by the copy and counted). One thread, right after the role split.
template <int N>
__device__ __forceinline__ void issue_q_rows(const DecodeSm90Params& p, const CUtensorMap* q_map, const Unit& u,
                                             uint8_t* smem) {
  using L = SmallTraits<N>;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L::kOffQBar);
  ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(Traits::kPanels * L::kQPanelBytes));
  const int h0 = u.row0 % p.rows.h_q, i0 = u.row0 / p.rows.h_q;
#pragma unroll 1
  for (int c = 0; c < Traits::kPanels; ++c)
    ptx::tma_load_4d(smem + L::kOffQ + c * L::kQPanelBytes, q_map, bar, c * Traits::kPanelCols, h0, i0,
                     static_cast<int32_t>(u.g));
}

// Src: the key source (source.cuh): PagedKeys (mqa_decode over a bf16 cache) or GatherKeys<bf16> (sparse_mqa's
// bf16 rows). The producer is warpgroup 0 (source.cuh produce); the consumers run SmallConsumer over the CTA's
// units.
template <int N, class Src>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_small_kernel(const __grid_constant__ SmallMaps maps, const DecodeSm90Params p) {
  using L = SmallTraits<N>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kStages;
  auto* win = reinterpret_cast<balance::Window*>(smem + L::kOffSched);  // paged source only
  static_assert(L::template smem_bytes<Src>() <= 227 * 1024, "shared memory per block on sm_90");
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();  // the combine (a dependent launch) may take the SMs this grid leaves free
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  MLA_DECODE_TRACE_EVENT(kTracePrologueBase, 0);
  Unit one{};  // the uniform schedule's unit
  const bool balanced = Src::kTma && p.balanced;
  if (balanced) balanced_window(p, win, reinterpret_cast<int64_t*>(smem + L::kOffSched + 64));
  else one = Unit(p, Src::kIndexed);
  MLA_DECODE_TRACE_EVENT(kTracePrologueBase + 1, 0);
  if (!start_roles<L, Src>(p, &maps.kv, one, !balanced, smem, [&](int warp, int lane) {
        if constexpr (kQByTma<N, Src>)
          if (p.q_tma && warp == 0 && lane == 0) issue_q_rows<N>(p, &maps.q, one, smem);
        produce<L, Src>(p, &maps.kv, win, smem, warp, lane, one, !balanced);
      }))
    return;
  SmallConsumer<N, Src> cons(smem, full, empty);
  if constexpr (!Src::kTma) {  // sparse_mqa: the uniform schedule's one unit (a loop here made ptxas spill)
    cons.run_unit(p, one, balance::Segment{one.g, 0, 0, 1, -1, -1}, 0, balanced);
  } else {  // the CTA's units in order
    Units<false> units(p, win, one, !balanced);
    Unit u;
    balance::Segment seg;
    [[maybe_unused]] int n_units = 0;
    for (int base = 0; units.next(p, win, u, seg); base += u.n_tiles, ++n_units)
      cons.run_unit(p, u, seg, base, balanced);
    MLA_DECODE_TRACE_VALUE(11, 128, static_cast<unsigned long long>(n_units));
  }
  MLA_DECODE_TRACE_EVENT(7, 128);
}

}  // namespace mla::cuda::decode_sm90
