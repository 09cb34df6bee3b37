// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers of the PTX wrapper device tests (test_ptx_*.cu): CUDA error checks, a typed device buffer,
// the Hopper skip, 1024-byte alignment of dynamic shared memory, random bf16 / e4m3 operands, and the graph-replay
// timing of the probe tests.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
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

// Times work as the bench times a small-step row: `capture()` issues it on `st` inside a stream capture, the graph is
// replayed `iters` times, each replay after `before()` (outside the timed events: an L2 flush, a reset), and
// median_us gets the median of the replays after the first five (events around the replay, µs).
template <class Capture, class Before>
void time_graph_replay(cudaStream_t st, int iters, Capture&& capture, Before&& before, double& median_us) {
  median_us = 0;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  MLA_CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  capture();
  MLA_CUDA_OK(cudaStreamEndCapture(st, &g));
  MLA_CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  MLA_CUDA_OK(cudaEventCreate(&e0));
  MLA_CUDA_OK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int it = 0; it < iters; ++it) {
    before(it);
    MLA_CUDA_OK(cudaEventRecord(e0, st));
    MLA_CUDA_OK(cudaGraphLaunch(ge, st));
    MLA_CUDA_OK(cudaEventRecord(e1, st));
    MLA_CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    MLA_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 5) t.push_back(ms * 1e3);
  }
  MLA_CUDA_OK(cudaStreamSynchronize(st));
  std::sort(t.begin(), t.end());
  if (!t.empty()) median_us = t[t.size() / 2];
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
}

}  // namespace mla::test

// Rounds a dynamic shared-memory pointer up to 1024 bytes (128B-swizzled TMA / wgmma tiles need it;
// launch with 1024 bytes of slack).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}
