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
  void* scales;      // group keys: f32 [K / G, M_pad] contiguous; nvfp4: e4m3 [M_pad, K / 16], row stride
                     // scales_stride; fp8: unused
  int64_t M, M_pad, K, x_stride, codes_stride, scales_stride;
  float scale;       // fp8: the static scale; nvfp4: the global scale
};

}  // namespace mla::cuda::block
