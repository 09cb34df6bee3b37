// SPDX-License-Identifier: Apache-2.0
#pragma once
// cp.async (sm_80+): per-thread asynchronous 16-byte global -> shared copies, completed by commit
// groups (SASS: LDGSTS). The portable kernels' pipeline; Hopper kernels move tiles with the copy
// engine instead (tma.cuh), but cp.async still serves scattered rows the tensor map cannot describe.
// Device test: tests/gpu/test_ptx_sm80.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// 16-byte copy bypassing L1. Preconditions: both addresses 16-byte aligned; `smem` in shared memory.
// The data is visible to this thread only after cp_async_wait covering its group, and to other
// threads after that wait plus a barrier (__syncthreads / named barrier).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
// 16-byte copy of which only the first `src_bytes` (0 or 16 here) are read; the rest of the 16 shared
// bytes are zero-filled. src_bytes 0 reads nothing (gmem must still be a valid-looking global address).
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// 16-byte copy, or 16 zero bytes where `zero` (the ignore-src predicate: nothing read, gmem still a valid-looking
// global address). The same copy as cp_async_16_zfill with 0 / 16 source bytes, but the choice is a predicate:
// ptxas lowers a run-time src-size to per-copy address arithmetic ((16 - size) & 15 added to the source, a test
// of size), about five instructions per copy that this form does not need (the raw kernel's producer, call sites
// with many rounds per row).
__device__ __forceinline__ void cp_async_16_or_zero(void* smem, const void* gmem, bool zero) {
  asm volatile("{\n.reg .pred z;\nsetp.ne.b32 z, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, z;\n}\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(static_cast<int>(zero))
               : "memory");
}
// The same with an L2 prefetch-size hint (.L2::256B: a miss brings the 256-byte aligned block around the 16
// bytes into L2, so the row's neighbouring 128-byte line is a hit when its copy comes) and the shared-memory
// destination as its 32-bit shared address (smem_addr), so that call sites adding compile-time offsets to one
// address per lane get them folded into the instruction (LDGSTS [R + imm]). The gathered bf16 rows (1152 bytes,
// copied a 128-byte panel row at a time, all nine within a tile): measured 10-12% faster on the sparse prefill
// over 131,072 rows.
__device__ __forceinline__ void cp_async_16_or_zero_pf256(uint32_t smem, const void* gmem, bool zero) {
  asm volatile("{\n.reg .pred z;\nsetp.ne.b32 z, %2, 0;\ncp.async.cg.shared.global.L2::256B [%0], [%1], 16, z;\n}\n" ::"r"(
                   smem),
               "l"(gmem), "r"(static_cast<int>(zero))
               : "memory");
}
// 4-byte copy through L1 (.ca: the only cache mode for sizes below 16). Preconditions: both addresses
// 4-byte aligned. Same completion rules as cp_async_16 (e.g. scattered fp32 scales beside 16-byte rows).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
// Closes this thread's current group of cp.async copies (an empty group is legal and counts).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Makes the mbarrier track this thread's prior cp.async copies: it counts one arrival of the barrier's
// expected count when they have landed (.noinc: the arrival is part of the count given at init).
// Lets cp.async producers feed the same mbarrier pipelines as TMA (mbarrier.cuh).
__device__ __forceinline__ void cp_async_arrive_mbarrier(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

}  // namespace mla::cuda::ptx
