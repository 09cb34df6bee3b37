// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tensor Memory Accelerator, shared -> global (sm_90): one thread stores a box of shared memory into the
// tensor a CUtensorMap describes (tensor_map.h; the map's box and swizzle give the shared layout, as for
// loads). Completion is tracked per thread with bulk async-groups, not mbarriers. SASS: UTMASTG,
// UTMACMDFLUSH / DEPBAR for the group waits.
//
// Invariants the caller holds:
//   - the shared tile was written by ordinary stores (st.shared, stmatrix): every writing thread ran
//     fence_proxy_async_smem() (fence.cuh) before the barrier after which the issuing thread stores;
//   - the tile is not overwritten before bulk_wait_group_read<N> says the copy engine has read it;
//   - elements of the box outside the tensor are not written (partial tiles at the edges are clipped);
//   - the issuing thread calls bulk_commit_group() after its stores and waits on the group before the
//     kernel relies on the global data (the kernel's end also waits).
// Device test: tests/gpu/test_ptx_sm90_extras.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

__device__ __forceinline__ void tma_store_2d(const void* tmap, const void* smem, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_addr(smem)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_store_3d(const void* tmap, const void* smem, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// Closes this thread's current group of bulk stores.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups still READ shared memory (their tiles may be reused).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's groups are incomplete (their global writes are done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace mla::cuda::ptx
