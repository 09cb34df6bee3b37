// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of merge_attn_states (semantics §7). Strides in elements, 64-bit.
#include <cstdint>

namespace mla::cuda::merge {

struct MergeParams {
  const void* prefix;          // [T, H, D] bf16 / f16 / f32 (the kernel's Act), strides (prefix_stride_t, head_stride, 1)
  const void* suffix;          // [T, H, D] Act, strides (suffix_stride_t, head_stride, 1)
  void* out;                   // [T, H, D] Act, or e4m3 codes when out_scale != 0
  const float* prefix_lse;     // [H, T], strides (lse_stride_h, lse_stride_t) of each view
  const float* suffix_lse;     // [H, T]
  float* out_lse;              // [H, T] or nullptr
  int64_t prefix_stride_t, suffix_stride_t, head_stride;
  int64_t out_stride_t, out_stride_h;
  int64_t plse_stride_h, plse_stride_t, slse_stride_h, slse_stride_t, olse_stride_h, olse_stride_t;
  int64_t num_tokens, num_heads;
  int64_t tokens_with_context;  // tokens t >= this copy the suffix
  int head_dim;
  float out_scale;              // 0: Act out; otherwise out = e4m3(merged / out_scale)
};

}  // namespace mla::cuda::merge
