#pragma once
// Named barriers (bar.sync with an id and a thread count): synchronise a subset of a CTA's warps, e.g.
// the consumer warpgroups of a warp-specialised kernel while the producer warps run on (or have exited).
// SASS: BAR.SYNC. Device test: tests/gpu/test_ptx_named_barrier.cu.
//
// Invariants the caller holds: id 0 is __syncthreads' barrier (use 1..15); `threads` is a multiple of
// 32 and every warp that uses the id passes the same count; all threads of a participating warp call it.
namespace mla::cuda::ptx {

// Waits until `threads` threads (whole warps) have arrived at barrier `id`; orders shared-memory
// accesses among them like __syncthreads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mla::cuda::ptx
