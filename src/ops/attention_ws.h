#pragma once
// Split-KV scratch size of the CUDA mqa_decode, declared here so that the host-compiled front end
// (src/ops/attention.cpp) can answer mqa_decode_workspace_bytes and check a caller's workspace without
// CUDA headers. Defined by the CUDA decode family (src/cuda/decode/); no CUDA or fmt includes here.
#include <cstddef>
#include <cstdint>

namespace mla::cuda {

// Bytes of device workspace mqa_decode needs for b requests of s_q queries and h_q heads whose keys number
// at most max_seq_len. The front end checks a given workspace against this value with
// max_seq_len = max_blocks * page_size (the bound every kernel can derive from the block table's shape
// without reading seq_lens). Arguments are validated (non-negative) by the caller.
std::size_t decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len);

}  // namespace mla::cuda
