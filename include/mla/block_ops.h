// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DeepSeek attention block's own ops (DeepseekAttention, mla/deepseek.h, docs/BLOCK.md): RMSNorm,
// YaRN RoPE, 1 x 128 fp8 activation quantisation and the block-scaled fp8 GEMM (DeepSeek's 128 x 128
// weight blocks). Each runs on the CPU (computed in float64 per element; the GEMM accumulates in
// float64 with Precision::reference) and on CUDA. Arguments are validated before anything is written
// (mla::Error); rows are the first dim, columns unit-stride.
#include <cstdint>
#include <string>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// Formats of a quantised activation written for the next GEMM's input (the attention layer's output,
// LayerOptions::out_quant; docs/SEMANTICS.md §15). Keys as the CLI and Python spell them:
//   none          the activation dtype (no quantisation)
//   fp8           e4m3 codes with one static fp32 scale given by the caller: code = e4m3(x / scale)
//   fp8_group128  e4m3 codes, one dynamic fp32 scale per token and 128 columns (DeepSeek's o_proj input)
//   fp8_group64   the same with groups of 64 columns
//   nvfp4         e2m1 codes packed two per byte, one e4m3 scale per 16 columns and the caller's fp32
//                 global scale (NVIDIA's NVFP4 storage convention)
enum class OutputQuant : uint8_t { none = 0, fp8 = 1, fp8_group128 = 2, fp8_group64 = 3, nvfp4 = 4 };
const char* to_string(OutputQuant q);
// The key's enum value; throws mla::Error naming every key for anything else.
OutputQuant parse_output_quant(const std::string& key);
// Throws mla::Error naming the keys unless `q` is one of the enum's values.
void check_output_quant(OutputQuant q, const char* what);
// Columns that share one scale: 128, 64 or 16 (nvfp4); 0 for fp8 (one scale) and none.
int64_t output_quant_group(OutputQuant q);

// Quantises x [M, K] into `key`'s format (docs/SEMANTICS.md §15: the rounding, NaN and zero rules):
//   fp8           codes fp8_e4m3 [M_pad, K]; scales undefined; `scale` > 0 finite (the static scale)
//   fp8_group128  codes fp8_e4m3 [M_pad, K]; scales f32 [K / 128, M_pad] group-major, unit inner stride
//   fp8_group64     and a row stride >= M_pad (contiguous: quantize_fp8_groups' layout, which
//                   gemm_fp8_block reads; a column slice of it: rows [t0, t1) of a larger output); K a
//                   multiple of the group; `scale` unused
//   nvfp4         codes u8 [M_pad, K / 2] (element 2i in the low nibble of byte i, 2i + 1 in the high);
//                 scales fp8_e4m3 [M_pad, K / 16] unit inner stride; `scale` > 0 finite (the global scale);
//                 K a multiple of 16
// x: float (CUDA: bf16, f16 or f32), unit column stride. M_pad >= M: rows M .. M_pad - 1 are padding,
// written as zero codes (scale 1 for the group keys, scale code 0 for nvfp4). `none` is refused.
void quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                     float scale, const Context& ctx = {});

// The attention layer's V up-projection written straight in `key`'s format (docs/SEMANTICS.md §15):
//   x [M, h * V], x[t, n * V + c] = sum_l o_lat[t, n, l] * w_uv[n, l, c] rounded once to o_lat's dtype
//   (the unquantised product bmm writes; CUDA accumulates in fp32, the CPU as its bmm does), then
//   codes / scales exactly as quantize_output(x, key, codes, scales, scale) writes them, padding rows
//   included. On CUDA one kernel computes the product and quantises it in its epilogue (no bf16 copy of
//   x is written), so the bytes equal quantize_output of that kernel's own bf16 product, and differ
//   from quantize_output(bmm(o_lat, w_uv)) by at most one code where cuBLAS's fp32 sum rounds to another
//   bf16 value.
//   o_lat [M, h, L], w_uv [h, L, V]: one float dtype (CUDA: bf16), unit inner stride (CUDA: data and the
//   other strides 16-byte aligned, L a multiple of 8); V a multiple of 16 and of key's group (so no
//   scale group spans two heads); codes, scales, scale and `none` as for quantize_output.
void up_project_quantized(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                          const TensorView& scales, float scale, const Context& ctx = {});

// out[0] = max |x| over x [M, K] (float, unit column stride) as f32, NaN when any element is NaN;
// out: f32 [1] on x's device. 0 for an empty x.
void abs_max(const TensorView& x, const TensorView& out, const Context& ctx = {});

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight, per row in float64 (CPU) / float32 (CUDA),
// rounded once into y's dtype.
//   x [T, n]  float (CUDA: bf16 or f32)       weight [n] float (CUDA: f32)      y [T, n] like x
// y may be x itself (in place) but no other overlap; eps >= 0 and finite.
void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& y, double eps,
              const Context& ctx = {});

// dst = src with rotary position embedding on the last rope_dim columns of each group; the first
// D - rope_dim columns are copied (rope_dim 0: a converting copy).
//   src [T, G, D]  float (CUDA: bf16 or f32)      dst [T, G, D] float (CUDA: bf16 or f32)
//   positions [T] int32 / int64 (values >= 0)     inv_freq [rope_dim / 2] f64 (angle = pos * inv_freq[i])
// Pair i is (2i, 2i + 1) of the rope columns when `interleave` (DeepSeek's checkpoints), else
// (i, i + rope_dim / 2); (a, b) <- (a cos - b sin, b cos + a sin) with cos / sin of the angle times
// attention_factor. The angle and its cos / sin are computed in float64 on both backends. dst may be
// src (in place) but no other overlap; rope_dim even, <= D.
void apply_rope(const TensorView& src, const TensorView& dst, const TensorView& positions,
                const TensorView& inv_freq, double attention_factor, int64_t rope_dim, bool interleave,
                const Context& ctx = {});

// DeepSeek-V4's sliding window (docs/SEMANTICS.md §17): the request-local positions each token attends in
// the window cache, out[t, j] = positions[t] - W + 1 + j for W = out.size(1), or -1 where that is below 0
// (the window reaches before the request's start) or above 2^31 - 1. convert_topk_indices turns them into
// cache rows.
//   positions [T] int32 / int64 (values >= 0; host values are checked)    out [T, W] int32, unit column stride
void sliding_window_positions(const TensorView& positions, const TensorView& out, const Context& ctx = {});

// Activation quantisation in groups of 128 columns (DeepSeek's act_quant, 1 x 128):
//   scale = amax(|x[t, 128 g : 128 g + 128]|) / 448 (1 when the group is all zeros),
//   codes[t, j] = e4m3(x[t, j] / scale)  (round to nearest even, saturating),
//   scales[g, t] = scale   (group-major: cuBLASLt's VEC128_32F layout for the token operand).
//   x [M, K] float (CUDA: bf16 or f32), K a multiple of 128      codes [M_pad, K] fp8_e4m3
//   scales [K / 128, M_pad] f32 contiguous, M_pad >= M: rows M .. M_pad - 1 are padding, written as
//   zero codes with scale 1 (cuBLASLt wants the token count a multiple of 4 on CUDA).
void quantize_fp8_groups(const TensorView& x, const TensorView& codes, const TensorView& scales,
                         const Context& ctx = {});

// c = (a * a_scales) @ (w * w_scales)^T: w8a8 GEMM with DeepSeek's block scales.
//   a [M, K] fp8_e4m3 codes, a_scales [K / 128, M] f32 contiguous (quantize_fp8_groups' layout)
//   w [N, K] fp8_e4m3 codes (a published Linear weight [out, in]), w_scales [ceil(N / 128), K / 128]
//     f32 with row stride round_up(K / 128, 4) (cuBLASLt's BLK128x128_32F layout; weight_scale_inv
//     padded), unit column stride
//   c [M, N] bf16 or f32, unit column stride, row stride >= N
// c[m, n] = sum_k a[m, k] a_scales[k / 128, m] w[n, k] w_scales[n / 128, k / 128]. K a multiple of 128;
// on CUDA M a multiple of 4 (cuBLASLt; quantize_fp8_groups pads) and N a multiple of 16.
// CUDA: cuBLASLt (CUDA >= 12.9, sm_90: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F on the weight,
// VEC128_32F on the tokens), fp32 accumulation without fast accumulation; one 32 MiB cuBLASLt
// workspace per device, allocated on first use (call once before capturing a CUDA graph).
// CPU: float64 accumulation with Precision::reference, else float32.
void gemm_fp8_block(const TensorView& a, const TensorView& a_scales, const TensorView& w, const TensorView& w_scales,
                    const TensorView& c, const Context& ctx = {});

}  // namespace mla
