// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the DeepSeek block's element-wise kernels (mla/block_ops.h; rms_norm.cu,
// rope.cu, quantize.cu). Raw pointers, strides in elements, each pointer with its shape.
#include <cstdint>

namespace mla::cuda::block {

struct RmsNormParams {
  const void* x;      // [rows, n] activation dtype, row stride x_stride, unit column stride
  const float* w;     // [n] f32
  void* y;            // [rows, n] activation dtype, row stride y_stride (may be x: in place)
  int64_t rows, n, x_stride, y_stride;
  float eps;
};

struct RopeParams {
  const void* src;         // [T, G, D] activation dtype, strides (src_s0, src_s1, 1)
  void* dst;               // [T, G, D] activation dtype, strides (dst_s0, dst_s1, 1) (may be src)
  const void* positions;   // [T] int32 or int64 (pos_i64)
  const double* inv_freq;  // [rope_dim / 2] f64
  int64_t T, G, D, rope_dim, src_s0, src_s1, dst_s0, dst_s1;
  double factor;           // attention factor on cos and sin
  bool interleave, pos_i64;
};

struct QuantParams {
  const void* x;    // [M, K] activation dtype, row stride x_stride, unit column stride
  uint8_t* codes;   // [M_pad, K] e4m3, row stride codes_stride
  float* scales;    // [K / 128, M_pad] f32 contiguous
  int64_t M, M_pad, K, x_stride, codes_stride;
};

}  // namespace mla::cuda::block

namespace mla::cuda::block {

struct OutQuantParams {
  const void* x;     // [M, K] activation dtype, row stride x_stride, unit column stride
  uint8_t* codes;    // [M_pad, K] e4m3 (nvfp4: [M_pad, K / 2] packed e2m1), row stride codes_stride
  void* scales;      // group keys: f32 [K / G, M_pad], row stride scales_stride (>= M_pad), unit column
                     // stride; nvfp4: e4m3 [M_pad, K / 16], row stride scales_stride; fp8: unused
  int64_t M, M_pad, K, x_stride, codes_stride, scales_stride;
  float scale;       // fp8: the static scale; nvfp4: the global scale
};

}  // namespace mla::cuda::block

namespace mla::cuda::block {

// The V up-projection with its output quantised (mla::up_project_quantized, up_proj_quant.cu).
struct UpProjQuantParams {
  const uint16_t* o_lat;  // [M, h, L] bf16, strides (o_stride_t, o_stride_h, 1); 16-byte aligned rows
  const uint16_t* w;      // [h, L, V] bf16, strides (w_stride_h, w_stride_l, 1); 16-byte aligned rows
  uint8_t* codes;         // [M_pad, h * V] e4m3 (nvfp4: [M_pad, h * V / 2] packed e2m1), row stride codes_stride
  void* scales;           // group keys: f32 [h * V / G, M_pad], row stride scales_stride, unit column stride;
                          // nvfp4: e4m3 [M_pad, h * V / 16], row stride scales_stride; fp8: unused
  int64_t M, M_pad, h, L, V, o_stride_t, o_stride_h, w_stride_h, w_stride_l, codes_stride, scales_stride;
  int m_tiles;            // row tiles that compute rows; tiles m_tiles .. x_tiles - 1 write padding rows
  int x_tiles;            // row tiles of the grid (computing and padding)
  int splits;             // CTAs of one cluster that split a tile's latent reduction (1: no cluster)
  int split_k_tiles;      // latent steps (32 wide; the Hopper mainloop's 64) of one split CTA: ceil(k tiles / splits)
  float scale;            // fp8: the static scale; nvfp4: the global scale
  bool vec;               // codes (and nvfp4 codes' 8-byte blocks) may be stored as 16- / 8-byte vectors
};

}  // namespace mla::cuda::block
