// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one rule by which every merge of partial attention states weighs its parts (docs/SEMANTICS.md §13 and
// §14.6a), shared by the split-KV combine of mqa_decode (split_kv_kernel.cuh: the portable and the sm90
// kernels' partials), the N-way combine of combine_attn_states and DCP (n_way_kernel.cuh). Arch-neutral.
//
// Parts n = 0..N-1 attended disjoint key sets and carry lse_n (their log-sum-exp, -inf when empty):
//   m = max of the finite lse_n;  w_n = exp(lse_n - m) for finite lse_n, else 0 (an empty part is never read)
//   lse = m + ln sum_n w_n;  out = sum_n (w_n / sum w) * out_n
// A NaN lse_n makes the row NaN (lse and every column); all parts empty gives out 0 and lse -inf. fp32.
//
// warp_merge_lse computes (m, sum w, NaN) with the 32 lanes of one warp (lane l reads parts l, l + 32, ...);
// every lane gets the result. MergeState::factor then gives part n's factor w_n / sum w (0 for an empty part).
// merge_factors is the same rule over a few parts held in one thread's registers.
#include <cmath>
#include <cstdint>

namespace mla::cuda::combine {

struct MergeState {
  float m;    // max of the finite part LSEs (-inf when there is none)
  float sum;  // sum of exp(lse_n - m) over the finite parts
  bool nan;   // some part's lse is NaN
  __device__ bool empty() const { return !nan && m == -INFINITY; }
  // The merged LSE.
  __device__ float lse() const { return nan ? NAN : empty() ? -INFINITY : m + logf(sum); }
  // Part n's factor from its lse: w_n / sum w, 0 for an empty part (NaN rows never read their parts).
  __device__ float factor(float lse_n) const { return isfinite(lse_n) ? expf(lse_n - m) / sum : 0.0f; }
};

// LseAt: float(int64_t n), part n's LSE.
template <class LseAt>
__device__ MergeState warp_merge_lse(const LseAt& lse_at, int64_t parts) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  float m = -INFINITY;
  bool nan = false;
  for (int64_t n = lane; n < parts; n += 32) {
    const float l = lse_at(n);
    nan |= isnan(l);
    if (isfinite(l)) m = fmaxf(m, l);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  nan = __any_sync(0xffffffffu, nan);
  float sum = 0.0f;
  for (int64_t n = lane; n < parts; n += 32) {
    const float l = lse_at(n);
    if (isfinite(l)) sum += expf(l - m);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  return {m, sum, nan};
}

// The rule over kParts part LSEs one thread holds (lse[n] for n < kParts; a part past the row's count given as -inf):
// each part's factor w_n / sum w into w (0 for an empty part; NaN for every part when one is NaN), the state returned.
// The exponentials are taken once (factor() would take each again); the factors multiply by 1 / sum.
template <int kParts>
__device__ __forceinline__ MergeState merge_factors(const float (&lse)[kParts], float (&w)[kParts]) {
  float m = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int n = 0; n < kParts; ++n) {
    nan |= isnan(lse[n]);
    if (isfinite(lse[n])) m = fmaxf(m, lse[n]);
  }
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < kParts; ++n) {
    w[n] = isfinite(lse[n]) ? expf(lse[n] - m) : 0.0f;
    sum += w[n];
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // every part empty: every factor 0
#pragma unroll
  for (int n = 0; n < kParts; ++n) w[n] = nan ? NAN : w[n] * inv;
  return {m, sum, nan};
}

}  // namespace mla::cuda::combine
