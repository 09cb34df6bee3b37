// SPDX-License-Identifier: Apache-2.0
#pragma once
// Activation element types of the CUDA kernels (bf16, f16, f32: the dtypes vLLM's ops take for q,
// out, merge inputs and gather destinations). A tag carries the storage type and the conversions
// with float (bf16 / f16: round to nearest even, exact widening); kernels are templated on the tag
// and instantiated through dispatch_activation, so one kernel body serves every dtype.
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "cuda/common/convert.cuh"
#include "mla/dtype.h"
#include "mla/error.h"

namespace mla::cuda {

struct Bf16 {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::bf16;
  __device__ static float to_float(Storage h) { return dev::bf16_to_float(h); }
  __device__ static Storage from_float(float f) { return dev::float_to_bf16(f); }
};

struct F16 {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::f16;
  __device__ static float to_float(Storage h) { return __half2float(__ushort_as_half(h)); }
  __device__ static Storage from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

struct F32 {
  using Storage = float;
  static constexpr DType kDType = DType::f32;
  __device__ static float to_float(Storage f) { return f; }
  __device__ static Storage from_float(float f) { return f; }
};

// Calls fn(Tag{}) for bf16 / f16 / f32; throws mla::Error naming `op` for any other dtype (the front
// ends reject those first).
template <class Fn>
decltype(auto) dispatch_activation(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::bf16: return fn(Bf16{});
    case DType::f16: return fn(F16{});
    case DType::f32: return fn(F32{});
    default: break;
  }
  throw Error(std::string(op) + ": activations must be bf16, f16 or f32 on CUDA, got " + to_string(t));
}

}  // namespace mla::cuda
