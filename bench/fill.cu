// SPDX-License-Identifier: Apache-2.0
// Device fills for benchmark inputs (registry.h): counter-based random values, so that multi-GB
// tensors fill in milliseconds and never hold zeros.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "mla/error.h"
#include "registry.h"

namespace mla::bench {
namespace {

// splitmix64 of (seed, index): independent, well-mixed 64-bit values.
__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t r) { return static_cast<float>(r >> 40) * 0x1p-24f; }  // [0, 1)

// Random e4m3 code that is finite (0x7f / 0xff are NaN).
__device__ __forceinline__ uint8_t finite_code(uint64_t r) {
  const auto c = static_cast<uint8_t>(r);
  return (c & 0x7f) == 0x7f ? static_cast<uint8_t>(c & 0xfe) : c;
}

// Grid-stride loop over [0, n) calling F::operator()(i). Functors, not __device__ lambdas: those
// need nvcc's --extended-lambda, which the build does not pass.
template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void for_each(int64_t n, void* stream, F f) {
  if (n == 0) return;
  for_each_kernel<<<4096, 256, 0, static_cast<cudaStream_t>(stream)>>>(n, f);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("bench fill: ") + cudaGetErrorString(e));
}

struct UniformBf16 {
  uint16_t* p;
  float a, w;
  uint64_t seed;
  __device__ void operator()(int64_t i) const { p[i] = cuda::dev::float_to_bf16(a + w * unit(mix(seed, i))); }
};
struct UniformF32 {
  float* p;
  float a, w;
  uint64_t seed;
  __device__ void operator()(int64_t i) const { p[i] = a + w * unit(mix(seed, i)); }
};
struct Codes {
  uint8_t* p;
  uint64_t seed;
  __device__ void operator()(int64_t i) const { p[i] = finite_code(mix(seed, i)); }
};
// One call per 4-byte word of a 656-byte record (164 words): codes, fp32 scales, or two bf16 rope values.
struct DsMlaWords {
  uint8_t* p;
  uint64_t seed;
  __device__ void operator()(int64_t i) const {
    const int64_t row = i / 164;
    const int w = static_cast<int>(i - row * 164);
    const uint64_t r = mix(seed, i);
    uint32_t v;
    if (w < 128) {
      v = finite_code(r) | finite_code(r >> 8) << 8 | finite_code(r >> 16) << 16 |
          static_cast<uint32_t>(finite_code(r >> 24)) << 24;
    } else if (w < 132) {
      v = __float_as_uint(1e-3f + 9e-3f * unit(r));
    } else {
      v = cuda::dev::float_to_bf16(unit(r) * 2 - 1) |
          static_cast<uint32_t>(cuda::dev::float_to_bf16(unit(r << 24) * 2 - 1)) << 16;
    }
    reinterpret_cast<uint32_t*>(p + row * 656)[w] = v;
  }
};
struct Iota {
  int32_t* p;
  int32_t start, step;
  __device__ void operator()(int64_t i) const { p[i] = start + step * static_cast<int32_t>(i); }
};

void require_contiguous(const TensorView& t, const char* what) {
  if (!t.is_contiguous() || !t.device.is_cuda())
    throw Error(std::string(what) + ": needs a contiguous CUDA tensor, got " + t.describe());
}

}  // namespace

void fill_uniform(const TensorView& t, double lo, double hi, uint64_t seed, void* stream) {
  require_contiguous(t, "fill_uniform");
  const float a = static_cast<float>(lo), w = static_cast<float>(hi - lo);
  if (t.dtype == DType::bf16) for_each(t.numel(), stream, UniformBf16{static_cast<uint16_t*>(t.data), a, w, seed});
  else if (t.dtype == DType::f32) for_each(t.numel(), stream, UniformF32{static_cast<float*>(t.data), a, w, seed});
  else throw Error("fill_uniform: bf16 or f32 tensor expected, got " + t.describe());
}

void fill_cache(const KVCache& c, uint64_t seed, void* stream) {
  if (c.format == CacheFormat::fp8_ds_mla) fill_ds_mla_rows(c.data, seed, stream);
  else if (c.format == CacheFormat::fp8) fill_e4m3_codes(c.data, seed, stream);
  else fill_uniform(c.data, -1, 1, seed, stream);
}

void fill_e4m3_codes(const TensorView& t, uint64_t seed, void* stream) {
  require_contiguous(t, "fill_e4m3_codes");
  if (t.element_size() != 1) throw Error("fill_e4m3_codes: 1-byte tensor expected, got " + t.describe());
  for_each(t.numel(), stream, Codes{static_cast<uint8_t*>(t.data), seed});
}

void fill_ds_mla_rows(const TensorView& cache_data, uint64_t seed, void* stream) {
  require_contiguous(cache_data, "fill_ds_mla_rows");
  if (cache_data.element_size() != 1 || cache_data.size(-1) != 656)
    throw Error("fill_ds_mla_rows: [..., 656] byte tensor expected, got " + cache_data.describe());
  for_each(cache_data.numel() / 656 * 164, stream, DsMlaWords{static_cast<uint8_t*>(cache_data.data), seed});
}

void fill_iota_i32(const TensorView& t, int32_t start, int32_t step, void* stream) {
  require_contiguous(t, "fill_iota_i32");
  if (t.dtype != DType::i32) throw Error("fill_iota_i32: i32 tensor expected, got " + t.describe());
  for_each(t.numel(), stream, Iota{static_cast<int32_t*>(t.data), start, step});
}

}  // namespace mla::bench
