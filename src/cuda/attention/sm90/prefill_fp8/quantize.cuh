// SPDX-License-Identifier: Apache-2.0
#pragma once
// The quantise pass of the sm90 fp8 mha_prefill (SEMANTICS §10.1; workspace layout core/prefill_fp8.h): q, k =
// [k_nope | k_pe] and v to e4m3 codes, code = e4m3(float(x) / scale) (fp32 division, correctly rounded; round to
// nearest even, satfinite; NaN stays NaN), bit for bit the CPU backend's codes.
//   quantize_q_kernel   q8[h][t][192]: one thread per 8 codes.
//   quantize_k_kernel   k8[h][R][192] for every padded row R: request b's key R - pad_start(b) or zero codes.
//   quantize_vt_kernel  vt8[h][d][R'] for 128 padded rows per CTA: v codes staged in shared memory at their
//                       permuted positions (traits.cuh vt_position: R' = R with its low 4 bits permuted), then
//                       written transposed, 16 keys (bytes) per store.
// Every byte of the k8 and vt8 regions is written, so the attention kernel reads only this call's codes or zeros.
// cu_k values are clamped to [0, Tk]: a request's source rows stay inside k_nope, k_pe and v whatever they hold.
#include <cstdint>

#include "cuda/attention/sm90/prefill_fp8/params.h"
#include "cuda/attention/sm90/prefill_fp8/traits.cuh"
#include "cuda/common/convert.cuh"

namespace mla::cuda::prefill_sm90_fp8 {

__device__ __forceinline__ int64_t qclamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// First row of request b's keys in k8 / vt8: round_up(cu_k[b], 16) + 128 b (core/prefill_fp8.h).
__device__ __forceinline__ int64_t pad_start(const QuantizeParams& p, int64_t b) {
  const int64_t k0 = qclamp(__ldg(p.cu_k + b * p.cu_k_stride), 0, p.total_k);
  return (k0 + 15) / 16 * 16 + 128 * b;
}

// Source key row of padded row R, or -1 (a tail or gap row: zero codes). The request is the last b with
// pad_start(b) <= R (binary search; pad_start is increasing for valid cu_k, and any cu_k gives in-bounds rows).
__device__ __forceinline__ int64_t source_row(const QuantizeParams& p, int64_t R) {
  int lo = -1, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (pad_start(p, mid) <= R)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo < 0) return -1;
  const int64_t k0 = qclamp(__ldg(p.cu_k + lo * p.cu_k_stride), 0, p.total_k);
  const int64_t k1 = qclamp(__ldg(p.cu_k + (lo + 1) * p.cu_k_stride), k0, p.total_k);
  const int64_t rel = R - pad_start(p, lo);
  return rel < k1 - k0 ? k0 + rel : -1;
}

// 8 bf16 values at src, col_stride apart (contiguous and 16-byte aligned when kVec) -> 8 e4m3 codes, lowest column in the lowest byte.
template <bool kVec>
__device__ __forceinline__ uint2 quantize8(const uint16_t* src, int64_t col_stride, float scale) {
  uint16_t x[8];
  if constexpr (kVec) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = static_cast<uint16_t>(w[i] & 0xffffu);
      x[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __ldg(src + i * col_stride);
  }
  uint32_t c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    c[i] = dev::float2_to_e4m3x2(__fdiv_rn(dev::bf16_to_float(x[2 * i]), scale),
                                 __fdiv_rn(dev::bf16_to_float(x[2 * i + 1]), scale));
  return make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
}

template <bool kVec>
__global__ void __launch_bounds__(256) quantize_q_kernel(const QuantizeParams p) {
  const int64_t n = p.total_q * p.heads * (Traits::kDqk / 8);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(e % (Traits::kDqk / 8));
    const int64_t ht = e / (Traits::kDqk / 8), t = ht % p.total_q, h = ht / p.total_q;
    const uint2 codes = quantize8<kVec>(p.q + t * p.q_stride_t + h * p.q_stride_h + 8 * c * p.q_stride_d, p.q_stride_d, p.q_scale);
    *reinterpret_cast<uint2*>(p.q8 + ht * Traits::kDqk + 8 * c) = codes;
  }
}

template <bool kVec>
__global__ void __launch_bounds__(256) quantize_k_kernel(const QuantizeParams p) {
  const int64_t n = p.k_rows * p.heads * (Traits::kDqk / 8);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(e % (Traits::kDqk / 8));
    const int64_t hr = e / (Traits::kDqk / 8), R = hr % p.k_rows, h = hr / p.k_rows;
    const int64_t row = source_row(p, R);
    uint2 codes = make_uint2(0, 0);
    if (row >= 0)
      codes = c < 16 ? quantize8<kVec>(p.k_nope + row * p.kn_stride_t + h * p.kn_stride_h + 8 * c * p.kn_stride_d,
                                       p.kn_stride_d, p.k_scale)
                     : quantize8<kVec>(p.k_pe + row * p.kp_stride_t + h * p.kp_stride_h + 8 * (c - 16) * p.kp_stride_d,
                                       p.kp_stride_d, p.k_scale);
    *reinterpret_cast<uint2*>(p.k8 + hr * Traits::kDqk + 8 * c) = codes;
  }
}

// Grid (ceil(k_rows / 128), heads), 256 threads: padded rows [128 x, 128 x + 128) of head h.
template <bool kVec>
__global__ void __launch_bounds__(256) quantize_vt_kernel(const QuantizeParams p) {
  constexpr int kN = Traits::kBlockN, kDv = Traits::kDv;
  __shared__ __align__(16) uint8_t tile[kN][kDv + 8];  // [permuted key position][d]
  const int64_t R0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int64_t h = blockIdx.y;
  for (int e = threadIdx.x; e < kN * (kDv / 8); e += blockDim.x) {
    const int kk = e / (kDv / 8), c = e % (kDv / 8);
    const int64_t row = R0 + kk < p.k_rows ? source_row(p, R0 + kk) : -1;
    uint2 codes = make_uint2(0, 0);
    if (row >= 0) codes = quantize8<kVec>(p.v + row * p.v_stride_t + h * p.v_stride_h + 8 * c * p.v_stride_d, p.v_stride_d,
                                             p.v_scale);
    *reinterpret_cast<uint2*>(&tile[(kk & ~15) + vt_position(kk & 15)][8 * c]) = codes;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kDv * (kN / 16); e += blockDim.x) {
    const int d = e / (kN / 16), g = e % (kN / 16);
    if (R0 + 16 * g >= p.k_rows) continue;  // k_rows is a multiple of 16
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = tile[16 * g + 4 * i][d] | (tile[16 * g + 4 * i + 1][d] << 8) | (tile[16 * g + 4 * i + 2][d] << 16) |
             (static_cast<uint32_t>(tile[16 * g + 4 * i + 3][d]) << 24);
    *reinterpret_cast<uint4*>(p.vt8 + (h * kDv + d) * p.k_rows + R0 + 16 * g) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace mla::cuda::prefill_sm90_fp8
