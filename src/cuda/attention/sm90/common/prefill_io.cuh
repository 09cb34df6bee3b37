// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pieces shared by the sm90 prefill kernels (prefill/kernel.cuh: bf16, prefill_fp8/kernel.cuh: fp8): the
// CTA's mbarriers of a Q + K / V ring, and the writes of a unit's output rows. Params: out, out_stride_t /
// _h (elements), lse, lse_stride_h / _t; Unit: q_start, h, m0, m_rows (each kernel's own structs).
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/mma_sync.cuh"

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
