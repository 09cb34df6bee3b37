#pragma once
// Launch parameters of the CUDA sparse_mqa (POD, host-includable). Strides in elements.
#include <cstdint>

#include "cuda/common/mqa_params.h"

namespace mla::cuda {

struct SparseParams {
  MqaRowParams rows;     // groups = T tokens, s_q = 1; q [T, h_q, d_qk], out [T, h_q, d_v], lse [T, h_q]
  MqaCacheParams cache;  // a flat row r is block r / page_size, offset r % page_size
  const int32_t* indices;      // [T, topk] flat cache rows; < 0 or >= num_blocks * page_size: invalid
  int64_t indices_stride;      // elements between tokens (inner stride 1)
  int32_t topk;
  const int32_t* topk_length;  // [T] or nullptr: entries at positions >= topk_length[t] are invalid
  int64_t topk_length_stride;
};

}  // namespace mla::cuda
