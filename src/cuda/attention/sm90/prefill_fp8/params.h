// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the sm90 fp8 mha_prefill (POD, host-includable): the quantise pass (quantize.cuh) and the
// attention kernel (kernel.cuh). Strides in elements; the workspace layout is core/prefill_fp8.h's.
#include <cstdint>

namespace mla::cuda::prefill_sm90_fp8 {

struct QuantizeParams {
  const uint16_t* q;       // bf16 [Tq, h, 192]
  int64_t q_stride_t, q_stride_h, q_stride_d;
  const uint16_t* k_nope;  // bf16 [Tk, h, 128]
  int64_t kn_stride_t, kn_stride_h, kn_stride_d;
  const uint16_t* k_pe;    // bf16 [Tk, h, 64]; head stride may be 0
  int64_t kp_stride_t, kp_stride_h, kp_stride_d;
  const uint16_t* v;       // bf16 [Tk, h, 128]
  int64_t v_stride_t, v_stride_h, v_stride_d;
  const int32_t* cu_k;     // [B+1] key row offsets (clamped to [0, Tk])
  int64_t cu_k_stride;
  uint8_t* q8;             // e4m3 [h][Tq][192]
  uint8_t* k8;             // e4m3 [h][k_rows][192]
  uint8_t* vt8;            // e4m3 [h][128][k_rows] (v_cols = k_rows)
  int64_t total_q, total_k, k_rows;
  int32_t batch, heads;
  float q_scale, k_scale, v_scale;  // code = e4m3(x / scale)
  // How x / scale is computed: a plan.h QuantDivision value (divide; multiply by recip = 1 / scale exactly; correct:
  // multiply by recip = RN(1 / scale), then one fused correction).
  float q_recip, k_recip, v_recip;
  int32_t q_div, k_div, v_div;
};

struct AttnParams {
  const int32_t* cu_q;     // [B+1] query row offsets (clamped to [0, Tq])
  const int32_t* cu_k;     // [B+1] key row offsets (clamped to [0, Tk])
  int64_t cu_q_stride, cu_k_stride;
  uint16_t* out;           // bf16 [Tq, h, 128]
  int64_t out_stride_t, out_stride_h;
  float* lse;              // fp32 [h, Tq] natural log, or nullptr
  int64_t lse_stride_h, lse_stride_t;
  int64_t total_q, total_k;
  int32_t batch, heads, q_tiles;  // q_tiles = ceil(max_seqlen_q / 128)
  int32_t causal;          // bottom-right aligned: query i of (sq, sk) sees keys j <= sk - sq + i
  float scale_log2;        // q_scale * k_scale * softmax_scale * log2(e): S codes to the log2 domain
  float v_scale;           // out = v_scale * (P8 . v8) / l
};

}  // namespace mla::cuda::prefill_sm90_fp8
