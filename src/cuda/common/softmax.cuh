// SPDX-License-Identifier: Apache-2.0
#pragma once
// Online-softmax helpers shared by the attention kernels. Scores are kept in the log2 domain
// (score * softmax_scale * log2(e)) so that exp is one ex2.approx; LSE is converted back to natural
// log on output (DESIGN.md §4: LSE is fp32, base e). A row that has seen no visible key keeps
// max = -inf and sum = 0; every helper below keeps such rows NaN-free.
#include <cmath>

namespace mla::cuda::softmax {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Reductions over the 4 lanes of a quad (lanes 4g..4g+3), the threads that share one mma row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Running state of one query row: max of the (log2-domain) scores so far and the sum of
// exp2(score - max). Update with a new block's row max `block_max` (-inf if the block had no
// visible key): returns the factor the previous accumulators must be multiplied by.
struct RowState {
  float max = -INFINITY;
  float sum = 0.0f;

  // New max after seeing `block_max`; the caller computes p = exp2(s - new_max) for visible keys.
  __device__ __forceinline__ float rescale(float block_max) {
    const float new_max = fmaxf(max, block_max);
    // Both -inf: nothing visible yet; keep factor 1 (the accumulators are 0) and avoid -inf - -inf.
    const float factor = new_max == -INFINITY ? 1.0f : exp2_approx(max - new_max);
    sum *= factor;
    max = new_max;
    return factor;
  }
  // Exponent base for visible keys; 0 when nothing is visible (then every p is masked to 0 anyway).
  __device__ __forceinline__ float base() const { return max == -INFINITY ? 0.0f : max; }
  // Natural-log LSE, -inf for an empty row (sum exactly 0). A NaN score makes sum NaN, and the LSE and
  // 1 / sum NaN with it: NaN propagates and is never taken for an empty row (SEMANTICS.md §14.6a).
  // fmaxf drops NaN from the running max, so the max alone cannot tell.
  __device__ __forceinline__ float lse() const { return sum == 0.0f ? -INFINITY : (max + __log2f(sum)) * kLn2; }
  __device__ __forceinline__ float inv_sum() const { return sum == 0.0f ? 0.0f : 1.0f / sum; }
};

// A finished row with an attention sink (log2 domain; a key of value 0 entering the denominator only):
// overwrites `inv` (the factor of the unnormalised output accumulators) and the natural-log `lse` that
// the row's state gave. -inf: no change. A row without keys gets inv 0 (out 0) and lse = sink; a NaN
// sink or score makes both NaN.
__device__ __forceinline__ void fold_sink(const RowState& st, float sink, float& inv, float& lse) {
  if (sink != sink) {
    inv = lse = sink;
    return;
  }
  const float new_max = fmaxf(st.max, sink);
  if (new_max == -INFINITY) return;
  const float factor = exp2_approx(st.max - new_max);  // 0 for a row without keys (max = -inf)
  const float sum = st.sum * factor + exp2_approx(sink - new_max);
  inv = factor / sum;
  lse = (new_max + __log2f(sum)) * kLn2;
}

}  // namespace mla::cuda::softmax
