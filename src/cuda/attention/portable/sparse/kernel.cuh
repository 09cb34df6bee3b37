// SPDX-License-Identifier: Apache-2.0
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
//
// DeepSeek-V4 inputs (SparseOptions, SEMANTICS §11.8): an extra cache of the same format (records: any record
// format, the engine converts per row) with its own index row and length; its valid entries follow the main ones in the token's key range (key j >=
// main.len is extra entry j - main.len), so both go through one online softmax. A per-head sink joins
// each row's state in the epilogue (softmax::fold_sink). An output rotation (SparseOptions::out_rotation) turns the
// last rot.dim columns of each row pairwise in the epilogue (mqa_core.cuh KeysWithRotation).
#include <climits>
#include <cstdint>

#include "cuda/attention/portable/common/mqa_core.cuh"
#include "cuda/attention/portable/sparse/params.h"
#include "cuda/attention/portable/sparse/traits.cuh"

namespace mla::cuda::sparse {

struct SparseKeys {
  using Params = SparseParams;
  int64_t group;
  int key_begin, key_end;
  float* ws_o = nullptr;  // no split-KV: the engine writes out / lse
  float* ws_lse = nullptr;
  int64_t ws_row0 = 0;
  // One index list over one cache: entries [0, len) of `row` name flat rows of `data`.
  struct List {
    const int32_t* row;
    const uint8_t* data;
    int64_t page_size, num_slots, stride_block, stride_row;  // strides in elements
    int len;
    CacheFormat format;  // records: each list's own format
    bool vec;            // records: 16-byte copies legal
  };
  List main, extra;  // token t's keys: main entries [0, main.len), then extra entries (extra.len 0: none)
  int elem_bytes;
  const float* sink;  // [h_q] or nullptr
  int64_t sink_stride;
  dev::OutRotation rot;  // the output's rotation (rot.dim 0: none); the group is the token

  __device__ static int clamp_len(const int32_t* lengths, int64_t stride, int64_t unit, int topk) {
    if (!lengths) return topk;
    const int len = lengths[unit * stride];
    return len < 0 ? 0 : len > topk ? topk : len;
  }

  __device__ SparseKeys(const SparseParams& p, int64_t unit) {
    group = unit;
    main = {p.indices + unit * p.indices_stride, p.cache.data, p.cache.page_size, p.cache.num_blocks * p.cache.page_size,
            p.cache.stride_block, p.cache.stride_row, clamp_len(p.topk_length, p.topk_length_stride, unit, p.topk),
            p.cache.format, p.cache.vec16 != 0};
    if (p.extra_indices) {
      extra = {p.extra_indices + unit * p.extra_indices_stride, p.extra_data, p.extra_page_size,
               p.extra_num_blocks * p.extra_page_size, p.extra_stride_block, p.extra_stride_row,
               clamp_len(p.extra_topk_length, p.extra_topk_length_stride, unit, p.extra_topk), p.extra_format,
               p.extra_vec16 != 0};
    } else {
      extra = {nullptr, nullptr, 1, 0, 0, 0, 0, p.cache.format, false};
    }
    key_begin = 0;
    key_end = main.len + extra.len;
    elem_bytes = p.cache.elem_bytes;
    sink = p.sink;
    sink_stride = p.sink_stride;
    rot = p.rot;
  }

  __device__ int row_limit(int) const { return INT_MAX; }  // no causal mask: the indices are the mask

  __device__ __forceinline__ const uint8_t* lookup(const List& l, int64_t r, int& tag) const {
    if (r < 0 || r >= l.num_slots) return nullptr;
    tag = 0;
    return l.data + ((r / l.page_size) * l.stride_block + (r % l.page_size) * l.stride_row) * elem_bytes;
  }
  __device__ const uint8_t* row_pointer(int j, int& tag) const {
    return j < main.len ? lookup(main, main.row[j], tag) : lookup(extra, extra.row[j - main.len], tag);
  }

  // Block-scaled record caches (the engine's record path): key j's body and scale slot through its list's
  // format (mla/cache_format.h RecordLayout::body_offset / slot_offset; record caches hold bytes).
  __device__ __forceinline__ mqa::RecordRow record_in(const List& l, int64_t r, int& tag) const {
    mqa::RecordRow out{nullptr, nullptr, l.format, l.vec};
    if (r < 0 || r >= l.num_slots) return out;
    const int64_t blk = r / l.page_size, in_page = r - blk * l.page_size;
    const uint8_t* page = l.data + blk * l.stride_block;
    visit_record_cache_format(l.format, [&](auto fmt) {
      using Fmt = decltype(fmt);
      out.body = page + Fmt::body_offset(in_page, l.stride_row);
      out.slot = page + Fmt::slot_offset(l.page_size, in_page, l.stride_row);
    });
    if (out.body) tag = 0;
    return out;
  }
  __device__ mqa::RecordRow record_row(int j, int& tag) const {
    return j < main.len ? record_in(main, main.row[j], tag) : record_in(extra, extra.row[j - main.len], tag);
  }

  // The output's rotation of the engine's epilogue (mqa_core.cuh KeysWithRotation): the rotation and this unit's
  // token's position.
  __device__ const dev::OutRotation& out_rotation() const { return rot; }
  __device__ double out_position() const { return rot.dim > 0 ? rot.position(group) : 0.0; }

  __device__ float sink_log2(int head) const {
    return sink ? sink[head * sink_stride] * 1.4426950408889634f : -INFINITY;
  }
};

}  // namespace mla::cuda::sparse
