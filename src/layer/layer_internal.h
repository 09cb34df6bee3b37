// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internals of MlaAttention shared by the layer's translation units:
//   workspace.cpp  workspace layout and sizes, the facts forward() derives from a plan
//   layer.cpp      constructor, workspace sizing, argument validation, forward() orchestration
//   dense.cpp      dense decode (absorbed MQA) and dense prefill (MHA + chunked context)
//   sparse.cpp     sparse top-k MQA for every token
//   step_util.cpp  views into the workspace and the step metadata, strided copies
//   step_metadata.cpp  PinnedBuffer and the one metadata upload per step (mla/step.h)
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "mla/layer.h"
#include "mla/ops.h"

namespace mla::layer_detail {

// ---- workspace layout ----------------------------------------------------------------------------
//
// One u8 buffer, every region aligned to kAlign bytes relative to its start. The plan's int32
// metadata is not in it: the caller uploads it once per step (upload_step_metadata) into a buffer of
// its own that every layer reads (ForwardArgs::metadata). The step's working set is one of two phases
// that run one after the other on one stream and therefore share memory (the bytes reserved are the
// larger of the two):
//   always (before the two phases: they live through the whole step)
//     out_stage act   [out_tokens, h*V]       the unquantised output when LayerOptions::out_quant != none
//                                             (on CUDA only the rows past Step::fused_rows() use it)
//     amax      f32   [amax_slots]            KvScales::from_first_batch: max |kv_c| of the calibrating step
//   phase A (dense decode tokens, or every token in sparse mode)
//     q_abs     act   [mqa_tokens, h, d_qk]   [ q_nope·W_UK_T | q_pe ]
//     o_lat     act   [mqa_tokens, h, L]      latent attention output
//     scratch   u8    [decode_scratch_bytes]  mqa_decode split-KV partials (0 on the CPU)
//     indices   int32 [mqa_tokens, topk]      converted top-k rows (sparse only)
//     upconv    bf16  [upconvert_rows, d_qk]  fp8_ds_mla prefill chunk, upconverted (sparse separate mode)
//     dcp_topk  int32 [mqa_tokens, topk]      DCP sparse: top-k positions localized to this rank's shard
//   phase B (dense prefill tokens)
//     kv_new    act   [prefill_tokens, h*(P+V)]  new tokens' k_nope | v
//     o_new     act   [staged_tokens, h, V]      new-token attention, staged for the context merge
//     lse_new   lse   [h, staged_tokens]          (lse = f32; f64 in the f64 oracle layer)
//     gathered  act   [context_rows, d_qk]       one context chunk, dequantised
//     kv_ctx    act   [context_rows, h*(P+V)]    its k_nope | v
//     acc[i]    act   [staged_tokens, h, V] + lse [h, staged_tokens], i < context_accumulators:
//               0/1 ping-pong running (out, lse) over chunks, 2 = the current chunk's partial
//     dcp_local act   [dcp_rows, d_qk]            DCP: this rank's rows of a context chunk
//     dcp_recv  act   [dcp_world * dcp_rows, d_qk] DCP: every rank's rows (all-gather), reordered into gathered
//     fp8_prefill u8  [fp8_prefill_bytes]         LayerOptions::fp8_prefill on CUDA: the quantised q, k and
//                                                 v^T of one mha_prefill call (mha_prefill_workspace_bytes)
inline constexpr int64_t kAlign = 256;


// Everything the workspace size depends on. Each region's size is a non-decreasing function of each
// field, so the layout of field-wise upper bounds bounds the layout of every plan (max_workspace_bytes).
struct WorkspaceShape {
  int64_t mqa_tokens = 0;
  int64_t decode_scratch_bytes = 0;
  int64_t topk = 0;
  int64_t upconvert_rows = 0;
  int64_t prefill_tokens = 0;
  int64_t staged_tokens = 0;
  int64_t context_rows = 0;
  int64_t context_accumulators = 0;  // 0, 1 or 3
  int64_t dcp_rows = 0;   // DCP context: the largest all-gather block (rows per rank) of a chunk
  int64_t dcp_world = 1;  // DCP group size (the receive buffer holds dcp_world blocks)
  int64_t out_tokens = 0;  // rows of the unquantised output staged before quantize_output
  int64_t amax_slots = 0;  // 1 for a layer calibrating its KV scale
  int64_t fp8_prefill_bytes = 0;  // LayerOptions::fp8_prefill on CUDA: mha_prefill's fp8 workspace, largest call
};

struct Region {
  int64_t offset = 0, bytes = 0;
};

struct WorkspaceLayout {
  Region out_stage, amax;                                  // whole step
  Region q_abs, o_lat, scratch, indices, upconv;           // phase A
  Region dcp_topk;                                         // phase A, DCP sparse: localized positions
  Region kv_new, o_new, lse_new, gathered, kv_ctx;         // phase B
  Region dcp_local, dcp_recv;                              // phase B, DCP context: own rows, all ranks' rows
  Region fp8_prefill;                                      // phase B, fp8 prefill: q8, k8, v8^T
  std::array<Region, 3> acc_o{}, acc_lse{};                // phase B
  int64_t total = 0;
};

// Model dimensions the layout needs, from the layer options.
struct Dims {
  int64_t h = 0, L = 0, R = 0, P = 0, V = 0, act_bytes = 0;
  // Partial-attention LSEs: f32 by contract; the f64 oracle layer keeps them in f64 so that context
  // merges do not cap its accuracy at fp32 (|lse| * 2^-24 relative on each merge weight).
  DType lse_dtype = DType::f32;
  int64_t lse_bytes = 4;
  int64_t d_qk() const { return L + R; }
  static Dims of(const LayerOptions& o);
};

WorkspaceLayout make_layout(const WorkspaceShape& s, const Dims& d);

// Facts about one plan that sizing and forward() both derive, in one place so they cannot drift.
struct StepFacts {
  int64_t num_decodes = 0, num_prefills = 0, num_reqs = 0;
  int64_t t_dec = 0;  // query tokens of decode requests: [0, t_dec)
  int64_t t_act = 0;  // actual tokens; prefill tokens are [t_dec, t_act)
  // Dense prefill context.
  int64_t context_chunks = 0;         // chunks with at least one gathered row
  int64_t max_chunk_rows = 0;
  int64_t prefill_tokens_with_context = 0;  // prefill-local tokens [0, this) belong to requests with context
  // Sparse.
  bool sparse_separate = false;       // fp8_ds_mla prefills through the upconverted workspace
  int64_t max_upconvert_rows = 0;
};
// Decode runs come from the plan's decode schedule (plan.decode); the packed device metadata from
// plan.metadata.
StepFacts step_facts(const Plan& plan, const LayerOptions& o);
WorkspaceShape plan_shape(const Plan& plan, const StepFacts& f, const LayerOptions& o);
// Field-wise upper bounds over every plan `c` admits with at most max_num_tokens tokens.
WorkspaceShape bound_shape(const PlannerConfig& c, int64_t max_num_tokens, const LayerOptions& o);
// Throws mla::Error unless the planner config describes the layer's model, cache format and mode.
void check_config_matches(const PlannerConfig& c, const LayerOptions& o, const char* what);

// ---- one forward step ----------------------------------------------------------------------------
struct Step {
  const LayerOptions& opt;
  const MlaAttention& layer;
  const Plan& plan;
  const ForwardArgs& args;
  const KVCache& cache;  // the caller's, with the calibrated scale under KvScales::from_first_batch
  const Context& ctx;
  Dims dims;
  StepFacts facts;
  WorkspaceLayout layout;
  uint8_t* ws = nullptr;
  void* meta = nullptr;  // the plan's metadata on the layer's device (ForwardArgs::metadata, or the plan's
                         // host copy on the CPU); int32 offsets as in plan.metadata

  // Contiguous view of a workspace region (rows may be fewer than the region holds).
  TensorView view(const Region& r, DType t, std::initializer_list<int64_t> shape) const;
  // int32 [n] view of the step metadata at element offset `at` (plan.metadata's offsets).
  TensorView meta_view(int64_t at, int64_t n) const;
  // Rows [t0, t1) of the unquantised output (ForwardArgs::out, or out_stage when quantised) viewed [n, h, V].
  TensorView out_rows(int64_t t0, int64_t t1) const;
  // The unquantised output: ForwardArgs::out [T, h * V], or the out_stage region [t_act, h * V].
  TensorView unquantised_out() const;
  // Whether the W_UV products write the quantised output themselves (up_project_quantized): on CUDA, for
  // every out_quant key whose groups fit in one head (V a multiple of 16 and of the group). Rows written
  // by the dense prefill still go through out_stage and quantize_output.
  bool fused_out() const;
  // Leading output rows [0, n) that the step's W_UV product writes quantised (0: none; every quantised row
  // then goes through out_stage and quantize_output). The product covers the dense decode tokens, or every
  // token in sparse mode. Before sm_90 the fused kernel always runs; from sm_90 on the two passes (cuBLAS's bmm,
  // then quantize_output): on Hopper the mma.sync kernel lost everywhere, and its wgmma mainloop, faster than the
  // two passes as an op at h 128 and 64..128 rows (up_proj::hopper_fuses), made the layer's step slower there.
  int64_t fused_rows() const;
  // Rows [t0, t1) of the quantised output: ForwardArgs::out and the matching rows of out_scales (group
  // keys: columns [t0, t1) of the group-major [h*V / G, T_out] scales; fp8: undefined).
  std::pair<TensorView, TensorView> quantised_rows(int64_t t0, int64_t t1) const;
};

// dst, src [n, h, w] with unit inner stride: row-wise copy (CPU loop; CUDA 2-D async copies).
void copy_rows(const TensorView& dst, const TensorView& src, const Context& ctx);
// [n, R] rope rows viewed [n, h, R] with head stride 0 (one rope key shared by all heads).
TensorView broadcast_heads(const TensorView& rope, int64_t h);

// q_abs rows [0, t1 - t0) = [ q[t0:t1, :, :P] · W_UK_T | q[t0:t1, :, P:] ].
void absorb_queries(const Step& s, int64_t t0, int64_t t1, const TensorView& q_abs);
// out rows [t0, t0 + n) = o_lat [n, h, L] · W_UV; with fused_out() quantised in the same pass (the call
// whose rows end at t_act also writes the padding rows [t_act, T_out)).
void up_project(const Step& s, const TensorView& o_lat, int64_t t0);

void run_dense_decode(const Step& s);
void run_dense_prefill(const Step& s);
void run_sparse(const Step& s);

}  // namespace mla::layer_detail
