// SPDX-License-Identifier: Apache-2.0
#pragma once
// mbarrier (sm_90 for the transaction-count forms): a 64-bit shared-memory barrier object that
// completes a *phase* when (a) the expected number of arrivals has arrived and (b) the transaction
// count (bytes announced with expect_tx, retired by TMA / bulk copies as they land) is back to zero.
// Phases alternate parity 0, 1, 0, ...; a waiter names the parity of the phase it waits for. SASS:
// SYNCS.* instructions.
//
// Pipeline idiom (stage s of a ring of S stages, iteration i, parity = (i / S) & 1):
//   producer: wait empty[s] (parity ^ 1); mbar_arrive_expect_tx(full[s], bytes); issue TMA on full[s]
//   consumer: mbar_wait(full[s], parity); read the stage; mbar_arrive(empty[s])
// Invariants the caller holds: the barrier lives in shared memory, 8-byte aligned; it is initialised by
// ONE thread, then made visible (fence_mbarrier_init + __syncthreads) before any other use; no thread
// waits for a parity more than one phase ahead; it is invalidated (mbar_inval) before its memory is
// reused for anything else. Device test: tests/gpu/test_ptx_tma.cu (phases over many stages) and
// tests/gpu/test_ptx_pipeline.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// Initialises the barrier for `arrivals` arrivals per phase (1 .. 2^20 - 1), current phase parity 0.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes barrier initialisations visible to the async proxy (TMA) and, with the barrier that follows
// it, to the other threads. Call once after the mbar_init calls, before __syncthreads.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release semantics: this thread's prior shared/global writes are visible to threads
// that observe the phase completing).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// `count` arrivals at once.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// One arrival plus `bytes` more expected transaction bytes for the current phase: the producer's call
// before (or after: the order does not matter within a phase) issuing copies that complete on `bar`.
// `bytes` must equal the total the copies will deliver (TMA boxes count whole, out-of-bounds fill
// included), or the phase never completes (too many) / completes early (too few).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Adds expected transaction bytes without arriving (several producers feeding one phase).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// True when the phase with parity `parity` has completed (acquire semantics: the data the phase
// guarded, TMA-written bytes included, is visible to this thread). May suspend for a time-limited
// interval before returning false. kCluster: acquire at cluster scope (arrivals and copies from the
// CTAs of a cluster; cluster.cuh mbar_wait_cluster).
template <bool kCluster = false>
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  if constexpr (kCluster)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  else
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  return done != 0;
}
// Spins until the phase with parity `parity` has completed.
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait<kCluster>(bar, parity)) {
  }
}

// Invalidates the barrier so its 8 bytes may be reused as ordinary shared memory (or re-initialised).
// Precondition: no thread or copy still uses it.
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

}  // namespace mla::cuda::ptx
