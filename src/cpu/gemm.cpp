// CPU gemm / bmm: c = alpha * a @ b + beta * c through OpenBLAS.
//
// Operands of any floating dtype and any strides are first converted to contiguous row-major buffers of
// the accumulation type (float: Precision::fast, cblas_sgemm; double: reference, cblas_dgemm). The
// conversion is O(mk + kn + mn) against O(mnk) arithmetic, and it is what lets one code path serve every
// dtype and stride. beta == 0 never reads c (outputs may be NaN-poisoned), as in BLAS.
#include <cblas.h>

#include <cstdint>
#include <vector>

#include "core/numeric.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

void blas_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(k), b, static_cast<blasint>(n), beta, c,
              static_cast<blasint>(n));
}
void blas_gemm(int64_t m, int64_t n, int64_t k, double alpha, const double* a, const double* b, double beta,
               double* c) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(k), b, static_cast<blasint>(n), beta, c,
              static_cast<blasint>(n));
}

// Copies a 2-D strided view into a row-major T buffer (or back), converting element by element.
template <class T>
void gather2d(const TensorView& t, T* dst) {
  const int64_t r = t.size(0), c = t.size(1), es = static_cast<int64_t>(t.element_size());
  const char* base = static_cast<const char*>(t.data);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      dst[i * c + j] = static_cast<T>(num::load(base + (i * t.stride[0] + j * t.stride[1]) * es, t.dtype));
}
template <class T>
void scatter2d(const T* src, const TensorView& t) {
  const int64_t r = t.size(0), c = t.size(1), es = static_cast<int64_t>(t.element_size());
  char* base = static_cast<char*>(t.data);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      num::store(base + (i * t.stride[0] + j * t.stride[1]) * es, t.dtype, static_cast<double>(src[i * c + j]));
}

// One product per batch entry; 2-D views.
template <class T>
void gemm_batch(const std::vector<TensorView>& as, const std::vector<TensorView>& bs, const std::vector<TensorView>& cs,
                T alpha, T beta) {
  if (as.empty()) return;
  const int64_t m = cs[0].size(0), n = cs[0].size(1), k = as[0].size(1);
  if (m == 0 || n == 0) return;
  std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)), c(static_cast<std::size_t>(m * n));
  for (std::size_t i = 0; i < as.size(); ++i) {
    if (beta != T(0)) gather2d(cs[i], c.data());
    if (k == 0) {
      // An empty sum: c = beta * c. BLAS may not touch c at all for k == 0, so do it here.
      for (T& x : c) x = beta != T(0) ? beta * x : T(0);
    } else {
      gather2d(as[i], a.data());
      gather2d(bs[i], b.data());
      blas_gemm(m, n, k, alpha, a.data(), b.data(), beta, c.data());
    }
    scatter2d(c.data(), cs[i]);
  }
}

template <class T>
void run(const std::vector<TensorView>& as, const std::vector<TensorView>& bs, const std::vector<TensorView>& cs,
         float alpha, float beta) {
  gemm_batch<T>(as, bs, cs, static_cast<T>(alpha), static_cast<T>(beta));
}

void dispatch(const std::vector<TensorView>& as, const std::vector<TensorView>& bs, const std::vector<TensorView>& cs,
              float alpha, float beta, const Context& ctx) {
  if (ctx.precision == Precision::reference) run<double>(as, bs, cs, alpha, beta);
  else run<float>(as, bs, cs, alpha, beta);
}

}  // namespace

void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  dispatch({a}, {b}, {c}, alpha, beta, ctx);
}

void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  std::vector<TensorView> as, bs, cs;
  for (int64_t i = 0; i < c.size(0); ++i) {
    as.push_back(a.select(0, i));
    bs.push_back(b.select(0, i));
    cs.push_back(c.select(0, i));
  }
  dispatch(as, bs, cs, alpha, beta, ctx);
}

}  // namespace mla::cpu
