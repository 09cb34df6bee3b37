// SPDX-License-Identifier: Apache-2.0
#pragma once
// DeepseekAttention: the whole DeepSeek V2 / V3 attention block of one layer, from hidden states to
// the o_proj output, with the weights of a published checkpoint (docs/BLOCK.md):
//   q path   V3: q_a_proj -> RMSNorm(q_a_layernorm) -> q_b_proj      V2-Lite: q_proj
//   kv path  kv_a_proj_with_mqa -> [latent L | k_pe R] -> RMSNorm(kv_a_layernorm) on the latent
//   RoPE     YaRN (DeepSeek's inverse frequencies and attention factor) on q_pe and k_pe, pairs
//            (2i, 2i+1) as the checkpoints store them (rope_interleave; halves otherwise)
//   MlaAttention (dense or sparse) with the softmax scale qk_head_dim^-0.5 * mscale(factor,
//            mscale_all_dim)^2, then o_proj.
// Tensor parallelism as vLLM shards the block: rank r of tp holds heads [r * h / tp, (r + 1) * h / tp)
// of q_b_proj / q_proj / kv_b_proj (column-parallel) and the matching input columns of o_proj
// (row-parallel): its output is the rank's partial sum, the caller all-reduces over ranks.
// q_a_proj and kv_a_proj_with_mqa are replicated.
//
// Weights may be any float dtype, or fp8 e4m3 codes with 128 x 128 (config weight_block_size)
// block scales `weight_scale_inv`: weight[i][j] = code[i][j] * scale_inv[i / 128][j / 128]. The CPU
// block dequantises each rank's slice exactly (in float64) at construction and rounds once to the
// layer dtype; the float64 layer therefore holds the checkpoint's exact values.
//
// Runs on the CPU (bf16 / f32 activations, or f64 with Precision::reference: the float64 oracle) and
// on CUDA (bf16): projections through mla::gemm (cuBLAS) into f32 scratch, RMSNorm and RoPE through
// mla::rms_norm / mla::apply_rope (mla/block_ops.h), MlaAttention, o_proj.
//
// fp8 checkpoints, two ways (DeepseekOptions::fp8_activations):
//   false (default)  each rank slice is dequantised once at load (exact) and rounded to the layer
//                    dtype: bf16 GEMMs, the accuracy of transformers' own bf16 path;
//   true             w8a8 as DeepSeek's inference code: weights stay e4m3 with their 128 x 128 scales,
//                    each GEMM quantises its activations in 1 x 128 groups (mla::quantize_fp8_groups)
//                    and runs the block-scaled fp8 GEMM (mla::gemm_fp8_block: cuBLASLt on CUDA). The
//                    activation rounding (e4m3: 2^-4 relative) costs accuracy (docs/BLOCK.md).
//                    A rank slice that does not start on a 128 block boundary (odd head splits) keeps
//                    the dequantised form for that projection.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mla/cache.h"
#include "mla/layer.h"
#include "mla/plan.h"
#include "mla/safetensors.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// One Linear weight as published: [out, in] in any float dtype, or fp8_e4m3 codes with
// weight_scale_inv [ceil(out / block_rows), ceil(in / block_cols)] (f32, bf16 or f64).
struct DeepseekLinear {
  TensorView weight;
  TensorView weight_scale_inv;  // absent for non-fp8 weights
};

// The block's weights of one layer, all heads (every view on the CPU).
struct DeepseekWeights {
  DeepseekLinear q_a_proj, q_b_proj;  // q_lora_rank > 0 (V3, R1, V3.2)
  DeepseekLinear q_proj;              // q_lora_rank == 0 (V2-Lite)
  DeepseekLinear kv_a_proj_with_mqa, kv_b_proj, o_proj;
  TensorView q_a_layernorm, kv_a_layernorm;  // [q_lora_rank], [kv_lora_rank]
};

// rows [row0, row0 + rows) x columns [col0, col0 + cols) of a published weight, dequantised exactly
// (fp8: code * scale_inv of its block, computed in float64) and rounded once to `dtype` (host
// tensor). Throws mla::Error naming `what` on a scale tensor of the wrong shape, a non-finite scale or
// a NaN weight (0x7f / 0xff codes), or a range outside the weight.
Tensor dequantize_block_fp8(const DeepseekLinear& w, int block_rows, int block_cols, int64_t row0, int64_t rows,
                            int64_t col0, int64_t cols, DType dtype, const std::string& what);

// The YaRN inverse frequencies of a rope of `dim` columns (DeepSeek's correction range and linear ramp,
// docs/BLOCK.md "RoPE convention"); factor 1 gives plain RoPE, 1 / theta^(2i / dim).
std::vector<double> yarn_inv_freq(int dim, double theta, double factor, int64_t original_max_positions,
                                  double beta_fast, double beta_slow);

struct DeepseekOptions {
  int tp = 1, rank = 0;  // tensor-parallel size and this rank
  CacheFormat cache_format = CacheFormat::bf16;
  bool sparse = false;  // DSA: needs config.index_topk > 0 and top-k indices per token
  DsMlaScale ds_scale = DsMlaScale::amax;
  Device device = Device::cpu();
  DType dtype = DType::bf16;  // activations and weights: bf16, f32 or f64 (CUDA: bf16)
  bool fp8_activations = false;  // fp8 checkpoints: w8a8 block-scaled GEMMs instead of dequantised weights
  // fp8 prefill attention in the block's layer (LayerOptions::fp8_prefill, docs/SEMANTICS.md §10.1): a dense block
  // with an fp8 or fp8_ds_mla cache only (the layer refuses others); the static (q, k, v) scales as
  // LayerOptions::fp8_prefill_scales.
  bool fp8_prefill = false;
  LayerOptions::Fp8PrefillScales fp8_prefill_scales;
};

// Tensors of one step. T = plan.num_tokens; rows past num_actual_tokens are padding (never read
// past the projections' outputs, never written in `out`).
struct DeepseekForwardArgs {
  TensorView hidden;        // [T, hidden_size] layer dtype
  TensorView positions;     // [T] int64 or int32: the token's position in its sequence (RoPE)
  TensorView slot_mapping;  // as ForwardArgs (mla/layer.h)
  TensorView block_table;
  TensorView seq_lens;
  TensorView topk_indices;  // sparse only
  TensorView metadata;
  TensorView out;           // [T, hidden_size] layer dtype: this rank's o_proj partial sum
};

class DeepseekAttention {
 public:
  DeepseekAttention(const DeepseekConfig& config, const DeepseekWeights& weights, const DeepseekOptions& options);
  // The tensors "model.layers.<layer>.self_attn.<name>.weight" (and ".weight_scale_inv" for fp8
  // checkpoints) of a checkpoint directory.
  static DeepseekAttention load(const Checkpoint& checkpoint, const DeepseekConfig& config, int layer,
                                const DeepseekOptions& options);

  const DeepseekConfig& config() const { return config_; }
  const DeepseekOptions& options() const { return options_; }
  const LayerOptions& layer_options() const { return attention_->options(); }
  const MlaAttention& attention() const { return *attention_; }
  // Planner settings matching the block (dims of one rank, cache format, sparse; on CUDA the device's SM
  // count and compute capability); the caller sets the serving limits (page size, max_model_len, ...).
  PlannerConfig planner_config() const;

  // True when `name` ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "o_proj") runs as a
  // w8a8 block-scaled fp8 GEMM (fp8_activations and a block-aligned rank slice).
  bool projection_is_fp8(const std::string& name) const;

  // YaRN tables of a position: cos and sin of pair i (times the attention factor), as RoPE applies them.
  double inv_freq(int i) const { return inv_freq_.at(static_cast<std::size_t>(i)); }
  double rope_attention_factor() const { return rope_factor_; }

  std::size_t workspace_bytes(const Plan& plan) const;
  std::size_t max_workspace_bytes(const PlannerConfig& config, int64_t max_num_tokens) const;

  // One step: writes out[0, num_actual_tokens) and the new tokens' cache rows. `workspace`: u8
  // [>= workspace_bytes(plan)] scratch on the block's device.
  void forward(const Plan& plan, const DeepseekForwardArgs& args, const KVCache& cache, const TensorView& workspace,
               const Context& ctx = {}) const;

 private:
  // One Linear of the rank, on the block's device: the dequantised weight transposed, or (w8a8) the
  // e4m3 codes with their scales in gemm_fp8_block's layout.
  struct Linear {
    std::string name;
    int64_t in = 0, out = 0;
    Tensor w_t;     // [in, out] layer dtype (dequantised form)
    Tensor codes;   // [out, in] fp8_e4m3 (w8a8 form)
    Tensor scales;  // [ceil(out / 128), round_up(in / 128, 4)] f32 (w8a8 form)
    TensorView scale_view() const;  // [ceil(out / 128), in / 128] over `scales`
  };
  Linear make_linear(const DeepseekLinear& w, const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                     int64_t cols) const;
  // y[0, t) = x[0, t) @ W^T for the t = x.size(0) rows of x; a w8a8 Linear writes round_up(t, 4) rows
  // of y (the padding rows' results) and uses `act` (the workspace's activation-quantisation region).
  // x_quantised: `act` already holds x's quantisation (the previous w8a8 projection read the same x).
  void project(const Linear& l, const TensorView& x, const TensorView& y, std::byte* act, const Context& ctx,
               bool x_quantised = false) const;
  bool bf16_q_n() const;  // the normalised q latent goes to a bf16 region (CUDA, dequantised q_b_proj)
  std::size_t own_bytes(int64_t num_tokens) const;
  DType wide_dtype() const;  // projection outputs: f32 (f64 for the f64 block)
  int64_t max_fp8_in() const;  // widest input of a w8a8 Linear (0: none)

  DeepseekConfig config_;
  DeepseekOptions options_;
  ModelDims dims_;
  Linear q_a_, q_b_, q_, kv_a_, o_;                  // rank slices
  Tensor q_a_norm_, kv_a_norm_;                      // norm weights: f64 (CPU) / f32 (CUDA), on the device
  Tensor inv_freq_t_;                                // [R / 2] f64 on the device
  std::vector<double> inv_freq_;
  double rope_factor_ = 1.0;
  std::optional<MlaAttention> attention_;
};

}  // namespace mla
