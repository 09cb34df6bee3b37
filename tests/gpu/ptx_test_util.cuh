// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers of the PTX wrapper device tests (test_ptx_*.cu): CUDA error checks, a typed device buffer,
// the Hopper skip, 1024-byte alignment of dynamic shared memory, and random bf16 / e4m3 operands.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "support/test_util.h"

#define MLA_CUDA_OK(expr)                                                                          \
  do {                                                                                             \
    const cudaError_t mla_e_ = (expr);                                                             \
    ASSERT_EQ(mla_e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(mla_e_) << " " << cudaGetErrorString(mla_e_); \
  } while (0)

// Skips unless device 0 is a Hopper (cc 9.x): the sm_90a instructions exist nowhere else.
#define MLA_SKIP_UNLESS_SM90()                                                                     \
  do {                                                                                             \
    MLA_SKIP_WITHOUT_GPU();                                                                        \
    int mla_cc_ = 0;                                                                               \
    cudaDeviceGetAttribute(&mla_cc_, cudaDevAttrComputeCapabilityMajor, 0);                        \
    if (mla_cc_ != 9) GTEST_SKIP() << "needs an sm_90 device, found cc " << mla_cc_ << ".x";       \
  } while (0)

namespace mla::test {

// Device array of T, freed on scope exit.
template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : n(count) {
    if (cudaMalloc(&p, count * sizeof(T) + 16) != cudaSuccess) p = nullptr;
  }
  DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) { cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void fill_bytes(int v) { cudaMemset(p, v, n * sizeof(T)); }
};

using num::bf16_to_float;
using num::e4m3_to_float;
using num::f16_to_float;
using num::float_to_bf16;
using num::float_to_f16;

// Random bf16 values in [-1, 1) (seeded through test::rng()).
inline std::vector<uint16_t> random_bf16(std::size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng()));
  return v;
}
// Random finite e4m3 codes of magnitude <= 2 (exponent field <= 8).
inline std::vector<uint8_t> random_e4m3(std::size_t n) {
  std::uniform_int_distribution<int> code(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& x : v) {
    int c;
    do c = code(rng());
    while (((c >> 3) & 15) > 8);
    x = static_cast<uint8_t>(c);
  }
  return v;
}

}  // namespace mla::test

// Rounds a dynamic shared-memory pointer up to 1024 bytes (128B-swizzled TMA / wgmma tiles need it;
// launch with 1024 bytes of slack).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}
