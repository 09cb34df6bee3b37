// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the CUDA mha_prefill (POD, host-includable), shared by its engines (portable/prefill/,
// sm90/prefill/). Strides in elements.
#include <cstdint>

namespace mla::cuda {

struct PrefillParams {
  const uint16_t* q;       // bf16 [Tq, h, d_nope + d_rope]
  int64_t q_stride_t, q_stride_h;
  const uint16_t* k_nope;  // bf16 [Tk, h, d_nope]
  int64_t kn_stride_t, kn_stride_h;
  const uint16_t* k_pe;    // bf16 [Tk, h, d_rope]; head stride may be 0 (one rope row shared by all heads)
  int64_t kp_stride_t, kp_stride_h;
  const uint16_t* v;       // bf16 [Tk, h, d_v]
  int64_t v_stride_t, v_stride_h;
  const int32_t* cu_q;     // [B+1] query row offsets (clamped to [0, Tq] in the kernel)
  const int32_t* cu_k;     // [B+1] key row offsets (clamped to [0, Tk])
  int64_t cu_q_stride, cu_k_stride;
  uint16_t* out;           // bf16 [Tq, h, d_v]
  int64_t out_stride_t, out_stride_h;
  float* lse;              // fp32 [h, Tq] natural log, or nullptr
  int64_t lse_stride_h, lse_stride_t;
  int64_t total_q, total_k;
  int32_t batch, heads, q_tiles;  // q_tiles = ceil(max_seqlen_q / kBlockM)
  int32_t d_nope, d_rope, d_v;
  int32_t causal;  // bottom-right aligned: query i of (sq, sk) sees keys j <= sk - sq + i
  int32_t vec16;   // 1 when every q / k_nope / k_pe / v row and all head dims allow 16-byte cp.async
  float scale_log2;  // softmax_scale * log2(e)
};

}  // namespace mla::cuda
