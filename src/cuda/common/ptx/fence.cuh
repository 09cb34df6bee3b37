// SPDX-License-Identifier: Apache-2.0
#pragma once
// Proxy fence (sm_90): orders this thread's ordinary ("generic proxy") shared-memory accesses with
// later accesses by the async proxy (wgmma operand reads, TMA stores, bulk copies), or the reverse.
#include "cuda/common/ptx/smem.cuh"

namespace mla::cuda::ptx {

// Every thread that wrote shared memory with ordinary stores (st.shared, stmatrix) that wgmma or a
// TMA store reads next calls this after its writes and before the barrier that hands the buffer over;
// likewise before ordinary stores overwrite a buffer the async proxy read (after the wgmma wait).
// Device test: tests/gpu/test_ptx_wgmma.cu (register-built operand tiles read by wgmma).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace mla::cuda::ptx
