// SPDX-License-Identifier: Apache-2.0
#pragma once
// combine_attn_states and DCP's N-way combine (semantics §13, rules [PIN] in ops.h): N partial attentions over
// disjoint key sets -> one, weighed by the merge rule (merge_rule.cuh; factors first, then out = Σ f_n · part_n
// over the non-empty parts only), with an optional per-head sink: a part of value 0 that joins the weights only
// (ops.h). fp32 arithmetic on inputs of the activation type Act.
//
// Schedule: one warp per row, 8 warps per block, grid-stride over rows. The lanes compute the N
// factors (lane n, n + 32, ...) into the warp's slice of shared memory, then each lane streams
// 8-column chunks (16-byte loads of bf16 / f16 when kVec) of kPartBatch parts at once and sums the N parts
// in registers, in part order. Bytes
// per row: N·D·sizeof(Act) read, D·sizeof(Act) written: bandwidth-bound.
#include <cstdint>

#include "cuda/attention/combine/merge_rule.cuh"
#include "cuda/common/act_type.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/vec.cuh"

namespace mla::cuda::merge {

struct CombineParams {
  const void* parts;       // [N, T, H, D] Act, strides (part_stride_n, part_stride_t, part_stride_h, 1)
  const float* part_lses;  // [N, T, H] fp32, strides (lse_stride_n, lse_stride_t, lse_stride_h)
  void* out;               // [T, H, D] Act, strides (out_stride_t, out_stride_h, 1)
  float* out_lse;          // [T, H] fp32 (olse_stride_t, olse_stride_h) or nullptr
  const float* sink;       // [H] fp32 (sink_stride) or nullptr: one more part of value 0 and lse sink[h]
  int64_t sink_stride;
  int64_t part_stride_n, part_stride_t, part_stride_h;
  int64_t lse_stride_n, lse_stride_t, lse_stride_h;
  int64_t out_stride_t, out_stride_h, olse_stride_t, olse_stride_h;
  int64_t num_parts, num_tokens, num_heads;
  int head_dim;
};

inline constexpr int kCombineWarps = 8;
inline constexpr int kCombineSlots = 256;  // factors per warp: kCombineMaxParts (ops.h)
inline constexpr int kPartBatch = 8;       // parts whose chunks one lane has in flight at once

template <class Act, bool kVec>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(CombineParams p) {
  using In = typename Act::Storage;
  __shared__ float factors[kCombineWarps][kCombineSlots];
  // A programmatic dependent launch (launch.cu): the CTAs may be resident before the previous kernel of the
  // stream ends (the DCP exchange's); nothing is read or written before it has completed.
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* f = factors[warp];
  const In* parts = static_cast<const In*>(p.parts);
  In* out = static_cast<In*>(p.out);
  const int64_t rows = p.num_tokens * p.num_heads;
  const int chunks = (p.head_dim + 7) / 8;
  for (int64_t row = int64_t(blockIdx.x) * kCombineWarps + warp; row < rows;
       row += int64_t(gridDim.x) * kCombineWarps) {
    const int64_t t = row / p.num_heads, h = row - t * p.num_heads;
    const float* lse = p.part_lses + t * p.lse_stride_t + h * p.lse_stride_h;
    combine::MergeState st = combine::warp_merge_lse([&](int64_t n) { return lse[n * p.lse_stride_n]; },
                                                     p.num_parts);
    if (p.sink) {  // the sink joins m and the sum, never the output; NaN or +inf make the row NaN
      const float s = p.sink[h * p.sink_stride];
      if (isnan(s) || s == INFINITY) {
        st.nan = true;
      } else if (s != -INFINITY) {
        const float m = fmaxf(st.m, s);
        st.sum = st.sum * expf(st.m - m) + expf(s - m);  // expf(-inf) = 0 when no part is finite
        st.m = m;
      }
    }
    const bool nan = st.nan, empty = st.empty();
    for (int64_t n = lane; n < p.num_parts; n += 32) {
      const float l = lse[n * p.lse_stride_n];
      f[n] = isfinite(l) ? st.factor(l) : -1.0f;  // -1: an empty part, not read
    }
    __syncwarp();
    if (lane == 0 && p.out_lse) p.out_lse[t * p.olse_stride_t + h * p.olse_stride_h] = st.lse();
    In* o_row = out + t * p.out_stride_t + h * p.out_stride_h;
    const In* p_row = parts + t * p.part_stride_t + h * p.part_stride_h;
    for (int c = lane; c < chunks; c += 32) {
      const int col = 8 * c, cnt = min(8, p.head_dim - col);
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = nan ? NAN : 0.0f;
      if (!nan && !empty) {
        // kPartBatch parts' chunks loaded before the first is summed (one L2 round trip per batch, not per
        // part), then summed in part order.
        for (int64_t n0 = 0; n0 < p.num_parts; n0 += kPartBatch) {
          dev::Array<In, 8> v[kPartBatch];
#pragma unroll
          for (int j = 0; j < kPartBatch; ++j)
            if (n0 + j < p.num_parts && f[n0 + j] >= 0.0f)
              dev::load_chunk<kVec>(v[j], p_row + (n0 + j) * p.part_stride_n + col, cnt);
#pragma unroll
          for (int j = 0; j < kPartBatch; ++j) {
            if (n0 + j >= p.num_parts) break;
            const float fn = f[n0 + j];
            if (fn < 0.0f) continue;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] += fn * Act::to_float(v[j].v[i]);
          }
        }
      }
      dev::Array<In, 8> r;
#pragma unroll
      for (int i = 0; i < 8; ++i) r.v[i] = Act::from_float(acc[i]);
      dev::store_chunk<kVec>(o_row + col, r, cnt);
    }
    __syncwarp();  // the next row overwrites this warp's factors
  }
}

}  // namespace mla::cuda::merge
