#pragma once
// Thin PTX wrappers for warp-level tensor-core math on sm_80+ (used on sm_90a by the attention
// kernels): mma.sync m16n8k16 bf16 x bf16 -> fp32, ldmatrix (plain and transposed) and cp.async.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), which the callers rely on:
//   A 16x16 row-major, 4 regs of bf16x2: a[0] = (row g, cols 2t..2t+1), a[1] = (row g+8, cols 2t..2t+1),
//                                        a[2] = (row g, cols 2t+8..+9), a[3] = (row g+8, cols 2t+8..+9)
//   B 16x8 (k x n), 2 regs:              b[0] = (k 2t..2t+1, col g),     b[1] = (k 2t+8..2t+9, col g)
//   C 16x8 fp32, 4 floats:               c[0..1] = (row g, cols 2t..2t+1), c[2..3] = (row g+8, cols 2t..2t+1)
// The lower column / k index always sits in the low 16 bits of a bf16x2 register.
#include <cuda_bf16.h>

#include <cstdint>

namespace mla::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8).
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

// d += a * b (bf16 inputs, fp32 accumulate).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (round to nearest even); `lo` lands in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16-byte asynchronous global -> shared copy (both addresses 16-byte aligned), bypassing L1.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace mla::cuda::ptx
