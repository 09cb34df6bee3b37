// SPDX-License-Identifier: Apache-2.0
// Host-side tensor-map encoding (tensor_map.h).
#include "cuda/common/ptx/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "mla/error.h"

namespace mla::cuda::ptx {
namespace {

using EncodeFn = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's encoder, looked up once per process (thread-safe static initialisation).
EncodeFn encoder() {
  static const EncodeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
      throw Error(std::string("TMA: cannot find the driver's cuTensorMapEncodeTiled (") +
                  (e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found or driver older than CUDA 12.0") +
                  ")");
    return reinterpret_cast<EncodeFn>(p);
  }();
  return fn;
}

CUtensorMapDataType data_type(DType t, const char* what) {
  switch (t) {
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::f32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::f64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
    case DType::fp8_e4m3:
    case DType::u8: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    case DType::i32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
    case DType::i64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
  }
  throw Error(std::string(what) + ": TMA: unsupported dtype");
}

[[noreturn]] void fail(const char* what, const std::string& msg) { throw Error(std::string(what) + ": TMA: " + msg); }

std::string s(int64_t v) { return std::to_string(v); }

}  // namespace

int64_t box_bytes(const TmaTensor& t) {
  int64_t n = static_cast<int64_t>(dtype_size(t.dtype));
  for (int i = 0; i < t.rank && i < 5; ++i) n *= t.box[i];
  return n;
}

CUtensorMap make_tensor_map(const TmaTensor& t, const char* what) {
  const CUtensorMapDataType dt = data_type(t.dtype, what);
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype));
  if (t.rank < 1 || t.rank > 5) fail(what, "rank must be 1..5, got " + s(t.rank));
  if (t.base == nullptr || reinterpret_cast<uintptr_t>(t.base) % 16 != 0)
    fail(what, "base address must be non-null and 16-byte aligned");
  if (t.strides[0] != 1) fail(what, "the innermost dimension must be contiguous (stride 1), got " + s(t.strides[0]));
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], estr[5];
  for (int i = 0; i < t.rank; ++i) {
    if (t.dims[i] < 1 || t.dims[i] > (int64_t(1) << 32))
      fail(what, "dims[" + s(i) + "] must be in [1, 2^32], got " + s(t.dims[i]));
    if (t.box[i] < 1 || t.box[i] > 256) fail(what, "box[" + s(i) + "] must be in [1, 256], got " + s(t.box[i]));
    dims[i] = static_cast<cuuint64_t>(t.dims[i]);
    box[i] = static_cast<cuuint32_t>(t.box[i]);
    estr[i] = 1;
    if (i > 0) {
      const int64_t bytes = t.strides[i] * elem;
      if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t(1) << 40))
        fail(what, "strides[" + s(i) + "] must be a positive multiple of 16 bytes below 2^40, got " + s(bytes) +
                       " bytes");
      strides[i - 1] = static_cast<cuuint64_t>(bytes);
    }
  }
  const int64_t inner = t.box[0] * elem;
  if (inner % 16 != 0) fail(what, "box[0] must span a multiple of 16 bytes, got " + s(inner));
  CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_NONE;
  int64_t span = 0;
  switch (t.swizzle) {
    case TmaSwizzle::none: break;
    case TmaSwizzle::b32: sw = CU_TENSOR_MAP_SWIZZLE_32B; span = 32; break;
    case TmaSwizzle::b64: sw = CU_TENSOR_MAP_SWIZZLE_64B; span = 64; break;
    case TmaSwizzle::b128: sw = CU_TENSOR_MAP_SWIZZLE_128B; span = 128; break;
  }
  if (span > 0 && inner > span)
    fail(what, "a swizzled box's inner extent must be at most the swizzle span (" + s(span) + " bytes), got " +
                   s(inner));
  CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_NONE;
  switch (t.l2_promotion_bytes) {
    case 0: break;
    case 64: l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_64B; break;
    case 128: l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_128B; break;
    case 256: l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B; break;
    default: fail(what, "l2_promotion_bytes must be 0, 64, 128 or 256, got " + s(t.l2_promotion_bytes));
  }
  CUtensorMap map{};
  const CUresult r = encoder()(&map, dt, static_cast<cuuint32_t>(t.rank), const_cast<void*>(t.base), dims, strides,
                               box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) fail(what, "cuTensorMapEncodeTiled rejected the description (CUresult " + s(r) + ")");
  return map;
}

}  // namespace mla::cuda::ptx
