// SPDX-License-Identifier: Apache-2.0
#pragma once
// setmaxnreg (sm_90a): moves registers between warpgroups of a warp-specialised kernel; producers
// (TMA issuers) give registers back, consumers (wgmma math) take them. SASS: USETMAXREG.
//
// Preconditions the caller holds, or the instruction is ignored / the kernel hangs:
//   - the kernel has a register cap at entry: __launch_bounds__(threads, 1) (the 1 matters) or
//     -maxrregcount; nvcc warns (C7508) and drops setmaxnreg otherwise;
//   - every warp of a warpgroup executes the same call (.sync.aligned), and each warpgroup's role is one
//     branch of a single if/else on warpgroup_index() (warpgroup.cuh);
//   - N is a multiple of 8 in [24, 256]; the sum over warpgroups of N * 128 fits the register file
//     (65536 per SM for one CTA): e.g. 3 warpgroups at entry 168 -> producer 40, 2 consumers 232.
// Device test: tests/gpu/test_ptx_pipeline.cu.
namespace mla::cuda::ptx {

// Raises this warpgroup's per-thread register limit to N (blocks until the registers are free).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: N must be a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Lowers this warpgroup's per-thread register limit to N, releasing the rest to the pool.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: N must be a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace mla::cuda::ptx
