// SPDX-License-Identifier: Apache-2.0
#pragma once
// wgmma (sm_90a): warpgroup-level asynchronous matrix multiply D(64 x N, fp32) += A(64 x K) * B(K x N),
// issued by the 128 threads of one warpgroup (warpgroup.cuh), B always from shared memory through a
// matrix descriptor, A from shared memory (ss) or from registers (rs). K = 16 for bf16 / f16, 32 for e4m3.
// SASS: HGMMA (bf16, f16), QGMMA (fp8). Device test: tests/gpu/test_ptx_wgmma.cu.
//
// Issue protocol (every thread of the warpgroup executes every step):
//   wgmma_fence();                       // orders prior register / smem writes before the async reads
//   wgmma_bf16_ss<N>(acc, da, db, k>0);  // one call per k-step; accumulate=false zeroes D first
//   wgmma_commit_group();                // closes the batch
//   wgmma_wait_group<0>();               // D (and A registers of rs) are safe to touch only after this
// Invariants: between issue and wait nothing reads or writes the accumulators or rs A registers
// (wgmma_fence_operand pins them so the compiler cannot move accesses across); shared memory the
// operands read was written by TMA (completed on an mbarrier the threads waited on) or by ordinary
// stores followed by fence_proxy_async_smem() + a barrier (fence.cuh); it is not overwritten until the
// wait that retires the read.
//
// Register layouts (warp w = warp index within the warpgroup, g = lane / 4, t = lane % 4):
//   D: float d[N/2]; for column block j (8 columns): d[4j+0] = (row 16w+g,   col 8j+2t),
//      d[4j+1] = (row 16w+g, col 8j+2t+1), d[4j+2] = (row 16w+g+8, col 8j+2t), d[4j+3] = (row 16w+g+8, col 8j+2t+1).
//   A in registers, bf16 (4 x bf16x2): a[0] = (row 16w+g, k 2t..2t+1), a[1] = (row 16w+g+8, k 2t..2t+1),
//      a[2] = (row 16w+g, k 2t+8..2t+9), a[3] = (row 16w+g+8, k 2t+8..2t+9)  (mma.sync's A fragment per warp);
//   A in registers, e4m3 (4 x 4 bytes): a[0] = (row 16w+g, k 4t..4t+3), a[1] = (row 16w+g+8, k 4t..4t+3),
//      a[2] = (row 16w+g, k 4t+16..4t+19), a[3] = (row 16w+g+8, k 4t+16..4t+19). Lower k in lower bits.
// So the D of one product, packed to bf16 pairs (pack_bf16x2), is the rs A of the next (P V after Q K^T).
//
// Shared-memory tiles (128-byte swizzle, the layout TMA writes with TmaSwizzle::b128; base 1024-byte aligned):
//   K-major ("row-major A", "B as [n][k]"): rows of 128 bytes = 64 bf16 / 128 e4m3 of K, 8-row atoms of
//     1024 bytes, rows contiguous. desc_sw128_k_major(tile); k-step s inside the 128-byte row: advance
//     the descriptor by s * 32 bytes (desc_advance); K beyond one row lives in another [rows][128 B] panel.
//   MN-major ("B as [k][n]", V for P V; bf16 only): rows of 128 bytes = 64 bf16 of N, one row per k,
//     panels of 64 N-columns `mn_panel_bytes` apart. desc_sw128_mn_major(tile, mn_panel_bytes); k-step s:
//     advance by s * 16 rows * 128 = s * 2048 bytes. Pass Major::MN for that operand.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

enum class Major { K = 0, MN = 1 };

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Compiler-only fence on registers an in-flight wgmma reads or writes: call on the accumulators (and rs
// A registers) right before wgmma_fence() and right after wgmma_wait_group().
template <int R>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void wgmma_fence_operand(uint32_t (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---- shared-memory matrix descriptors ----
// Bits: 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 49-51 base offset (0: tiles are 1024-byte aligned), 62-63 swizzle (1 = 128B).
__device__ __forceinline__ uint64_t make_smem_desc(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                   uint32_t swizzle_mode) {
  uint64_t d = (smem_addr(p) >> 4) & 0x3FFF;
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(swizzle_mode & 3) << 62;
  return d;
}
// K-major 128B-swizzled tile: 8-row atoms 1024 bytes apart (SBO); LBO unused (the k16 / k32 step fits in
// one 128-byte row) and set to 16 bytes.
// Byte offset of 16-byte chunk `chunk` (0..7) of 128-byte row `row` in a panel of the 128-byte swizzle above.
__device__ __forceinline__ int sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

__device__ __forceinline__ uint64_t desc_sw128_k_major(const void* tile) { return make_smem_desc(tile, 16, 1024, 1); }
// MN-major 128B-swizzled tile: LBO = bytes between 64-column panels along N (or M), SBO = 1024 bytes
// between 8-row (k) groups.
__device__ __forceinline__ uint64_t desc_sw128_mn_major(const void* tile, uint32_t mn_panel_bytes) {
  return make_smem_desc(tile, mn_panel_bytes, 1024, 1);
}
// The descriptor of the same tile `bytes` further on (a multiple of 16; the k-steps above).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// ---- the products (instructions generated into wgmma_ops.inc; N in {8, 16, 32, 64, 128, 192, 256}) ----
template <int N>
struct WgmmaOps;
#include "cuda/common/ptx/wgmma_ops.inc"

// D(64xN) (+)= A(64x16, smem) * B(16xN, smem), bf16 in, fp32 accumulate; accumulate=false: D = A*B.
template <int N, Major kA = Major::K, Major kB = Major::K>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  WgmmaOps<N>::template bf16_ss<static_cast<int>(kA), static_cast<int>(kB)>(d, desc_a, desc_b, accumulate ? 1 : 0);
}
// Same with A from registers (layout above).
template <int N, Major kB = Major::K>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              bool accumulate) {
  WgmmaOps<N>::template bf16_rs<static_cast<int>(kB)>(d, a, desc_b, accumulate ? 1 : 0);
}
// The same products with f16 inputs (fp32 accumulate): the fragments and shared-memory layouts of bf16.
template <int N, Major kA = Major::K, Major kB = Major::K>
__device__ __forceinline__ void wgmma_f16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  WgmmaOps<N>::template f16_ss<static_cast<int>(kA), static_cast<int>(kB)>(d, desc_a, desc_b, accumulate ? 1 : 0);
}
template <int N, Major kB = Major::K>
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                             bool accumulate) {
  WgmmaOps<N>::template f16_rs<static_cast<int>(kB)>(d, a, desc_b, accumulate ? 1 : 0);
}
// D(64xN) (+)= A(64x32) * B(32xN), e4m3 in (both K-major: fp8 wgmma has no transposed form), fp32 out.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  WgmmaOps<N>::e4m3_ss(d, desc_a, desc_b, accumulate ? 1 : 0);
}
template <int N>
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              bool accumulate) {
  WgmmaOps<N>::e4m3_rs(d, a, desc_b, accumulate ? 1 : 0);
}

// D's rows times per-row factors, in place: f_lo for this thread's row 16w+g (d[4j], d[4j+1]), f_hi for row 16w+g+8
// (d[4j+2], d[4j+3]); all of it skipped by one branch when `any` is 0. `any` must be the same in every lane of the
// warp (a vote: __any_sync of "some factor is not 1"), since the branch is bra.uni. Why asm: the same branch in C++
// around the multiplies made ptxas spill 41..62 bytes in each seesaw kernel at 232 registers (the join keeps two
// versions of the accumulators); inside one asm block the registers are modified in place. Not with a group open.
// Device test: tests/gpu/test_ptx_wgmma.cu (PtxWgmma.ScaleRowsIf).
template <int N>
__device__ __forceinline__ void wgmma_scale_rows_if(float (&d)[N / 2], bool any, float f_lo, float f_hi) {
  WgmmaOps<N>::scale_rows_if(d, any ? 1 : 0, f_lo, f_hi);
}

}  // namespace mla::cuda::ptx
