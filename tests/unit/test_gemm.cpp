// SPDX-License-Identifier: Apache-2.0
// gemm / bmm on the CPU against a naive float64 product: strided and transposed views, mixed dtypes,
// beta (including beta = 0 over a NaN-poisoned c, which must not be read), k = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

// c_ref = alpha * a @ b + beta * c0 over logical (strided) element order.
std::vector<double> naive(const TensorView& a, const TensorView& b, const std::vector<double>& c0, double alpha,
                          double beta) {
  const bool batched = a.ndim == 3;
  const int64_t nb = batched ? a.size(0) : 1, m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const std::vector<double> av = test::to_doubles(a), bv = test::to_doubles(b);
  std::vector<double> c(static_cast<std::size_t>(nb * m * n));
  for (int64_t z = 0; z < nb; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t x = 0; x < k; ++x) acc += av[(z * m + i) * k + x] * bv[(z * k + x) * n + j];
        const std::size_t o = static_cast<std::size_t>((z * m + i) * n + j);
        c[o] = alpha * acc + (beta != 0 ? beta * c0[o] : 0.0);
      }
  return c;
}

TEST(Gemm, StridedTransposedMixedDtypes) {
  test::reseed(21);
  const int64_t m = 37, k = 70, n = 19;
  // a: transposed view of a [k, m] buffer; b: every other column of a [k, 2n] buffer; c: a column slice.
  Tensor abuf = test::random_tensor({k, m}, DType::bf16);
  Tensor bbuf = test::random_tensor({k, 2 * n}, DType::f32);
  const TensorView a = abuf.view().transpose(0, 1);
  const int64_t bshape[] = {k, n}, bstride[] = {2 * n, 2};
  const TensorView b(bbuf.data(), DType::f32, bshape, bstride);
  for (Precision prec : {Precision::reference, Precision::fast}) {
    for (float beta : {0.0f, 0.5f}) {
      Tensor cbuf = test::random_tensor({m, n + 5}, DType::f64);
      const TensorView c = cbuf.view().slice(1, 2, 2 + n);
      if (beta == 0.0f) fill(c, NAN);  // beta == 0 must not read c
      const std::vector<double> c0 = test::to_doubles(c);
      const std::vector<double> ref = naive(a, b, c0, 1.5, beta);
      gemm(a, b, c, 1.5f, beta, Context{nullptr, prec});
      // fast: float32 accumulation over k = 70 terms of magnitude <= 1.
      EXPECT_EQ(test::check_close(test::to_doubles(c), ref, prec == Precision::fast ? DType::f32 : DType::f64,
                                  prec == Precision::fast ? 1e-6 : 1e-13),
                "")
          << "beta " << beta;
      // Columns outside the slice are untouched.
      const std::vector<double> all = test::to_doubles(cbuf.view());
      for (int64_t i = 0; i < m; ++i) ASSERT_FALSE(std::isnan(all[static_cast<std::size_t>(i * (n + 5))]));
    }
  }
}

TEST(Gemm, Bf16OutputAndEmptyK) {
  test::reseed(22);
  Tensor a = test::random_tensor({5, 64}, DType::bf16), b = test::random_tensor({64, 9}, DType::bf16);
  Tensor c = test::poisoned({5, 9}, DType::bf16);
  gemm(a, b, c, 1.0f, 0.0f);
  EXPECT_EQ(test::check_close(test::to_doubles(c.view()), naive(a, b, {}, 1.0, 0.0), DType::bf16, 1e-6), "");

  // k = 0: an empty sum, c = beta * c (and 0 when beta == 0, even over NaN).
  Tensor a0 = Tensor::empty({3, 0}, DType::f32), b0 = Tensor::empty({0, 4}, DType::f32);
  Tensor c0 = test::random_tensor({3, 4}, DType::f32);
  const std::vector<double> before = test::to_doubles(c0.view());
  gemm(a0, b0, c0, 1.0f, 2.0f);
  const std::vector<double> after = test::to_doubles(c0.view());
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], 2.0 * before[i]);
  fill(c0.view(), NAN);
  gemm(a0, b0, c0, 1.0f, 0.0f);
  for (double x : test::to_doubles(c0.view())) EXPECT_EQ(x, 0.0);
}

TEST(Gemm, BmmStridedBatches) {
  test::reseed(23);
  const int64_t nb = 4, m = 3, k = 48, n = 33;
  // a: [nb, m, k] with the batch as the middle dim of its buffer; b: a transposed per-batch view.
  Tensor abuf = test::random_tensor({m, nb, k}, DType::f32);
  const TensorView a = abuf.view().transpose(0, 1);
  Tensor bbuf = test::random_tensor({nb, n, k}, DType::bf16);
  const TensorView b = bbuf.view().transpose(1, 2);
  for (Precision prec : {Precision::reference, Precision::fast}) {
    Tensor c = test::random_tensor({nb, m, n}, DType::f32);
    const std::vector<double> c0 = test::to_doubles(c.view());
    const std::vector<double> ref = naive(a, b, c0, -0.5, 1.0);
    bmm(a, b, c, -0.5f, 1.0f, Context{nullptr, prec});
    EXPECT_EQ(test::check_close(test::to_doubles(c.view()), ref, DType::f32, 1e-6), "");
  }
}

TEST(Gemm, BadInputsThrowAndLeaveOutputUntouched) {
  Tensor a = test::random_tensor({4, 8}, DType::f32), b = test::random_tensor({8, 5}, DType::f32);
  Tensor c = Tensor::empty({4, 5}, DType::f32);
  fill(c.view(), 7.0);
  Tensor wrong_k = test::random_tensor({7, 5}, DType::f32), wrong_c = Tensor::empty({4, 6}, DType::f32);
  Tensor ints = Tensor::zeros({8, 5}, DType::i32);
  EXPECT_THROW(gemm(a, wrong_k, c), Error);
  EXPECT_THROW(gemm(a, b, wrong_c), Error);
  EXPECT_THROW(gemm(a, ints, c), Error);
  EXPECT_THROW(gemm(a, b, c, NAN, 0.0f), Error);
  const int64_t shape[] = {4, 5}, overlap[] = {1, 1};  // c elements alias each other
  EXPECT_THROW(gemm(a, b, TensorView(c.data(), DType::f32, shape, overlap)), Error);
  TensorView cuda_c = c.view();
  cuda_c.device = Device::cuda(0);
  EXPECT_THROW(gemm(a, b, cuda_c), Error);
  EXPECT_THROW(gemm(a.view().reshape({4, 8, 1}), b, c), Error);
  Tensor a3 = test::random_tensor({2, 4, 8}, DType::f32), b3 = test::random_tensor({3, 8, 5}, DType::f32);
  Tensor c3 = Tensor::empty({2, 4, 5}, DType::f32);
  fill(c3.view(), 7.0);
  EXPECT_THROW(bmm(a3, b3, c3), Error);
  EXPECT_THROW(bmm(a, b, c), Error);
  for (double x : test::to_doubles(c.view())) ASSERT_EQ(x, 7.0);
  for (double x : test::to_doubles(c3.view())) ASSERT_EQ(x, 7.0);

  // On CUDA an operand must be row- or column-major (cuBLAS); refused by the front end, whether or not
  // this build or machine has a device (the views are never dereferenced).
  Tensor h16 = Tensor::empty({8, 16}, DType::bf16);
  auto cuda_view = [](const Tensor& t, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
    return TensorView(t.data(), t.dtype(), std::span<const int64_t>(shape.begin(), shape.size()),
                      std::span<const int64_t>(stride.begin(), stride.size()), Device::cuda(0));
  };
  const TensorView cb = cuda_view(h16, {8, 5}, {16, 1});
  const TensorView cc = cuda_view(h16, {4, 5}, {16, 1});
  const TensorView no_unit = cuda_view(h16, {4, 8}, {16, 2}), short_ld = cuda_view(h16, {4, 8}, {4, 1});
  for (const TensorView& bad : {no_unit, short_ld}) {
    try {
      gemm(bad, cb, cc);
      ADD_FAILURE() << "accepted " << bad.describe();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("row- or column-major"), std::string::npos) << e.what();
    }
  }
  Tensor h32 = Tensor::empty({4, 8}, DType::f32);
  EXPECT_THROW(gemm(cuda_view(h32, {4, 8}, {8, 1}), cb, cc), Error);  // CUDA inputs are bf16
}

}  // namespace
}  // namespace mla
