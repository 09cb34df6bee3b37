// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "sm90_fp8" variant of mha_prefill (fp8 compute, PrefillOptions::fp8; kernel.cuh), as an entry of the
// family's dispatch table (attention/mha_prefill.cpp). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::prefill_sm90_fp8 {

// nullptr when the variant runs the launch; else why not. It runs exactly the fp8 launches (no other variant
// takes them), so a launch it declines is an error, never another kernel.
const char* supports(const dispatch::PrefillArgs& a);
// The quantise pass (quantize.cuh) into the options' workspace, then the attention kernel (kernel.cuh): persistent
// pairs of units or one CTA per unit, by common/prefill_schedule.h's use_persistent (the bf16 kernel's schedules and
// rule).
void run(const dispatch::PrefillArgs& a);

}  // namespace mla::cuda::prefill_sm90_fp8
