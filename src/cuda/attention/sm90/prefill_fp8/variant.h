// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "sm90_fp8" variant of mha_prefill (fp8 compute, PrefillOptions::fp8; kernel.cuh), as an entry of the
// family's dispatch table (attention/mha_prefill.cpp). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::prefill_sm90_fp8 {

// nullptr when the variant runs the launch; else why not. It runs exactly the fp8 launches (no other variant
// takes them), so a launch it declines is an error, never another kernel.
const char* supports(const dispatch::PrefillArgs& a);
// The quantise pass (quantize.cuh) into the options' workspace, then the attention kernel (kernel.cuh): one CTA
// per unit (run), or persistent pairs of units from 2 units per SM (run_persistent; below that one CTA per unit):
// the bf16 kernel's two schedules. The table's automatic choice is run; run_persistent is the variant
// sm90_fp8_persist, forced for comparison until device A/Bs choose a rule.
void run(const dispatch::PrefillArgs& a);
void run_persistent(const dispatch::PrefillArgs& a);

}  // namespace mla::cuda::prefill_sm90_fp8
