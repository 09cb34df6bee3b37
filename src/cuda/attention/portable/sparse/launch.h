// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "portable" variant of sparse_mqa as an entry of the op's dispatch table (attention/sparse_mqa.cpp): the
// mma.sync MQA engine (attention/portable/common/mqa_core.cuh), sm_80+, every cache format, any top-k and h_q,
// DeepSeek-V4's options. Plain C++.
#include <cuda_runtime.h>

#include "cuda/attention/portable/sparse/params.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda::sparse {

void run_portable(const dispatch::SparseArgs& a);

// The engine's launch for one activation type of q and out (mqa_attention_kernel<SparseKeys, Act>), each
// compiled in its own file of instantiations/ so that the three build in parallel: `grid` CTAs, `smem` bytes of
// dynamic shared memory.
void launch_bf16(const SparseParams& p, unsigned grid, int smem, cudaStream_t stream);
void launch_f16(const SparseParams& p, unsigned grid, int smem, cudaStream_t stream);
void launch_f32(const SparseParams& p, unsigned grid, int smem, cudaStream_t stream);

}  // namespace mla::cuda::sparse
