// SPDX-License-Identifier: Apache-2.0
// gemm / bmm on CUDA (cuBLAS) against the CPU backend (float64 reference). Tolerance: DESIGN.md §5 at
// c's storage precision plus extra_rel 1e-5 of max|ref|, the size of fp32 accumulation error over
// k <= 576 random terms (the oracle accumulates in double). Covered: row- and column-major views of
// each operand (and row-major c computed as c^T = b^T a^T), bf16 and f32 outputs, alpha/beta, beta 0
// on a NaN-poisoned c, k = 0 (c = beta c), single rows/columns, broadcast batch strides, and a layout
// cuBLAS cannot express (overlapping rows), which must raise mla::Error and write nothing.
#include <gtest/gtest.h>

#include <tuple>

#include "gpu_test_util.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::Mirror;

// A [rows, cols] operand (with a leading batch dim when batch > 0), row-major or as the transposed
// view of a column-major buffer; random values (or NaN when `poison`).
struct Operand {
  Mirror m;
  TensorView host;
  Operand(int64_t batch, int64_t rows, int64_t cols, bool col_major, DType t, bool poison)
      : m(make(batch, rows, cols, col_major, t, poison)) {
    host = m.host.view();
    if (col_major) host = host.transpose(host.ndim - 2, host.ndim - 1);
  }
  static Tensor make(int64_t batch, int64_t rows, int64_t cols, bool col_major, DType t, bool poison) {
    const int64_t r = col_major ? cols : rows, c = col_major ? rows : cols;
    if (batch > 0) return poison ? test::poisoned({batch, r, c}, t) : test::random_tensor({batch, r, c}, t);
    return poison ? test::poisoned({r, c}, t) : test::random_tensor({r, c}, t);
  }
  TensorView dev() const { return m.on_dev(host); }
};

struct GemmCase {
  int64_t batch;  // 0: gemm
  int64_t m, n, k;
  bool a_cm, b_cm, c_cm;
  DType c_type;
  float alpha, beta;
};

void run_case(const GemmCase& g) {
  SCOPED_TRACE(::testing::Message() << "batch=" << g.batch << " m=" << g.m << " n=" << g.n << " k=" << g.k
                                    << " a_cm=" << g.a_cm << " b_cm=" << g.b_cm << " c_cm=" << g.c_cm
                                    << " c=" << to_string(g.c_type) << " alpha=" << g.alpha << " beta=" << g.beta);
  Operand a(g.batch, g.m, g.k, g.a_cm, DType::bf16, false), b(g.batch, g.k, g.n, g.b_cm, DType::bf16, false);
  Operand c(g.batch, g.m, g.n, g.c_cm, g.c_type, g.beta == 0.0f);
  if (g.batch > 0) {
    bmm(a.host, b.host, c.host, g.alpha, g.beta, test::reference_ctx());
    bmm(a.dev(), b.dev(), c.dev(), g.alpha, g.beta);
  } else {
    gemm(a.host, b.host, c.host, g.alpha, g.beta, test::reference_ctx());
    gemm(a.dev(), b.dev(), c.dev(), g.alpha, g.beta);
  }
  EXPECT_EQ(test::check_close(test::to_doubles(c.m.dev), test::to_doubles(c.m.host), g.c_type, 1e-5), "");
}

TEST(GemmGpu, LayoutsAndScalars) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(41);
  for (bool a_cm : {false, true})
    for (bool b_cm : {false, true})
      for (bool c_cm : {false, true})
        for (DType ct : {DType::bf16, DType::f32}) {
          run_case({0, 64, 96, 128, a_cm, b_cm, c_cm, ct, 1.0f, 0.0f});
          run_case({0, 33, 20, 576, a_cm, b_cm, c_cm, ct, 0.7f, 0.5f});
        }
}

TEST(GemmGpu, EdgeShapes) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(42);
  run_case({0, 1, 512, 576, false, false, false, DType::bf16, 1.0f, 0.0f});   // one row (decode-like)
  run_case({0, 33, 1, 40, false, true, false, DType::f32, 1.0f, 0.0f});      // one column
  run_case({0, 1, 1, 7, true, true, true, DType::bf16, 2.0f, 0.0f});
  run_case({0, 17, 23, 0, false, false, false, DType::bf16, 1.0f, 0.5f});   // k = 0: c = beta c
  run_case({0, 5, 7, 0, false, false, true, DType::f32, 1.0f, 0.0f});       // k = 0, beta 0: zeros over NaN
}

TEST(BmmGpu, BatchedLayouts) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(43);
  // The absorbed-query shapes: (N, B, P) x (N, P, L) and (N, B, L) x (N, L, V), small.
  run_case({8, 4, 512, 128, false, false, false, DType::bf16, 1.0f, 0.0f});
  run_case({8, 4, 128, 512, true, false, true, DType::bf16, 1.0f, 0.0f});
  run_case({3, 19, 33, 64, false, true, false, DType::f32, 0.5f, 0.25f});
  run_case({2, 6, 5, 0, false, false, false, DType::bf16, 1.0f, 0.5f});
}

TEST(BmmGpu, BroadcastBatchStride) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(44);
  const int64_t B = 5, m = 12, k = 64, n = 40;
  Mirror a(test::random_tensor({B, m, k}, DType::bf16));
  Mirror w(test::random_tensor({1, k, n}, DType::bf16));  // one weight shared by the batch (stride 0)
  const int64_t shape[3] = {B, k, n}, stride[3] = {0, n, 1};
  const TensorView bh(w.host.data(), DType::bf16, shape, stride);
  Mirror c(test::poisoned({B, m, n}, DType::bf16));
  bmm(a.host, bh, c.host, 1.0f, 0.0f, test::reference_ctx());
  bmm(a.dev, w.on_dev(bh), c.dev, 1.0f, 0.0f);
  EXPECT_EQ(test::check_close(test::to_doubles(c.dev), test::to_doubles(c.host), DType::bf16, 1e-5), "");
}

// Rows that overlap (row stride 4 < 8 columns) have no cuBLAS description: mla::Error, c untouched.
TEST(GemmGpuEdge, InexpressibleLayoutThrows) {
  MLA_SKIP_WITHOUT_GPU();
  Tensor buf = test::random_tensor({64}, DType::bf16, Device::cuda(0));
  const int64_t shape[2] = {4, 8}, stride[2] = {4, 1};
  const TensorView a(buf.data(), DType::bf16, shape, stride, Device::cuda(0));
  Tensor b = test::random_tensor({8, 3}, DType::bf16, Device::cuda(0));
  Tensor c = test::poisoned({4, 3}, DType::bf16, Device::cuda(0));
  EXPECT_THROW(gemm(a, b, c), Error);
  for (double v : test::to_doubles(c)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace mla
