// SPDX-License-Identifier: Apache-2.0
#pragma once
// MlaAttention: one DeepSeek MLA attention layer (the part between RoPE and o_proj), as vLLM's
// MLAAttention forward runs it (docs/SEMANTICS.md §2):
//   1. write_cache(kv_c, k_pe) at slot_mapping (new tokens visible to this step)
//   2. decode tokens:  ql = q_nope · W_UK_T (bmm) | mqa_decode([ql | q_pe], cache) | out = o_lat · W_UV
//   3. prefill tokens: k_nope, v = kv_c · kv_b_proj | causal MHA over new tokens, then per context chunk
//                      gather_cache -> kv_b_proj -> non-causal MHA -> merge_attn_states
//   4. sparse mode: every token through sparse MQA over top-k rows (convert_topk_indices), fp8_ds_mla
//                   prefills through an upconverted bf16 workspace unless the mixed-batch mode applies.
// Plan once per step, run every layer with the plan (mla/plan.h, mla/step.h): the caller makes the
// Plan, uploads its metadata once (upload_step_metadata) and passes the device copy to each layer's
// forward(). forward() never allocates, never synchronises the host (except once, in the step that
// calibrates KvScales::from_first_batch) and never uploads: all scratch
// lives in a caller-owned workspace of workspace_bytes(plan) bytes, and every step kind (decode,
// prefill, mixed, sparse) can be captured in a CUDA graph together with the upload.
#include <cstddef>

#include <optional>

#include "mla/block_ops.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "mla/step.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// Where the per-tensor fp8 cache's scale comes from (docs/SEMANTICS.md §16).
enum class KvScales : uint8_t {
  fixed = 0,             // KVCache::scale as the caller passes it, every step
  from_first_batch = 1,  // vLLM's calc_kv_scales: the first step with a nonzero latent sets
                         // scale = max|kv_c| / 200 from its actual tokens; fixed from then on
};
const char* to_string(KvScales k);

struct LayerOptions {
  ModelDims dims;
  CacheFormat cache_format = CacheFormat::bf16;
  bool sparse = false;
  DsMlaScale ds_scale = DsMlaScale::amax;
  Device device = Device::cpu();
  // Activation / weight dtype: bf16 on CUDA; bf16, f32 or f64 on the CPU (f64 + Precision::reference
  // gives the float64 oracle layer).
  DType dtype = DType::bf16;
  // Decode context parallelism (§13, mla/dcp.h): this rank's communicator of the DCP group, not owned
  // (the caller keeps it alive while the layer runs). Set, the layer's dims.num_heads are this rank's
  // heads (the group's heads / W, as tensor parallelism splits them), its cache is this rank's shard,
  // and forward() takes plans made with PlannerConfig::dcp = {W, rank, interleave}: decode steps
  // all-gather q over the group's heads, attend the shard and combine the partials. nullptr = no DCP.
  Communicator* dcp_comm = nullptr;
  // The output's format (mla/block_ops.h OutputQuant, docs/SEMANTICS.md §15): none writes `out` in the
  // layer dtype; any other key writes ForwardArgs::out as that format's codes and out_scales as its
  // scales, equal to quantize_output(the unquantised output). h_q * V must be a multiple of the key's
  // group (128, 64 or 16).
  OutputQuant out_quant = OutputQuant::none;
  // fp8: the static scale (code = e4m3(x / out_scale)); nvfp4: the global scale; unused otherwise.
  float out_scale = 1.0f;
  // fp8 (per-tensor) caches only: from_first_batch calibrates the cache scale from the data (§16).
  KvScales kv_scales = KvScales::fixed;
  // A batch-invariant layer (PlannerConfig::batch_invariant): forward(), workspace_bytes() and
  // max_workspace_bytes() refuse plans and configs that are not batch-invariant, so a layer built for
  // reproducible decoding cannot run a step whose decode attention depends on the batch. false: the plan
  // decides.
  bool batch_invariant = false;
  // fp8 prefill attention (vLLM's use_prefill_query_quantization; docs/SEMANTICS.md §10.1): the dense prefill's
  // mha_prefill calls (new tokens and context chunks) run with PrefillOptions::fp8 and these static scales of
  // q, k and v. Off by default; a dense layer with an fp8 or fp8_ds_mla cache only (others are refused), and on
  // CUDA an sm_90 device with DeepSeek's head dims (P 128, R 64, V 128).
  bool fp8_prefill = false;
  struct Fp8PrefillScales {
    float q = 1.0f, k = 1.0f, v = 1.0f;
  } fp8_prefill_scales;
};

// Tensors of one step. T = plan.num_tokens (rows beyond num_actual_tokens are padding and ignored).
struct ForwardArgs {
  TensorView q;             // [T, h_q, P + R] query after RoPE
  TensorView kv_c;          // [T, L] kv_c_normed
  TensorView k_pe;          // [T, R] rope key (after RoPE)
  TensorView slot_mapping;  // [T] int64 (int32 accepted); < 0 = not written
  TensorView block_table;   // [num_reqs, max_blocks] int32
  TensorView seq_lens;      // [num_reqs] int32, device copy of plan.seq_lens
  TensorView topk_indices;  // sparse only: [T, topk] int32 request-local positions, -1 padded
  // out_quant none: [T, h_q * V] in the layer dtype, written for the first num_actual_tokens rows.
  // Quantised (LayerOptions::out_quant): [T_out, h_q * V] fp8_e4m3 codes (nvfp4: u8 [T_out, h_q * V / 2])
  // with T_out >= num_actual_tokens; rows past num_actual_tokens are written as padding (zero codes).
  TensorView out;
  // Quantised output's scales (quantize_output's layouts with M_pad = T_out): fp8_group128 / 64 f32
  // [h_q * V / G, T_out] contiguous (gemm_fp8_block's token scales), nvfp4 fp8_e4m3 [T_out, h_q * V / 16];
  // undefined for none and fp8 (its scale is LayerOptions::out_scale).
  TensorView out_scales;
  // u8 [>= plan.metadata.bytes()] on the layer's device: the plan's metadata as upload_step_metadata
  // copied it (contiguous, 16-byte aligned). May be absent when the plan has none (dense decode-only)
  // and on the CPU (the layer then reads the plan's host copy).
  TensorView metadata;
};

class MlaAttention {
 public:
  // kv_b_proj_weight: [h_q * (P + V), L], the kv_b_proj Linear weight as stored in checkpoints
  // ((out, in) = rows are per-head [P nope | V value] blocks), any float dtype but fp8_e4m3 (codes
  // need their block scales: mla::dequantize_block_fp8, mla/deepseek.h), any device. Derives
  // W_UK_T (h_q, P, L) and W_UV (h_q, L, V) on options.device in options.dtype.
  MlaAttention(const LayerOptions& options, const TensorView& kv_b_proj_weight);

  const LayerOptions& options() const { return options_; }
  const Tensor& w_uk_t() const { return w_uk_t_; }    // (h_q, P, L)
  const Tensor& w_uv() const { return w_uv_; }        // (h_q, L, V)
  const Tensor& w_kv_b() const { return w_kv_b_; }    // (L, h_q * (P + V)) for the prefill up-projection

  // Workspace bytes forward() needs for this plan, and an upper bound over every plan the config
  // admits with at most max_num_tokens tokens (preallocate once; CUDA graphs).
  std::size_t workspace_bytes(const Plan& plan) const;
  std::size_t max_workspace_bytes(const PlannerConfig& config, int64_t max_num_tokens) const;

  // Runs one step. `workspace`: u8 [>= workspace_bytes(plan)] on the layer's device; it is scratch
  // only, so one workspace serves every layer of the step (they run one after the other on a stream).
  void forward(const Plan& plan, const ForwardArgs& args, const KVCache& cache, const TensorView& workspace,
               const Context& ctx = {}) const;

  // KvScales::from_first_batch: the calibrated cache scale once a step has set it (nullopt before, and
  // always with KvScales::fixed). Every later step reads and writes the cache with this scale, whatever
  // KVCache::scale the caller passes; other readers of the cache must use it too.
  std::optional<float> kv_scale() const { return kv_scale_; }

 private:
  LayerOptions options_;
  Tensor w_uk_t_, w_uv_, w_kv_b_;
  // Set by the first calibrating forward() (which synchronises the host once to read the batch's
  // max |kv_c|); read by every later one, which then needs no host sync (graph capture safe).
  mutable std::optional<float> kv_scale_;
  void calibrate_kv_scale(const TensorView& kv_c, uint8_t* slot, const Context& ctx) const;
};

}  // namespace mla
