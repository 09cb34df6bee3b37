// SPDX-License-Identifier: Apache-2.0
#pragma once
// The MQA engine's launch for a key source and an activation type: the template the ops' instantiations/ compile,
// one activation type per file (decode/, sparse/).
#include <cuda_runtime.h>

#include "cuda/attention/portable/common/mqa_core.cuh"
#include "cuda/common/launch.h"

namespace mla::cuda::mqa {

// `grid` CTAs of the engine over Keys with q / out of type Act, `smem` bytes of dynamic shared memory; `op` names
// the launch in errors, `smem_what` the shared-memory limit.
template <class Keys, class Act>
void launch_engine(const typename Keys::Params& p, unsigned grid, int smem, cudaStream_t stream, const char* op,
                   const char* smem_what) {
  auto* kernel = mqa_attention_kernel<Keys, Act>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), smem_what);
  launch_kernel(kernel, grid, Traits::kThreads, static_cast<std::size_t>(smem), stream, p.rows.pdl != 0, op, p);
}

}  // namespace mla::cuda::mqa
