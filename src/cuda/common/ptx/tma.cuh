// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tensor Memory Accelerator, device side (sm_90): the copy engine moves a box of a tensor (described by
// a CUtensorMap built on the host, tensor_map.h) or a plain byte range from global into shared memory
// and retires the bytes on an mbarrier's transaction count (mbarrier.cuh). One thread issues each copy;
// the other threads wait on the barrier. SASS: UTMALDG (tensor), UBLKCP (bulk), UTMACCTL (descriptor prefetch).
//
// Invariants the caller holds:
//   - the tensor map is a __grid_constant__ kernel parameter (or in global/const memory) and is passed
//     here by address: `&map` of the parameter itself, never a copy in registers or local memory;
//   - the shared destination is 128-byte aligned, 1024-byte aligned when the map swizzles 128B (the
//     swizzle pattern is a function of the address bits, and wgmma descriptors assume that base);
//   - the barrier's phase expects exactly the bytes delivered: a tensor box always delivers its whole
//     box (elements outside the tensor are filled with zeros and counted), a bulk copy its `bytes`;
//   - coordinates are element indices, innermost dimension first, signed: negative or past-the-end
//     coordinates are legal and read as zeros (partial tiles at the edges need no special case).
// Device test: tests/gpu/test_ptx_tma.cu.
#include <cstdint>

#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// L2 eviction priorities for the cache-hinted forms (the 64-bit cache-policy operand; the encodings
// `createpolicy.fractional.L2::<priority>.b64 p, 1.0` produces).
enum class L2Hint : uint64_t {
  evict_normal = 0x1000000000000000ull,
  evict_first = 0x12F0000000000000ull,  // streamed once (KV pages of one request)
  evict_last = 0x14F0000000000000ull,   // re-read by other CTAs (queries, shared prefixes)
};

namespace detail {
__device__ __forceinline__ uint64_t gaddr(const void* p) { return reinterpret_cast<uint64_t>(p); }
}  // namespace detail

// ---- tensor tile loads: cp.async.bulk.tensor.Nd global -> shared, completion on an mbarrier ----
// `tmap` = address of the __grid_constant__ CUtensorMap; c0 = innermost coordinate.
__device__ __forceinline__ void tma_load_2d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6, %7}], [%2];\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// Same as tma_load_2d / _3d with an L2 eviction priority for the loaded lines.
__device__ __forceinline__ void tma_load_2d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1,
                                            L2Hint hint) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%3, %4}], [%2], %5;\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "l"(static_cast<uint64_t>(hint))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* smem, const void* tmap, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, L2Hint hint) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%3, %4, %5}], [%2], %6;\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// ---- multicast tensor tile load (thread-block clusters, cluster.cuh) ----
// tma_load_3d into every CTA of this cluster whose bit is set in `cta_mask` (bit r = cluster rank r): the
// box lands at the same shared-memory offset (`smem`'s) in each, and its bytes complete as transaction
// bytes on the mbarrier at the same offset as `bar` in each. One read of global memory / L2 for all of
// them. Each receiving CTA announces the bytes on its own barrier (expect_tx) and must have released the
// destination before the issuing CTA writes it (cross-CTA empty barriers; the protocol tests/gpu/test_ptx_cluster.cu
// checks). No shipped kernel multicasts today.
// An issuer's own copy can complete on a peer barrier before that peer announced the bytes: the phase
// cannot complete while the announcing arrival is pending, so the transient deficit is harmless.
__device__ __forceinline__ void tma_load_3d_multicast(void* smem, const void* tmap, uint64_t* bar, int32_t c0,
                                                      int32_t c1, int32_t c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%3, %4, %5}], [%2], %6;\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// Prefetches the tensor map's 128-byte descriptor into the descriptor cache (once per CTA, by the thread
// that will issue the copies, at kernel start: hides the first copy's descriptor fetch).
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(detail::gaddr(tmap)) : "memory");
}

// ---- plain bulk copy: cp.async.bulk global -> shared, completion on an mbarrier ----
// Copies `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned): one paged-cache row
// or a run of rows the tensor map cannot describe (gathers through a block table or top-k indices).
// The bytes land unswizzled.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(smem)),
      "l"(detail::gaddr(gmem)), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// Same with an L2 eviction priority.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar, L2Hint hint) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
      "%4;\n" ::"r"(smem_addr(smem)),
      "l"(detail::gaddr(gmem)), "r"(bytes), "r"(smem_addr(bar)), "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// ---- L2 prefetches (no shared memory, no barrier): warm L2 with data a later copy will load ----
// A box of the tensor (e.g. the next KV page while this one is being consumed).
__device__ __forceinline__ void tma_prefetch_l2_2d(const void* tmap, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(detail::gaddr(tmap)), "r"(c0),
               "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_l2_3d(const void* tmap, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(detail::gaddr(tmap)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// A contiguous byte range (16-byte aligned, a multiple of 16 bytes).
__device__ __forceinline__ void bulk_prefetch_l2(const void* gmem, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(detail::gaddr(gmem)), "r"(bytes) : "memory");
}
// The cache line holding `gmem` (any alignment; no register result, so nothing waits for it).
__device__ __forceinline__ void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(detail::gaddr(gmem)) : "memory");
}

}  // namespace mla::cuda::ptx
