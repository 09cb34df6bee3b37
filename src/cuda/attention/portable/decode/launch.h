// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "portable" variant of mqa_decode as an entry of the op's dispatch table (attention/mqa_decode.cpp): the
// mma.sync MQA engine (attention/portable/common/mqa_core.cuh), sm_80+, every cache format, page size, h_q and
// s_q; split-KV into the caller's workspace as the caller planned it. Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::decode {

void run_portable(const dispatch::DecodeArgs& a);

}  // namespace mla::cuda::decode
