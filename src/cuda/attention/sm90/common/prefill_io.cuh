// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pieces shared by the sm90 prefill kernels (prefill/kernel.cuh: bf16, prefill_fp8/kernel.cuh: fp8): the
// CTA's mbarriers of a Q + K / V ring, a key tile's online softmax, and the writes of a unit's output rows.
// Params: out, out_stride_t / _h (elements), lse, lse_stride_h / _t; Unit: q_start, h, m0, m_rows (each kernel's
// own structs).
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/softmax.cuh"

namespace mla::cuda::prefill_io {

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// The CTA's sequence of units: first(), then next(x) while below units. One unit per CTA (blockIdx.x), or
// persistent: units in pairs (2i, 2i + 1), (2i + 2G, 2i + 2G + 1), ... (G = gridDim.x).
template <bool kPersistent>
struct Schedule {
  int64_t units;
  __device__ int64_t first() const { return kPersistent ? 2 * static_cast<int64_t>(blockIdx.x) : blockIdx.x; }
  __device__ int64_t next(int64_t x) const {
    if constexpr (kPersistent) return (x & 1) ? x - 1 + 2 * static_cast<int64_t>(gridDim.x) : x + 1;
    return units;
  }
};

// The mbarriers at Traits::kOffBar: q_full, q_empty, then per stage k_full, v_full, k_empty, v_empty (arrays
// of Traits::kStages). *_full: one arrival + TMA bytes; *_empty: the consumers' releases.
template <class Traits>
struct Bars {
  uint64_t *q_full, *q_empty, *k_full, *v_full, *k_empty, *v_empty;
  __device__ explicit Bars(uint8_t* smem) {
    uint64_t* b = reinterpret_cast<uint64_t*>(smem + Traits::kOffBar);
    q_full = b;
    q_empty = b + 1;
    k_full = b + 2;
    v_full = k_full + Traits::kStages;
    k_empty = v_full + Traits::kStages;
    v_empty = k_empty + Traits::kStages;
  }
};

// Online softmax of key tile `tile` for a consumer thread's two rows, in the wgmma D layout (s[4j + e]: key
// 8j + 2 t4 + (e & 1) of row e >> 1): keys past lim[row] masked to -inf when `mask` (diagonal and partial tiles
// only), the running state rescaled to the new maximum (alpha: the O factors), s <- 2^(s scale_log2 - max + kBias)
// and the per-thread row sums of those (reduced over the quad in the epilogue). kBias: 0 (bf16 P), 8 (fp8: P * 256,
// the row's largest 256, inside e4m3's range). scale_log2 > 0, so the raw scores' maximum scales to the log2 one.
template <int kBlockN, int kBias>
__device__ __forceinline__ void softmax_tile(float (&s)[kBlockN / 2], softmax::RowState (&st)[2], const int (&lim)[2],
                                             int tile, bool mask, float scale_log2, int t4, float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
  if (mask) {
    const int n0 = tile * kBlockN;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (n0 + 8 * j + 2 * t4 + (e & 1) > lim[e >> 1]) s[4 * j + e] = -INFINITY;
  }
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
  float base[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    alpha[hf] = st[hf].rescale(softmax::quad_max(mx[hf]) * scale_log2);
    base[hf] = st[hf].base();
    if constexpr (kBias != 0) base[hf] -= static_cast<float>(kBias);
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      s[4 * j + e] = softmax::exp2_approx(fmaf(s[4 * j + e], scale_log2, -base[hf]));  // -inf -> 0
      sum[hf] += s[4 * j + e];
    }
  st[0].sum += sum[0];
  st[1].sum += sum[1];
}

// Writes out row `i` of the unit (columns 8j + 2t4, +1 for j < kDv / 8 from o[4j + 2 hf], o[4j + 2 hf + 1], the
// wgmma D layout) times inv, as bf16; 4-byte stores when out allows them.
template <int kDv, class Params, class Unit>
__device__ __forceinline__ void store_row(const Params& p, const Unit& u, int i, const float* o, int hf, float inv,
                                          int t4, bool pairs) {
  uint16_t* dst = p.out + (u.q_start + i) * p.out_stride_t + u.h * p.out_stride_h;
#pragma unroll
  for (int j = 0; j < kDv / 8; ++j) {
    const float a = o[4 * j + 2 * hf] * inv, b = o[4 * j + 2 * hf + 1] * inv;
    const int col = 8 * j + 2 * t4;
    if (pairs) {
      *reinterpret_cast<uint32_t*>(dst + col) = ptx::pack_bf16x2(a, b);
    } else {
      dst[col] = dev::float_to_bf16(a);
      dst[col + 1] = dev::float_to_bf16(b);
    }
  }
}

// Host: the fields both kernels' params share, from the op's arguments (dispatch::PrefillArgs): the cu_seqlens,
// out [total_q, h, d_v] bf16 and lse [h, total_q] (null when not asked for).
template <class Params, class Args>
void set_io(Params& p, const Args& a) {
  p.cu_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
  p.cu_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  p.cu_q_stride = a.cu_seqlens_q.stride[0];
  p.cu_k_stride = a.cu_seqlens_k.stride[0];
  p.out = static_cast<uint16_t*>(a.out.data);
  p.out_stride_t = a.out.stride[0];
  p.out_stride_h = a.out.stride[1];
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_stride_h = a.lse.stride[0];
    p.lse_stride_t = a.lse.stride[1];
  }
}

// A unit without keys: out 0 and LSE -inf for its rows, by threads tid of n (no barrier, no load).
template <int kDv, class Params, class Unit>
__device__ __forceinline__ void write_empty_unit(const Params& p, const Unit& u, int tid, int n) {
  for (int e = tid; e < u.m_rows * kDv; e += n) {
    const int r = e / kDv, col = e % kDv;
    const int64_t t = u.q_start + u.m0 + r;
    p.out[t * p.out_stride_t + u.h * p.out_stride_h + col] = 0;
    if (col == 0 && p.lse) p.lse[u.h * p.lse_stride_h + t * p.lse_stride_t] = -INFINITY;
  }
}

}  // namespace mla::cuda::prefill_io
