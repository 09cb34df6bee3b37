#pragma once
// CUDA backend entry points, called by the front ends in src/ops/ after validation. Plain C++
// declarations (no CUDA headers) so that src/ops/ compiles with the host compiler; only linked when
// MLA_WITH_CUDA. ctx.stream is the cudaStream_t to launch on; nothing here synchronises.
#include "mla/ops.h"

namespace mla::cuda {
#include "ops/backend_ops.inc"
}  // namespace mla::cuda
