// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared-memory and global I/O pieces of the sm90 decode kernels with 64-row tiles: query rows into
// swizzled panels and register fragments, zero-filling keys that were not loaded, P to smem, and the
// epilogue that normalises and writes one consumer's 256 output columns (or the split partials).
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/cluster_merge.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"

namespace mla::cuda::decode_sm90 {

// Columns 0 .. 64 * panels of query rows [row0, row0 + rows) of request g into swizzled panels of `rows`
// rows, panel_bytes apart (zeros past the request's rows), by `nthreads` threads (index ct). bf16 q
// (supports() admits no other).
// Column col of query row `row` (= query i * h_q + head) of request g, bf16 (supports() admits no other).
__device__ __forceinline__ const uint16_t* q_row_ptr(const MqaRowParams& rp, int64_t g, int row, int64_t col = 0) {
  return static_cast<const uint16_t*>(rp.q) + g * rp.q_stride_g + (row / rp.h_q) * rp.q_stride_i +
         (row % rp.h_q) * rp.q_stride_h + col;
}
// The largest key query row `row` may see (causal: its query's position in the step; else the last), -1 for a
// row past the unit's rows or a request too short for it.
__device__ __forceinline__ int query_row_limit(const DecodeSm90Params& p, const Unit& u, int row) {
  if (row >= u.m_rows) return -1;
  const int lim = p.causal ? u.seq_len - p.rows.s_q + row / p.rows.h_q : u.seq_len - 1;
  return lim < -1 ? -1 : lim;
}
// 16-byte chunk ch (columns 8 ch .. 8 ch + 7) of query row `row` of request g: one vector load when the
// rows allow it (rp.q_vec16), else four bf16 pairs.
__device__ __forceinline__ uint4 load_q_chunk(const MqaRowParams& rp, int64_t g, int row, int ch) {
  const uint16_t* src = q_row_ptr(rp, g, row, ch * 8);
  if (rp.q_vec16) return *reinterpret_cast<const uint4*>(src);
  uint32_t x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = src[2 * k] | uint32_t(src[2 * k + 1]) << 16;
  return make_uint4(x[0], x[1], x[2], x[3]);
}
// Its place in the swizzled Q panels: panel ch / 8, row r, 16-byte column ch % 8.
__device__ __forceinline__ void store_q_chunk(uint8_t* sQ, int panel_bytes, int r, int ch, uint4 v) {
  *reinterpret_cast<uint4*>(sQ + (ch / 8) * panel_bytes + swz(r, ch % 8)) = v;
}

__device__ __forceinline__ void load_q_panels(const MqaRowParams& rp, int64_t g, int row0, int m_rows, int rows,
                                              int panels, int panel_bytes, uint8_t* sQ, int ct, int nthreads) {
  const int chunks = panels * 8;  // 16-byte chunks per row
  for (int e = ct; e < rows * chunks; e += nthreads) {
    const int r = e / chunks, ch = e % chunks, row = row0 + r;
    store_q_chunk(sQ, panel_bytes, r, ch, row < m_rows ? load_q_chunk(rp, g, row, ch) : make_uint4(0, 0, 0, 0));
  }
}

// load_q_panels for kRows rows of nine panels by kThreads threads with the loads in flight together,
// in groups of at most kGroup per thread, each group's loads before its stores (the paged bf16 small kernel at
// N 8 / 16 and the seesaw kernel: the loop above issues one dependent global round trip per iteration, 5 at N 16).
// The N 32 small kernel keeps the loop (batched, in groups of 3 or 5, it spilled 116 bytes).
// kPanels: the panels loaded (the seesaw kernel's Q: 8, its rope lives in registers).
// The groups run as a loop, not unrolled: this code runs once per CTA, at the pace of its first instruction
// fetches (docs/design/attention_sm90.md §6b "Where its time goes"): its size is its cost.
template <int kRows, int kThreads, int kGroup = 5, int kPanels = Traits::kPanels>
__device__ __forceinline__ void load_q_panels_batched(const MqaRowParams& rp, int64_t g, int row0, int m_rows,
                                                      int panel_bytes, uint8_t* sQ, int ct) {
  constexpr int kChunks = kPanels * 8, kItems = kRows * kChunks;
  constexpr int kIter = (kItems + kThreads - 1) / kThreads;
#pragma unroll 1
  for (int k0 = 0; k0 < kIter; k0 += kGroup) {
    uint4 v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int e = ct + (k0 + k) * kThreads, r = e / kChunks, ch = e % kChunks, row = row0 + r;
      v[k] = k0 + k < kIter && e < kItems && row < m_rows ? load_q_chunk(rp, g, row, ch) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int e = ct + (k0 + k) * kThreads, r = e / kChunks, ch = e % kChunks;
      if (k0 + k < kIter && e < kItems) store_q_chunk(sQ, panel_bytes, r, ch, v[k]);
    }
  }
}

// Columns col, col + 1 of query row `row` of request g as a bf16 pair (lower column in the low half).
__device__ __forceinline__ uint32_t load_q_pair(const MqaRowParams& rp, int64_t g, int row, int col) {
  const uint16_t* src = q_row_ptr(rp, g, row, col);
  return src[0] | uint32_t(src[1]) << 16;
}

// Zeroes, in all nine panels of a 64-key tile, the keys whose bit in `mask` is clear (not loaded: stale
// or NaN-poisoned bytes must not reach P V as 0 * NaN), by `nthreads` threads (index t).
__device__ __forceinline__ void zero_unloaded_rows(uint8_t* sK, uint64_t mask, int t, int nthreads) {
  using T = Traits;
  for (int e = t; e < T::kBlockN * (T::kDqk / 8); e += nthreads) {
    const int r = e / (T::kDqk / 8), ch = e % (T::kDqk / 8);
    if (!((mask >> r) & 1))
      *reinterpret_cast<uint4*>(sK + (ch / 8) * T::kPanelBytes + swz(r, ch % 8)) = make_uint4(0, 0, 0, 0);
  }
}

// P (a 64 x 64 wgmma D fragment, fp32) times a per-row factor, as bf16 into a swizzled K-major panel
// [64 rows][64 keys]: the A operand of a shared-memory wgmma.
__device__ __forceinline__ void store_p(uint8_t* sP, const float (&s)[32], float f_lo, float f_hi, int r_lo, int r_hi,
                                        int t4) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    *reinterpret_cast<uint32_t*>(sP + swz(r_lo, jj) + 4 * t4) = ptx::pack_bf16x2(s[4 * jj] * f_lo, s[4 * jj + 1] * f_lo);
    *reinterpret_cast<uint32_t*>(sP + swz(r_hi, jj) + 4 * t4) =
        ptx::pack_bf16x2(s[4 * jj + 2] * f_hi, s[4 * jj + 3] * f_hi);
  }
}

// The softmax steps of a 64 x 64 S fragment (a wgmma D: this thread's rows r_lo (s[4jj], s[4jj + 1]) and r_hi
// (s[4jj + 2], s[4jj + 3]), keys 8jj + 2 t4, + 1), shared by the 64-row kernels (seesaw/base.cuh, convert/kernel.cuh).
// Scores times the row's scale (scale_lo / scale_hi: the log2 domain), keys not in `mask` or past a row's limit
// (lim_lo / lim_hi: its largest visible key) -inf; the rows' maxima over the quad. kClean: a tile whose 64 keys are
// all loaded and visible to every row of the warp is only scaled (no per-key tests; the seesaw measured when that
// pays, attention_sm90.md "5. The seesaw kernel", clean tiles).
template <bool kClean>
__device__ __forceinline__ void mask_scale_max(float (&s)[32], uint64_t mask, int k0, int t4, int lim_lo, int lim_hi,
                                               float scale_lo, float scale_hi, float& mx_lo, float& mx_hi) {
  mx_lo = -INFINITY;
  mx_hi = -INFINITY;
  if constexpr (kClean) {
    const bool clean = mask == ~uint64_t(0) && k0 + Traits::kBlockN - 1 <= min(lim_lo, lim_hi);
    if (__all_sync(0xffffffffu, clean)) {
#pragma unroll
      for (int i = 0; i < 32; i += 4) {
        s[i] *= scale_lo;
        s[i + 1] *= scale_lo;
        s[i + 2] *= scale_hi;
        s[i + 3] *= scale_hi;
        mx_lo = fmaxf(mx_lo, fmaxf(s[i], s[i + 1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[i + 2], s[i + 3]));
      }
      mx_lo = softmax::quad_max(mx_lo);
      mx_hi = softmax::quad_max(mx_hi);
      return;
    }
  }
#pragma unroll
  for (int jj = 0; jj < Traits::kBlockN / 8; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int kk = 8 * jj + 2 * t4 + e, key = k0 + kk;
      const bool in = (mask >> kk) & 1;
      float& a = s[4 * jj + e];
      float& b = s[4 * jj + 2 + e];
      a = in && key <= lim_lo ? a * scale_lo : -INFINITY;
      b = in && key <= lim_hi ? b * scale_hi : -INFINITY;
      mx_lo = fmaxf(mx_lo, a);
      mx_hi = fmaxf(mx_hi, b);
    }
  mx_lo = softmax::quad_max(mx_lo);
  mx_hi = softmax::quad_max(mx_hi);
}
// P = 2^(S - base) in place (a row whose base is -inf: base 0, its P all 0); this thread's row sums.
__device__ __forceinline__ void exp2_rows(float (&s)[32], float base_lo, float base_hi, float& sum_lo, float& sum_hi) {
  base_lo = base_lo == -INFINITY ? 0.0f : base_lo;
  base_hi = base_hi == -INFINITY ? 0.0f : base_hi;
  sum_lo = 0.0f;
  sum_hi = 0.0f;
#pragma unroll
  for (int jj = 0; jj < Traits::kBlockN / 8; ++jj) {
    s[4 * jj] = softmax::exp2_approx(s[4 * jj] - base_lo);
    s[4 * jj + 1] = softmax::exp2_approx(s[4 * jj + 1] - base_lo);
    s[4 * jj + 2] = softmax::exp2_approx(s[4 * jj + 2] - base_hi);
    s[4 * jj + 3] = softmax::exp2_approx(s[4 * jj + 3] - base_hi);
    sum_lo += s[4 * jj] + s[4 * jj + 1];
    sum_hi += s[4 * jj + 2] + s[4 * jj + 3];
  }
}
// P as bf16 rs A fragments (k-steps of 16 keys): element (ks, e) holds keys 16 ks + 8 (e >> 1) + 2 t4, + 1 of row
// r_lo (e even) or r_hi.
__device__ __forceinline__ void p_fragments_bf16(const float (&s)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * (2 * ks + (e >> 1)) + 2 * (e & 1);  // (e & 1): row hi; (e >> 1): keys + 8
      pa[ks][e] = ptx::pack_bf16x2(s[i], s[i + 1]);
    }
}

// O (+)= P V over one 64-key tile with P from registers (rs: pa, p_fragments_bf16's layout), four k-steps of 16 keys;
// v_desc(ks) is the MN-major descriptor of the value panels' k-step ks. Fenced, issued, not committed.
template <int N, class VDesc>
__device__ __forceinline__ void issue_pv_rs(float (&o)[N / 2], uint32_t (&pa)[4][4], VDesc&& v_desc) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) ptx::wgmma_fence_operand(pa[ks]);
  ptx::wgmma_fence_operand(o);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) ptx::wgmma_bf16_rs<N, ptx::Major::MN>(o, pa[ks], v_desc(ks), true);
}

// A row's natural-log LSE from its running maximum m (log2 domain) and row sum l: -inf for a row with no visible
// key (l == 0), a NaN l propagates (§14.6a).
__device__ __forceinline__ float row_lse(float m, float l) {
  return l == 0.0f ? -INFINITY : (m + __log2f(l)) * softmax::kLn2;
}
// Query row `row` of the unit's LSE into the split's partial LSE (ws_lse) or, unsplit, into lse when given.
__device__ __forceinline__ void store_row_lse(const DecodeSm90Params& p, const Unit& u, int row, float lse) {
  const MqaRowParams& rp = p.rows;
  if (u.ws_slot >= 0) p.ws_lse[u.ws_slot * static_cast<int64_t>(u.m_rows) + row] = lse;
  else if (rp.lse)
    rp.lse[u.g * rp.lse_stride_g + (row / rp.h_q) * rp.lse_stride_i + (row % rp.h_q) * rp.lse_stride_h] = lse;
}

// Epilogue of consumer c: rows r_lo / r_hi with running max m (log2 domain) and total row sum l;
// columns 256c .. 256c + 255 of O (a 64 x 256 wgmma D fragment) divided by l, as bf16 out + natural-log
// LSE (consumer 0 writes the LSE), or fp32 partials and partial LSE for the combine kernel. A row with
// no visible key gets 0 and -inf. out_scale: the source's code_scale (exact-code sources), else 1.
// partial (p.cluster_merge): the O / l and LSE go into this CTA's shared partial instead (cluster_merge.cuh
// ClusterMerge layout from `partial` = the KV stages), for the cluster's merge.
__device__ __forceinline__ void write_rows_half(const DecodeSm90Params& p, const Unit& u, const float (&o)[128],
                                                float m_lo, float m_hi, float l_lo, float l_hi, int c, int r_lo,
                                                int r_hi, int t4, float out_scale, uint8_t* partial = nullptr) {
  using T = Traits;
  const MqaRowParams& rp = p.rows;
  const bool split = u.ws_slot >= 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r_hi : r_lo, row = u.row0 + r;
    if (row >= u.m_rows) continue;
    const float l = half ? l_hi : l_lo, m = half ? m_hi : m_lo;
    const float inv = l == 0.0f ? 0.0f : out_scale / l;  // l == 0: no key; a NaN l propagates (§14.6a)
    const float lse = row_lse(m, l);
    const int i = row / rp.h_q, h = row % rp.h_q;
    const int64_t ws_row = u.ws_slot * static_cast<int64_t>(u.m_rows) + row;
    if (c == 0 && t4 == 0) {
      if (partial != nullptr) reinterpret_cast<float*>(partial + ClusterMerge::kPartialLse)[r] = lse;
      else store_row_lse(p, u, row, lse);
    }
    auto store_f32 = [&](float* dst) {  // fp32 O / l of this consumer's columns of the row
#pragma unroll
      for (int j = 0; j < T::kDvHalf / 8; ++j)
        *reinterpret_cast<float2*>(dst + c * T::kDvHalf + 8 * j + 2 * t4) =
            make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
    };
    if (partial != nullptr) {  // the cluster's shared partial (a shared-memory pointer: STS)
      store_f32(reinterpret_cast<float*>(partial + ClusterMerge::kPartialO) + r * ClusterMerge::kRowFloats);
    } else if (split) {
      store_f32(p.ws_o + ws_row * T::kDv);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i +
                      h * rp.out_stride_h + c * T::kDvHalf;  // bf16 out
#pragma unroll
      for (int j = 0; j < T::kDvHalf / 8; ++j) {
        const float a = o[4 * j + 2 * half] * inv, b = o[4 * j + 2 * half + 1] * inv;
        if (p.out_pairs) {
          *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) = ptx::pack_bf16x2(a, b);
        } else {
          dst[8 * j + 2 * t4] = dev::float_to_bf16(a);
          dst[8 * j + 2 * t4 + 1] = dev::float_to_bf16(b);
        }
      }
    }
  }
}

// The online-softmax step of the small kernels for one 64-key tile: s[i] holds this thread's masked, scaled
// scores (the D fragment of S^T: keys key_lo (i & 2 == 0) / key_hi, query row 8 (i / 4) + 2 t4 + (i & 1)); the
// tile's column (query row) maxima go through the warp by shuffles and across the warpgroup through sRed
// ([4 warps][N], one barrier); m_run moves to the new maxima, alpha is the running sums' rescale and
// p_lo / p_hi the keys' weights exp2(s - m) (0 for masked keys; rows with no key yet keep base 0).
template <int N>
__device__ __forceinline__ void small_tile_softmax(const float (&s)[N / 2], float (&m_run)[N / 4],
                                                   float (&l_part)[N / 4], float (&alpha)[N / 4],
                                                   float (&p_lo)[N / 4], float (&p_hi)[N / 4], float* sRed, int w,
                                                   int g8, int t4, int wg_bar) {
  constexpr int kRows = N / 4;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int i = 4 * (rr / 2) + rr % 2;
    float v = fmaxf(s[i], s[i + 2]);
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
    if (g8 == 0) sRed[w * N + 8 * (rr / 2) + 2 * t4 + rr % 2] = v;
  }
  ptx::named_barrier_sync(wg_bar, 128);
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int n = 8 * (rr / 2) + 2 * t4 + rr % 2, i = 4 * (rr / 2) + rr % 2;
    const float bm = fmaxf(fmaxf(sRed[n], sRed[N + n]), fmaxf(sRed[2 * N + n], sRed[3 * N + n]));
    const float nm = fmaxf(m_run[rr], bm);
    alpha[rr] = nm == -INFINITY ? 1.0f : softmax::exp2_approx(m_run[rr] - nm);
    m_run[rr] = nm;
    const float base_m = nm == -INFINITY ? 0.0f : nm;
    p_lo[rr] = softmax::exp2_approx(s[i] - base_m);
    p_hi[rr] = softmax::exp2_approx(s[i + 2] - base_m);
    l_part[rr] = l_part[rr] * alpha[rr] + p_lo[rr] + p_hi[rr];
  }
}

// O^T *= alpha per query row (o[mb][i]: row 8 (i / 4) + 2 t4 + (i & 1), alpha from small_tile_softmax), skipped
// by the whole warp when no row's running max moved (every alpha exactly 1: the products would be exact no-ops;
// most tiles of a long stream).
// kBlocks: the value blocks this warpgroup holds (8; 4 in the raw kernel's ping-pong).
template <int N, int kBlocks = 8>
__device__ __forceinline__ void small_rescale_o(float (&o)[kBlocks][N / 2], const float (&alpha)[N / 4]) {
  bool moved = false;
#pragma unroll
  for (int rr = 0; rr < N / 4; ++rr) moved |= alpha[rr] != 1.0f;
  if (!__any_sync(0xffffffffu, moved)) return;
#pragma unroll
  for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o[mb][i] *= alpha[2 * (i / 4) + (i & 1)];
}

// The small kernels' row sums: this thread's l_part over the warp's 8 lanes of each row (shuffles), one value per
// (warp, row) into sRed[w][N], published to the warpgroup by its barrier; a row's sum is then the four warps'
// entries, added in warp order.
template <int N>
__device__ __forceinline__ void warp_row_sums(const float (&l_part)[N / 4], float* sRed, int w, int g8, int t4,
                                              int wg_bar) {
#pragma unroll
  for (int rr = 0; rr < N / 4; ++rr) {
    float v = l_part[rr];
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    if (g8 == 0) sRed[w * N + 8 * (rr / 2) + 2 * t4 + rr % 2] = v;
  }
  ptx::named_barrier_sync(wg_bar, 128);
}

// Epilogue of the small kernels (small/kernel.cuh, raw/kernel.cuh: N query rows as wgmma N, two consumer
// warpgroups c = 0, 1 with their own online softmax over alternate tiles). Both warpgroups publish their (m, l) per
// row; every thread then derives its own rows' two scales (e_c / l, the merged state's weights); warpgroup 0 writes
// the LSE. O goes out through a shared staging area of kStageRows rows x ClusterMerge::kRowFloats fp32 (the cluster
// partial's layout), kStageRows rows per round: warpgroup 0 stores its scaled O^T, warpgroup 1 adds its own, and
// then (unless the staging area is the cluster partial itself) all 256 threads copy the round's rows out in 16-byte
// pieces with one rolled loop (bf16 out, or the split's fp32 workspace rows). This code runs once per unit, at the
// pace of its first instruction fetches (per-element stores compiled for three destinations in every unrolled
// position came to ~42 KB of SASS at N 16), so it is kept short.
// o[mb][i]: this thread's O^T accumulator of value block mb (the kernel's D fragment: query row n =
// 8 (i / 4) + 2 t4 + (i & 1)); col_of(mb, i): the output column it holds (kernel_small: the natural order;
// kernel_raw: its permuted value rows). out_scale multiplies O / l (exact-code sources). xo: the staging area
// (kStageRows x kRowFloats fp32, free from this call on). part_o / part_lse (the raw kernel under p.cluster_merge):
// the rows and their LSE go into the CTA's shared partial instead ([N][kRowFloats], [N]; kStageRows == N).
template <int N, int kStageRows, class ColOf>
__device__ __forceinline__ void small_epilogue(const DecodeSm90Params& p, const Unit& u, const float (&o)[8][N / 2],
                                               const float (&m_run)[N / 4], const float (&l_part)[N / 4], float* sRed,
                                               float* sML, float* xo, float out_scale, int c, int wg_bar,
                                               ColOf&& col_of, float* part_o = nullptr, float* part_lse = nullptr) {
  using T = Traits;
  using M = ClusterMerge;
  constexpr int kRows = N / 4;
  static_assert(kStageRows % 8 == 0 && N % kStageRows == 0, "whole 8-row groups of the fragment per round");
  const MqaRowParams& rp = p.rows;
  const int wt = threadIdx.x & 127, w = wt >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  const int ct = c * 128 + wt;
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c, 128u + 128u * c);
  warp_row_sums<N>(l_part, sRed, w, g8, t4, wg_bar);
  if (w == 0 && g8 == 0) {
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int n = 8 * (rr / 2) + 2 * t4 + rr % 2;
      sML[(c * 2) * N + n] = m_run[rr];
      sML[(c * 2 + 1) * N + n] = sRed[n] + sRed[N + n] + sRed[2 * N + n] + sRed[3 * N + n];
    }
  }
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);  // both warpgroups' (m, l)
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 1, 128u + 128u * c);
  // The rows' weights of both warpgroups (e_c / l of the merged state) into sSc ([2][N], warpgroup 0's sRed, free
  // now) and the LSE, by warpgroup 0's lanes g8 == 0 of warp 0; warpgroup 1 reads its weights after the first pass.
  float* sSc = sRed - c * 4 * N;
  if (c == 0 && w == 0 && g8 == 0) {
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int n = 8 * (rr / 2) + 2 * t4 + rr % 2, row = u.row0 + n;
      const float m0 = sML[n], l0 = sML[N + n], m1 = sML[2 * N + n], l1 = sML[3 * N + n];
      const float mm = fmaxf(m0, m1);
      const float e0 = m0 == -INFINITY ? 0.0f : softmax::exp2_approx(m0 - mm);
      const float e1 = m1 == -INFINITY ? 0.0f : softmax::exp2_approx(m1 - mm);
      const float l = l0 * e0 + l1 * e1, inv = l == 0.0f ? 0.0f : out_scale / l;  // NaN l stays NaN (§14.6a)
      sSc[n] = e0 * inv;
      sSc[N + n] = e1 * inv;
      if (row < u.m_rows) {
        if (part_lse != nullptr) part_lse[n] = row_lse(mm, l);
        else store_row_lse(p, u, row, row_lse(mm, l));
      }
    }
  }
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);  // the weights
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 2, 128u + 128u * c);
  const bool split = u.ws_slot >= 0;
  constexpr int kHalf = kStageRows * M::kRowFloats;  // one warpgroup's rows of a round in xo
#pragma unroll
  for (int k = 0; k < N / kStageRows; ++k) {
    // Each warpgroup stores its scaled O^T of round k's rows into its half of xo (no read-modify-write: with one,
    // ptxas spilled in the raw N 16 kernel).
    float* mine = xo + c * kHalf;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      if ((i / 4) / (kStageRows / 8) != k) continue;  // the fragment's rows 8 (i / 4) .. + 7: round k's only
      const int n = 8 * (i / 4) + 2 * t4 + (i & 1);
      const float f = sSc[c * N + n];
      float* dst = mine + (n - k * kStageRows) * M::kRowFloats;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) dst[col_of(mb, i)] = o[mb][i] * f;
    }
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
#pragma unroll 1
    for (int e = ct; e < kStageRows * (T::kDv / 4); e += T::kConsumerThreads) {  // (row of the round, 4 columns)
      const int rr = e / (T::kDv / 4), col = 4 * (e % (T::kDv / 4)), n = k * kStageRows + rr, row = u.row0 + n;
      if (row >= u.m_rows) continue;
      const float4 a = *reinterpret_cast<const float4*>(xo + rr * M::kRowFloats + col);
      const float4 b = *reinterpret_cast<const float4*>(xo + kHalf + rr * M::kRowFloats + col);
      const float4 v = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      if (part_o != nullptr) {  // the cluster partial (cluster_merge.cuh takes it from here)
        *reinterpret_cast<float4*>(part_o + n * M::kRowFloats + col) = v;
      } else if (split) {
        *reinterpret_cast<float4*>(p.ws_o + (u.ws_slot * static_cast<int64_t>(u.m_rows) + row) * T::kDv + col) = v;
      } else {
        uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + (row / rp.h_q) * rp.out_stride_i +
                        (row % rp.h_q) * rp.out_stride_h + col;  // bf16 out (supports() admits no other)
        if (p.out_pairs) {
          reinterpret_cast<uint32_t*>(dst)[0] = ptx::pack_bf16x2(v.x, v.y);
          reinterpret_cast<uint32_t*>(dst)[1] = ptx::pack_bf16x2(v.z, v.w);
        } else {
          dst[0] = dev::float_to_bf16(v.x);
          dst[1] = dev::float_to_bf16(v.y);
          dst[2] = dev::float_to_bf16(v.z);
          dst[3] = dev::float_to_bf16(v.w);
        }
      }
    }
    if (k + 1 < N / kStageRows) ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);  // xo is free
  }
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 3, 128u + 128u * c);
}

// Epilogue of the small kernel under p.wg_partials (a split unit of the uniform schedule): consumer warpgroup c writes
// its own state as partial 2 u.ws_slot + c of the combine, with no exchange with the other warpgroup: its rows' sums
// over its four warps (sRed, its own barrier), the LSE (warp 0's lanes g8 == 0) and O^T / l straight from the
// accumulator. A warp's store of o[mb][i] covers 8 adjacent columns of 4 rows: whole 32-byte sectors. A warpgroup
// that ran no tile writes its LSE only (-inf: the combine never reads an empty partial's rows). N / 2 x 8 stores a
// thread, one destination: a few KB of code where small_epilogue's staging rounds take 8-29 KB.
// o, m_run, l_part, col_of: as small_epilogue.
template <int N, class ColOf>
__device__ __forceinline__ void small_wg_partial(const DecodeSm90Params& p, const Unit& u, const float (&o)[8][N / 2],
                                                 const float (&m_run)[N / 4], const float (&l_part)[N / 4],
                                                 float* sRed, float out_scale, int c, int wg_bar, ColOf&& col_of) {
  constexpr int kRows = N / 4;
  const int w = (threadIdx.x & 127) >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c, 128u + 128u * c);
  warp_row_sums<N>(l_part, sRed, w, g8, t4, wg_bar);
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 1, 128u + 128u * c);
  const int64_t slot = 2 * u.ws_slot + c, m_rows = u.m_rows;
  float inv[kRows];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int n = 8 * (rr / 2) + 2 * t4 + rr % 2, row = u.row0 + n;
    const float l = sRed[n] + sRed[N + n] + sRed[2 * N + n] + sRed[3 * N + n];  // warp order
    inv[rr] = l == 0.0f ? 0.0f : out_scale / l;  // a NaN l stays NaN (§14.6a)
    if (w == 0 && g8 == 0 && row < u.m_rows) p.ws_lse[slot * m_rows + row] = row_lse(m_run[rr], l);
  }
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 2, 128u + 128u * c);
  if (c < u.n_tiles) {  // warpgroup c ran tiles c, c + 2, ... of the unit
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int n = 8 * (i / 4) + 2 * t4 + (i & 1), row = u.row0 + n;
      if (row >= u.m_rows) continue;
      const int col0 = col_of(0, i);  // col_of(mb, i) - col0 is a constant: immediate offsets from one address
      float* dst = p.ws_o + (slot * m_rows + row) * Traits::kDv + col0;
      const float f = inv[2 * (i / 4) + (i & 1)];
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) dst[col_of(mb, i) - col0] = o[mb][i] * f;
    }
  }
  MLA_DECODE_TRACE_EVENT(kTraceEpilogueBase + 4 * c + 3, 128u + 128u * c);
}

// Epilogue of the ping-pong raw kernel (raw/kernel.cuh kPingPong): both warpgroups end at the same running maximum
// m_run (each took over the other's flagged tiles' maxima) and hold row sums of their own tiles at it; warpgroup c
// holds O^T of value blocks 4c .. 4c + 3 (o[mb], the D fragment as in small_epilogue) over every tile. Each sums
// its row sums over its warps into sRed2[c] ([2 wg][4 warps][N]), both wait for the other's, and each divides its
// blocks by the total and writes them (bf16 out, or the split's fp32 partials); warpgroup 0 writes the LSE.
// col_of(mb, i): the output column of o[mb][i]; the element i + 2 holds the next column, so columns go out in pairs.
// part_o / part_lse (p.cluster_merge): the normalised rows and their LSE go into this CTA's shared partial instead
// ([N][ClusterMerge::kRowFloats] fp32 and [N] fp32, row n = u.row0 + n; cluster_merge.cuh merges them).
template <int N, class ColOf>
__device__ __forceinline__ void pingpong_epilogue(const DecodeSm90Params& p, const Unit& u,
                                                  const float (&o)[4][N / 2], const float (&m_run)[N / 4],
                                                  const float (&l_part)[N / 4], float* sRed2, float out_scale, int c,
                                                  int wg_bar, ColOf&& col_of, float* part_o = nullptr,
                                                  float* part_lse = nullptr) {
  using T = Traits;
  constexpr int kRows = N / 4;
  const MqaRowParams& rp = p.rows;
  const int w = (threadIdx.x & 127) >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  warp_row_sums<N>(l_part, sRed2 + c * 4 * N, w, g8, t4, wg_bar);
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);  // both warpgroups' sums
  const bool split = u.ws_slot >= 0;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int n = 8 * (rr / 2) + 2 * t4 + rr % 2, row = u.row0 + n, i0 = 4 * (rr / 2) + rr % 2;
    if (row >= u.m_rows) continue;
    float l = 0.0f;  // in a fixed order (warpgroup, warp): both warpgroups divide by the same sum
#pragma unroll
    for (int k = 0; k < 8; ++k) l += sRed2[k * N + n];
    const float inv = l == 0.0f ? 0.0f : out_scale / l;  // l == 0: no key; a NaN l propagates (§14.6a)
    const int i = row / rp.h_q, h = row % rp.h_q;
    const int64_t ws_row = u.ws_slot * static_cast<int64_t>(u.m_rows) + row;
    if (c == 0 && w == 0 && g8 == 0) {
      if (part_lse != nullptr) part_lse[n] = row_lse(m_run[rr], l);
      else store_row_lse(p, u, row, row_lse(m_run[rr], l));
    }
    const int64_t dst = split ? ws_row * T::kDv
                              : u.g * rp.out_stride_g + i * rp.out_stride_i + h * rp.out_stride_h;
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) {
      const int col = col_of(mb, i0);  // even; o[mb][i0 + 2] is col + 1
      const float a = o[mb][i0] * inv, b = o[mb][i0 + 2] * inv;
      if (part_o != nullptr) {
        *reinterpret_cast<float2*>(part_o + n * ClusterMerge::kRowFloats + col) = make_float2(a, b);
      } else if (split) {
        *reinterpret_cast<float2*>(p.ws_o + dst + col) = make_float2(a, b);
      } else {
        uint16_t* out = static_cast<uint16_t*>(rp.out) + dst + col;
        if (p.out_pairs) {
          *reinterpret_cast<uint32_t*>(out) = ptx::pack_bf16x2(a, b);
        } else {
          out[0] = dev::float_to_bf16(a);
          out[1] = dev::float_to_bf16(b);
        }
      }
    }
  }
}

}  // namespace mla::cuda::decode_sm90
