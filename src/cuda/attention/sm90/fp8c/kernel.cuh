// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fp8-compute kernel: mqa_decode over a paged fp8 per-tensor cache at 64-row tiles with the products on the fp8
// tensor cores (e4m3 x e4m3, fp32 accumulate), design C1 of docs/design/fp8_64row_plan.md. Q and P are rounded to
// e4m3, so the results are within the fp8-compute bound of docs/SEMANTICS.md, not the exact-code one: the kernel runs
// only when the caller asks for fp8 compute (mqa_decode's fp8_compute).
//
// Roles (384 threads, __launch_bounds__(384, 1), one CTA per (row tile, split, request)):
//   warpgroup 0, loader and transposer (64 registers): warp 0 issues each 64-key tile's codes by TMA through the
//     block table (five boxes of [rows][128 bytes] a page run, 128-byte swizzle; the fifth box's bytes past the
//     576-byte row read as zeros) into a ring of two stages, and publishes the tile's loaded-key mask; then all four
//     warps write V^T_L, value columns 0..255 of the tile as rows of keys (fp8c/transpose.cuh: at vt_position, keys
//     not loaded as zeros), into one of two V^T buffers, fence the proxy and arrive on vt_full.
//   warpgroups 1 and 2 first quantize the unit's Q rows together (q_e4m3: e4m3(q * 2^e_r), 2^e_r the power of two
//     that brings the row's largest |q| into (224, 448]), straight from global memory into five e4m3 panels.
//   warpgroup 1, S (240): per tile S = Q K^T (18 e4m3 ss m64n64k32), times 2^-e_r, the
//     cache scale and the softmax scale, the key mask and causal limits, the running maximum, P = 2^(S - m + 8) (so
//     the largest weight is 256 and weights down to 2^-17 of it stay representable) as e4m3 A fragments at
//     vt_position, O_L *= a and O_L += P V^T_L (two rs m64n256k32); P and the rows' factors go to shared memory.
//   warpgroup 2, R (200): writes V^T_R (value columns 256..511) of each tile itself while S works on it (the
//     transposition split in halves: the design note's section 6c), then O_R *= a and
//     O_R += P V^T_R (two ss m64n256k32).
// The row sums come from P in fp32 (before its rounding), so the LSE is that of the quantized q's scores; O's weights
// are P's e4m3 values. The epilogue divides by the row sum and multiplies by the cache scale.
//
// Protocol, stage s = i % 2 and V^T / P buffer b = i % 2 for tile i, parity (i / 2) & 1:
//   full[s]       TMA bytes of tile i (warp 0's lane 0 arrives with them after writing the mask).
//   empty[s]      384 arrivals: S's threads once S of tile i retired and its mask was read, the loader's and R's once
//                 their V^T halves of tile i are written. Warp 0 waits it (parity flipped) before issuing tile i + 2.
//   vt_full[b]    128 loader arrivals after V^T_L of tile i and the proxy fence; S waits it before P V_L.
//   vt_empty[b]   256 arrivals: S's threads once O_L's product of tile i retired (seen at tile i + 1), R's once O_R's
//                 did. The loader waits it (parity flipped) before writing V^T_L of tile i + 2 into buffer b.
//   kBarQ         S's and R's 256 threads: Q quantized (q_e4m3) and fenced.
//   kBarR         R's own: its V^T_R of the tile written by all its threads (and fenced) before its products.
//   kBarP + b     S arrives after P and the factors of tile i, R syncs.
//   (S writes tile i's P and factors into buffer b after vt_full[b] of tile i, which the loader arrived on after
//   vt_empty[b] of tile i - 2, R's release included: R has read buffer b's previous contents by then.)
//   kBarEnd       S arrives after the row sums and maxima, R syncs before its epilogue.
#include <cuda.h>

#include <climits>
#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/exact_codes.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"
#include "cuda/attention/sm90/fp8c/traits.cuh"
#include "cuda/attention/sm90/fp8c/transpose.cuh"

namespace mla::cuda::decode_sm90 {

namespace fp8c {

using T = Traits;
using L = Fp8cTraits;

// Shared-memory views of the plan (Fp8cTraits).
struct Smem {
  uint8_t* base;
  __device__ __forceinline__ uint8_t* q() const { return base + L::kOffQ; }
  __device__ __forceinline__ uint8_t* stage(int s) const { return base + L::kOffK + s * L::kStageBytes; }
  __device__ __forceinline__ uint8_t* vt(int b) const { return base + L::kOffVt + b * VtLayout::kBytes; }
  __device__ __forceinline__ uint8_t* p_panel(int b) const { return base + L::kOffP + b * L::kPBytes; }
  __device__ __forceinline__ float* factors(int b) const { return reinterpret_cast<float*>(base + L::kOffA) + b * T::kBlockM; }
  __device__ __forceinline__ float* sums() const { return reinterpret_cast<float*>(base + L::kOffL); }
  __device__ __forceinline__ float* maxima() const { return sums() + T::kBlockM; }
  __device__ __forceinline__ float* q_scales() const { return reinterpret_cast<float*>(base + L::kOffQScale); }
  __device__ __forceinline__ uint64_t* mask_slot(int s) const { return reinterpret_cast<uint64_t*>(base + L::kOffMask) + s; }
  __device__ __forceinline__ uint64_t mask(int s) const { return *mask_slot(s); }
  __device__ __forceinline__ const uint8_t* zero() const { return base + L::kOffZero; }
  __device__ __forceinline__ uint64_t* bar(int i) const { return reinterpret_cast<uint64_t*>(base + L::kOffBar) + i; }
  __device__ __forceinline__ uint64_t* full(int s) const { return bar(s); }
  __device__ __forceinline__ uint64_t* empty(int s) const { return bar(L::kStages + s); }
  __device__ __forceinline__ uint64_t* vt_full(int b) const { return bar(2 * L::kStages + b); }
  __device__ __forceinline__ uint64_t* vt_empty(int b) const { return bar(2 * L::kStages + 2 + b); }
};

// ---- the loader and transposer ------------------------------------------------------------------------------------

// Warp 0: tile i's codes by TMA into stage i % 2 (after the stage's release), its key mask published first.
__device__ __forceinline__ void issue_tile(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                           const Smem& sm, int i, int lane) {
  const int s = i & 1;
  const PagedKeys::Tile tile(p, u, u.key_begin + i * T::kBlockN, 0, lane);
  ptx::mbar_wait(sm.empty(s), ((i >> 1) & 1) ^ 1);
  tile.begin(sm.mask_slot(s), nullptr);
  tile.announce(p, sm.full(s), L::kPanels);
  uint8_t* dst = sm.stage(s);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!tile.load[h]) continue;
#pragma unroll
    for (int c = 0; c < L::kPanels; ++c)
      ptx::tma_load_3d(dst + c * T::kPanelBytes + tile.off[h], map, sm.full(s), c * 128, tile.row[h], tile.blk[h]);
  }
}

__device__ __forceinline__ void loader(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                       const Smem& sm) {
  const int warp = ptx::warp_idx_in_warpgroup(), lane = static_cast<int>(threadIdx.x & 31);
  if (warp == 0) {
    if (lane == 0) ptx::tma_prefetch_descriptor(map);
    for (int i = 0; i < L::kStages && i < u.n_tiles; ++i) issue_tile(p, map, u, sm, i, lane);
  }
#pragma unroll 1
  for (int i = 0; i < u.n_tiles; ++i) {
    const int s = i & 1, b = i & 1;
    const int slot = trace_prod_slot(s, warp, 0, i);  // the loader's steps of the traced pair (trace.cuh)
    ptx::mbar_wait(sm.full(s), (i >> 1) & 1);
    MLA_DECODE_TRACE_PROD(slot, 0);
    ptx::mbar_wait(sm.vt_empty(b), ((i >> 1) & 1) ^ 1);
    MLA_DECODE_TRACE_PROD(slot, 1);
    transpose_values<8>(sm.stage(s), sm.vt(b), warp, lane, sm.mask(s), sm.zero(), 0);  // V^T_L
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(sm.vt_full(b));
    MLA_DECODE_TRACE_PROD(slot, 2);
    ptx::mbar_arrive(sm.empty(s));
    if (warp == 0 && i + L::kStages < u.n_tiles) issue_tile(p, map, u, sm, i + L::kStages, lane);
  }
}

// ---- S's query ------------------------------------------------------------------------------------------------------

// The power of two 2^e that brings a row's largest |q| (fp32 bits) into (224, 448], e4m3's top binade and a half
// (e4m3's largest finite value is 448 = 1.75 * 2^8): the row's e4m3 copy then rounds each element to 3 significant
// bits relative to its own magnitude down to 2^-9 * 2^-e (e4m3's subnormals). Zero rows keep 0; inf and NaN rows are
// flagged (nullopt as INT_MIN) for a NaN scale; the clamp keeps 2^e and 2^-e normal fp32.
__device__ __forceinline__ int q_e4m3_exponent(uint32_t amax_bits) {
  const int biased = static_cast<int>(amax_bits >> 23);
  if (amax_bits == 0) return 0;
  if (biased == 255) return INT_MIN;
  const int e = ((amax_bits & 0x7fffffu) <= 0x600000u ? 8 : 7) - (biased - 127);
  return e < -120 ? -120 : e > 120 ? 120 : e;
}

// The unit's Q as e4m3 * 2^e_r into the five e4m3 panels, 2^-e_r into q_scales (NaN for a row holding inf or NaN),
// the fifth panel's columns 576.. as zeros; straight from global memory, by S's and R's 256 threads (c: 0..255, S's
// first): four a row, rows by warp (warp w of the two warpgroups: rows 8 w .. 8 w + 7), thread c % 4 of a row
// taking its 18 chunks of eight columns in one round of loads. Rows past the unit's are zeros.
__device__ __forceinline__ void q_e4m3(const DecodeSm90Params& p, const Unit& u, const Smem& sm, int c) {
  const int r = c >> 2, k = c & 3, row = u.row0 + r;
  uint4 v[18];
#pragma unroll
  for (int i = 0; i < 18; ++i) v[i] = row < u.m_rows ? load_q_chunk(p.rows, u.g, row, 18 * k + i) : make_uint4(0, 0, 0, 0);
  uint32_t amax = 0;  // fp32 bits of max |q|
#pragma unroll
  for (int i = 0; i < 18; ++i) {
    const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = max(amax, max((w[j] << 16) & 0x7fffffffu, w[j] & 0x7fff0000u));
  }
  amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const int e = q_e4m3_exponent(amax);
  const float f = e == INT_MIN ? 1.0f : exp2i(e);
  uint8_t* dst = sm.q();
#pragma unroll
  for (int i = 0; i < 18; ++i) {
    const int col = 8 * (18 * k + i);  // e4m3 columns col .. col + 7
    const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    uint32_t out[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t a = dev::float2_to_e4m3x2(__uint_as_float(w[2 * j] << 16) * f, __uint_as_float(w[2 * j] & 0xffff0000u) * f);
      const uint32_t b = dev::float2_to_e4m3x2(__uint_as_float(w[2 * j + 1] << 16) * f,
                                               __uint_as_float(w[2 * j + 1] & 0xffff0000u) * f);
      out[j] = a | b << 16;
    }
    *reinterpret_cast<uint2*>(dst + (col >> 7) * T::kPanelBytes + swz(r, (col & 127) >> 4) + (col & 15)) =
        make_uint2(out[0], out[1]);
  }
  // Columns 576 .. 639 of the fifth panel (the K tile's are zeros: the TMA's bounds): a 16-byte chunk a thread.
  *reinterpret_cast<uint4*>(dst + 4 * T::kPanelBytes + swz(r, 4 + k)) = make_uint4(0, 0, 0, 0);
  if (k == 0) sm.q_scales()[r] = e == INT_MIN ? __int_as_float(0x7fffffff) : exp2i(-e);
}

// ---- the consumers --------------------------------------------------------------------------------------------------

inline constexpr float kPShift = 8.0f;  // P = 2^(S - m + kPShift): the row's largest weight is 2^8

struct SRole {
  const DecodeSm90Params& p;
  const Unit& u;
  const Smem& sm;
  convert::Frag rw;
  int lim_lo, lim_hi;
  float sc_lo, sc_hi;  // S to the log2 domain per row: softmax scale * cache scale * 2^-e_r
  float o[T::kDvHalf / 2];
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  __device__ __forceinline__ SRole(const DecodeSm90Params& p_, const Unit& u_, const Smem& sm_) : p(p_), u(u_), sm(sm_) {
    lim_lo = query_row_limit(p, u, u.row0 + rw.r_lo);
    lim_hi = query_row_limit(p, u, u.row0 + rw.r_hi);
    sc_lo = p.rows.scale_log2 * p.gather.scale * sm.q_scales()[rw.r_lo];
    sc_hi = p.rows.scale_log2 * p.gather.scale * sm.q_scales()[rw.r_hi];
#pragma unroll
    for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  }

  // S = Q K^T over stage s (18 k-steps of 32 codes), issued and committed. The two base descriptors pass through an
  // empty asm each tile, so that the 36 k-step descriptors are formed here, not held across the loop.
  __device__ __forceinline__ void issue_s(float (&sc)[32], int s) const {
    uint64_t dq = ptx::desc_sw128_k_major(sm.q()), dk = ptx::desc_sw128_k_major(sm.stage(s));
    asm volatile("" : "+l"(dq), "+l"(dk));
    ptx::wgmma_fence_operand(sc);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 18; ++ks) {
      const uint32_t off = (ks >> 2) * T::kPanelBytes + (ks & 3) * 32;
      ptx::wgmma_e4m3_ss<T::kBlockN>(sc, ptx::desc_advance(dq, off), ptx::desc_advance(dk, off), ks > 0);
    }
    ptx::wgmma_commit_group();
  }

  __device__ __forceinline__ void run() {
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int s = i & 1, b = i & 1, k0 = u.key_begin + i * T::kBlockN;
      ptx::mbar_wait(sm.full(s), (i >> 1) & 1);
      MLA_DECODE_TRACE_EVENT(4, 128, true);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1), i >> 1);
      float sc[32];
      issue_s(sc, s);
      if (i > 0) {  // O_L's product of tile i - 1 retired: S's share of its V^T buffer is free
        ptx::wgmma_wait_group<1>();
        ptx::wgmma_fence_operand(o);
        ptx::mbar_arrive(sm.vt_empty(b ^ 1));
      }
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(sc);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 1, i >> 1);
      float mx_lo, mx_hi;
      mask_scale_max<true>(sc, sm.mask(s), k0, rw.t4, lim_lo, lim_hi, sc_lo, sc_hi, mx_lo, mx_hi);
      ptx::mbar_arrive(sm.empty(s));  // S and the mask read: the stage is S's no more
      const float n_lo = fmaxf(m_lo, mx_lo), n_hi = fmaxf(m_hi, mx_hi);
      const float a_lo = convert::factor(m_lo, n_lo), a_hi = convert::factor(m_hi, n_hi);
      convert::rescale(o, a_lo, a_hi);
      float sum_lo, sum_hi;
      exp2_rows(sc, n_lo - kPShift, n_hi - kPShift, sum_lo, sum_hi);  // a row still without keys: -inf, P 0
      l_lo = l_lo * a_lo + sum_lo;
      l_hi = l_hi * a_hi + sum_hi;
      m_lo = n_lo;
      m_hi = n_hi;
      uint32_t pa[2][4];
      p_fragments(sc, pa);
      // V^T_L of tile i written, which means buffer b's P and factors are free too: the loader waited for R's release
      // of tile i - 2 (vt_empty) before writing it.
      ptx::mbar_wait(sm.vt_full(b), (i >> 1) & 1);
      store_p_panel(sm.p_panel(b), pa, rw.r_lo, rw.r_hi, rw.t4);
      if (rw.t4 == 0) {
        sm.factors(b)[rw.r_lo] = a_lo;
        sm.factors(b)[rw.r_hi] = a_hi;
      }
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_arrive(L::kBarP + b, 256);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 2, i >> 1);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) ptx::wgmma_fence_operand(pa[kk]);
      ptx::wgmma_fence_operand(o);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) ptx::wgmma_e4m3_rs<T::kDvHalf>(o, pa[kk], vt_desc(sm.vt(b), 0, kk), true);
      ptx::wgmma_commit_group();
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 3, i >> 1);
    }
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
    if (u.n_tiles > 0) ptx::mbar_arrive(sm.vt_empty((u.n_tiles - 1) & 1));
    MLA_DECODE_TRACE_EVENT(5, 128);
    l_lo = softmax::quad_sum(l_lo);
    l_hi = softmax::quad_sum(l_hi);
  }
};

struct RRole {
  const Unit& u;
  const Smem& sm;
  convert::Frag rw;
  int warp, lane;
  float o[T::kDvHalf / 2];

  __device__ __forceinline__ RRole(const Unit& u_, const Smem& sm_)
      : u(u_), sm(sm_), warp(ptx::warp_idx_in_warpgroup()), lane(static_cast<int>(threadIdx.x & 31)) {
#pragma unroll
    for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  }
  __device__ __forceinline__ void run() {
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int s = i & 1, b = i & 1;
      // V^T_R of tile i (this warpgroup's own products of tile i - 2 retired: the half is free), while S works.
      const int slot = trace_prod_slot(s, warp, 1, i);  // R's transposition steps of the traced pair
      ptx::mbar_wait(sm.full(s), (i >> 1) & 1);
      MLA_DECODE_TRACE_PROD(slot, 0);
      transpose_values<8>(sm.stage(s), sm.vt(b), warp, lane, sm.mask(s), sm.zero(), 32);
      ptx::fence_proxy_async_smem();
      ptx::mbar_arrive(sm.empty(s));
      MLA_DECODE_TRACE_PROD(slot, 1);
      ptx::named_barrier_sync(L::kBarR, 128);
      MLA_DECODE_TRACE_PROD(slot, 2);
      ptx::named_barrier_sync(L::kBarP + b, 256);
      MLA_DECODE_TRACE_PAIR(1, 2 * (i & 1), i >> 1);
      convert::rescale(o, sm.factors(b)[rw.r_lo], sm.factors(b)[rw.r_hi]);
      ptx::wgmma_fence_operand(o);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        ptx::wgmma_e4m3_ss<T::kDvHalf>(o, p_desc(sm.p_panel(b), kk), vt_desc(sm.vt(b), T::kDvHalf, kk), true);
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(o);
      ptx::mbar_arrive(sm.vt_empty(b));
      MLA_DECODE_TRACE_PAIR(1, 2 * (i & 1) + 1, i >> 1);
    }
  }
};

}  // namespace fp8c

// The kernel (file comment): paged fp8 per-tensor rows (mqa_decode), `map` the cache as [num_blocks][page_size][576]
// bytes with boxes of 128 bytes x min(page_size, 64) rows, 128-byte swizzle.
template <CacheFormat F>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_fp8c_kernel(const __grid_constant__ CUtensorMap map, const DecodeSm90Params p) {
  static_assert(F == CacheFormat::fp8, "fp8 per-tensor codes");
  using L = Fp8cTraits;
  extern __shared__ uint8_t smem_raw[];
  const fp8c::Smem sm{aligned_smem(smem_raw)};
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  const Unit u(p, /*gather=*/false);
  if (u.n_tiles == 0) {  // uniform over the CTA: nothing below runs
    write_empty_unit(p, u, threadIdx.x, blockDim.x);
    return;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ptx::mbar_init(sm.full(s), 1);
      ptx::mbar_init(sm.empty(s), L::kEmptyArrivals);
    }
    for (int b = 0; b < 2; ++b) {
      ptx::mbar_init(sm.vt_full(b), L::kVtFullArrivals);
      ptx::mbar_init(sm.vt_empty(b), L::kVtEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
  }
  if (threadIdx.x < 4) reinterpret_cast<uint32_t*>(sm.base + L::kOffZero)[threadIdx.x] = 0;
  __syncthreads();
  const int wg = ptx::warpgroup_index();
  const float out_scale = p.gather.scale;  // O / l: P's 2^8 cancels; the codes' scale remains
  if (wg == L::kLoader) {
    ptx::setmaxnreg_dec<L::kLoaderRegs>();
    fp8c::loader(p, &map, u, sm);
    return;
  }
  const convert::Frag rw;
  // Q (S's and R's threads), visible to S's products after the barrier.
  if (wg == L::kRWarpgroup) ptx::setmaxnreg_inc<L::kRRegs>();
  else ptx::setmaxnreg_inc<L::kSRegs>();
  fp8c::q_e4m3(p, u, sm, static_cast<int>(threadIdx.x) - 128);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(L::kBarQ, 256);
  MLA_DECODE_TRACE_EVENT(3, 128);
  if (wg == L::kRWarpgroup) {
    fp8c::RRole r(u, sm);
    r.run();
    ptx::named_barrier_sync(L::kBarEnd, 256);
    const float* sums = sm.sums();
    const float* maxima = sm.maxima();
    write_rows_half(p, u, r.o, maxima[rw.r_lo], maxima[rw.r_hi], sums[rw.r_lo], sums[rw.r_hi], 1, rw.r_lo, rw.r_hi,
                    rw.t4, out_scale);
    return;
  }
  fp8c::SRole sr(p, u, sm);
  sr.run();
  // The LSE's maximum is the running one less kPShift (l holds P * 2^8); -inf stays -inf for a row without keys.
  const float ref_lo = sr.m_lo - fp8c::kPShift, ref_hi = sr.m_hi - fp8c::kPShift;
  if (rw.t4 == 0) {
    sm.sums()[rw.r_lo] = sr.l_lo;
    sm.sums()[rw.r_hi] = sr.l_hi;
    sm.maxima()[rw.r_lo] = ref_lo;
    sm.maxima()[rw.r_hi] = ref_hi;
  }
  ptx::named_barrier_arrive(L::kBarEnd, 256);
  write_rows_half(p, u, sr.o, ref_lo, ref_hi, sr.l_lo, sr.l_hi, 0, rw.r_lo, rw.r_hi, rw.t4, out_scale);
  MLA_DECODE_TRACE_EVENT(6, 128);
}

}  // namespace mla::cuda::decode_sm90
