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
// X, 8 rows per round, then all 256 threads write the rows).
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
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/small/traits.cuh"

namespace mla::cuda::decode_sm90 {


// Src: the key source (source.cuh): PagedKeys (mqa_decode over a bf16 cache) or GatherKeys<bf16> (sparse_mqa's
// bf16 rows).
template <int N, class Src>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_small_kernel(const __grid_constant__ CUtensorMap kv_map, const DecodeSm90Params p) {
  using T = Traits;
  using L = SmallTraits<N>;
  constexpr int kRows = N / 4;  // query rows per thread: 8j + 2t + e, j < N / 8, e < 2
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kStages;
  auto* win = reinterpret_cast<balance::Window*>(smem + L::kOffSched);  // paged source only
  static_assert(L::template smem_bytes<Src>() <= 227 * 1024, "shared memory per block on sm_90");
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();  // the combine (a dependent launch) may take the SMs this grid leaves free
  Unit one{};  // the uniform schedule's unit
  const bool balanced = Src::kTma && p.balanced;
  if (balanced) balanced_window(p, win, reinterpret_cast<int64_t*>(smem + L::kOffSched + 64));
  else one = Unit(p, Src::kIndexed);
  if (!start_roles<L, Src>(p, &kv_map, one, !balanced, smem, [&](int warp, int lane) {
        produce<L, Src>(p, &kv_map, win, smem, warp, lane);
      }))
    return;
  const int wg = ptx::warpgroup_index();

  const MqaRowParams& rp = p.rows;
  const int c = wg - 1, ct = threadIdx.x - 128, wt = threadIdx.x & 127;
  const int w = ptx::warp_idx_in_warpgroup(), lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  const int wg_bar = 2 + c;  // named barrier of this warpgroup alone
  uint8_t* sQ = smem + L::kOffQ;
  uint8_t* sP = smem + L::kOffP + c * L::kPBytes;
  float* sRed = reinterpret_cast<float*>(smem + L::kOffRed) + c * 4 * N;
  float* sML = reinterpret_cast<float*>(smem + L::kOffML);
  // Epilogue exchange X: its own region for the paged source, else the drained KV stage 1.
  float* xo = reinterpret_cast<float*>(smem + (Src::kTma ? L::kOffX : L::kOffK + T::kTileBytes));
  int* sLim = reinterpret_cast<int*>(smem + L::kOffLim);
  const uint64_t* sMask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask);
  uint8_t* sK = smem + L::kOffK + c * T::kTileBytes;
  const int key_lo = 16 * w + g8, key_hi = key_lo + 8;  // this thread's keys of a tile (S^T rows)

  // One unit: tiles base .. base + u.n_tiles - 1 of the CTA's tile sequence (tile `it` in stage it % 2 =
  // consumer c's); seg: its segment of the balanced schedule.
  auto run_unit = [&](const Unit& u, const balance::Segment& seg, int base) {
    if (balanced && ct == 0 && seg.t0 == 0) {  // the request's first CTA: its partial slots for the combine
      p.ws_meta[2 * u.g] = static_cast<int32_t>(seg.first_slot);
      p.ws_meta[2 * u.g + 1] = static_cast<int32_t>(seg.splits);
    }
    if (u.n_tiles == 0) {  // balanced schedule: an empty request (out 0, lse -inf)
      if (c == 0) write_empty_unit(p, u, wt, 128);
      return;
    }
    // Q rows [row0, row0 + N) into N-row swizzled panels (zeros past the rows). Both warpgroups left the
    // previous unit's products (the epilogue's last barrier), so sQ is free.
    if (Src::kTma && N <= 16)  // N 32 keeps the loop: batched (groups of 3 or 5) it spilled 116 bytes
      load_q_panels_batched<N, T::kConsumerThreads>(rp, u.g, u.row0, u.m_rows, L::kQPanelBytes, sQ, ct);
    else load_q_panels(rp, u.g, u.row0, u.m_rows, N, T::kPanels, L::kQPanelBytes, sQ, ct, T::kConsumerThreads);
    if (ct < N) sLim[ct] = query_row_limit(p, u, u.row0 + ct);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    MLA_DECODE_TRACE_EVENT(3, 128, true);

    // Each query row's largest visible key, in shared memory (published by the barrier above; registers
    // are the scarce resource at N 32). This thread's rows: n(rr) = 8 (rr / 2) + 2 t4 + rr % 2.
    float m_run[kRows], l_part[kRows];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      m_run[rr] = -INFINITY;
      l_part[rr] = 0.0f;
    }
    const float sl2 = rp.scale_log2 * code_scale<Src>(p);  // exact-code sources: S times scale * 2^56
    float o[8][N / 2];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) o[mb][i] = 0.0f;

    for (int it = base + ((c - base) & 1); it < base + u.n_tiles; it += 2) {
      const uint32_t parity = (it / 2) & 1;
      const int k0 = u.key_begin + (it - base) * T::kBlockN;
      wait_full<Src>(&full[c], parity);
      const uint64_t mask = sMask[c];
      if (!Src::kZeroFilled && mask != ~uint64_t(0)) {  // keys not loaded: zero them before any wgmma reads the tile
        zero_unloaded_rows(sK, mask, wt, 128);
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_sync(wg_bar, 128);
      }

      // ---- S^T = K Q^T ----
      float s[N / 2];
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

      // ---- mask, column (= query row) max over the 64 keys ----
      const bool in_lo = (mask >> key_lo) & 1, in_hi = (mask >> key_hi) & 1;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int i = 4 * (rr / 2) + rr % 2;  // s[i]: (key_lo, row rr), s[i + 2]: (key_hi, row rr)
        const int lim = sLim[8 * (rr / 2) + 2 * t4 + rr % 2];
        s[i] = in_lo && k0 + key_lo <= lim ? s[i] * sl2 : -INFINITY;
        s[i + 2] = in_hi && k0 + key_hi <= lim ? s[i + 2] * sl2 : -INFINITY;
      }
      float alpha[kRows], p_lo[kRows], p_hi[kRows];
      small_tile_softmax<N>(s, m_run, l_part, alpha, p_lo, p_hi, sRed, w, g8, t4, wg_bar);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {  // P^T [n][key] bf16 in the swizzled K-major panel: key k at chunk k / 8
        const int n = 8 * (rr / 2) + 2 * t4 + rr % 2;
        *reinterpret_cast<uint16_t*>(sP + swz(n, key_lo >> 3) + 2 * (key_lo & 7)) = dev::float_to_bf16(p_lo[rr]);
        *reinterpret_cast<uint16_t*>(sP + swz(n, key_hi >> 3) + 2 * (key_hi & 7)) = dev::float_to_bf16(p_hi[rr]);
      }
      small_rescale_o<N>(o, alpha);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(wg_bar, 128);

      // ---- O^T += V^T P^T: 8 blocks of 64 value columns ----
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) ptx::wgmma_fence_operand(o[mb]);
      ptx::wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
        for (int ks = 0; ks < T::kBlockN / 16; ++ks) {
          const uint64_t da = ptx::desc_sw128_mn_major(sK + mb * T::kPanelBytes + ks * 2048, T::kPanelBytes);
          const uint64_t db = ptx::desc_sw128_k_major(sP + ks * 32);
          ptx::wgmma_bf16_ss<N, ptx::Major::MN, ptx::Major::K>(o[mb], da, db, true);
        }
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) ptx::wgmma_fence_operand(o[mb]);
      ptx::mbar_arrive(&empty[c]);
    }

    MLA_DECODE_TRACE_EVENT(5, 128);
    small_epilogue<N, L::kStageRows>(p, u, o, m_run, l_part, sRed, sML, xo, code_scale<Src>(p), c, wg_bar,
                                   [&](int mb, int i) { return 64 * mb + 16 * w + g8 + 8 * ((i >> 1) & 1); });
    MLA_DECODE_TRACE_EVENT(6, 128);
  };

  if constexpr (!Src::kTma) {  // sparse_mqa: the uniform schedule's one unit (a loop here made ptxas spill)
    run_unit(one, balance::Segment{one.g, 0, 0, 1, -1, -1}, 0);
  } else {  // the CTA's units in order
    Units<false> units(p, win);
    Unit u;
    balance::Segment seg;
    [[maybe_unused]] int n_units = 0;
    for (int base = 0; units.next(p, win, u, seg); base += u.n_tiles, ++n_units) run_unit(u, seg, base);
    MLA_DECODE_TRACE_VALUE(11, 128, static_cast<unsigned long long>(n_units));
  }
  MLA_DECODE_TRACE_EVENT(7, 128);
}

}  // namespace mla::cuda::decode_sm90
