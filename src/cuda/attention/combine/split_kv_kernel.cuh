// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-KV combine kernel (split_kv.h): one CTA per output row (request g, row (i, h)); warp 0 weighs the
// row's partials by the merge rule (merge_rule.cuh), then every thread sums its columns in split order.
#include <cstdint>

#include "cuda/attention/combine/merge_rule.cuh"
#include "cuda/attention/combine/split_kv.h"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/trace.cuh"

namespace mla::cuda::combine {

// kBatch: live partials a thread loads at once (split_kv.h combine_batch); its registers set the CTAs an SM holds.
template <class Act, int kBatch>
__global__ void __launch_bounds__(kThreads, kBatch > 8 ? 4 : 8) split_kv_kernel(const SplitKvParams p) {
  __shared__ float weight[kMaxMergedSplits];
  __shared__ float total_lse;
  const MqaRowParams& rp = p.rows;
  const int64_t m_rows = static_cast<int64_t>(rp.s_q) * rp.h_q;
  const int64_t g = blockIdx.x / m_rows;
  const int row = static_cast<int>(blockIdx.x % m_rows);
  const int i = row / rp.h_q, h = row % rp.h_q;
  auto* out = static_cast<typename Act::Storage*>(rp.out) + g * rp.out_stride_g + i * rp.out_stride_i +
              h * rp.out_stride_h;
  MLA_DECODE_TRACE_EVENT(decode_sm90::kTraceCombineBase, 0);
  // While the attention kernel runs (this grid waits on the device below): the output row's first line
  // into L2, so that the final stores find it (and its translation) warm after a cold start.
  if (threadIdx.x == 0) cuda::ptx::prefetch_l2(out);
  cuda::ptx::grid_dependency_wait();  // launched as a dependent of the attention kernel: its partials
  cuda::ptx::launch_dependents();
  MLA_DECODE_TRACE_EVENT(decode_sm90::kTraceCombineBase + 1, 0);
  int splits = p.num_splits;
  int64_t slot0 = g * splits;
  if (p.ws_meta != nullptr) {
    slot0 = p.ws_meta[2 * g];
    splits = min(p.ws_meta[2 * g + 1], kMaxMergedSplits);
    if (splits <= 1) return;
  }
  const float* lse_s = p.ws_lse + slot0 * m_rows + row;  // split s at lse_s[s * m_rows]
  const float* o_s = p.ws_o + (slot0 * m_rows + row) * int64_t(kMaxDv);
  const int64_t split_stride = m_rows * kMaxDv;
  const int col = 4 * static_cast<int>(threadIdx.x);
  if (splits <= kBatch && rp.d_v == kMaxDv) {
    // One round trip: every thread loads all splits' LSEs (the same addresses in every thread: L1 broadcasts) and its
    // four columns of every partial at once, then applies the merge rule in registers in split order (an empty or
    // skipped split's columns may hold garbage: loaded, never used).
    float l[kBatch], w[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      l[j] = -INFINITY;
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j < splits) {
        l[j] = lse_s[j * m_rows];
        v[j] = *reinterpret_cast<const float4*>(o_s + j * split_stride + col);
      }
    }
    const MergeState st = merge_factors(l, w);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (w[j] != 0.0f) {  // NaN factors included: a NaN split makes the row NaN
        acc[0] += w[j] * v[j].x;
        acc[1] += w[j] * v[j].y;
        acc[2] += w[j] * v[j].z;
        acc[3] += w[j] * v[j].w;
      }
    }
    if (threadIdx.x == 0 && rp.lse) rp.lse[g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = st.lse();
#pragma unroll
    for (int c = 0; c < 4; ++c) out[col + c] = Act::from_float(acc[c]);
    MLA_DECODE_TRACE_EVENT(decode_sm90::kTraceCombineBase + 3, 0);
    return;
  }
  if (threadIdx.x < 32) {
    const MergeState st = warp_merge_lse([&](int64_t s) { return lse_s[s * m_rows]; }, splits);
    // A NaN split makes every weight NaN, hence every column (an empty split's weight is 0: not read).
    for (int s = threadIdx.x; s < splits; s += 32) weight[s] = st.nan ? NAN : st.factor(lse_s[s * m_rows]);
    if (threadIdx.x == 0) total_lse = st.lse();
  }
  __syncthreads();
  MLA_DECODE_TRACE_EVENT(decode_sm90::kTraceCombineBase + 2, 0);
  if (threadIdx.x == 0 && rp.lse) rp.lse[g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = total_lse;
  // Each thread owns four adjacent columns (kThreads * 4 = kMaxDv: one pass) and loads them from up to kBatch
  // partials at once, 16-byte loads all in flight before the first is summed: the whole row is one L2 round
  // trip after the weights for up to kBatch splits (one column and eight splits at a time took ten dependent
  // trips at 16 splits). Summed in split order. Skipped splits (weight 0) may hold garbage: not read.
  static_assert(kThreads * 4 == kMaxDv, "one pass of four columns per thread covers a partial row");
  if (col >= rp.d_v) return;
  const bool whole = col + 4 <= rp.d_v;  // else the row's last 1..3 columns, loaded one by one
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s0 = 0; s0 < splits; s0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (s0 + j < splits && weight[s0 + j] != 0.0f) {
        const float* src = o_s + (s0 + j) * split_stride + col;
        if (whole) {
          v[j] = *reinterpret_cast<const float4*>(src);
        } else {
          v[j].x = src[0];
          if (col + 1 < rp.d_v) v[j].y = src[1];
          if (col + 2 < rp.d_v) v[j].z = src[2];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (s0 + j < splits && weight[s0 + j] != 0.0f) {
        const float w = weight[s0 + j];
        acc[0] += w * v[j].x;
        acc[1] += w * v[j].y;
        acc[2] += w * v[j].z;
        acc[3] += w * v[j].w;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (col + c < rp.d_v) out[col + c] = Act::from_float(acc[c]);
  MLA_DECODE_TRACE_EVENT(decode_sm90::kTraceCombineBase + 3, 0);
}

}  // namespace mla::cuda::combine
