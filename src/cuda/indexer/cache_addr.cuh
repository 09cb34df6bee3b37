// SPDX-License-Identifier: Apache-2.0
#pragma once
// Byte addresses inside the indexer K cache (docs/INDEXER.md §1): block b starts at base + b *
// block_stride; token o's codes at o * 128, its fp32 scale at page_size * 128 + o * 4.
#include <cstdint>

#include "cuda/indexer/params.h"
#include "mla/indexer.h"

namespace mla::cuda::indexer {

__device__ __forceinline__ uint8_t* block_base(const CacheRef& c, int64_t block) {
  return c.base + block * c.block_stride;
}
__device__ __forceinline__ uint8_t* codes_ptr(const CacheRef& c, int64_t block, int64_t off) {
  return block_base(c, block) + off * kIndexerHeadDim;
}
__device__ __forceinline__ float* scale_ptr(const CacheRef& c, int64_t block, int64_t off) {
  return reinterpret_cast<float*>(block_base(c, block) + c.page_size * kIndexerHeadDim + off * kIndexerScaleBytes);
}

}  // namespace mla::cuda::indexer
