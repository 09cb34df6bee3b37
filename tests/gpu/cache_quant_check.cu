// SPDX-License-Identifier: Apache-2.0
// Device-side checks of the reciprocal division of src/cuda/cache/quant.cuh (see cache_quant_check.h).
// The kernels run the shipped device functions; the reference is IEEE division on the same GPU
// (correctly rounded, like the CPU's float division), and the codes the same e4m3 conversion.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cache_quant_check.h"
#include "cuda/cache/quant.cuh"

namespace mla::test {
namespace {

using cuda::cache::RecipDiv;

struct Result {
  unsigned long long checked, mismatches;
  unsigned int s_bits, x_bits;  // the first mismatch found (by any thread)
  int found;
};

__device__ void record(Result* out, unsigned long long checked, unsigned long long bad, float s, float x) {
  atomicAdd(&out->checked, checked);
  if (bad == 0) return;
  atomicAdd(&out->mismatches, bad);
  if (atomicCAS(&out->found, 0, 1) == 0) {
    out->s_bits = __float_as_uint(s);
    out->x_bits = __float_as_uint(x);
  }
}

__device__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// One thread per scale significand m; x runs over the 256 bf16 values +-2^e_x * 1.xxxxxxx.
template <bool kClamped>
__global__ void exhaustive_kernel(int e_s, int e_x, Result* out) {
  const uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= (1u << 23)) return;
  const float s = __uint_as_float((static_cast<uint32_t>(127 + e_s) << 23) | m);
  const auto div = RecipDiv<kClamped>::make(s);
  unsigned long long bad = 0;
  float bad_x = 0;
  for (uint32_t v = 0; v < 256; ++v) {
    const float x = bf16_bits_to_float(((v & 128u) << 8) | (static_cast<uint32_t>(127 + e_x) << 7) | (v & 127u));
    if (__float_as_uint(div(x)) != __float_as_uint(__fdiv_rn(x, s))) {
      ++bad;
      bad_x = x;
    }
  }
  record(out, 256, bad, s, bad_x);
}

__device__ uint8_t code(float q) { return cuda::dev::float_to_e4m3(q); }

// Block per scale, threads over the 65536 bf16 patterns.
template <bool kClamped>
__global__ void codes_kernel(const float* scales, Result* out) {
  const float s = scales[blockIdx.x];
  const auto div = RecipDiv<kClamped>::make(s);
  unsigned long long bad = 0, checked = 0;
  float bad_x = 0;
  for (uint32_t b = threadIdx.x; b < 65536u; b += blockDim.x) {
    const float x = bf16_bits_to_float(b);
    const float ref = __fdiv_rn(x, s);
    if (!kClamped && !(fabsf(ref) <= 449.0f)) continue;  // a ds_mla tile with scale s never holds x
    ++checked;
    if (code(div(x)) != code(ref)) {
      ++bad;
      bad_x = x;
    }
  }
  record(out, checked, bad, s, bad_x);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cache_quant_check: ") + what + ": " + cudaGetErrorString(e));
}

template <class Launch>
RecipCheck run(Launch launch) {
  Result* d = nullptr;
  check(cudaMalloc(&d, sizeof(Result)), "cudaMalloc");
  Result h{};
  try {
    check(cudaMemset(d, 0, sizeof(Result)), "cudaMemset");
    launch(d);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy");
  } catch (...) {
    cudaFree(d);
    throw;
  }
  cudaFree(d);
  RecipCheck r;
  r.checked = h.checked;
  r.mismatches = h.mismatches;
  r.s = __builtin_bit_cast(float, h.s_bits);
  r.x = __builtin_bit_cast(float, h.x_bits);
  return r;
}

}  // namespace

RecipCheck recip_div_exhaustive(int e_s, int e_x, bool clamped) {
  if (e_s < -126 || e_s > 127 || e_x < -126 || e_x > 127) throw std::invalid_argument("recip_div_exhaustive: exponent");
  return run([&](Result* d) {
    const unsigned blocks = (1u << 23) / 256;
    if (clamped) exhaustive_kernel<true><<<blocks, 256>>>(e_s, e_x, d);
    else exhaustive_kernel<false><<<blocks, 256>>>(e_s, e_x, d);
  });
}

RecipCheck recip_div_codes(const std::vector<float>& scales, bool clamped) {
  if (scales.empty()) return {};
  float* ds = nullptr;
  check(cudaMalloc(&ds, scales.size() * sizeof(float)), "cudaMalloc");
  try {
    check(cudaMemcpy(ds, scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    const RecipCheck r = run([&](Result* d) {
      const unsigned blocks = static_cast<unsigned>(scales.size());
      if (clamped) codes_kernel<true><<<blocks, 256>>>(ds, d);
      else codes_kernel<false><<<blocks, 256>>>(ds, d);
    });
    cudaFree(ds);
    return r;
  } catch (...) {
    cudaFree(ds);
    throw;
  }
}

}  // namespace mla::test
