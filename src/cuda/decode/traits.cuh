// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decode tiling (the MQA engine's, common/mqa_traits.cuh) and the split-KV workspace layout.
#include <cstdint>

#include "cuda/common/mqa_traits.cuh"
#include "mla/plan.h"

namespace mla::cuda::decode {

using Traits = mqa::Traits;

inline constexpr int kMaxSplits = kDecodeMaxSplits;  // partials per request row (combine keeps their weights in smem)
inline constexpr int kCombineThreads = 128;
inline constexpr int kMaxCombineSplits = 256;  // partials one combine row merges (the sm90 balanced schedule: <= its CTAs)
// The split-KV count is the planner's decision (decode_num_splits in mla/plan.h, sized from the SM
// count the caller passes); it assumes this kernel's CTA covers kDecodeTileRows query rows.
static_assert(Traits::kBlockM == kDecodeTileRows, "mla/plan.h's decode schedule models this kernel's tile");

inline int64_t m_tiles(int64_t s_q, int64_t h_q) { return (s_q * h_q + Traits::kBlockM - 1) / Traits::kBlockM; }

// Workspace layout for S splits: partial LSE [b, S, M] fp32, then (256-byte aligned) partial O
// [b, S, M, 512] fp32, M = s_q * h_q.
inline int64_t ws_lse_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  return (b * splits * s_q * h_q * 4 + 255) / 256 * 256;
}
inline int64_t ws_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  if (splits <= 1) return 0;
  return ws_lse_bytes(b, s_q, h_q, splits) + b * splits * s_q * h_q * Traits::kMaxDv * 4;
}

}  // namespace mla::cuda::decode
