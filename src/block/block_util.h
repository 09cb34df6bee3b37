// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers the DeepSeek attention blocks share (deepseek_attention.cpp: V2 / V3; deepseek_v4_attention.cpp:
// V4): workspace regions, argument overlap, weight shapes and rank slices of published weights.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mla/deepseek.h"
#include "mla/safetensors.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla::block {

// Workspace regions start on multiples of this many bytes.
inline constexpr std::size_t kAlign = 256;
// Bytes of a [rows, cols] region of dtype t, rounded up to kAlign (overflow refused naming `what`).
std::size_t region_bytes(int64_t rows, int64_t cols, DType t, const char* what);
// Whether two views with non-negative strides share a byte (empty views share none).
bool bytes_overlap(const TensorView& a, const TensorView& b);
// hidden / out of a step: a [T, H] tensor of `dtype` on `device` with unit inner stride.
void check_token_rows(const TensorView& v, int64_t T, int64_t H, DType dtype, Device device, const char* op,
                      const char* name);
// A published weight must be a host tensor [out, in]; throws "<op>: weight <what> ..." otherwise.
void check_weight_shape(const DeepseekLinear& w, int64_t out, int64_t in, const char* op, const std::string& what);
// [in, out] = transpose of rows [row0, row0 + rows) x columns [col0, col0 + cols) of a published
// [out, in] weight, dequantised exactly (dequantize_block_fp8 with these block sizes), in `dtype`.
Tensor rank_weight_t(const DeepseekLinear& w, int block_rows, int block_cols, int64_t row0, int64_t rows, int64_t col0,
                     int64_t cols, DType dtype, const std::string& what);
// A norm weight [n] (any float dtype but fp8) as f64, every value finite.
Tensor norm_weight(const TensorView& w, int64_t n, const char* op, const char* what);
// The f64 vector `f64` [n] for a block on `dev`: itself on the CPU (the oracle's exact values), an f32 copy on
// CUDA (rms_norm's CUDA weight type; exact for bf16 / f32 checkpoints).
Tensor norm_on_device(Tensor f64, Device dev);

// The float tensors "model.layers.<layer>.self_attn.<name>" of a checkpoint, loaded into owning copies
// that live as long as the reader (the views it returns point into them).
class LayerTensors {
 public:
  LayerTensors(const Checkpoint& ck, int layer, const char* op);
  TensorView tensor(const std::string& name);
  // "<name>.weight", and "<name>.weight_scale_inv" when the weight is fp8 e4m3 (refused when absent).
  DeepseekLinear linear(const std::string& name);

 private:
  const Checkpoint& ck_;
  std::string pre_;
  const char* op_;
  std::vector<Tensor> keep_;
};

}  // namespace mla::block
