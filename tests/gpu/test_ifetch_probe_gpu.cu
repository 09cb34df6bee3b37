// SPDX-License-Identifier: Apache-2.0
// Issue 48's cost model for code that runs once a launch (docs/design/attention_sm90.md "10. Where the time goes"):
// what a launch pays for straight-line code it executes once, against the same instructions in a loop (whose body
// is fetched once), at the timing of issue 48's rows (a CUDA graph replayed, events around the replay). Three
// timings a kernel: after an L2 flush (cold), without it (warm), and a second launch of the same kernel in the same
// graph (the code fetched by the first). Each thread runs 8 independent FFMA chains (16-byte instructions, ~N issue
// cycles a warp whatever the form), so straight minus looped is the fetch's cost. Every thread's sums are checked.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "ptx_test_util.cuh"

namespace mla {
namespace {

constexpr int kChains = 8;

__device__ __forceinline__ void fma_step(float (&a)[kChains], float x, float y) {
#pragma unroll
  for (int k = 0; k < kChains; ++k) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(a[k]) : "f"(x), "f"(y));
}

__device__ __forceinline__ void write_sum(const float (&a)[kChains], float* out) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) s += a[k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// kSteps x 8 FFMAs as straight-line code: 128 * kSteps bytes of SASS executed once.
template <int kSteps>
__global__ void straight_kernel(float x, float y, float* out) {
  float a[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) a[k] = static_cast<float>(k);
#pragma unroll
  for (int i = 0; i < kSteps; ++i) fma_step(a, x, y);
  write_sum(a, out);
}

// The same kSteps x 8 FFMAs as a loop over a body of 8 steps (1 KiB of SASS).
template <int kSteps>
__global__ void looped_kernel(float x, float y, float* out) {
  float a[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) a[k] = static_cast<float>(k);
#pragma unroll 1
  for (int i = 0; i < kSteps / 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) fma_step(a, x, y);
  }
  write_sum(a, out);
}

struct Timing {
  double cold = 0, warm = 0, second = 0;
};

template <class K>
void time_kernel(K kernel, int grid, int block, float* out, unsigned char* flush, std::size_t flush_bytes,
                 cudaStream_t st, Timing& r) {
  for (int v = 0; v < 3; ++v)  // 0 cold, 1 warm, 2 two launches (warm)
    test::time_graph_replay(
        st, 45,
        [&] {
          for (int l = 0; l < (v == 2 ? 2 : 1); ++l) kernel<<<grid, block, 0, st>>>(1.0f, 1.0f, out);
        },
        [&](int it) {
          if (v == 0) MLA_CUDA_OK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, st));
        },
        v == 0 ? r.cold : v == 1 ? r.warm : r.second);
  r.second -= r.warm;
}

template <int kSteps>
void probe_size(int sms, int block, float* out, std::size_t out_n, unsigned char* flush, std::size_t flush_bytes,
                cudaStream_t st) {
  Timing s, l;
  time_kernel(straight_kernel<kSteps>, sms, block, out, flush, flush_bytes, st, s);
  time_kernel(looped_kernel<kSteps>, sms, block, out, flush, flush_bytes, st, l);
  // Checked: every thread's sum of its chains, k + kSteps each (x = y = 1; exact in fp32).
  std::vector<float> h(out_n);
  MLA_CUDA_OK(cudaMemcpy(h.data(), out, out_n * sizeof(float), cudaMemcpyDeviceToHost));
  const float want = static_cast<float>(kChains * (kChains - 1) / 2 + kChains * kSteps);
  int bad = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(sms) * block; ++i)
    if (h[i] != want && bad++ < 4) ADD_FAILURE() << "steps " << kSteps << " thread " << i << ": " << h[i] << " != " << want;
  EXPECT_EQ(bad, 0);
  const double kib = kSteps * 128.0 / 1024.0;
  std::printf("ifetch, %d threads a CTA x %d CTAs, %6.0f KiB straight (us, medians): cold %6.2f / warm %6.2f / second "
              "launch %6.2f; looped %6.2f / %6.2f / %6.2f; straight - looped (warm) %6.2f us = %5.2f KiB/us\n",
              block, sms, kib, s.cold, s.warm, s.second, l.cold, l.warm, l.second, s.warm - l.warm,
              s.warm > l.warm ? kib / (s.warm - l.warm) : 0.0);
}

TEST(IfetchProbeGpu, StraightLineAgainstLoopedCode) {
  MLA_SKIP_UNLESS_SM90();
  int l2 = 0, sms = 0;
  MLA_CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  MLA_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  MLA_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  test::DevBuf<unsigned char> flush(std::size_t(2) * l2);
  test::DevBuf<float> out(std::size_t(sms) * 384);
  for (const int block : {128, 384}) {
    probe_size<32>(sms, block, out.p, out.n, flush.p, flush.n, st);
    probe_size<128>(sms, block, out.p, out.n, flush.p, flush.n, st);
    probe_size<512>(sms, block, out.p, out.n, flush.p, flush.n, st);
    probe_size<1024>(sms, block, out.p, out.n, flush.p, flush.n, st);
  }
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace mla
