// SPDX-License-Identifier: Apache-2.0
// CPU gemm / bmm: c = alpha * a @ b + beta * c through OpenBLAS (float: cblas_sgemm in Precision::fast,
// double: cblas_dgemm in reference mode).
//
// An operand already in the accumulation type with a unit stride in one of its two dims goes to BLAS as
// it is (row- or column-major, with its leading dimension); anything else (bf16 / f16 weights, other
// strides) is converted once into a contiguous row-major buffer, which costs O(mk + kn + mn) against the
// O(mnk) product and lets one path serve every dtype and stride. beta == 0 never reads c (outputs may
// be NaN-poisoned), as in BLAS.
//
// Threads: OpenBLAS runs single-threaded and the products are split over OpenMP threads here (bmm by
// batch entry, large products by row or column panels of c). Two thread pools on the same cores (the
// attention ops use OpenMP) spin-wait against each other between calls; with one pool they cannot.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

template <class T>
constexpr DType kAccumDType = std::is_same_v<T, float> ? DType::f32 : DType::f64;

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// A 2-D view as BLAS sees it: row-major (trans = false, ld = row stride) or column-major (trans = true,
// ld = column stride) over either the view's own memory or a converted row-major copy.
template <class T>
struct Operand {
  const T* ptr = nullptr;
  bool trans = false;
  int64_t ld = 1;
};

template <class T>
bool direct_layout(const TensorView& t, Operand<T>& op) {
  if (t.dtype != kAccumDType<T>) return false;
  const int64_t r = t.size(0), c = t.size(1);
  if (t.stride[1] == 1 || c == 1) {
    const int64_t ld = r == 1 ? std::max<int64_t>(c, 1) : t.stride[0];
    if (ld < std::max<int64_t>(c, 1)) return false;
    op = {static_cast<const T*>(t.data), false, ld};
    return true;
  }
  if (t.stride[0] == 1 || r == 1) {
    const int64_t ld = c == 1 ? std::max<int64_t>(r, 1) : t.stride[1];
    if (ld < std::max<int64_t>(r, 1)) return false;
    op = {static_cast<const T*>(t.data), true, ld};
    return true;
  }
  return false;
}

// Row-major T copy of a 2-D view; rows with a unit stride convert as whole rows.
template <class T>
void gather2d(const TensorView& t, T* dst) {
  const int64_t r = t.size(0), c = t.size(1), es = static_cast<int64_t>(t.element_size());
  const char* base = static_cast<const char*>(t.data);
  for (int64_t i = 0; i < r; ++i) {
    const char* row = base + i * t.stride[0] * es;
    if (t.stride[1] == 1) {
      load_row(row, t.dtype, dst + i * c, c);
    } else {
      for (int64_t j = 0; j < c; ++j) dst[i * c + j] = static_cast<T>(num::load(row + j * t.stride[1] * es, t.dtype));
    }
  }
}
template <class T>
void scatter2d(const T* src, const TensorView& t) {
  const int64_t r = t.size(0), c = t.size(1), es = static_cast<int64_t>(t.element_size());
  char* base = static_cast<char*>(t.data);
  for (int64_t i = 0; i < r; ++i) {
    char* row = base + i * t.stride[0] * es;
    if (t.stride[1] == 1) {
      store_row(row, t.dtype, src + i * c, c);
    } else {
      // Element by element through store_row: f64 outputs keep every bit (no float detour).
      for (int64_t j = 0; j < c; ++j) store_row(row + j * t.stride[1] * es, t.dtype, src + i * c + j, 1);
    }
  }
}

template <class T>
Operand<T> input(const TensorView& t, std::vector<T>& buf) {
  Operand<T> op;
  if (direct_layout(t, op)) return op;
  buf.resize(static_cast<std::size_t>(t.numel()));
  gather2d(t, buf.data());
  return {buf.data(), false, std::max<int64_t>(t.size(1), 1)};
}

// Keeps OpenBLAS to the calling thread (see the file comment); set once per process.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Below this many multiply-adds a product stays on one thread (a panel split costs more than it saves).
constexpr double kParallelMacs = 1 << 20;

// c = alpha a b + beta c for 2-D views, through reusable conversion buffers; `threads` > 1 splits the
// product into panels of c rows (or columns, when c is wider than tall) computed in parallel.
template <class T>
void gemm2d(const TensorView& a, const TensorView& b, const TensorView& c, T alpha, T beta, std::vector<T>& abuf,
            std::vector<T>& bbuf, std::vector<T>& cbuf, int threads) {
  const int64_t m = c.size(0), n = c.size(1), k = a.size(1);
  if (m == 0 || n == 0) return;
  // c in place when it is row-major in T; otherwise through a row-major buffer.
  Operand<T> cd;
  const bool c_direct = direct_layout(c, cd) && !cd.trans;
  T* cp = const_cast<T*>(cd.ptr);
  int64_t ldc = cd.ld;
  if (!c_direct) {
    cbuf.resize(static_cast<std::size_t>(m * n));
    cp = cbuf.data();
    ldc = n;
    if (beta != T(0)) gather2d(c, cp);
  }
  if (k == 0) {
    // An empty sum: c = beta * c (0 when beta == 0, without reading c).
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) cp[i * ldc + j] = beta != T(0) ? beta * cp[i * ldc + j] : T(0);
  } else {
    const Operand<T> ao = input(a, abuf), bo = input(b, bbuf);
    const bool by_rows = m >= n;
    const int64_t extent = by_rows ? m : n;
    const int64_t parts =
        static_cast<double>(m) * n * k < kParallelMacs ? 1 : std::min<int64_t>(threads, (extent + 15) / 16);
    const int64_t step = (extent + parts - 1) / parts;
#pragma omp parallel for num_threads(static_cast <int>(parts)) schedule(static, 1) if (parts > 1)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = p * step, hi = std::min(extent, lo + step);
      if (lo >= hi) continue;
      if (by_rows) {  // rows [lo, hi) of a and c
        const T* ap = ao.trans ? ao.ptr + lo : ao.ptr + lo * ao.ld;
        blas_gemm(ao.trans, bo.trans, hi - lo, n, k, alpha, ap, ao.ld, bo.ptr, bo.ld, beta, cp + lo * ldc, ldc);
      } else {  // columns [lo, hi) of b and c
        const T* bp = bo.trans ? bo.ptr + lo * bo.ld : bo.ptr + lo;
        blas_gemm(ao.trans, bo.trans, m, hi - lo, k, alpha, ao.ptr, ao.ld, bp, bo.ld, beta, cp + lo, ldc);
      }
    }
  }
  if (!c_direct) scatter2d(cbuf.data(), c);
}

template <class T>
void run(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta) {
  single_threaded_blas();
  const int threads = omp_get_max_threads();
  if (c.ndim == 2) {
    std::vector<T> abuf, bbuf, cbuf;
    gemm2d<T>(a, b, c, alpha, beta, abuf, bbuf, cbuf, threads);
    return;
  }
  const int64_t batch = c.size(0);
  if (batch >= threads) {  // whole entries per thread
#pragma omp parallel
    {
      std::vector<T> abuf, bbuf, cbuf;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < batch; ++i)
        gemm2d<T>(a.select(0, i), b.select(0, i), c.select(0, i), alpha, beta, abuf, bbuf, cbuf, 1);
    }
    return;
  }
  std::vector<T> abuf, bbuf, cbuf;
  for (int64_t i = 0; i < batch; ++i)
    gemm2d<T>(a.select(0, i), b.select(0, i), c.select(0, i), alpha, beta, abuf, bbuf, cbuf, threads);
}

}  // namespace

void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  if (ctx.precision == Precision::reference)
    run<double>(a, b, c, alpha, beta);
  else
    run<float>(a, b, c, alpha, beta);
}

void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  if (ctx.precision == Precision::reference)
    run<double>(a, b, c, alpha, beta);
  else
    run<float>(a, b, c, alpha, beta);
}

}  // namespace mla::cpu
