// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "portable" variant of sparse_mqa as an entry of the op's dispatch table (attention/sparse_mqa.cpp): the
// mma.sync MQA engine (attention/portable/common/mqa_core.cuh), sm_80+, every cache format, any top-k and h_q,
// DeepSeek-V4's options. Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::sparse {

void run_portable(const dispatch::SparseArgs& a);

}  // namespace mla::cuda::sparse
