// SPDX-License-Identifier: Apache-2.0
// gemm / bmm on CUDA through cuBLAS: c = alpha * a @ b + beta * c, bf16 a and b, bf16 or f32 c,
// fp32 accumulation (CUBLAS_COMPUTE_32F), 64-bit sizes (the *_64 entry points).
//
// Row-major views with strides are mapped onto cuBLAS's column-major operands: a matrix X [r, c] with
// strides (s0, 1) is the transpose of a column-major [c, r] matrix with leading dimension s0; with
// strides (1, s1) it is a column-major [r, c] matrix with leading dimension s1. If c itself is
// row-major we compute c^T = b^T a^T instead, so that cuBLAS writes a column-major result. A matrix
// with no unit stride, or whose other stride is smaller than the extent of the unit-stride dim
// (overlapping rows), has no cuBLAS description and is refused with mla::Error.
//
// One cuBLAS handle per device, created on first use and kept for the process; the stream is set
// on each call under a mutex (a handle is not safe for concurrent use from several threads).
#include <cublas_v2.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "cuda/common/convert.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string(what) + ": " + cublas_status_name(s));
}

// One cuBLAS handle per device, each with its own lock (a handle is set to the caller's stream and used
// under it). Per device, not one lock for the process: threads driving different GPUs (the ranks of an
// in-process DCP group, one thread and GPU each) must not serialise on each other's GEMMs, nor hold a lock
// another rank needs while a collective waits for it. The map's own lock only guards the slot lookup (no
// CUDA call under it). Handles are never destroyed: destroying them at static destruction would race the
// CUDA runtime's own teardown.
struct HandleSlot {
  std::mutex mu;
  cublasHandle_t h = nullptr;
};
HandleSlot& handle_slot(int device) {
  static std::mutex m;
  static std::map<int, HandleSlot> slots;  // node-based: a slot's address is stable
  std::lock_guard<std::mutex> lock(m);
  return slots[device];
}

// A row-major view X [rows, cols] (strides s0, s1) as op(M), M column-major with leading dim ld.
struct Operand {
  const void* ptr;
  cublasOperation_t op;
  int64_t ld;
};

bool describe(const void* ptr, int64_t rows, int64_t cols, int64_t s0, int64_t s1, Operand& out) {
  // Row-major: X = M^T with M [cols, rows], ld = s0 (>= cols unless only one row is ever addressed).
  if ((s1 == 1 || cols <= 1) && (rows <= 1 || s0 >= cols)) {
    out = {ptr, CUBLAS_OP_T, std::max<int64_t>({rows <= 1 ? cols : s0, cols, 1})};
    return true;
  }
  // Column-major: X = M with M [rows, cols], ld = s1.
  if ((s0 == 1 || rows <= 1) && (cols <= 1 || s1 >= rows)) {
    out = {ptr, CUBLAS_OP_N, std::max<int64_t>({cols <= 1 ? rows : s1, rows, 1})};
    return true;
  }
  return false;
}

Operand describe_or_throw(const TensorView& t, const char* op, const char* arg) {
  const int nd = t.ndim;
  Operand o{};
  if (!describe(t.data, t.size(nd - 2), t.size(nd - 1), t.stride[nd - 2], t.stride[nd - 1], o))
    throw Error(std::string(op) + ": cuBLAS needs " + arg +
                " to be row- or column-major (a unit stride in one of its last two dims, and the other stride at "
                "least that dim's extent), got " + t.describe());
  return o;
}

Operand transposed(Operand o) {
  o.op = o.op == CUBLAS_OP_N ? CUBLAS_OP_T : CUBLAS_OP_N;
  return o;
}

cudaDataType_t cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

// k == 0: the product is an empty sum and c = beta * c (c is not read when beta == 0, as in BLAS).
template <class T>
__global__ void scale_kernel(T* c, int64_t batch, int64_t m, int64_t n, int64_t sb, int64_t sm, int64_t sn,
                             float beta) {
  const int64_t total = batch * m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (m * n), r = (i / n) % m, col = i % n;
    T* p = c + b * sb + r * sm + col * sn;
    if constexpr (sizeof(T) == 4) {
      *p = beta == 0.0f ? 0.0f : beta * *p;
    } else {
      *p = dev::float_to_bf16(beta == 0.0f ? 0.0f : beta * dev::bf16_to_float(*p));
    }
  }
}

void scale_c(const TensorView& c, int64_t batch, float beta, const Context& ctx, const char* op) {
  const int nd = c.ndim;
  const int64_t m = c.size(nd - 2), n = c.size(nd - 1), sb = nd == 3 ? c.stride[0] : 0;
  const int64_t total = batch * m * n;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  if (c.dtype == DType::f32)
    scale_kernel<<<grid, 256, 0, stream_of(ctx)>>>(static_cast<float*>(c.data), batch, m, n, sb, c.stride[nd - 2],
                                                   c.stride[nd - 1], beta);
  else
    scale_kernel<<<grid, 256, 0, stream_of(ctx)>>>(static_cast<uint16_t*>(c.data), batch, m, n, sb,
                                                   c.stride[nd - 2], c.stride[nd - 1], beta);
  check_launch(op);
}

// c[batch] = alpha * a[batch] @ b[batch] + beta * c[batch]; batch strides 0 for a plain gemm.
void run_gemm(const TensorView& a, const TensorView& b, const TensorView& c, int64_t batch, float alpha, float beta,
              const Context& ctx, const char* op) {
  const int nd = c.ndim;
  const int64_t m = c.size(nd - 2), n = c.size(nd - 1), k = a.size(nd - 1);
  const Operand oa = describe_or_throw(a, op, "a"), ob = describe_or_throw(b, op, "b"),
                oc = describe_or_throw(c, op, "c");
  if (m == 0 || n == 0 || batch == 0) return;
  DeviceGuard guard(c.device);
  if (k == 0) {
    scale_c(c, batch, beta, ctx, op);
    return;
  }
  // cuBLAS writes a column-major C. If c is row-major, compute c^T = b^T a^T.
  const bool swap = oc.op == CUBLAS_OP_T;
  const Operand first = swap ? transposed(ob) : oa, second = swap ? transposed(oa) : ob;
  const int64_t rows = swap ? n : m, cols = swap ? m : n;
  const int64_t stride_first = nd == 3 ? (swap ? b.stride[0] : a.stride[0]) : 0;
  const int64_t stride_second = nd == 3 ? (swap ? a.stride[0] : b.stride[0]) : 0;
  const int64_t stride_c = nd == 3 ? c.stride[0] : 0;

  HandleSlot& slot = handle_slot(c.device.index);
  std::lock_guard<std::mutex> lock(slot.mu);
  if (slot.h == nullptr) check_cublas(cublasCreate(&slot.h), "cublasCreate");
  cublasHandle_t h = slot.h;
  check_cublas(cublasSetStream(h, stream_of(ctx)), "cublasSetStream");
  if (nd == 2) {
    check_cublas(cublasGemmEx_64(h, first.op, second.op, rows, cols, k, &alpha, first.ptr, CUDA_R_16BF, first.ld,
                                 second.ptr, CUDA_R_16BF, second.ld, &beta, c.data, cuda_type(c.dtype), oc.ld,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 op);
  } else {
    check_cublas(cublasGemmStridedBatchedEx_64(h, first.op, second.op, rows, cols, k, &alpha, first.ptr, CUDA_R_16BF,
                                               first.ld, stride_first, second.ptr, CUDA_R_16BF, second.ld,
                                               stride_second, &beta, c.data, cuda_type(c.dtype), oc.ld, stride_c,
                                               batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 op);
  }
}

}  // namespace

void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  run_gemm(a, b, c, 1, alpha, beta, ctx, "gemm");
}

void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  run_gemm(a, b, c, a.size(0), alpha, beta, ctx, "bmm");
}

}  // namespace mla::cuda
