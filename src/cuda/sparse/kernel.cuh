#pragma once
// sparse_mqa: MQA of each token's heads over its own top-k cache rows (FlashMLA-sparse semantics,
// docs/SEMANTICS.md §11.6, ops.h).
//
// Algorithm: token t's h_q heads are cut into 64-row tiles; one CTA of the MQA engine
// (common/mqa_core.cuh: warp roles, shared-memory budget and pipeline are described there) streams
// entries [0, topk_length[t]) of the token's index row in tiles of 32. Entry j names the flat cache row
// r = indices[t, j] (block r / page_size, offset r % page_size); r < 0 or r >= num_blocks * page_size is
// invalid and never read, as is every entry at j >= topk_length[t]. Duplicates are separate keys (they
// count twice). A token with no valid entry ("lonely") gets out 0 and lse -inf [PIN].
#include <climits>
#include <cstdint>

#include "cuda/common/mqa_core.cuh"
#include "cuda/sparse/params.h"
#include "cuda/sparse/traits.cuh"

namespace mla::cuda::sparse {

struct SparseKeys {
  using Params = SparseParams;
  int64_t group;
  int key_begin, key_end;
  float* ws_o = nullptr;  // no split-KV: the engine writes out / lse
  float* ws_lse = nullptr;
  int64_t ws_row0 = 0;
  const int32_t* row;  // this token's index row
  int64_t page_size, num_slots, stride_block, stride_row;
  int elem_bytes;

  __device__ SparseKeys(const SparseParams& p, int64_t unit) {
    group = unit;
    key_begin = 0;
    key_end = p.topk;
    if (p.topk_length) {
      const int len = p.topk_length[unit * p.topk_length_stride];
      key_end = len < 0 ? 0 : len > p.topk ? p.topk : len;
    }
    row = p.indices + unit * p.indices_stride;
    page_size = p.cache.page_size;
    num_slots = p.cache.num_blocks * page_size;
    stride_block = p.cache.stride_block;
    stride_row = p.cache.stride_row;
    elem_bytes = p.cache.elem_bytes;
  }

  __device__ int row_limit(int) const { return INT_MAX; }  // no causal mask: the indices are the mask

  __device__ int64_t row_offset(int j, int& tag) const {
    const int64_t r = row[j];
    if (r < 0 || r >= num_slots) return -1;
    tag = 0;
    return ((r / page_size) * stride_block + (r % page_size) * stride_row) * elem_bytes;
  }
};

}  // namespace mla::cuda::sparse
