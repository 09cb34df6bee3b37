// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the CUDA sparse_mqa (POD, host-includable). Strides in elements.
#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "cuda/common/rotation.cuh"

namespace mla::cuda {

struct SparseParams {
  MqaRowParams rows;     // groups = T tokens, s_q = 1; q [T, h_q, d_qk], out [T, h_q, d_v], lse [T, h_q]
  MqaCacheParams cache;  // a flat row r is block r / page_size, offset r % page_size
  const int32_t* indices;      // [T, topk] flat cache rows; < 0 or >= num_blocks * page_size: invalid
  int64_t indices_stride;      // elements between tokens (inner stride 1)
  int32_t topk;
  const int32_t* topk_length;  // [T] or nullptr: entries at positions >= topk_length[t] are invalid
  int64_t topk_length_stride;

  // DeepSeek-V4 inputs (SparseOptions); absent when extra_indices / sink are nullptr.
  // The extra cache has the main cache's format and row bytes (the engine's MqaCacheParams describe
  // both), its own base, strides and page size; with block-scaled records it may have another record format
  // (extra_format) and its own alignment (extra_vec16). Token t's keys: valid main entries, then extra entries.
  const uint8_t* extra_data;        // [extra_blocks, extra_page, row_elems] or nullptr
  int64_t extra_stride_block, extra_stride_row, extra_num_blocks, extra_page_size;  // elements / rows
  CacheFormat extra_format;          // the main cache's, or (records) another record format
  int32_t extra_vec16;               // records: the extra cache's MqaCacheParams::vec16
  const int32_t* extra_indices;     // [T, extra_topk] flat rows of the extra cache, or nullptr
  int64_t extra_indices_stride;
  int32_t extra_topk;
  const int32_t* extra_topk_length;  // [T] or nullptr
  int64_t extra_topk_length_stride;
  const float* sink;                 // [h_q] natural-log logits, or nullptr
  int64_t sink_stride;
  // The output's rotation (SparseOptions::out_rotation; cuda/common/rotation.cuh): columns d_v - rot.dim .. d_v - 1
  // of token t's rows turned pairwise by its position times inv_freq before the store; rot.dim 0: none.
  dev::OutRotation rot;
};

}  // namespace mla::cuda
