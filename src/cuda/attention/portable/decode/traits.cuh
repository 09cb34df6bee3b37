// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decode tiling (the MQA engine's, common/mqa_traits.cuh); the split-KV workspace is combine/split_kv.h's.
#include <cstdint>

#include "cuda/attention/combine/split_kv.h"
#include "cuda/common/mqa_traits.cuh"
#include "mla/plan.h"

namespace mla::cuda::decode {

using Traits = mqa::Traits;

inline constexpr int kMaxSplits = combine::kMaxSplits;  // partials per request row
static_assert(Traits::kMaxDv == combine::kMaxDv, "the split-KV workspace's O rows");
// The split-KV count is the planner's decision (decode_num_splits in mla/plan.h, sized from the SM
// count the caller passes); it assumes this kernel's CTA covers kDecodeTileRows query rows.
static_assert(Traits::kBlockM == kDecodeTileRows, "mla/plan.h's decode schedule models this kernel's tile");

inline int64_t m_tiles(int64_t s_q, int64_t h_q) { return (s_q * h_q + Traits::kBlockM - 1) / Traits::kBlockM; }

}  // namespace mla::cuda::decode
