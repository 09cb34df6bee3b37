// SPDX-License-Identifier: Apache-2.0
// Issue 48's question for split decode steps (docs/NOTES.md "Next"): what merging the splits costs when the last split
// to finish merges in the kernel (a per-request arrival counter: fence, atomic add, the CTA that completes the count
// reads the other splits' partials from L2) against a programmatic dependent combine launch (one CTA per row), at the
// timing of issue 48's rows (a CUDA graph replayed after an L2 flush, events around the replay). The split work is a
// stand-in: each CTA writes its partial rows. Both merges are checked against the host sum; the times are printed.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/griddep.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

constexpr int kSplits = 8, kRows = 16, kCols = 512, kThreads = 128;
constexpr int kChunks = kRows * kCols / 4;  // float4 chunks of a partial: 16 a thread

// Split s of request b's partial: value (s + 1) * (chunk index % 7 + 1), small integers (sums exact in fp32).
__device__ __forceinline__ float4 partial_value(int s, int i) {
  const float v = float((s + 1) * (i % 7 + 1));
  return make_float4(v, v, v, v);
}

// The split CTAs alone: CTA (b, s) writes its partial. kTrigger: lets a dependent grid start at entry (PDL).
template <bool kTrigger>
__global__ void __launch_bounds__(kThreads) splits_kernel(float4* partials) {
  if constexpr (kTrigger) cuda::ptx::launch_dependents();
  const int b = blockIdx.x / kSplits, s = blockIdx.x % kSplits;
  float4* dst = partials + (int64_t(b) * kSplits + s) * kChunks;
  for (int i = threadIdx.x; i < kChunks; i += kThreads) dst[i] = partial_value(s, i);
}

// The split CTAs, the last of a request's to finish merging: fence, one arrival, and the CTA whose arrival completes
// the count sums every split's partial (its own from registers would do; read back for simplicity) into out, in split
// order, and resets the counter for the next replay.
__global__ void __launch_bounds__(kThreads) splits_last_merge_kernel(float4* partials, float4* out, int* counter) {
  const int b = blockIdx.x / kSplits, s = blockIdx.x % kSplits;
  float4* base = partials + int64_t(b) * kSplits * kChunks;
  for (int i = threadIdx.x; i < kChunks; i += kThreads) base[int64_t(s) * kChunks + i] = partial_value(s, i);
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counter[b], 1) == kSplits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  constexpr int kPer = kChunks / kThreads;
  float4 acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = make_float4(0, 0, 0, 0);
#pragma unroll 1
  for (int q = 0; q < kSplits; ++q) {
    const float4* src = base + int64_t(q) * kChunks;
    float4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = __ldcg(src + threadIdx.x + k * kThreads);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      acc[k].x += v[k].x; acc[k].y += v[k].y; acc[k].z += v[k].z; acc[k].w += v[k].w;
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) out[int64_t(b) * kChunks + threadIdx.x + k * kThreads] = acc[k];
  if (threadIdx.x == 0) counter[b] = 0;
}

// The dependent combine: CTA (b, row) sums the row's 512 columns over the splits (a thread four columns of each).
__global__ void __launch_bounds__(kThreads) combine_kernel(const float4* partials, float4* out) {
  cuda::ptx::grid_dependency_wait();
  const int b = blockIdx.x / kRows, r = blockIdx.x % kRows, i = r * (kCols / 4) + threadIdx.x;
  float4 v[kSplits];
#pragma unroll
  for (int q = 0; q < kSplits; ++q) v[q] = __ldcg(partials + (int64_t(b) * kSplits + q) * kChunks + i);
  float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int q = 0; q < kSplits; ++q) {
    acc.x += v[q].x; acc.y += v[q].y; acc.z += v[q].z; acc.w += v[q].w;
  }
  out[int64_t(b) * kChunks + i] = acc;
}

TEST(SplitMergeProbeGpu, LastArrivalAgainstDependentLaunch) {
  MLA_SKIP_UNLESS_SM90();
  int l2 = 0;
  MLA_CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaStream_t st;
  MLA_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  test::DevBuf<unsigned char> flush(std::size_t(2) * l2);
  for (const int batch : {1, 4, 8}) {
    test::DevBuf<float4> partials(std::size_t(batch) * kSplits * kChunks), out(std::size_t(batch) * kChunks);
    test::DevBuf<int> counter{static_cast<std::size_t>(batch)};
    MLA_CUDA_OK(cudaMemsetAsync(counter.p, 0, counter.n * sizeof(int), st));
    // 0: the splits alone; 1: the last split merges; 2: the splits, then the combine as a dependent launch.
    std::vector<double> med(3);
    for (int v = 0; v < 3; ++v) {
      const unsigned splits_grid = static_cast<unsigned>(batch * kSplits);
      test::time_graph_replay(
          st, 40,
          [&] {
            if (v == 0)
              EXPECT_NO_THROW(
                  cuda::launch_kernel(splits_kernel<false>, splits_grid, kThreads, 0, st, false, "splits", partials.p));
            if (v == 1)
              EXPECT_NO_THROW(cuda::launch_kernel(splits_last_merge_kernel, splits_grid, kThreads, 0, st, false,
                                                  "last merge", partials.p, out.p, counter.p));
            if (v == 2) {
              EXPECT_NO_THROW(
                  cuda::launch_kernel(splits_kernel<true>, splits_grid, kThreads, 0, st, false, "splits", partials.p));
              EXPECT_NO_THROW(cuda::launch_kernel(combine_kernel, static_cast<unsigned>(batch * kRows), kThreads, 0,
                                                  st, true, "combine", static_cast<const float4*>(partials.p), out.p));
            }
          },
          [&](int it) {
            MLA_CUDA_OK(cudaMemsetAsync(out.p, 0xff, out.n * sizeof(float4), st));
            MLA_CUDA_OK(cudaMemsetAsync(flush.p, it & 0xff, flush.n, st));
          },
          med[static_cast<std::size_t>(v)]);
      if (v > 0) {  // the merged rows: the sum over the splits
        const std::vector<float4> o = out.download();
        int bad = 0;
        for (int b = 0; b < batch; ++b)
          for (int i = 0; i < kChunks; ++i) {
            const float want = float((kSplits * (kSplits + 1) / 2) * (i % 7 + 1));
            const float4 x = o[std::size_t(b) * kChunks + i];
            if ((x.x != want || x.w != want) && bad++ < 4)
              ADD_FAILURE() << "variant " << v << " batch " << batch << " request " << b << " chunk " << i << ": " << x.x;
          }
        EXPECT_EQ(bad, 0);
      }
    }
    std::printf("split merge, b %d x %d splits x %d rows (graph-replayed, L2 flushed; us, medians): splits alone %.2f, "
                "last split merges %.2f (+%.2f), dependent combine %.2f (+%.2f)\n", batch, kSplits, kRows, med[0], med[1],
                med[1] - med[0], med[2], med[2] - med[0]);
  }
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace mla
