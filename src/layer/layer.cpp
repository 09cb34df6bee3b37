// SPDX-License-Identifier: Apache-2.0
// MlaAttention: weight absorption, workspace sizing, argument validation and the forward step
// (docs/SEMANTICS.md §2). The step itself lives in dense.cpp / sparse.cpp; the workspace layout is
// documented in layer_internal.h.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "core/index_view.h"
#include "layer/layer_internal.h"
#include "ops/validate.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla {

using namespace layer_detail;

namespace {

constexpr const char* kFwd = "MlaAttention::forward";
// vLLM's K_SCALE_CONSTANT: the calibrated scale maps max |kv_c| to 200 (below e4m3's 448, so values
// up to 2.24x the first batch's maximum are still represented unsaturated).
constexpr float kKScaleRange = 200.0f;

void check_options(const LayerOptions& o) {
  // A DeviceType outside the enum is neither CPU nor CUDA: refused here, not taken for a CPU layer.
  detail::check_device_value(o.device, "MlaAttention", "options.device");
  o.dims.validate();
  check_cache_format(o.cache_format, "MlaAttention");
  // The DeepSeek-V4 records are read by sparse_mqa's V4 options only; the layer's MLA step (dense decode, the
  // V3.2 sparse path) has no use for them: refused before anything is allocated or written.
  MLA_CHECK(!cache_format_info(o.cache_format).record,
            "MlaAttention: the {} cache format is a DeepSeek-V4 record (sparse_mqa with V4 options only); the layer "
            "takes bf16, fp8, fp8_ds_mla or f64",
            to_string(o.cache_format));
  if (o.device.is_cuda()) {
    MLA_CHECK(cache_format_info(o.cache_format).device,
              "MlaAttention: the {} cache format is CPU-only (the float64 oracle's cache); the CUDA layer takes {}",
              to_string(o.cache_format), device_cache_format_names());
    MLA_CHECK(built_with_cuda(), "MlaAttention: device {} requested but this build of mla has no CUDA backend",
              to_string(o.device));
    MLA_CHECK(o.device.index >= 0 && o.device.index < cuda_device_count(),
              "MlaAttention: device {} requested but {} CUDA device(s) are present", to_string(o.device),
              cuda_device_count());
    MLA_CHECK(o.dtype == DType::bf16, "MlaAttention: the CUDA layer computes in bf16, got dtype {}",
              to_string(o.dtype));
  } else {
    MLA_CHECK(o.dtype == DType::bf16 || o.dtype == DType::f32 || o.dtype == DType::f64,
              "MlaAttention: the CPU layer computes in bf16, f32 or f64, got dtype {}", to_string(o.dtype));
  }
  if (o.sparse)
    MLA_CHECK(o.dims.index_topk > 0, "MlaAttention: sparse mode needs dims.index_topk > 0, got {}", o.dims.index_topk);
  check_ds_mla_scale(o.ds_scale, "MlaAttention");
  if (o.fp8_prefill) {
    MLA_CHECK(!o.sparse && (o.cache_format == CacheFormat::fp8 || o.cache_format == CacheFormat::fp8_ds_mla),
              "MlaAttention: fp8_prefill applies to a dense layer with an fp8 or fp8_ds_mla cache, got a {} {} cache",
              o.sparse ? "sparse" : "dense", to_string(o.cache_format));
    for (float s : {o.fp8_prefill_scales.q, o.fp8_prefill_scales.k, o.fp8_prefill_scales.v})
      MLA_CHECK(std::isfinite(s) && s > 0.0f, "MlaAttention: fp8_prefill_scales must be positive and finite, got {}",
                s);
    if (o.device.is_cuda()) {
      MLA_CHECK(o.dims.qk_nope_head_dim == 128 && o.dims.qk_rope_head_dim == 64 && o.dims.v_head_dim == 128,
                "MlaAttention: fp8_prefill on CUDA needs P 128, R 64, V 128 (the sm90_fp8 kernel), got {}, {}, {}",
                o.dims.qk_nope_head_dim, o.dims.qk_rope_head_dim, o.dims.v_head_dim);
      const int cc = compute_capability(o.device);
      MLA_CHECK(cc == 90, "MlaAttention: fp8_prefill on CUDA runs on sm_90 devices only, {} has compute capability {}.{}",
                to_string(o.device), cc / 10, cc % 10);
    }
  }
  if (o.dcp_comm) {
    MLA_CHECK(o.dcp_comm->device() == o.device, "MlaAttention: the DCP communicator runs on {}, the layer on {}",
              to_string(o.dcp_comm->device()), to_string(o.device));
    MLA_CHECK(o.dims.kv_lora_rank == 512 && o.dims.qk_rope_head_dim == 64,
              "MlaAttention: DCP needs the 576-wide latent rows (kv_lora_rank 512, rope 64), got {} and {}",
              o.dims.kv_lora_rank, o.dims.qk_rope_head_dim);
  }
  check_output_quant(o.out_quant, "MlaAttention");
  if (o.out_quant != OutputQuant::none) {
    const int64_t group = output_quant_group(o.out_quant), width = int64_t{o.dims.num_heads} * o.dims.v_head_dim;
    MLA_CHECK(group == 0 || width % group == 0,
              "MlaAttention: out_quant {} takes scale groups of {} columns, but the output rows are h_q * V = {} wide",
              to_string(o.out_quant), group, width);
    if (o.out_quant == OutputQuant::fp8 || o.out_quant == OutputQuant::nvfp4)
      MLA_CHECK(std::isfinite(o.out_scale) && o.out_scale > 0,
                "MlaAttention: out_quant {} needs a finite out_scale > 0 (its {} scale), got {}", to_string(o.out_quant),
                o.out_quant == OutputQuant::fp8 ? "static" : "global", o.out_scale);
  }
  MLA_CHECK(o.kv_scales == KvScales::fixed || o.kv_scales == KvScales::from_first_batch,
            "MlaAttention: kv_scales must be fixed or from_first_batch, got the value {}", static_cast<int>(o.kv_scales));
  MLA_CHECK(o.kv_scales == KvScales::fixed || o.cache_format == CacheFormat::fp8,
            "MlaAttention: kv_scales from_first_batch sets the one scale of a per-tensor fp8 cache; a {} cache has "
            "no such scale (fp8_ds_mla keeps a scale per 128-value tile of each row)",
            to_string(o.cache_format));
  const CacheFormatInfo& f = cache_format_info(o.cache_format);
  MLA_CHECK(f.admits(o.dims.d_qk(), o.dims.qk_rope_head_dim),
            "MlaAttention: an {} cache needs kv_lora_rank {} and qk_rope_head_dim {}, got {} and {}", f.name,
            f.d_qk - f.d_rope, f.d_rope, o.dims.kv_lora_rank, o.dims.qk_rope_head_dim);
}

// The plan was made for this layer's place in its DCP group (or both have none).
void check_dcp_matches(const Plan& plan, const LayerOptions& o) {
  const DcpLayout& dcp = plan.config.dcp;
  if (o.dcp_comm) {
    const Communicator& c = *o.dcp_comm;
    MLA_CHECK(dcp.world_size == c.world_size() && dcp.rank == c.rank(),
              "MlaAttention: the layer's DCP communicator is rank {} of {}, the plan was made for rank {} of {}",
              c.rank(), c.world_size(), dcp.rank, dcp.world_size);
  } else {
    MLA_CHECK(dcp.world_size == 1, "MlaAttention: the plan is for DCP rank {} of {} but the layer has no dcp_comm",
              dcp.rank, dcp.world_size);
  }
}

// A view with the layer's dtype and device, the given extents, unit inner stride.
void check_activation_arg(const TensorView& t, const LayerOptions& o, std::initializer_list<int64_t> shape,
                          bool is_output, const char* arg) {
  detail::check_defined(t, kFwd, arg);
  detail::check_ndim(t, static_cast<int>(shape.size()), kFwd, arg);
  int dim = 0;
  for (int64_t n : shape) detail::check_size(t, dim++, n, kFwd, arg);
  detail::check_dtype(t, o.dtype, kFwd, arg);
  detail::check_device(t, o.device, kFwd, arg);
  detail::check_activation(t, is_output, kFwd, arg);
}

void check_int_arg(const TensorView& t, const LayerOptions& o, int ndim, const char* arg) {
  detail::check_defined(t, kFwd, arg);
  detail::check_ndim(t, ndim, kFwd, arg);
  detail::check_device(t, o.device, kFwd, arg);
  detail::check_strides(t, false, kFwd, arg);
  if (ndim == 2) detail::check_inner_contiguous(t, kFwd, arg);
}

// Host-readable (CPU) integer metadata must agree with the plan and stay inside the cache, so that
// no op fails half way through a step (DESIGN §5: nothing is written on bad input).
void check_values(const Plan& p, const ForwardArgs& a, const KVCache& cache) {
  const int64_t page = cache.page_size();
  for (int64_t r = 0; r < p.num_reqs; ++r) {
    const int64_t len = index_at(a.seq_lens, r);
    MLA_CHECK(len == p.seq_lens[r], "{}: seq_lens[{}] = {} but the plan was made for {}", kFwd, r, len, p.seq_lens[r]);
    detail::check_block_ids(a.block_table, r, 0, len, page, cache.num_blocks(), kFwd);
  }
  detail::check_values_in_range(a.slot_mapping, INT64_MIN, cache.num_slots() - 1, kFwd, "slot_mapping");
}

void validate_forward(const LayerOptions& o, const Plan& p, const StepFacts& f, const ForwardArgs& a,
                      const KVCache& cache, const TensorView& ws, const WorkspaceLayout& layout) {
  const int64_t need = layout.total;
  const Dims d = Dims::of(o);
  validate_cache(cache, kFwd);
  MLA_CHECK(cache.format == o.cache_format, "{}: the layer was built for a {} cache, got a {} cache", kFwd,
            to_string(o.cache_format), to_string(cache.format));
  detail::check_device(cache.data, o.device, kFwd, "cache.data");
  MLA_CHECK(cache.d_qk == d.d_qk() && cache.d_rope == d.R, "{}: cache rows must be {} wide with {} rope, got {} and {}",
            kFwd, d.d_qk(), d.R, cache.d_qk, cache.d_rope);
  MLA_CHECK(cache.page_size() == p.config.page_size, "{}: the plan was made for page size {}, the cache has {}", kFwd,
            p.config.page_size, cache.page_size());

  const int64_t T = p.num_tokens;
  check_activation_arg(a.q, o, {T, d.h, d.P + d.R}, false, "q [T, h, P + R]");
  check_activation_arg(a.kv_c, o, {T, d.L}, false, "kv_c [T, L]");
  check_activation_arg(a.k_pe, o, {T, d.R}, false, "k_pe [T, R]");
  if (o.out_quant == OutputQuant::none) {
    check_activation_arg(a.out, o, {T, d.h * d.V}, true, "out [T, h * V]");
    MLA_CHECK(!a.out_scales.defined(), "{}: out_scales given, but the layer's out_quant is none: {}", kFwd,
              a.out_scales.describe());
  }

  check_int_arg(a.slot_mapping, o, 1, "slot_mapping");
  detail::check_index(a.slot_mapping, kFwd, "slot_mapping");
  MLA_CHECK(a.slot_mapping.size(0) >= f.t_act && a.slot_mapping.size(0) <= T,
            "{}: slot_mapping must hold between num_actual_tokens = {} and num_tokens = {} slots, got {}", kFwd,
            f.t_act, T, a.slot_mapping.describe());
  check_int_arg(a.block_table, o, 2, "block_table");
  detail::check_dtype(a.block_table, DType::i32, kFwd, "block_table");
  detail::check_size(a.block_table, 0, p.num_reqs, kFwd, "block_table [num_reqs, max_blocks]");
  const int64_t table_tokens = a.block_table.size(1) * cache.page_size();
  // Under DCP the table maps this rank's shard: it must cover the request's local positions.
  for (int64_t r = 0; r < p.num_reqs; ++r)
    MLA_CHECK(dcp_local_length(p.seq_lens[r], p.config.dcp) <= table_tokens,
              "{}: request {} has seq_len {} ({} positions on this DCP rank) but a block_table row covers {} blocks "
              "of {} = {} tokens",
              kFwd, r, p.seq_lens[r], dcp_local_length(p.seq_lens[r], p.config.dcp), a.block_table.size(1),
              cache.page_size(), table_tokens);
  // The decode schedule hands each run the first block_cols table columns (BatchDesc::decode_seq_len_bound
  // may ask for more than the batch's sequences need).
  for (const DecodeRun& r : p.decode.runs)
    MLA_CHECK(r.block_cols <= a.block_table.size(1),
              "{}: the plan's decode schedule reads {} block-table columns (decode_seq_len_bound {} tokens) but "
              "block_table has {}",
              kFwd, r.block_cols, r.block_cols * cache.page_size(), a.block_table.size(1));
  check_int_arg(a.seq_lens, o, 1, "seq_lens");
  detail::check_dtype(a.seq_lens, DType::i32, kFwd, "seq_lens");
  detail::check_size(a.seq_lens, 0, p.num_reqs, kFwd, "seq_lens [num_reqs]");
  if (o.sparse) {
    check_int_arg(a.topk_indices, o, 2, "topk_indices");
    detail::check_dtype(a.topk_indices, DType::i32, kFwd, "topk_indices");
    detail::check_size(a.topk_indices, 0, T, kFwd, "topk_indices [T, topk]");
    detail::check_size(a.topk_indices, 1, o.dims.index_topk, kFwd, "topk_indices [T, topk]");
  } else {
    MLA_CHECK(!a.topk_indices.defined(), "{}: topk_indices given to a dense layer: {}", kFwd,
              a.topk_indices.describe());
  }

  // The plan's metadata as upload_step_metadata copied it (CPU layers may read the plan's own copy).
  const std::size_t meta_bytes = p.metadata.bytes();
  if (meta_bytes > 0 && (o.device.is_cuda() || a.metadata.defined())) {
    const TensorView& m = a.metadata;
    MLA_CHECK(m.defined(), "{}: this plan has {} bytes of step metadata; pass their device copy as "
              "ForwardArgs::metadata (upload_step_metadata)", kFwd, meta_bytes);
    detail::check_ndim(m, 1, kFwd, "metadata");
    detail::check_dtype(m, DType::u8, kFwd, "metadata");
    detail::check_device(m, o.device, kFwd, "metadata");
    MLA_CHECK((m.stride[0] == 1 || m.size(0) <= 1) && static_cast<std::size_t>(m.size(0)) >= meta_bytes &&
                  reinterpret_cast<uintptr_t>(m.data) % 16 == 0,
              "{}: metadata must be a contiguous, 16-byte aligned u8 buffer of at least plan.metadata.bytes() = {} "
              "bytes, got {} at {}",
              kFwd, meta_bytes, m.describe(), m.data);
    // On the CPU the copy is host-readable: it must be the plan's (the kernels trust its offsets and
    // lengths; stale or shifted metadata would fail an op after the cache was written).
    if (o.device.is_cpu())
      MLA_CHECK(std::memcmp(m.data, p.metadata.data.data(), meta_bytes) == 0,
                "{}: metadata does not hold this plan's step metadata (upload_step_metadata(plan, ...) after make_plan)",
                kFwd);
  }

  detail::check_defined(ws, kFwd, "workspace");
  detail::check_ndim(ws, 1, kFwd, "workspace");
  detail::check_dtype(ws, DType::u8, kFwd, "workspace");
  detail::check_device(ws, o.device, kFwd, "workspace");
  MLA_CHECK(ws.stride[0] == 1 || ws.size(0) <= 1, "{}: workspace must be contiguous, got {}", kFwd, ws.describe());
  MLA_CHECK(ws.size(0) >= need, "{}: this plan needs a workspace of {} bytes (workspace_bytes), got {}", kFwd, need,
            ws.describe());
  MLA_CHECK(need == 0 || reinterpret_cast<uintptr_t>(ws.data) % 16 == 0,
            "{}: workspace must be 16-byte aligned, got address {}", kFwd, ws.data);

  if (o.out_quant != OutputQuant::none) {
    // The quantised output is quantize_output(out_stage rows [0, t_act)) into out / out_scales.
    const TensorView staged(static_cast<uint8_t*>(ws.data) + layout.out_stage.offset, o.dtype, {f.t_act, d.h * d.V},
                            o.device);
    detail::check_quantize_output(staged, o.out_quant, a.out, a.out_scales, o.out_scale, kFwd);
  }

  if (o.device.is_cpu()) check_values(p, a, cache);
}

// Element (i, j) of a [rows, L] weight in any float dtype, on the host.
double weight_at(const TensorView& w, int64_t i, int64_t j) { return num::load(w.ptr_at({i, j}), w.dtype); }

}  // namespace

MlaAttention::MlaAttention(const LayerOptions& options, const TensorView& kv_b_proj_weight) : options_(options) {
  check_options(options_);
  const Dims d = Dims::of(options_);
  const TensorView& w = kv_b_proj_weight;
  constexpr const char* op = "MlaAttention";
  detail::check_defined(w, op, "kv_b_proj_weight");
  detail::check_ndim(w, 2, op, "kv_b_proj_weight [h * (P + V), L]");
  detail::check_size(w, 0, d.h * (d.P + d.V), op, "kv_b_proj_weight [h * (P + V), L]");
  detail::check_size(w, 1, d.L, op, "kv_b_proj_weight [h * (P + V), L]");
  MLA_CHECK(is_floating(w.dtype), "{}: kv_b_proj_weight must be a float tensor, got {}", op, w.describe());
  // fp8 checkpoints store e4m3 codes whose values are meaningful only with their block scales
  // (weight_scale_inv): dequantise first (DeepseekAttention does, docs/BLOCK.md).
  MLA_CHECK(w.dtype != DType::fp8_e4m3,
            "{}: kv_b_proj_weight is fp8_e4m3 codes without their weight_scale_inv block scales; dequantise it "
            "first (mla::dequantize_block_fp8) or build the block with DeepseekAttention", op);

  // Derive on the host in float64 from a host copy, round once to the layer dtype, then move.
  Tensor staged;
  TensorView host = w;
  if (w.device.is_cuda()) {
    MLA_CHECK(w.is_contiguous(), "{}: a CUDA kv_b_proj_weight must be contiguous, got {}", op, w.describe());
    staged = Tensor::empty({w.shape[0], w.shape[1]}, w.dtype, Device::cpu());
    copy(staged.view(), w);
    host = staged.view();
  }
  const DType t = options_.dtype;
  Tensor uk = Tensor::empty({d.h, d.P, d.L}, t), uv = Tensor::empty({d.h, d.L, d.V}, t),
         kvb = Tensor::empty({d.L, d.h * (d.P + d.V)}, t);
  for (int64_t n = 0; n < d.h; ++n) {
    const int64_t row0 = n * (d.P + d.V);  // per head: P nope rows, then V value rows
    for (int64_t l = 0; l < d.L; ++l) {
      for (int64_t p = 0; p < d.P; ++p) num::store(uk.view().ptr_at({n, p, l}), t, weight_at(host, row0 + p, l));
      for (int64_t v = 0; v < d.V; ++v) num::store(uv.view().ptr_at({n, l, v}), t, weight_at(host, row0 + d.P + v, l));
    }
  }
  for (int64_t l = 0; l < d.L; ++l)
    for (int64_t j = 0; j < d.h * (d.P + d.V); ++j) num::store(kvb.view().ptr_at({l, j}), t, weight_at(host, j, l));
  if (options_.device.is_cuda()) {
    w_uk_t_ = uk.to(options_.device);
    w_uv_ = uv.to(options_.device);
    w_kv_b_ = kvb.to(options_.device);
  } else {
    w_uk_t_ = std::move(uk);
    w_uv_ = std::move(uv);
    w_kv_b_ = std::move(kvb);
  }
}

std::size_t MlaAttention::workspace_bytes(const Plan& plan) const {
  check_config_matches(plan.config, options_, "the plan's config");
  check_dcp_matches(plan, options_);
  const StepFacts f = step_facts(plan, options_);
  return static_cast<std::size_t>(make_layout(plan_shape(plan, f, options_), Dims::of(options_)).total);
}

std::size_t MlaAttention::max_workspace_bytes(const PlannerConfig& config, int64_t max_num_tokens) const {
  config.validate();
  check_config_matches(config, options_, "the planner config");
  MLA_CHECK(max_num_tokens >= 0, "MlaAttention::max_workspace_bytes: max_num_tokens must be >= 0, got {}",
            max_num_tokens);
  return static_cast<std::size_t>(
      make_layout(bound_shape(config, max_num_tokens, options_), Dims::of(options_)).total);
}

void MlaAttention::forward(const Plan& plan, const ForwardArgs& args, const KVCache& cache,
                           const TensorView& workspace, const Context& ctx) const {
  detail::check_precision(ctx.precision, "MlaAttention::forward");
  // A plan is exactly what make_plan produced or it is refused here, before anything is written:
  // the steps below trust its values (lengths, chunk starts, metadata offsets) to be consistent.
  MLA_CHECK(plan.seal != 0, "{}: the plan is not sealed (Plan::seal is 0): build plans with make_plan", kFwd);
  const uint64_t digest = plan_digest(plan);
  MLA_CHECK(plan.seal == digest,
            "{}: the plan was modified after make_plan (seal {:#x}, digest now {:#x}); make a new plan instead "
            "of editing one", kFwd, plan.seal, digest);
  check_config_matches(plan.config, options_, "the plan's config");
  check_dcp_matches(plan, options_);
  StepFacts facts = step_facts(plan, options_);
  const Dims dims = Dims::of(options_);
  const WorkspaceLayout layout = make_layout(plan_shape(plan, facts, options_), dims);
  validate_forward(options_, plan, facts, args, cache, workspace, layout);

  // §16: the calibrating step reads max |kv_c| of its actual tokens (a host sync) before anything is
  // written; every step from then on reads and writes the cache with the calibrated scale.
  KVCache step_cache = cache;
  if (options_.kv_scales == KvScales::from_first_batch) {
    if (!kv_scale_ && facts.t_act > 0) calibrate_kv_scale(args.kv_c.slice(0, 0, facts.t_act),
                                                          workspace.data_as<uint8_t>() + layout.amax.offset, ctx);
    if (kv_scale_) step_cache.scale = *kv_scale_;
  }

  // Every kernel below reads the step's metadata from here; nothing is uploaded by forward().
  void* meta = args.metadata.defined() ? args.metadata.data : const_cast<int32_t*>(plan.metadata.data.data());
  const Step s{options_, *this, plan, args, step_cache, ctx, dims, std::move(facts), layout,
               workspace.data_as<uint8_t>(), meta};
  // 1. New tokens enter the cache first: decode and sparse prefill read them from there (§2.1).
  ctx.mark("write_cache");
  if (args.slot_mapping.size(0) > 0)
    write_cache(args.kv_c, args.k_pe, args.slot_mapping, step_cache, options_.ds_scale, ctx);
  if (options_.sparse) {
    ctx.mark("sparse");
    run_sparse(s);
  } else {
    run_dense_decode(s);
    run_dense_prefill(s);
  }
  if (options_.out_quant != OutputQuant::none) {
    // quantize(unfused output), §15: the staged rows into out / out_scales, padding rows zero. The fused
    // W_UV product wrote rows [0, t_cov) (and the padding when t_cov = t_act > 0); the staged rows
    // [t_cov, t_act) and the padding after them remain.
    const int64_t t_act = s.facts.t_act, t_cov = s.fused_rows();
    if (t_cov < t_act || t_act == 0) {
      ctx.mark("out_quant");
      const auto [codes, scales] = s.quantised_rows(t_cov, args.out.size(0));
      quantize_output(s.unquantised_out().slice(0, t_cov, t_act), options_.out_quant, codes, scales,
                      options_.out_scale, ctx);
    }
  }
  ctx.mark("end");
}

void MlaAttention::calibrate_kv_scale(const TensorView& kv_c, uint8_t* slot, const Context& ctx) const {
  const TensorView amax(slot, DType::f32, {1}, options_.device);
  abs_max(kv_c, amax, ctx);
  float m = 0;
  if (options_.device.is_cpu()) {
    m = *amax.data_as<float>();
  } else {
#if MLA_WITH_CUDA
    cuda_rt::memcpy_async(&m, amax.data, sizeof(float), ctx.stream, options_.device.index);
    cuda_rt::synchronize(options_.device.index);
#endif
  }
  MLA_CHECK(std::isfinite(m), "{}: kv_scales from_first_batch: max |kv_c| of the calibrating step is {}; a cache "
            "scale cannot be set from it (nothing was written)", kFwd, m);
  if (m > 0) kv_scale_ = m / kKScaleRange;
}

const char* to_string(KvScales k) {
  switch (k) {
    case KvScales::fixed: return "fixed";
    case KvScales::from_first_batch: return "from_first_batch";
  }
  return "invalid";
}

}  // namespace mla
