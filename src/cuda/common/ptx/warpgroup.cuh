// SPDX-License-Identifier: Apache-2.0
#pragma once
// Warp and warpgroup indices as warp-uniform values, and elect.one (sm_90). wgmma and setmaxnreg act
// per warpgroup (4 consecutive warps starting at a warp index divisible by 4): kernels branch on
// warpgroup_index() to give each warpgroup its role. The shuffles make the values provably uniform to
// the compiler, so role branches do not diverge within a warp.
// Device test: tests/gpu/test_ptx_pipeline.cu.
#include <cstdint>

namespace mla::cuda::ptx {

inline constexpr int kWarpgroupThreads = 128;

// Warp index within the CTA (threadIdx.x / 32) from lane 0, uniform across the warp. 1-D blocks.
__device__ __forceinline__ int canonical_warp_idx() { return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0); }
// Warpgroup index within the CTA (threadIdx.x / 128), uniform across the warp. 1-D blocks.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, threadIdx.x / 128, 0); }
// Warp index within its warpgroup (0..3), uniform across the warp.
__device__ __forceinline__ int warp_idx_in_warpgroup() { return canonical_warp_idx() % 4; }

// True in exactly one active lane of the warp (the same lane for all), false in the others: pick the
// single thread that issues TMA copies or arrives on an mbarrier. All lanes in `mask` must execute it.
__device__ __forceinline__ bool elect_one_sync(uint32_t mask = 0xffffffffu) {
  uint32_t pred = 0;
  asm volatile(
      "{\n"
      ".reg .b32 lane;\n"
      ".reg .pred p;\n"
      "elect.sync lane|p, %1;\n"
      "selp.b32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(pred)
      : "r"(mask));
  return pred != 0;
}

}  // namespace mla::cuda::ptx
