// SPDX-License-Identifier: Apache-2.0
// The portable mqa_decode engine for f32 q and out.
#include "cuda/attention/portable/common/launch.cuh"
#include "cuda/attention/portable/decode/kernel.cuh"
#include "cuda/attention/portable/decode/launch.h"

namespace mla::cuda::decode {

void launch_f32(const DecodeParams& p, unsigned grid, int smem, cudaStream_t stream) {
  mqa::launch_engine<DecodeKeys, F32>(p, grid, smem, stream, "mqa_decode", "mqa_decode: shared-memory limit");
}

}  // namespace mla::cuda::decode
