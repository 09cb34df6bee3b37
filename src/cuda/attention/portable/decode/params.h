// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the CUDA mqa_decode (POD, host-includable). Strides in elements.
#include <cstdint>

#include "cuda/common/mqa_params.h"

namespace mla::cuda {

struct DecodeParams {
  MqaRowParams rows;     // groups = b requests; q [b, s_q, h_q, d_qk], out [b, s_q, h_q, d_v], lse [b, s_q, h_q]
  MqaCacheParams cache;
  const int32_t* block_table;  // [b, max_blocks] page ids
  int64_t block_table_stride;  // elements between requests
  int64_t max_blocks;
  const int32_t* seq_lens;     // [b]; clamped to [0, max_blocks * page_size] in the kernel
  int64_t seq_lens_stride;
  int32_t causal;              // query i sees positions [0, seq_len - s_q + i]; else [0, seq_len)
  int32_t num_splits;          // KV splits per request (1: the attention kernel writes out / lse itself)
  float* ws_lse;               // [b, num_splits, s_q * h_q] partial LSE (num_splits > 1)
  float* ws_o;                 // [b, num_splits, s_q * h_q, 512] partial O / l (num_splits > 1)
  // The sm90 balanced schedule's combine (core/decode_balance.h): request g's partials are the slots
  // ws_meta[2g] .. + ws_meta[2g + 1] - 1 of ws_lse [slots, s_q * h_q] / ws_o [slots, s_q * h_q, 512];
  // ws_meta[2g + 1] <= 1: the attention kernel wrote the request itself. nullptr: the layout above.
  const int32_t* ws_meta;
};

}  // namespace mla::cuda
