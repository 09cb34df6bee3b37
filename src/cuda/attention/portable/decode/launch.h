// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "portable" variant of mqa_decode as an entry of the op's dispatch table (attention/mqa_decode.cpp): the
// mma.sync MQA engine (attention/portable/common/mqa_core.cuh), sm_80+, every cache format, page size, h_q and
// s_q; split-KV into the caller's workspace as the caller planned it. Plain C++.
#include <cuda_runtime.h>

#include "cuda/attention/portable/decode/params.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda::decode {

void run_portable(const dispatch::DecodeArgs& a);

// The engine's launch for one activation type of q and out (mqa_attention_kernel<DecodeKeys, Act>), each
// compiled in its own file of instantiations/ so that the three build in parallel: `grid` CTAs, `smem` bytes of
// dynamic shared memory.
void launch_bf16(const DecodeParams& p, unsigned grid, int smem, cudaStream_t stream);
void launch_f16(const DecodeParams& p, unsigned grid, int smem, cudaStream_t stream);
void launch_f32(const DecodeParams& p, unsigned grid, int smem, cudaStream_t stream);

}  // namespace mla::cuda::decode
