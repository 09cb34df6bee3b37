#pragma once
// Shared-memory addressing shared by every PTX wrapper in this folder.
#include <cstdint>

namespace mla::cuda::ptx {

// 32-bit shared-window address of a pointer into this CTA's shared memory (what PTX `.shared`
// operands take). Precondition: `p` points into shared memory (undefined otherwise).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace mla::cuda::ptx
