#pragma once
// The "sm90" variant of mha_prefill (kernel.cuh), as an entry of the family's dispatch table
// (src/cuda/prefill/launch.cu). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::prefill_sm90 {

// nullptr when the variant runs the launch; else why not (the portable variant runs it instead).
const char* supports(const dispatch::PrefillArgs& a);
void run(const dispatch::PrefillArgs& a);              // consumers take turns issuing (pingpong)
void run_no_pingpong(const dispatch::PrefillArgs& a);  // consumers issue independently

}  // namespace mla::cuda::prefill_sm90
