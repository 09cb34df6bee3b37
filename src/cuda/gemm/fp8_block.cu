// SPDX-License-Identifier: Apache-2.0
// Block-scaled fp8 GEMM on CUDA (mla::gemm_fp8_block) through cuBLASLt: DeepSeek's w8a8 recipe,
// weights e4m3 with one f32 scale per 128 x 128 block, activations e4m3 with one f32 scale per row
// and 128 columns. cuBLASLt 12.9+ runs it on sm_90 (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F and
// VEC128_32F; fp32 accumulation with the scales applied per 128-deep k block, no fast accumulation).
//
// Mapping onto cuBLASLt's column-major operands (c row-major [M, N] is D column-major [N, M]):
//   A = w    [N][K] row-major = column-major K x N (ld = w's row stride), TRANSA = T, scale mode
//            BLK128x128_32F, scales [ceil(N / 128)][round_up(K / 128, 4)] (weight_scale_inv padded)
//   B = a    [M][K] row-major = column-major K x M (ld = a's row stride), TRANSB = N, scale mode
//            VEC128_32F, scales [K / 128][M] (M contiguous: the "outer-dim-major" layout)
//   D = C = c column-major N x M (ld = c's row stride), bf16 or f32; alpha 1, beta 0.
// The front end checks the shapes and alignments cuBLASLt needs (K % 128, M % 4, N % 16, 16-byte
// rows). One cuBLASLt handle and one 32 MiB workspace per device, created on first use and kept for
// the process (like gemm/launch.cu's cuBLAS handle); heuristic results are cached per shape.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("gemm_fp8_block: ") + what + " failed: cuBLAS status " + std::to_string(static_cast<int>(s)) +
                " (" + cublasGetStatusString(s) + ")");
}

// One cuBLASLt handle and workspace per device, each with its own lock (the workspace is shared by the
// device's calls), not one lock for the process: threads driving different GPUs must not wait for each
// other here (src/cuda/gemm/launch.cu handle_slot). The map's lock guards only the slot lookup.
struct LtDevice {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Never destroyed (static destruction would race the runtime's teardown).
LtDevice& lt_slot(int device) {
  static std::mutex m;
  static std::map<int, LtDevice> devices;  // node-based: a slot's address is stable
  std::lock_guard<std::mutex> lock(m);
  return devices[device];
}

// Caller holds d.mu.
void lt_init(LtDevice& d) {
  if (!d.handle) {
    check_lt(cublasLtCreate(&d.handle), "cublasLtCreate");
    check_cuda(cudaMalloc(&d.workspace, kWorkspaceBytes), "gemm_fp8_block: cuBLASLt workspace");
  }
}

// RAII for the per-call descriptors (host objects only).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what);
}

}  // namespace

void gemm_fp8_block(const TensorView& a, const TensorView& a_scales, const TensorView& w, const TensorView& w_scales,
                    const TensorView& c, const Context& ctx) {
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  const int64_t lda = w.size(0) <= 1 ? K : w.stride[0], ldb = M <= 1 ? K : a.stride[0],
                ldc = M <= 1 ? N : c.stride[0];
  const cudaDataType_t ct = c.dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  DeviceGuard guard(c.device);
  LtDevice& dev = lt_slot(c.device.index);
  std::lock_guard<std::mutex> lock(dev.mu);
  lt_init(dev);

  Descs d;
  check_lt(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "TRANSA");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "TRANSB");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
           "A_SCALE_MODE (BLK128x128_32F)");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F),
           "B_SCALE_MODE (VEC128_32F)");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales.data), "A_SCALE_POINTER");
  set_attr(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scales.data), "B_SCALE_POINTER");
  check_lt(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(N), lda),
           "layout of w");
  check_lt(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(M), ldb),
           "layout of a");
  check_lt(cublasLtMatrixLayoutCreate(&d.c, ct, static_cast<uint64_t>(N), static_cast<uint64_t>(M), ldc),
           "layout of c");

  // Heuristic once per shape (the chosen algorithm does not depend on the pointers, which are
  // 16-byte aligned by the front end's checks and the workspace layouts).
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>, cublasLtMatmulAlgo_t>
      algos;
  const auto key = std::make_tuple(c.device.index, M, N, K, lda, ldb, ldc, static_cast<int>(ct));
  auto it = algos.find(key);
  if (it == algos.end()) {
    check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
    const std::size_t ws = kWorkspaceBytes;
    check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
             "workspace preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(dev.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found),
             "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw Error("gemm_fp8_block: cuBLASLt has no block-scaled fp8 algorithm for M = " + std::to_string(M) +
                  ", N = " + std::to_string(N) + ", K = " + std::to_string(K) +
                  " on this device (needs cuBLAS >= 12.9 and an sm_90 GPU)");
    it = algos.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(dev.handle, d.op, &alpha, w.data, d.a, a.data, d.b, &beta, c.data, d.c, c.data, d.c,
                          &it->second, dev.workspace, kWorkspaceBytes, stream_of(ctx)),
           "cublasLtMatmul");
}

}  // namespace mla::cuda
