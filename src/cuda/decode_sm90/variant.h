#pragma once
// The "sm90" variant of mqa_decode (kernel_small.cuh, kernel_seesaw.cuh), as entries of the family's dispatch table
// (src/cuda/decode/launch.cu). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::decode_sm90 {

// nullptr when the variant runs the launch; else why not (the portable variant runs it instead).
const char* supports(const dispatch::DecodeArgs& a);
void run(const dispatch::DecodeArgs& a);

}  // namespace mla::cuda::decode_sm90
