// SPDX-License-Identifier: Apache-2.0
// Front ends of gemm and bmm: c = alpha * a @ b + beta * c over row-major strided views. Validation of
// shapes, dtypes, devices and strides comes first, so a bad call writes nothing.
#include <cmath>

#include "mla/ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {
namespace {

// One operand: `nd` dims, a floating dtype (bf16 for a/b on CUDA; c bf16 or f32 there), non-negative
// strides (non-overlapping for c). cuBLAS needs each matrix to be row- or column-major: on CUDA one of
// the last two dims has a unit stride and the other a stride of at least the first one's extent.
void check_operand(const TensorView& t, int nd, bool is_output, const char* op, const char* arg) {
  detail::check_ndim(t, nd, op, arg);
  if (t.device.is_cuda()) {
    if (is_output)
      MLA_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, "{}: {} must be bf16 or f32 on CUDA, got {}", op, arg,
                t.describe());
    else
      detail::check_dtype(t, DType::bf16, op, arg);
    const int64_t rows = t.size(nd - 2), cols = t.size(nd - 1);
    const int64_t s_row = t.stride[nd - 2], s_col = t.stride[nd - 1];
    // Row-major (unit column stride, rows at least a row apart) or column-major, as cuBLAS describes them.
    const bool row_major = (s_col == 1 || cols <= 1) && (s_row >= cols || rows <= 1);
    const bool col_major = (s_row == 1 || rows <= 1) && (s_col >= rows || cols <= 1);
    MLA_CHECK(row_major || col_major,
              "{}: on CUDA {} must be row- or column-major (a unit stride in one of its last two dims, the other at "
              "least that dim's extent), got {}",
              op, arg, t.describe());
  } else {
    detail::check_float(t, op, arg);
  }
  detail::check_strides(t, is_output, op, arg);
}

void check_scalars(float alpha, float beta, const char* op) {
  MLA_CHECK(std::isfinite(alpha) && std::isfinite(beta), "{}: alpha and beta must be finite, got {} and {}", op, alpha,
            beta);
}

}  // namespace

void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  constexpr const char* op = "gemm";
  check_operand(a, 2, false, op, "a [m, k]");
  check_operand(b, 2, false, op, "b [k, n]");
  check_operand(c, 2, true, op, "c [m, n]");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  detail::check_size(b, 0, k, op, "b [k, n] (k = a.size(1))");
  detail::check_size(c, 0, m, op, "c [m, n] (m = a.size(0))");
  detail::check_size(c, 1, n, op, "c [m, n] (n = b.size(1))");
  check_scalars(alpha, beta, op);
  detail::check_device(b, a.device, op, "b");
  detail::check_device(c, a.device, op, "c");
  if (m == 0 || n == 0) return;
  MLA_DISPATCH(a.device, gemm, a, b, c, alpha, beta, ctx);
}

void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  constexpr const char* op = "bmm";
  check_operand(a, 3, false, op, "a [batch, m, k]");
  check_operand(b, 3, false, op, "b [batch, k, n]");
  check_operand(c, 3, true, op, "c [batch, m, n]");
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  detail::check_size(b, 0, batch, op, "b [batch, k, n] (batch = a.size(0))");
  detail::check_size(b, 1, k, op, "b [batch, k, n] (k = a.size(2))");
  detail::check_size(c, 0, batch, op, "c [batch, m, n] (batch = a.size(0))");
  detail::check_size(c, 1, m, op, "c [batch, m, n] (m = a.size(1))");
  detail::check_size(c, 2, n, op, "c [batch, m, n] (n = b.size(2))");
  check_scalars(alpha, beta, op);
  detail::check_device(b, a.device, op, "b");
  detail::check_device(c, a.device, op, "c");
  if (batch == 0 || m == 0 || n == 0) return;
  MLA_DISPATCH(a.device, bmm, a, b, c, alpha, beta, ctx);
}

}  // namespace mla
