// SPDX-License-Identifier: Apache-2.0
#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization (launch_kernel / launch_dependent in cuda/common/launch.h)
// may start while the previous kernel of its stream still runs. The invariant every such kernel of the library
// keeps (launch.h states it once, docs/DESIGN.md "Programmatic dependent launch" lists the kernels): every thread
// calls grid_dependency_wait() before its first global-memory access other than its parameters, and every CTA
// calls it before it exits. The previous kernel calls launch_dependents() once the dependent grid may be
// scheduled (its CTAs then occupy free SMs and wait), e.g. at its start: with the invariant, any trigger point is
// safe. Both are no-ops for kernels launched without the attribute. Device test: tests/gpu/test_ptx_griddep.cu.
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

// The entry of a kernel that may be launched dependent and has no prologue free of global memory: wait for the
// previous grid, then let the next one be scheduled.
__device__ __forceinline__ void dependent_entry() {
  grid_dependency_wait();
  launch_dependents();
}

}  // namespace mla::cuda::ptx
