// SPDX-License-Identifier: Apache-2.0
#pragma once
// Indexer K cache kernels (docs/INDEXER.md §1). Included by launch.cu only (non-template kernels are
// defined here: one translation unit).
//   write:  one warp per token; lane l holds values 4l..4l+3, amax by butterfly shuffles, the scale rule
//           of core/indexer_math.h, codes e4m3_satfinite(x / scale) stored as one 4-byte word per lane,
//           the scale by lane 0. Slots < 0 and slots outside the cache are skipped. No shared memory.
//   gather: one warp per destination row; request found by binary search over cu (B+1 entries); lane l
//           copies 4 code bytes, lane 0 the scale. Positions whose block lies outside the table or the
//           cache are skipped (row untouched). No shared memory.
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/common/convert.cuh"
#include "cuda/indexer/cache_addr.cuh"
#include "cuda/indexer/params.h"
#include "mla/indexer.h"

namespace mla::cuda::indexer {

template <class Act>
__global__ void write_k_kernel(const WriteParams<typename Act::Storage> p) {
  const int lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.num_tokens) return;
  const int64_t slot = p.slots_i64 ? static_cast<const int64_t*>(p.slots)[t * p.slot_stride]
                                   : static_cast<const int32_t*>(p.slots)[t * p.slot_stride];
  if (slot < 0 || slot >= p.cache.num_blocks * p.cache.page_size) return;
  float x[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[i] = Act::to_float(p.k[t * p.k_row + lane * 4 + i]);
    amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const float s = mla::indexer::writer_scale(amax, p.ue8m0);
  const int64_t block = slot / p.cache.page_size, off = slot % p.cache.page_size;
  const uint32_t lo = dev::float2_to_e4m3x2(x[0] / s, x[1] / s), hi = dev::float2_to_e4m3x2(x[2] / s, x[3] / s);
  reinterpret_cast<uint32_t*>(codes_ptr(p.cache, block, off))[lane] = lo | (hi << 16);
  if (lane == 0) *scale_ptr(p.cache, block, off) = s;
}

// static: this header reaches two translation units (launch.cu, and logits.cu through logits_common.cuh).
static __global__ void gather_k_kernel(const GatherParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.tot) return;
  // The request whose rows [cu[r], cu[r+1]) hold `row` (the last such r for empty requests).
  int64_t lo = 0, hi = p.num_requests;  // invariant: cu[lo] <= row < cu[hi] when it exists
  if (row < p.cu[0] || row >= p.cu[hi * p.cu_stride]) return;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (p.cu[mid * p.cu_stride] <= row) lo = mid;
    else hi = mid;
  }
  const int64_t pos = row - p.cu[lo * p.cu_stride];
  const int64_t col = pos / p.cache.page_size;
  if (col >= p.max_blocks) return;
  const int64_t block = p.block_table[lo * p.bt_row + col];
  if (block < 0 || block >= p.cache.num_blocks) return;
  const int64_t off = pos % p.cache.page_size;
  const uint32_t v = reinterpret_cast<const uint32_t*>(codes_ptr(p.cache, block, off))[lane];
  uint8_t* dst = p.dst_k + row * p.dst_k_row + lane * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(v >> (8 * i));
  if (lane == 0) p.dst_scale[row * p.dst_scale_stride] = *scale_ptr(p.cache, block, off);
}

}  // namespace mla::cuda::indexer
