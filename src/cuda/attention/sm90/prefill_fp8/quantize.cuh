// SPDX-License-Identifier: Apache-2.0
#pragma once
// The quantise pass of the sm90 fp8 mha_prefill (SEMANTICS §10.1; workspace layout core/prefill_fp8.h): q, k =
// [k_nope | k_pe] and v to e4m3 codes, code = e4m3(float(x) / scale) (fp32 division, correctly rounded; round to
// nearest even, satfinite; NaN stays NaN), bit for bit the CPU backend's codes. The division is a multiplication
// by the reciprocal where that is exact, or a multiplication and one fused correction (plan.h QuantDivision).
//   quantize_rows_kernel<false>  q8[h][t][192]: 16 tokens x 8 heads per CTA, 16 codes (32 bytes in, 16 out) per item.
//   quantize_rows_kernel<true>   k8[h][R][192] for every padded row R: 16 padded rows x 8 heads per CTA. The 16
//                                rows are one 16-aligned group, which lies inside one request's span (every
//                                pad_start is a multiple of 16): one request lookup per CTA.
//   quantize_vt_kernel           vt8[h][d][R'] for 128 padded rows of one head per CTA: each lane quantises the 4
//                                keys whose codes of one column are 4 consecutive vt_position bytes, transposes
//                                4 x 4 bytes in registers (byte permutes) and stores one 32-bit word per column
//                                to shared memory [d][position] (conflict-free); then 16-byte rows out.
// Every byte of the k8 and vt8 regions is written, so the attention kernel reads only this call's codes or zeros.
// cu_k values are clamped to [0, Tk]: a request's source rows stay inside k_nope, k_pe and v whatever they hold.
#include <cstdint>

#include "cuda/attention/sm90/common/prefill_io.cuh"
#include "cuda/attention/sm90/prefill_fp8/params.h"
#include "cuda/attention/sm90/prefill_fp8/plan.h"
#include "cuda/attention/sm90/prefill_fp8/traits.cuh"
#include "cuda/common/convert.cuh"

namespace mla::cuda::prefill_sm90_fp8 {

struct QuantizeShape {
  static constexpr int kThreads = 256;           // vt kernel
  static constexpr int kRowsThreads = 512;       // rows kernels
  static constexpr int kRows = 16;               // rows kernels: rows per CTA (one 16-aligned group of padded rows)
  static constexpr int kHeads = 8;               // rows kernels: heads per CTA
  static constexpr int kItemsPerRow = Traits::kDqk / 16;  // 12 items of 16 codes per (row, head)
  static constexpr int kItems = kRows * kHeads * kItemsPerRow;  // 1536
  static constexpr int kItemsPerThread = kItems / kRowsThreads;  // 3
  static constexpr int kVtRows = Traits::kBlockN;  // vt kernel: padded rows per CTA
  static_assert(kItems % kRowsThreads == 0, "whole items per thread");
  static_assert(kThreads / 32 * 16 == Traits::kDv, "vt kernel: one warp per 16 columns");
};

using prefill_io::clamp64;

// First row of request b's keys in k8 / vt8: round_up(cu_k[b], 16) + 128 b (core/prefill_fp8.h).
__device__ __forceinline__ int64_t pad_start(const QuantizeParams& p, int64_t b) {
  const int64_t k0 = clamp64(__ldg(p.cu_k + b * p.cu_k_stride), 0, p.total_k);
  return (k0 + 15) / 16 * 16 + 128 * b;
}

// The 16-aligned group of padded rows [R, R + 16): rows R + i, i < n, hold source key rows src + i; the others
// (a tail or a gap) hold zero codes. The request is the last b with pad_start(b) <= R (binary search; pad_start is
// increasing and 16-aligned for valid cu_k, so the group lies in that request's span; any cu_k gives rows inside
// [k0, k1) of one request, which are in bounds).
__device__ __forceinline__ void group_source(const QuantizeParams& p, int64_t R, int64_t& src, int& n) {
  int lo = -1, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (pad_start(p, mid) <= R)
      lo = mid;
    else
      hi = mid - 1;
  }
  src = 0;
  n = 0;
  if (lo < 0) return;
  const int64_t k0 = clamp64(__ldg(p.cu_k + lo * p.cu_k_stride), 0, p.total_k);
  const int64_t k1 = clamp64(__ldg(p.cu_k + (lo + 1) * p.cu_k_stride), k0, p.total_k);
  const int64_t rel = R - pad_start(p, lo);
  src = k0 + rel;
  n = static_cast<int>(clamp64(k1 - k0 - rel, 0, 16));
}

// 16 bf16 values at src, col_stride apart (contiguous and 16-byte aligned when kVec), as raw pairs.
template <bool kVec>
__device__ __forceinline__ void load16(const uint16_t* src, int64_t col_stride, uint4 (&raw)[2]) {
  if constexpr (kVec) {
    raw[0] = __ldg(reinterpret_cast<const uint4*>(src));
    raw[1] = __ldg(reinterpret_cast<const uint4*>(src) + 1);
  } else {
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = static_cast<uint32_t>(__ldg(src + 2 * i * col_stride)) |
             (static_cast<uint32_t>(__ldg(src + (2 * i + 1) * col_stride)) << 16);
    raw[0] = make_uint4(w[0], w[1], w[2], w[3]);
    raw[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// 16 bf16 values (lowest column in the low half of raw[0].x) -> 16 e4m3 codes (lowest column in the lowest byte).
// q = RN(x / scale) by plan.h's QuantDivision `division` (uniform across the grid).
__device__ __forceinline__ uint4 codes16(const uint4 (&raw)[2], float scale, float recip, int32_t division) {
  const uint32_t w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
  float f[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
  if (division == static_cast<int32_t>(QuantDivision::multiply)) {  // recip = 1 / scale exactly
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = __fmul_rn(f[i], recip);
  } else if (division == static_cast<int32_t>(QuantDivision::correct)) {  // recip = RN(1 / scale), one correction
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float q0 = __fmul_rn(f[i], recip);
      const float q = fabsf(q0) < __int_as_float(0x7f800000) ? __fmaf_rn(__fmaf_rn(-q0, scale, f[i]), recip, q0) : q0;
      f[i] = copysignf(q, f[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = __fdiv_rn(f[i], scale);
  }
  uint32_t c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) c[i] = dev::float2_to_e4m3x2(f[2 * i], f[2 * i + 1]);
  return make_uint4(c[0] | (c[1] << 16), c[2] | (c[3] << 16), c[4] | (c[5] << 16), c[6] | (c[7] << 16));
}

// Grid (ceil(rows / 16), ceil(heads / 8)): rows [16 x, 16 x + 16) x heads [8 y, 8 y + 8). Item i of the CTA is
// (row i / 96, head (i / 12) % 8, 16 codes i % 12): consecutive items read consecutive 32-byte pieces of the
// source rows (a token's heads are adjacent in q, k_nope, v) and write a (head, row)'s 192 codes as 12 x 16 bytes.
// kIsK: k8 over padded rows (k_nope for items 0..7, k_pe for 8..11; zero codes past the request's keys); else q8.
template <bool kIsK, bool kVec>
__global__ void __launch_bounds__(QuantizeShape::kRowsThreads, 2) quantize_rows_kernel(const QuantizeParams p) {
  using S = QuantizeShape;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * S::kRows;
  const int h0 = static_cast<int>(blockIdx.y) * S::kHeads;
  int64_t src0 = r0;
  int n = 0;  // rows r0 + r, r < n, read source rows src0 + r; the others are zero codes
  if constexpr (kIsK)
    group_source(p, r0, src0, n);
  else
    n = static_cast<int>(clamp64(p.total_q - r0, 0, S::kRows));
  const int64_t rows = kIsK ? p.k_rows : p.total_q;  // k_rows is a multiple of 16: a k CTA's rows all exist
  uint8_t* const dst = kIsK ? p.k8 : p.q8;
  const float scale = kIsK ? p.k_scale : p.q_scale, recip = kIsK ? p.k_recip : p.q_recip;
  const int32_t division = kIsK ? p.k_div : p.q_div;

  uint4 raw[S::kItemsPerThread][2];
#pragma unroll
  for (int j = 0; j < S::kItemsPerThread; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * S::kRowsThreads;
    const int c = i % S::kItemsPerRow, hh = (i / S::kItemsPerRow) % S::kHeads, r = i / (S::kItemsPerRow * S::kHeads);
    const int h = h0 + hh;
    raw[j][0] = raw[j][1] = make_uint4(0, 0, 0, 0);
    if (r < n && h < p.heads) {
      const int64_t t = src0 + r;
      if constexpr (kIsK) {
        if (c < 8)
          load16<kVec>(p.k_nope + t * p.kn_stride_t + h * p.kn_stride_h + 16 * c * p.kn_stride_d, p.kn_stride_d, raw[j]);
        else
          load16<kVec>(p.k_pe + t * p.kp_stride_t + h * p.kp_stride_h + 16 * (c - 8) * p.kp_stride_d, p.kp_stride_d,
                       raw[j]);
      } else {
        load16<kVec>(p.q + t * p.q_stride_t + h * p.q_stride_h + 16 * c * p.q_stride_d, p.q_stride_d, raw[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < S::kItemsPerThread; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * S::kRowsThreads;
    const int c = i % S::kItemsPerRow, hh = (i / S::kItemsPerRow) % S::kHeads, r = i / (S::kItemsPerRow * S::kHeads);
    const int h = h0 + hh;
    if (r0 + r < rows && h < p.heads) {
      const uint4 codes = codes16(raw[j], scale, recip, division);
      *reinterpret_cast<uint4*>(dst + (h * rows + r0 + r) * Traits::kDqk + 16 * c) = codes;
    }
  }
}

// Grid (ceil(k_rows / 128), heads), 256 threads: padded rows [128 x, 128 x + 128) of head h. Warp w quantises
// columns [16 w, 16 w + 16); lane (g = lane / 4, t = lane % 4) the keys 16 g + {2t, 2t + 1, 8 + 2t, 9 + 2t}, whose
// codes of one column are the bytes at vt_position 4t .. 4t + 3 of key group g. A 4 x 4 byte transpose in registers
// gives one 32-bit word per column, stored at tile[d][4 g + t] (bank 4 g + t: conflict-free); then each 16 keys of a
// column row leave as one 16-byte store (8 threads per 128-byte shared row: conflict-free).
template <bool kVec>
__global__ void __launch_bounds__(QuantizeShape::kThreads) quantize_vt_kernel(const QuantizeParams p) {
  constexpr int kN = QuantizeShape::kVtRows, kDv = Traits::kDv;
  __shared__ __align__(16) uint32_t tile[kDv][kN / 4];  // [d][position / 4]
  static_assert(vt_position(0) == 0 && vt_position(1) == 1 && vt_position(8) == 2 && vt_position(9) == 3 &&
                    vt_position(2) == 4 && vt_position(11) == 7,
                "lane t's keys {2t, 2t + 1, 8 + 2t, 9 + 2t} sit at positions 4t .. 4t + 3");
  const int64_t R0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int64_t h = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  int64_t src = 0;
  int n = 0;
  if (R0 + 16 * g < p.k_rows) group_source(p, R0 + 16 * g, src, n);

  uint4 raw[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = (i < 2 ? 0 : 8) + 2 * t + (i & 1);
    raw[i][0] = raw[i][1] = make_uint4(0, 0, 0, 0);
    if (k < n)
      load16<kVec>(p.v + (src + k) * p.v_stride_t + h * p.v_stride_h + 16 * warp * p.v_stride_d, p.v_stride_d, raw[i]);
  }
  uint4 cw[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) cw[i] = codes16(raw[i], p.v_scale, p.v_recip, p.v_div);
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // columns 16 warp + 4 j .. + 3
    const uint32_t a = (&cw[0].x)[j], b = (&cw[1].x)[j], c = (&cw[2].x)[j], d = (&cw[3].x)[j];
    const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1, a2 b2 a3 b3
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    const int col = 16 * warp + 4 * j;
    tile[col + 0][4 * g + t] = __byte_perm(ab_lo, cd_lo, 0x5410);  // a0 b0 c0 d0
    tile[col + 1][4 * g + t] = __byte_perm(ab_lo, cd_lo, 0x7632);
    tile[col + 2][4 * g + t] = __byte_perm(ab_hi, cd_hi, 0x5410);
    tile[col + 3][4 * g + t] = __byte_perm(ab_hi, cd_hi, 0x7632);
  }
  __syncthreads();
#pragma unroll
  for (int e = static_cast<int>(threadIdx.x); e < kDv * (kN / 16); e += QuantizeShape::kThreads) {
    const int d = e / (kN / 16), g2 = e % (kN / 16);
    if (R0 + 16 * g2 >= p.k_rows) continue;  // k_rows is a multiple of 16
    *reinterpret_cast<uint4*>(p.vt8 + (h * kDv + d) * p.k_rows + R0 + 16 * g2) =
        *reinterpret_cast<const uint4*>(&tile[d][4 * g2]);
  }
}

}  // namespace mla::cuda::prefill_sm90_fp8
