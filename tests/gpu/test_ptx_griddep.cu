// SPDX-License-Identifier: Apache-2.0
// Device test of griddep.cuh with launch_dependent (cuda/common/launch.h): a primary grid that lets its
// dependent launch at once (launch_dependents at its start) and then spins ~50 us before writing every
// element; the dependent grid, launched as a programmatic dependent, waits (grid_dependency_wait) and
// must read every element written. Without the wait it would read the sentinel (the dependent's CTAs
// run on the SMs the primary leaves free).
#include <vector>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/griddep.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

__global__ void primary_kernel(int* data, int n) {
  cuda::ptx::launch_dependents();
  const long long t0 = clock64();
  while (clock64() - t0 < 100000) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) data[i] = i + 1;
}

__global__ void dependent_kernel(const int* data, int n, int* bad) {
  cuda::ptx::grid_dependency_wait();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (data[i] != i + 1) atomicAdd(bad, 1);
}

TEST(PtxGriddep, DependentWaitsForPrimary) {
  MLA_SKIP_UNLESS_SM90();
  const int n = 1 << 16;
  test::DevBuf<int> data(n), bad(1);
  data.fill_bytes(0);
  bad.fill_bytes(0);
  cudaStream_t s;
  MLA_CUDA_OK(cudaStreamCreate(&s));
  for (int rep = 0; rep < 5; ++rep) {
    primary_kernel<<<8, 128, 0, s>>>(data.p, n);
    cuda::launch_dependent(dependent_kernel, 64, 128, 0, s, "dependent_kernel", static_cast<const int*>(data.p), n, bad.p);
    MLA_CUDA_OK(cudaStreamSynchronize(s));
    MLA_CUDA_OK(cudaMemsetAsync(data.p, 0, n * sizeof(int), s));
  }
  MLA_CUDA_OK(cudaStreamDestroy(s));
  EXPECT_EQ(bad.download()[0], 0);
}

}  // namespace
}  // namespace mla
