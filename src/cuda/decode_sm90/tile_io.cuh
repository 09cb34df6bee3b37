#pragma once
// Shared-memory and global I/O pieces of the sm90 decode kernels with 64-row tiles: query rows into
// swizzled panels and register fragments, zero-filling keys that were not loaded, P to smem, and the
// epilogue that normalises and writes one consumer's 256 output columns (or the split partials).
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/decode_sm90/cluster_merge.cuh"
#include "cuda/decode_sm90/pipeline.cuh"

namespace mla::cuda::decode_sm90 {

// Columns 0 .. 64 * panels of query rows [row0, row0 + rows) of request g into swizzled panels of `rows`
// rows, panel_bytes apart (zeros past the request's rows), by `nthreads` threads (index ct). bf16 q
// (supports() admits no other).
// 16-byte chunk ch (columns 8 ch .. 8 ch + 7) of query row `row` of request g: one vector load when the
// rows allow it (rp.q_vec16), else four bf16 pairs.
__device__ __forceinline__ uint4 load_q_chunk(const MqaRowParams& rp, int64_t g, int row, int ch) {
  const uint16_t* src = static_cast<const uint16_t*>(rp.q) + g * rp.q_stride_g + (row / rp.h_q) * rp.q_stride_i +
                        (row % rp.h_q) * rp.q_stride_h + ch * 8;
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
// in groups of at most kGroup per thread, each group's loads before its stores (p.q_batch, the default
// start of the paged bf16 small kernel: the loop above issues one dependent global round trip per
// iteration, 5 at N 16). The N 32 kernel keeps the loop (batched, in groups of 3 or 5, it spilled 116 bytes).
// kPanels: the panels loaded (the seesaw kernel's Q: 8, its rope lives in registers).
template <int kRows, int kThreads, int kGroup = 5, int kPanels = Traits::kPanels>
__device__ __forceinline__ void load_q_panels_batched(const MqaRowParams& rp, int64_t g, int row0, int m_rows,
                                                      int panel_bytes, uint8_t* sQ, int ct) {
  constexpr int kChunks = kPanels * 8, kItems = kRows * kChunks;
  constexpr int kIter = (kItems + kThreads - 1) / kThreads;
#pragma unroll
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
  const uint16_t* src = static_cast<const uint16_t*>(rp.q) + g * rp.q_stride_g + (row / rp.h_q) * rp.q_stride_i +
                        (row % rp.h_q) * rp.q_stride_h + col;
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
    const float lse = l == 0.0f ? -INFINITY : (m + __log2f(l)) * softmax::kLn2;
    const int i = row / rp.h_q, h = row % rp.h_q;
    const int64_t ws_row = u.ws_slot * static_cast<int64_t>(u.m_rows) + row;
    if (c == 0 && t4 == 0) {
      if (partial != nullptr) reinterpret_cast<float*>(partial + ClusterMerge::kPartialLse)[r] = lse;
      else if (split) p.ws_lse[ws_row] = lse;
      else if (rp.lse) rp.lse[u.g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = lse;
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

}  // namespace mla::cuda::decode_sm90
