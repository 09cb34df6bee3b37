// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "portable" variant of mha_prefill as an entry of the op's dispatch table (attention/mha_prefill.cpp): the
// mma.sync prefill engine (kernel.cuh), sm_80+, d_nope + d_rope <= 192, d_v <= 128, any strides. Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::prefill {

// nullptr unless the launch asks for fp8 compute (the sm90_fp8 variant's alone).
const char* supports_portable(const dispatch::PrefillArgs& a);
void run_portable(const dispatch::PrefillArgs& a);

}  // namespace mla::cuda::prefill
