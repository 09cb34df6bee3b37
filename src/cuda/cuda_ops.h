// SPDX-License-Identifier: Apache-2.0
#pragma once
// CUDA backend entry points, called by the front ends in src/ops/ after validation. Plain C++
// declarations (no CUDA headers) so that src/ops/ compiles with the host compiler; only linked when
// MLA_WITH_CUDA. ctx.stream is the cudaStream_t to launch on; nothing here synchronises.
#include "mla/block_ops.h"
#include "mla/indexer.h"
#include "mla/ops.h"

#include <cstddef>
#include <cstdint>

namespace mla::cuda {
#include "core/backend_ops.inc"

// Bytes of device workspace mqa_decode needs for b requests of s_q queries and h_q heads cut into
// num_splits KV ranges (0 for one split): the layout of the partials is the split-KV combine's
// (src/cuda/attention/combine/split_kv.h). The split count itself is the planner's decision (decode_num_splits,
// mla/plan.h). Arguments are validated (non-negative, num_splits >= 1) by the caller.
std::size_t decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int num_splits);
}  // namespace mla::cuda
