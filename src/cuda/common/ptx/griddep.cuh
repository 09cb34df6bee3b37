// SPDX-License-Identifier: Apache-2.0
#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization (launch_dependent() in cuda/common/launch.h) may
// start while the previous kernel of its stream still runs; it calls grid_dependency_wait() before it
// reads anything that kernel writes. The previous kernel calls launch_dependents() once the dependent
// grid may be scheduled (its CTAs then occupy free SMs and wait), e.g. at its start. Both are no-ops for
// kernels launched without the attribute. Device test: tests/gpu/test_ptx_griddep.cu.
namespace mla::cuda::ptx {

// Blocks until every prerequisite grid has completed and its memory operations are visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the dependent grid launch before this grid completes (per CTA; the grid counts once all its CTAs
// called it or exited).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace mla::cuda::ptx
