#pragma once
// Split-KV scratch size of the CUDA mqa_decode, declared here so that the host-compiled front end
// (src/ops/attention.cpp) can answer mqa_decode_workspace_bytes and check a caller's workspace without
// CUDA headers (the layout of the partials is the kernel family's). Defined by the CUDA decode family
// (src/cuda/decode/); no CUDA or fmt includes here.
#include <cstddef>
#include <cstdint>

namespace mla::cuda {

// Bytes of device workspace mqa_decode needs for b requests of s_q queries and h_q heads cut into
// num_splits KV ranges (0 for one split). The split count itself is the planner's decision
// (decode_num_splits, mla/plan.h). Arguments are validated (non-negative, num_splits >= 1) by the caller.
std::size_t decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int num_splits);

}  // namespace mla::cuda
