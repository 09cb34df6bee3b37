// SPDX-License-Identifier: Apache-2.0
// The portable sparse_mqa engine for bf16 q and out.
#include "cuda/attention/portable/common/launch.cuh"
#include "cuda/attention/portable/sparse/kernel.cuh"
#include "cuda/attention/portable/sparse/launch.h"

namespace mla::cuda::sparse {

void launch_bf16(const SparseParams& p, unsigned grid, int smem, cudaStream_t stream) {
  mqa::launch_engine<SparseKeys, Bf16>(p, grid, smem, stream, "sparse_mqa", "sparse_mqa: shared-memory limit");
}

}  // namespace mla::cuda::sparse
