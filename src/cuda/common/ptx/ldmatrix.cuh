// SPDX-License-Identifier: Apache-2.0
#pragma once
// ldmatrix (sm_75+): a warp loads four 8x8 b16 matrices from shared memory straight into the mma.sync
// fragment layout (mma_sync.cuh). SASS: LDSM.
// Device test: tests/gpu/test_ptx_sm80.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// Four 8x8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8). Preconditions:
// every row address is 16-byte aligned and in shared memory; all 32 lanes execute it. Register r[i]
// receives matrix i in the A/C fragment layout (lane holds row lane/4, columns 2(lane%4)..+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}
// Same, each matrix transposed on the way into registers (B operand from a [k][n] row-major tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}

}  // namespace mla::cuda::ptx
