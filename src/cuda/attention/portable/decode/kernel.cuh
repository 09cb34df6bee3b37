// SPDX-License-Identifier: Apache-2.0
#pragma once
// mqa_decode: absorbed MQA over the paged latent cache (docs/SEMANTICS.md §6), split-KV.
//
// Algorithm: request b's rows (i, h), M = s_q * h_q of them, are cut into 64-row tiles; its positions
// [0, seq_len) into num_splits contiguous ranges of whole 32-key tiles. One CTA of the MQA engine
// (common/mqa_core.cuh: warp roles, shared-memory budget and pipeline are described there) computes one
// (row tile, split, request) and, with one split, writes out / lse directly. With several splits it
// writes O / l and the partial LSE into the caller's workspace (combine/split_kv.h's layout) and the split-KV
// combine merges them by the merge rule (attention/combine/merge_rule.cuh: empty splits cost nothing, an
// all-empty row gives out 0, lse -inf).
// Causality within the step: query i (position seq_len - s_q + i) sees positions <= seq_len - s_q + i.
// The kernel reads only positions < seq_len (clamped to max_blocks * page_size, so never outside the
// block table) and only pages whose id lies in [0, num_blocks); other keys are masked.
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/attention/portable/common/mqa_core.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/attention/portable/decode/params.h"
#include "cuda/attention/portable/decode/traits.cuh"

namespace mla::cuda::decode {

struct DecodeKeys {
  using Params = DecodeParams;
  int64_t group;
  int key_begin, key_end;
  float* ws_o;
  float* ws_lse;
  int64_t ws_row0;
  int seq_len, s_q, causal;
  const int32_t* table;  // this request's block-table row
  int64_t page_size, num_blocks, stride_block, stride_row;
  int elem_bytes;

  __device__ DecodeKeys(const DecodeParams& p, int64_t unit) {
    const int splits = p.num_splits;
    group = unit / splits;
    const int split = static_cast<int>(unit % splits);
    page_size = p.cache.page_size;
    const int64_t cap = p.max_blocks * page_size;
    const int64_t len = p.seq_lens[group * p.seq_lens_stride];
    seq_len = static_cast<int>(len < 0 ? 0 : len > cap ? cap : len);
    const int tiles = (seq_len + Traits::kBlockN - 1) / Traits::kBlockN;
    const int per_split = (tiles + splits - 1) / splits;
    const int t0 = min(split * per_split, tiles), t1 = min(t0 + per_split, tiles);
    key_begin = t0 * Traits::kBlockN;
    key_end = min(t1 * Traits::kBlockN, seq_len);
    s_q = p.rows.s_q;
    causal = p.causal;
    table = p.block_table + group * p.block_table_stride;
    num_blocks = p.cache.num_blocks;
    stride_block = p.cache.stride_block;
    stride_row = p.cache.stride_row;
    elem_bytes = p.cache.elem_bytes;
    if (splits > 1) {
      ws_o = p.ws_o;
      ws_lse = p.ws_lse;
      ws_row0 = unit * (static_cast<int64_t>(p.rows.s_q) * p.rows.h_q);
    } else {
      ws_o = nullptr;
      ws_lse = nullptr;
      ws_row0 = 0;
    }
  }

  __device__ int row_limit(int i) const {
    const int lim = causal ? seq_len - s_q + i : seq_len - 1;
    return lim < -1 ? -1 : lim;
  }

  // Positions are tags: the softmax compares them with row_limit.
  __device__ int64_t row_offset(int pos, int& tag) const {
    const int64_t blk = table[pos / page_size];
    if (blk < 0 || blk >= num_blocks) return -1;
    tag = pos;
    return (blk * stride_block + (pos % page_size) * stride_row) * elem_bytes;
  }
};

}  // namespace mla::cuda::decode
