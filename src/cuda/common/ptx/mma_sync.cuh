// SPDX-License-Identifier: Apache-2.0
#pragma once
// mma.sync m16n8k16 bf16 x bf16 -> fp32 (sm_80+): the warp-level tensor-core product of the portable
// kernels. On sm_90 it runs at about a third of wgmma's rate (SASS: HMMA); Hopper variants use
// wgmma.cuh instead.
//
// Fragment layouts (g = lane / 4, t = lane % 4), which the callers rely on:
//   A 16x16 row-major, 4 regs of bf16x2: a[0] = (row g, cols 2t..2t+1), a[1] = (row g+8, cols 2t..2t+1),
//                                        a[2] = (row g, cols 2t+8..+9), a[3] = (row g+8, cols 2t+8..+9)
//   B 16x8 (k x n), 2 regs:              b[0] = (k 2t..2t+1, col g),     b[1] = (k 2t+8..2t+9, col g)
//   C 16x8 fp32, 4 floats:               c[0..1] = (row g, cols 2t..2t+1), c[2..3] = (row g+8, cols 2t..2t+1)
// The lower column / k index always sits in the low 16 bits of a bf16x2 register.
// Device test: tests/gpu/test_ptx_sm80.cu.
#include <cuda_bf16.h>

#include <cstdint>

namespace mla::cuda::ptx {

// d += a * b (bf16 inputs, fp32 accumulate). All 32 lanes of the warp must execute it (.sync.aligned).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (round to nearest even); `lo` lands in the low half (the lower k / column index
// of an mma or wgmma register fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Two floats -> f16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace mla::cuda::ptx
