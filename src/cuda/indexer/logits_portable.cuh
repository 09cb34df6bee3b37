// SPDX-License-Identifier: Apache-2.0
#pragma once
// Indexer logits on CUDA cores (variant "portable" of indexer_logits; docs/INDEXER.md §3): any h, any
// alignment, sm_80+. The fallback of the sm90 variant and a second, independent GPU formulation.
//
// Algorithm. A CTA of 128 threads owns one query row and 128 consecutive key columns, one per thread.
// The thread converts its key's 128 codes to fp32 registers once; the row's q is staged in shared
// memory 64 heads at a time (as fp32, broadcast reads), and the thread accumulates
//   logit = sum_h w[h] * relu_nan((sum_d q[h][d] * k[d]) * k_scale)
// in fp32 (products of e4m3 values are exact in fp32). Columns outside the row's range are -inf.
// Shared memory: 64 x 128 fp32 q + 64 fp32 weights = 32.25 KiB.
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/common/convert.cuh"
#include "cuda/indexer/logits_common.cuh"

namespace mla::cuda::indexer {

constexpr int kPortableThreads = 128;

__global__ void __launch_bounds__(kPortableThreads) logits_portable_kernel(const LogitsParams p, int64_t num_chunks) {
  __shared__ float q_s[64][128];
  __shared__ float w_s[64];
  const int tid = threadIdx.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) / num_chunks;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) % num_chunks) * kPortableThreads + tid;
  int64_t lo, hi;
  row_range(p, t, lo, hi);
  const bool in = col < p.n_cols && col >= lo && col < hi;
  float k[128];
  float scale = 0.0f;
  if (in) {
    const KeyAddr a = key_addr(p, p.paged ? t / p.s_q : 0, col);
    if (a.codes != nullptr) {
#pragma unroll
      for (int d = 0; d < 128; d += 2) {
        const float2 f = dev::e4m3x2_to_float2(static_cast<uint16_t>(a.codes[d] | (a.codes[d + 1] << 8)));
        k[d] = f.x;
        k[d + 1] = f.y;
      }
      scale = *a.scale;
    } else {
#pragma unroll
      for (int d = 0; d < 128; ++d) k[d] = 0.0f;
      scale = __int_as_float(0x7fc00000);  // block outside the cache: never read, NaN logit
    }
  }
  float sum = 0.0f;
  for (int64_t h0 = 0; h0 < p.h; h0 += 64) {
    __syncthreads();
    for (int i = tid; i < 64 * 128; i += kPortableThreads) {
      const int64_t head = h0 + i / 128;
      q_s[i / 128][i % 128] =
          head < p.h ? dev::e4m3_to_float(p.q[t * p.q_row + head * p.q_head + i % 128]) : 0.0f;
    }
    if (tid < 64) w_s[tid] = h0 + tid < p.h ? p.w[t * p.w_row + (h0 + tid) * p.w_head] : 0.0f;
    __syncthreads();
    if (!in) continue;
    const int nh = p.h - h0 < 64 ? static_cast<int>(p.h - h0) : 64;
    for (int hh = 0; hh < nh; ++hh) {
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < 128; d += 4) {
        const float4 q4 = *reinterpret_cast<const float4*>(&q_s[hh][d]);
        dot = fmaf(q4.x, k[d], dot);
        dot = fmaf(q4.y, k[d + 1], dot);
        dot = fmaf(q4.z, k[d + 2], dot);
        dot = fmaf(q4.w, k[d + 3], dot);
      }
      sum = fmaf(w_s[hh], mla::indexer::relu_nan(dot * scale), sum);
    }
  }
  if (col < p.n_cols) p.logits[t * p.out_row + col] = in ? sum : -__int_as_float(0x7f800000);
}

}  // namespace mla::cuda::indexer
