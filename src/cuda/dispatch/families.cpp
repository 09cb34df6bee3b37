// SPDX-License-Identifier: Apache-2.0
// The list of dispatch tables and the device compute-capability lookup (families.h).
#include "cuda/dispatch/families.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <string>

namespace mla::cuda::dispatch {

std::vector<Family*> all_families() {
  return {&mqa_decode_table(), &sparse_mqa_table(), &mha_prefill_table(), &indexer_logits_table()};
}

int device_cc(int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0 = not read yet
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    if (const int cc = cache[device].load(std::memory_order_relaxed)) return cc;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    throw Error("kernel dispatch: cannot read the compute capability of CUDA device " + std::to_string(device));
  }
  const int cc = major * 10 + minor;
  if (cached) cache[device].store(cc, std::memory_order_relaxed);
  return cc;
}

}  // namespace mla::cuda::dispatch
