// SPDX-License-Identifier: Apache-2.0
// What compute-sanitizer initcheck sees of cuBLAS's stores (issue 14; docs/DEVELOPING.md "GPU sanitizers"). The
// layer's query absorption is a bmm (cuBLAS) into the first 512 columns of q_abs [n, h, 576], and the sm90 decode kernel's load_q_panels
// reads those rows. initcheck reported that read only in the CUDA-graph layer tests, whose workspace is a fresh
// allocation that nothing but the bmm ever writes (the other layer tests poison their workspace first, which
// initcheck counts as a write). This test is that sequence alone, at the layer's shape: the bmm into a fresh
// cudaMalloc buffer (no memset) through the transposed view the layer uses, then a plain kernel reading exactly the
// elements the bmm wrote. Without a sanitizer it checks the values (every element against the CPU backend's float64
// product, and the kernel's sum against the host's). Under initcheck, a report on `sum_written_columns` means
// initcheck does not see these cuBLAS stores as writes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

// Sum of q_abs[:, :, 0:cols) in double, one thread per (row, head); strides in elements.
__global__ void sum_written_columns(const __nv_bfloat16* q_abs, int64_t rows, int64_t row_stride, int64_t cols,
                                    double* sums) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  double s = 0.0;
  for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(__bfloat162float(q_abs[r * row_stride + c]));
  sums[r] = s;
}

TEST(SanitizerProbeGpu, CublasBmmIntoFreshAllocationThenKernelReads) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t n = 96, h = 16, P = 128, L = 512, d_qk = 576;
  const Device gpu = Device::cuda(0);
  // The raw allocation and the plain kernel below run on the thread's current device, the bmm on `gpu`: make
  // them the same device (the library restores the caller's current device after every call, so this holds
  // whatever ran before, but the probe states it).
  ASSERT_EQ(cudaSetDevice(gpu.index), cudaSuccess);
  test::reseed(14);
  // q [n, h, P] and w_uk_t [h, P, L] (random, uploaded: initialised by a copy).
  Tensor q = test::random_tensor({n, h, P}, DType::bf16), w = test::random_tensor({h, P, L}, DType::bf16);
  Tensor qd = q.to(gpu), wd = w.to(gpu);
  void* raw = nullptr;  // fresh, never written before the bmm
  ASSERT_EQ(cudaMalloc(&raw, static_cast<size_t>(n * h * d_qk) * 2), cudaSuccess);
  const TensorView q_abs(raw, DType::bf16, {n, h, d_qk}, gpu);
  bmm(qd.view().transpose(0, 1), wd.view(), q_abs.slice(2, 0, L).transpose(0, 1), 1.0f, 0.0f, Context{});
  double* sums = nullptr;
  ASSERT_EQ(cudaMalloc(&sums, static_cast<size_t>(n * h) * sizeof(double)), cudaSuccess);
  sum_written_columns<<<(n * h + 127) / 128, 128>>>(static_cast<const __nv_bfloat16*>(raw), n * h, d_qk, L, sums);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // The bmm's values against the float64 product, and the kernel's sums against the host's.
  std::vector<uint16_t> got(static_cast<size_t>(n * h * d_qk));
  ASSERT_EQ(cudaMemcpy(got.data(), raw, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<double> dev_sums(static_cast<size_t>(n * h));
  ASSERT_EQ(cudaMemcpy(dev_sums.data(), sums, dev_sums.size() * sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  Tensor ref = Tensor::empty({h, n, L}, DType::f64);
  bmm(q.view().transpose(0, 1), w.view(), ref.view(), 1.0f, 0.0f, test::reference_ctx());
  const double* r = ref.view().data_as<double>();
  const auto bf = [](uint16_t bits) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  };
  double worst = 0.0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < h; ++hh) {
      double host_sum = 0.0;
      for (int64_t c = 0; c < L; ++c) {
        const double v = bf(got[static_cast<size_t>((t * h + hh) * d_qk + c)]);
        host_sum += v;
        const double want = r[(hh * n + t) * L + c];
        worst = std::max(worst, std::abs(v - want) / (std::abs(want) + 1.0));
      }
      ASSERT_EQ(dev_sums[static_cast<size_t>(t * h + hh)], host_sum) << "row " << t << " head " << hh;
    }
  EXPECT_LT(worst, 1e-2);  // bf16 output rounding of sums of 128 products of values in [-1, 1)
  cudaFree(sums);
  cudaFree(raw);
}

}  // namespace
}  // namespace mla
