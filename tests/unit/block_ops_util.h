// SPDX-License-Identifier: Apache-2.0
#pragma once
// Inputs and independent references of the DeepSeek block's ops (mla/block_ops.h), shared by the CPU
// unit tests (tests/unit/test_block_ops.cpp) and the GPU tests (tests/gpu/test_block_gpu.cpp). The
// references are written from the formulas in the header, not from the backends' code.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numeric.h"
#include "mla/tensor.h"
#include "support/test_util.h"

namespace mla::test::block_ops {

// Random e4m3 codes [rows, cols] (finite: NaN codes 0x7f / 0xff replaced by 0x7e / 0xfe).
inline Tensor random_codes(int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty({rows, cols}, DType::fp8_e4m3);
  auto* p = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    auto b = static_cast<uint8_t>(rng()() & 0xff);
    if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
    p[i] = b;
  }
  return t;
}

// f32 scales [rows, cols] with row stride `ld` (>= cols; the padding is NaN: never read), in [lo, hi).
inline Tensor random_scales(int64_t rows, int64_t cols, int64_t ld, double lo = 1e-3, double hi = 1e-2) {
  Tensor t = Tensor::empty({rows, ld}, DType::f32);
  auto* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < ld; ++j) p[i * ld + j] = j < cols ? static_cast<float>(uniform(lo, hi)) : std::nanf("");
  return t;
}

// c[m, n] = sum_k a[m, k] a_scales[k / 128, m] w[n, k] w_scales[n / 128, k / 128] in float64.
inline std::vector<double> gemm_fp8_block_ref(const Tensor& a, const Tensor& a_scales, const Tensor& w,
                                              const Tensor& w_scales) {
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0), lds = w_scales.size(1);
  const auto* ap = static_cast<const uint8_t*>(a.data());
  const auto* wp = static_cast<const uint8_t*>(w.data());
  const auto* as = static_cast<const float*>(a_scales.data());
  const auto* ws = static_cast<const float*>(w_scales.data());
  std::vector<double> c(static_cast<std::size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += static_cast<double>(num::e4m3_to_float(ap[m * K + k])) * as[(k / 128) * M + m] *
             static_cast<double>(num::e4m3_to_float(wp[n * K + k])) * ws[(n / 128) * lds + k / 128];
      c[static_cast<std::size_t>(m * N + n)] = s;
    }
  return c;
}

// The [rows, cols] view over the first cols columns of a [rows, ld] tensor (the padded scale layout).
inline TensorView scale_view(const Tensor& t, int64_t cols) {
  const int64_t shape[2] = {t.size(0), cols}, stride[2] = {t.size(1), 1};
  return TensorView(const_cast<void*>(t.data()), DType::f32, std::span<const int64_t>(shape, 2),
                    std::span<const int64_t>(stride, 2), t.device());
}

// Expected quantisation of one row-group: (scale, codes) per DeepSeek's act_quant in float.
inline float group_scale(const std::vector<double>& x, int64_t row, int64_t K, int64_t g) {
  float amax = 0;
  for (int64_t j = g * 128; j < g * 128 + 128; ++j)
    amax = std::max(amax, std::fabs(static_cast<float>(x[static_cast<std::size_t>(row * K + j)])));
  return amax > 0 ? amax / 448.0f : 1.0f;
}

}  // namespace mla::test::block_ops
