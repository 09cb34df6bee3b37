// SPDX-License-Identifier: Apache-2.0
#pragma once
// Thread-block clusters and distributed shared memory (sm_90). A kernel launched with a cluster
// dimension (launch_cluster in cuda/common/launch.h) runs its CTAs in groups that are co-scheduled on
// one GPC; a CTA may copy into and arrive on the mbarriers of a peer CTA's shared memory through a
// shared::cluster address (map_peer). The two hand-overs the sm90 decode crossover
// (attention/sm90/seesaw/source_cross.cuh) builds on:
//   data: the writer's bulk_copy_to_peer completes transaction bytes on the peer's mbarrier, which the
//         peer announced (expect_tx) and waits for: as with a TMA load, the bytes come through the async
//         proxy, so the peer's wgmma may read them after its wait;
//   signal: mbar_arrive_cluster on a peer's mbarrier (release at cluster scope), mbar_wait_cluster on
//         one's own (acquire at cluster scope).
// In a cluster launch, smem_addr of CTA rank r is not below 2^18: mask it before packing it into a
// 14-bit field (wgmma descriptors: decode_sm90 seesaw/kernel.cuh base4).
// A CTA must not exit while a peer may still address its shared memory: cluster_sync() by every thread
// of both CTAs at the end (and after mbarrier initialisation, before the first remote access).
// Device test: tests/gpu/test_ptx_cluster.cu.
#include <cstdint>

#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of the byte at `local` (a shared::cta address of this CTA, smem_addr) in
// the shared memory of cluster CTA `rank`: the same offset in the peer's window.
__device__ __forceinline__ uint32_t map_peer(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}

// Bulk copy (the async proxy, like TMA) of `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// this CTA's shared memory at `src` (smem_addr) into a peer's at `dst` (map_peer); its completion is `bytes`
// transaction bytes on the mbarrier at `bar` in the same peer (map_peer). The bytes it reads were written
// by ordinary stores: every writing thread calls fence_proxy_async_smem first (and the issuer orders after
// them, e.g. __syncwarp). Whoever waits on `bar` in the peer must have announced the bytes (expect_tx).
// The copy's reads of `src` are complete once the peer has observed the transaction bytes.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "r"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// One arrival on the mbarrier at shared::cluster address `addr` (a peer's, map_peer), with release
// semantics at cluster scope: this thread's prior memory accesses are
// visible to a thread whose mbar_wait_cluster observes the phase completing.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}

// mbar_wait (mbarrier.cuh) with acquire semantics at cluster scope: what a peer CTA's threads wrote before
// their cluster-scope arrivals on this CTA's barrier (and what its bulk copies delivered) is visible after it.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) { mbar_wait<true>(bar, parity); }

// Loads from a peer's shared memory (distributed shared memory) at shared::cluster address `addr` (map_peer):
// one fp32, or four (16-byte aligned). Ordered after the peer's stores by a cluster-scope hand-over (cluster_sync,
// or mbar_wait_cluster on a barrier the peer arrived on with release): volatile, so that the compiler keeps them
// after that hand-over's asm, without a memory clobber, so that several stay in flight (the decode_sm90 cluster
// merge issues 16 per thread before using any: attention/sm90/common/cluster_merge.cuh).
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float4 ld_shared_cluster_v4f32(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

// The number of CTAs in this CTA's cluster.
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// Barrier over every thread of the cluster (arrive with release, wait with acquire): after it, the
// peers' mbarrier initialisations (fence_mbarrier_init) and writes before it are visible, and no peer
// is still before it. Every thread of every CTA of the cluster calls it the same number of times.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

}  // namespace mla::cuda::ptx
