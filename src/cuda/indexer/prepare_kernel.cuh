// SPDX-License-Identifier: Apache-2.0
#pragma once
// Indexer query / key preparation (mla/indexer.h indexer_prepare; docs/INDEXER.md §6). Included by
// launch.cu only.
//   One warp per (token, item), item < h a query head, item == h the token's key; lane l holds dims
//   4l..4l+3 in fp32. Key: LayerNorm by two warp reductions (mean, then the biased variance). Both:
//   NeoX rope on dims < 64 (dim i pairs with i + 32: lane l < 8 with lane l + 8, one shfl_xor 8), then the
//   Walsh-Hadamard transform (2 stages inside the thread, 5 across lanes by shfl_xor 1..16) scaled by
//   1/sqrt(128). Query heads: warp amax, the ue8m0 scale, e4m3 codes, lane 0 writes the weight.
//   No shared memory.
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/common/convert.cuh"

namespace mla::cuda::indexer {

template <class Storage>
struct PrepareParams {
  const Storage* q;            // [T, h, 128], strides q_row, q_head
  int64_t q_row, q_head;
  const Storage* k;            // [T, 128], row stride k_row
  int64_t k_row;
  const Storage* w_raw;        // [T, h], strides wr_row, wr_head
  int64_t wr_row, wr_head;
  const void* positions;       // [T] int32 or int64 (pos_i64), stride pos_stride
  int64_t pos_stride;
  bool pos_i64;
  const float* cos_sin;        // [P, 64], row stride cs_row
  int64_t cs_row, num_pos;
  const float* ln_w;           // [128], stride ln_w_stride
  const float* ln_b;           // [128], stride ln_b_stride
  int64_t ln_w_stride, ln_b_stride;
  uint8_t* q_codes;            // [T, h, 128], strides qc_row, qc_head
  int64_t qc_row, qc_head;
  float* weights;              // [T, h], strides w_row, w_head
  int64_t w_row, w_head;
  Storage* k_out;              // [T, 128], row stride ko_row
  int64_t ko_row;
  int64_t num_tokens, h;
  float eps, weight_scale;     // weight_scale = h^-1/2 * 128^-1/2
  bool hadamard;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Rope (dims < 64) and the optional Hadamard transform of the warp's 128 values (x: dims 4 lane + r).
// cs == nullptr (a position outside the table): NaN rotation.
__device__ __forceinline__ void rope_hadamard(float (&x)[4], const float* cs, bool hadamard) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float partner = __shfl_xor_sync(0xffffffffu, x[r], 8);
    if (lane < 16) {
      const int i = (lane % 8) * 4 + r;
      const float nan = __int_as_float(0x7fc00000);
      const float c = cs != nullptr ? cs[i] : nan, s = cs != nullptr ? cs[32 + i] : nan;
      x[r] = lane < 8 ? x[r] * c - partner * s : x[r] * c + partner * s;
    }
  }
  if (!hadamard) return;
  float y0 = x[0] + x[1], y1 = x[0] - x[1], y2 = x[2] + x[3], y3 = x[2] - x[3];
  x[0] = y0 + y2;
  x[1] = y1 + y3;
  x[2] = y0 - y2;
  x[3] = y1 - y3;
#pragma unroll
  for (int b = 0; b < 5; ++b) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float p = __shfl_xor_sync(0xffffffffu, x[r], 1 << b);
      x[r] = (lane >> b) & 1 ? p - x[r] : x[r] + p;
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) x[r] *= 0.08838834764831845f;  // 1/sqrt(128)
}

template <class Act>
__global__ void prepare_kernel(const PrepareParams<typename Act::Storage> p) {
  const int lane = threadIdx.x % 32;
  const int64_t item_all = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t t = item_all / (p.h + 1), item = item_all % (p.h + 1);
  if (t >= p.num_tokens) return;
  const int64_t pos = p.pos_i64 ? static_cast<const int64_t*>(p.positions)[t * p.pos_stride]
                                : static_cast<const int32_t*>(p.positions)[t * p.pos_stride];
  const float* cs = pos >= 0 && pos < p.num_pos ? p.cos_sin + pos * p.cs_row : nullptr;
  float x[4];
  if (item == p.h) {
#pragma unroll
    for (int r = 0; r < 4; ++r) x[r] = Act::to_float(p.k[t * p.k_row + lane * 4 + r]);
    const float mean = warp_sum(x[0] + x[1] + x[2] + x[3]) / 128.0f;
    float sq = 0.0f;
#pragma unroll
    for (int r = 0; r < 4; ++r) sq += (x[r] - mean) * (x[r] - mean);
    const float inv = 1.0f / sqrtf(warp_sum(sq) / 128.0f + p.eps);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int d = lane * 4 + r;
      x[r] = (x[r] - mean) * inv * p.ln_w[d * p.ln_w_stride] + p.ln_b[d * p.ln_b_stride];
    }
    rope_hadamard(x, cs, p.hadamard);
#pragma unroll
    for (int r = 0; r < 4; ++r) p.k_out[t * p.ko_row + lane * 4 + r] = Act::from_float(x[r]);
    return;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) x[r] = Act::to_float(p.q[t * p.q_row + item * p.q_head + lane * 4 + r]);
  rope_hadamard(x, cs, p.hadamard);
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
  for (int m = 16; m > 0; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const float s = mla::indexer::writer_scale(amax, true);
  uint8_t* codes = p.q_codes + t * p.qc_row + item * p.qc_head + lane * 4;
  const uint16_t lo = dev::float2_to_e4m3x2(x[0] / s, x[1] / s), hi = dev::float2_to_e4m3x2(x[2] / s, x[3] / s);
  codes[0] = static_cast<uint8_t>(lo);
  codes[1] = static_cast<uint8_t>(lo >> 8);
  codes[2] = static_cast<uint8_t>(hi);
  codes[3] = static_cast<uint8_t>(hi >> 8);
  if (lane == 0)
    p.weights[t * p.w_row + item * p.w_head] = Act::to_float(p.w_raw[t * p.wr_row + item * p.wr_head]) * p.weight_scale * s;
}

}  // namespace mla::cuda::indexer
