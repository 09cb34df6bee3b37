// SPDX-License-Identifier: Apache-2.0
#pragma once
// stmatrix (sm_90): the inverse of ldmatrix: a warp stores four 8x8 b16 matrices from registers in the
// mma / wgmma fragment layout to shared memory (e.g. P = softmax(Q K^T) as bf16 for a shared-memory
// wgmma operand, or an output tile before a TMA store). SASS: STSM.
// Device test: tests/gpu/test_ptx_sm90_extras.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// Lane l supplies the address of row (l % 8) of matrix (l / 8); register r[i] of lane 4g + t holds
// (row g, columns 2t..2t+1) of matrix i, the lower column in the low half. Preconditions: row addresses
// 16-byte aligned, in shared memory; all 32 lanes execute it. Stores feeding wgmma or a TMA store need
// fence_proxy_async_smem (fence.cuh) before the hand-over barrier.
__device__ __forceinline__ void stmatrix_x4(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_ptr)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// Same, each matrix transposed on the way out: lane 4g + t's register i lands at (rows 2t and 2t+1,
// column g) of matrix i.
__device__ __forceinline__ void stmatrix_x4_trans(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_ptr)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace mla::cuda::ptx
