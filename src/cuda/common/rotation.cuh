// SPDX-License-Identifier: Apache-2.0
#pragma once
// sparse_mqa's output rotation on the device (SparseOptions::out_rotation, docs/SEMANTICS.md §11.8): pair i of a
// row's last `dim` columns, (d_v - dim + 2i, + 1), turned by the angle positions[t] * inv_freq[i] (the angle and
// its cos / sin in float64, rounded to float, the turn in float: as apply_rope's kernel), before the output's one
// rounding. A rotation is linear, so the kernels may turn unnormalised accumulators or split partials (their
// per-row weights commute). Host-includable: the fields are POD, the methods compile for the device only.
#include <cstdint>

#include "mla/ops.h"

namespace mla::cuda::dev {

struct OutRotation {
  const void* positions;   // [T] int32 (pos_i64 0) or int64, element stride pos_stride
  const double* inv_freq;  // [dim / 2]
  int64_t pos_stride;
  int dim, pos_i64;        // dim 0: no rotation

#if defined(__CUDACC__)  // the fields are POD for the host's launch parameters; the methods are the device's
  __device__ __forceinline__ bool on() const { return dim > 0; }
  // Token t's position.
  __device__ __forceinline__ double position(int64_t t) const {
    return pos_i64 ? static_cast<double>(static_cast<const int64_t*>(positions)[t * pos_stride])
                   : static_cast<double>(static_cast<const int32_t*>(positions)[t * pos_stride]);
  }
  // The pair whose first column is `col` of a d_v-wide row: its index i, or -1 when col is not the first column of
  // a rotated pair (d_v - dim is even: the pairs start on even columns).
  __device__ __forceinline__ int pair_of(int col, int d_v) const {
    const int c0 = d_v - dim;
    return dim > 0 && col >= c0 && ((col - c0) & 1) == 0 ? (col - c0) >> 1 : -1;
  }
  // Pair i's cos and sin: the angle pos * inv_freq[i] and its sincos in float64, rounded to float (apply_rope's
  // kernel, cuda/block/rope.cu, does the same).
  __device__ __forceinline__ void cos_sin(double pos, int i, float& c, float& s) const {
    double sd, cd;
    sincos(pos * inv_freq[i], &sd, &cd);
    c = static_cast<float>(cd);
    s = static_cast<float>(sd);
  }
  // The table of a token's pairs, tab[0 .. dim / 2) the cosines and tab[dim / 2 .. dim) the sines, by n threads
  // (index k): one sincos per pair, one copy of its code.
  __device__ __forceinline__ void fill_table(double pos, float* tab, int k, int n) const {
#pragma unroll 1
    for (int i = k; i < dim / 2; i += n) cos_sin(pos, i, tab[i], tab[dim / 2 + i]);
  }
  // (a, b) <- (a cos - b sin, b cos + a sin).
  __device__ __forceinline__ static void turn(float c, float s, float& a, float& b) {
    const float x = a, y = b;
    a = x * c - y * s;
    b = y * c + x * s;
  }
  // One column of a pair whose other column `other` another thread holds: the first column (a) becomes
  // a cos - b sin, the second (b) b cos + a sin.
  __device__ __forceinline__ static float turn_one(float c, float s, float self, float other, bool first) {
    return first ? self * c - other * s : self * c + other * s;
  }
#endif
};

// The launch parameters of a (validated) SparseOutRotation.
inline OutRotation out_rotation_of(const SparseOutRotation& r) {
  OutRotation o{};
  if (!r.defined()) return o;
  o.positions = r.positions.data;
  o.inv_freq = static_cast<const double*>(r.inv_freq.data);
  o.pos_stride = r.positions.stride[0];
  o.dim = static_cast<int>(r.rope_dim);
  o.pos_i64 = r.positions.dtype == DType::i64 ? 1 : 0;
  return o;
}

}  // namespace mla::cuda::dev
