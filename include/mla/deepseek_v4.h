// SPDX-License-Identifier: Apache-2.0
#pragma once
// DeepseekV4Attention: the whole DeepSeek-V4 / V4.1 attention block of one layer, from hidden states to
// the o_b_proj output (docs/SEMANTICS.md §17):
//   q path   q_a_proj -> RMSNorm(q_a_norm) -> q_b_proj -> [h, 512] -> unweighted RMSNorm per head (V4 only)
//            -> RoPE on the trailing 64 columns of each head
//   kv path  kv_proj -> RMSNorm(kv_norm) -> [512] -> RoPE on the trailing 64 columns: one row, K = V
//   cache    the new rows go to the main (sliding-window) cache at slot_mapping; the compressors' outputs
//            of the step (the caller's: compressed rows, already normalised and rotated) go to the extra
//            cache at extra_slot_mapping
//   attend   sparse_mqa with the V4 options: each token's window (its own and the sliding_window - 1
//            previous positions of its request) from the main cache, its top-k compressed entries from
//            the extra cache, one softmax with the per-head sink, scale head_dim^-0.5, values = whole rows
//   output   the rope columns of each head's output rotated back by -position, then the grouped low-rank
//            o projection: o_a_proj per group of heads (block diagonal), o_b_proj over the groups.
// Tensor parallelism as heads shard: rank r of tp holds heads [r h / tp, (r + 1) h / tp) of q_b_proj and
// the sinks, o_groups / tp groups of o_a_proj and the matching input columns of o_b_proj (row-parallel):
// its output is the rank's partial sum. tp must divide o_groups. q_a_proj and kv_proj are replicated.
//
// On the CPU (bf16 / f32 activations, or f64 with Precision::reference: the float64 oracle) or CUDA (bf16
// activations; bf16, v4, v41 and v41_fp4 caches; the step reads no device value on the host, so it can be
// captured in a CUDA graph). Weights may be any float dtype or fp8 e4m3 with block scales (weight_scale_inv),
// dequantised exactly at construction as the V3 block does, then held on the block's device.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mla/cache.h"
#include "mla/deepseek.h"
#include "mla/safetensors.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// One layer's weights, all heads, as published (transformers' names under "self_attn.").
struct DeepseekV4Weights {
  DeepseekLinear q_a_proj;   // [q_lora_rank, hidden]
  DeepseekLinear q_b_proj;   // [heads * head_dim, q_lora_rank]
  DeepseekLinear kv_proj;    // [head_dim, hidden]
  DeepseekLinear o_a_proj;   // [o_groups * o_lora_rank, heads * head_dim / o_groups]: group g's rows
                             // [g * o_lora_rank, (g + 1) * o_lora_rank) read heads [g h / G, (g + 1) h / G)
  DeepseekLinear o_b_proj;   // [hidden, o_groups * o_lora_rank]
  TensorView q_a_norm, kv_norm;  // [q_lora_rank], [head_dim]
  TensorView sinks;              // [heads]: logits in the units of the scaled scores
};

struct DeepseekV4Options {
  int tp = 1, rank = 0;
  CacheFormat cache_format = CacheFormat::bf16;        // the main (sliding-window) cache
  CacheFormat extra_cache_format = CacheFormat::bf16;  // the compressed cache: the main one's format, or
                                                       // both V4 records (V4.1: v41 window + v41_fp4)
  Device device = Device::cpu();
  DType dtype = DType::bf16;  // activations and weights: bf16, f32 or f64
};

// One step's tensors, every one on the block's device (index values are checked where they are host tensors).
// T = hidden.size(0) tokens of R requests.
struct DeepseekV4ForwardArgs {
  TensorView hidden;        // [T, hidden_size] layer dtype
  TensorView positions;     // [T] int64 / int32: position of the token in its request (>= 0)
  TensorView req_id;        // [T] int32: the token's request (row of the block tables)
  TensorView block_table;   // [R, max_blocks] int32: the main cache's pages of each request
  TensorView slot_mapping;  // [T] int64 / int32: main-cache slot of each token's row (< 0: not written)
  // The compressors' outputs of this step (optional, layers with an extra cache): rows of head_dim in
  // any float dtype, written at extra_slot_mapping (< 0: not written) before the attention.
  TensorView extra_kv;            // [N_e, head_dim]
  TensorView extra_slot_mapping;  // [N_e] int64 / int32
  // Compressed entries each token attends (layers with an extra cache): request-local entry numbers,
  // < 0 invalid, mapped to extra-cache rows through extra_block_table (page = the extra cache's).
  TensorView extra_block_table;  // [R, max_blocks_e] int32
  TensorView extra_topk;         // [T, K] int32
  TensorView out;                // [T, hidden_size] layer dtype: this rank's o_b_proj partial sum
};

class DeepseekV4Attention {
 public:
  DeepseekV4Attention(const DeepseekV4Config& config, int layer, const DeepseekV4Weights& weights,
                      const DeepseekV4Options& options);
  // "model.layers.<layer>.self_attn.<name>.weight" (q_a_proj, q_a_norm, q_b_proj, kv_proj, kv_norm,
  // o_a_proj, o_b_proj; ".weight_scale_inv" for fp8 linears) and "model.layers.<layer>.self_attn.sinks".
  static DeepseekV4Attention load(const Checkpoint& checkpoint, const DeepseekV4Config& config, int layer,
                                  const DeepseekV4Options& options);

  const DeepseekV4Config& config() const { return config_; }
  const DeepseekV4Options& options() const { return options_; }
  int layer() const { return layer_; }
  int compress_ratio() const { return ratio_; }
  int heads() const { return heads_; }  // query heads of this rank
  // RoPE of this layer: angle of pair i at position p = p * inv_freq(i) (cos / sin not scaled).
  double inv_freq(int i) const { return inv_freq_.at(static_cast<std::size_t>(i)); }

  // Scratch bytes of a step of T tokens with extra_topk rows K wide (0: no extra cache).
  std::size_t workspace_bytes(int64_t num_tokens, int64_t extra_topk = 0) const;

  // One step: writes the main cache rows of the tokens, the extra cache rows of extra_kv, and
  // out[0, T). Every argument is checked before the first write. `extra_cache` is unused (may be
  // default-constructed) when the layer has no extra cache.
  void forward(const DeepseekV4ForwardArgs& args, const KVCache& cache, const KVCache& extra_cache,
               const TensorView& workspace, const Context& ctx = {}) const;

 private:
  std::size_t own_bytes(int64_t T, int64_t K) const;
  DType wide_dtype() const;

  DeepseekV4Config config_;
  DeepseekV4Options options_;
  int layer_ = 0, ratio_ = 0, heads_ = 0, groups_ = 0;
  Tensor q_a_t_, q_b_t_, kv_t_, o_b_t_;  // [in, out] rank slices, layer dtype
  std::vector<Tensor> o_a_t_;            // per group of the rank: [heads_per_group * head_dim, o_lora_rank]
  Tensor q_a_norm_, kv_norm_, ones_;     // f64
  Tensor sinks_;                         // [heads of the rank] f32
  Tensor inv_freq_t_, neg_inv_freq_t_;   // [R / 2] f64
  std::vector<double> inv_freq_;
};

}  // namespace mla
