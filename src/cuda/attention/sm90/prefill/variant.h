// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "sm90" variant of mha_prefill (kernel.cuh), as an entry of the family's dispatch table
// (attention/mha_prefill.cpp). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::prefill_sm90 {

// nullptr when the variant runs the launch; else why not (the portable variant runs it instead).
const char* supports(const dispatch::PrefillArgs& a);
// Consumers take turns issuing (pingpong). run: persistent pairs for causal launches with s_q <= 4096
// and >= 2 units per SM, else one CTA per unit; run_one_per_cta / run_persistent force one schedule
// (persistent needs >= 2 units per SM, else it runs one CTA per unit too).
void run(const dispatch::PrefillArgs& a);
void run_one_per_cta(const dispatch::PrefillArgs& a);
void run_persistent(const dispatch::PrefillArgs& a);
void run_no_pingpong(const dispatch::PrefillArgs& a);  // consumers issue independently
// run (automatic schedule) with other sets of kernel.cuh's refinements (kOpts), for interleaved A/Bs
// (docs/design/prefill_sm90.md): none (the kernel without them); all three (kHalfFirstTile + kEarlyNext +
// kWarpRelease, measured slower than the half first tile alone).
void run_opts_none(const dispatch::PrefillArgs& a);
void run_opts_loads(const dispatch::PrefillArgs& a);

}  // namespace mla::cuda::prefill_sm90
