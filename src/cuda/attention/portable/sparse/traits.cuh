// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sparse MQA tiling: the MQA engine's (common/mqa_traits.cuh). One CTA per (64-head tile, token); no
// split-KV (top-k is short: 2048 keys are 64 tiles) and no workspace.
#include "cuda/common/mqa_traits.cuh"

namespace mla::cuda::sparse {

using Traits = mqa::Traits;

}  // namespace mla::cuda::sparse
