// SPDX-License-Identifier: Apache-2.0
#pragma once
// Named CTA barriers (bar.sync / bar.arrive, sm_70+): synchronise a subset of the CTA's warps, e.g. the
// consumer warpgroups of a warp-specialised kernel without the producer (which __syncthreads would
// need). SASS: BAR.SYNC / BAR.ARV with a barrier index.
//
// Invariants the caller holds: `id` in 1..15 (0 is __syncthreads' barrier) and reserved for one group of
// warps at a time; `threads` a multiple of 32, the same in every participating warp, counting every
// thread of each participating warp; all threads of a participating warp execute the call.
// Device test: tests/gpu/test_ptx_sm90_extras.cu.
namespace mla::cuda::ptx {

// Waits until `threads` threads have arrived at barrier `id` (this one included); orders shared- and
// global-memory accesses of the participants like __syncthreads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at barrier `id` without waiting (a producer signalling consumers that named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mla::cuda::ptx
