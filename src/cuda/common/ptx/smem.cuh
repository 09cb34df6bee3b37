// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared-memory addressing shared by every PTX wrapper in this folder.
#include <cstdint>

namespace mla::cuda::ptx {

// 32-bit shared-window address of a pointer into this CTA's shared memory (what PTX `.shared`
// operands take). Precondition: `p` points into shared memory (undefined otherwise).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// `raw` (the dynamic shared-memory base) rounded up to 1024 bytes, for 128-byte-swizzled tiles (TMA
// b128 and wgmma descriptors need that base; the kernel requests 1 KiB of slack). Computed as `raw`
// plus an offset, not an integer cast back to a pointer, so that the compiler keeps knowing it points
// into shared memory (LDS / STS rather than generic LD / ST; checked in the SASS).
__device__ __forceinline__ uint8_t* align_smem_1024(uint8_t* raw) {
  const uint32_t a = smem_addr(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

}  // namespace mla::cuda::ptx
