// SPDX-License-Identifier: Apache-2.0
// DeepseekAttention (mla/deepseek.h, docs/BLOCK.md): weight loading for a tensor-parallel rank (exact
// fp8 block dequantisation, or the e4m3 codes with their scales for w8a8), YaRN tables, and the
// forward step on the CPU and CUDA: projections through mla::gemm (or quantize_fp8_groups +
// gemm_fp8_block), RMSNorm and RoPE through mla::rms_norm / mla::apply_rope (mla/block_ops.h),
// MlaAttention in between.
//
// Workspace layout (own_bytes(T), each region a multiple of 256 bytes from the 16-byte aligned base,
// then MlaAttention's workspace; Tp = round_up(T, 4), the rows a w8a8 GEMM writes).
// The projections write a wide dtype (f32; f64 for the f64 block) so that RMSNorm and RoPE round once
// into the layer dtype, as a fused epilogue would:
//   q_a   [Tp, q_lora_rank]  wide   q_a_proj output, RMSNorm in place on the CPU (q_lora_rank > 0)
//   q_n   [Tp, q_lora_rank]  dtype  CUDA with a dequantised q_b_proj: RMSNorm(q_a) in bf16, its input
//   q_w   [Tp, h * (P + R)]  wide   q_b_proj / q_proj output
//   kv_w  [Tp, L + R]        wide   kv_a_proj_with_mqa output
//   q     [T, h * (P + R)]   dtype  q_nope | RoPE(q_pe) per head: MlaAttention's q
//   kv_c  [T, L]             dtype  RMSNorm of the latent
//   k_pe  [T, R]             dtype  RoPE(k_pe)
//   attn  [Tp, h * V]        dtype  MlaAttention output (before o_proj); unused with a w8a8 o_proj, whose
//                                   input the layer writes quantised into `codes` / `scales` below
//   w8a8 only (K = the widest input of an fp8 Linear):
//   codes [Tp, K] e4m3, then scales [K / 128, Tp] f32   one projection's quantised activations
//   o_pad [Tp, hidden]       dtype  o_proj output when T is not a multiple of 4 (copied into out)
#include "mla/deepseek.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "block/block_util.h"
#include "core/check.h"
#include "core/checked.h"
#include "core/numeric.h"
#include "mla/block_ops.h"
#include "mla/ops.h"

namespace mla {

namespace {

constexpr const char* kOp = "DeepseekAttention";
using block::bytes_overlap;
using block::check_weight_shape;
using block::region_bytes;

}  // namespace

Tensor dequantize_block_fp8(const DeepseekLinear& w, int block_rows, int block_cols, int64_t row0, int64_t rows,
                            int64_t col0, int64_t cols, DType dtype, const std::string& what) {
  const TensorView& v = w.weight;
  MLA_CHECK(v.defined() && v.ndim == 2 && v.device.is_cpu(), "{}: weight must be a 2-D host tensor, got {}", what,
            v.describe());
  MLA_CHECK(is_floating(v.dtype), "{}: weight must be a float tensor, got {}", what, v.describe());
  MLA_CHECK(row0 >= 0 && rows >= 0 && col0 >= 0 && cols >= 0 && row0 + rows <= v.shape[0] && col0 + cols <= v.shape[1],
            "{}: rows [{}, {}) x columns [{}, {}) are outside the weight {}", what, row0, row0 + rows, col0, col0 + cols,
            v.shape_str());
  const bool fp8 = v.dtype == DType::fp8_e4m3;
  const TensorView& s = w.weight_scale_inv;
  if (fp8) {
    MLA_CHECK(block_rows > 0 && block_cols > 0, "{}: block size must be positive, got {} x {}", what, block_rows,
              block_cols);
    MLA_CHECK(s.defined(), "{}: an fp8_e4m3 weight needs its weight_scale_inv block scales", what);
    const int64_t br = (v.shape[0] + block_rows - 1) / block_rows, bc = (v.shape[1] + block_cols - 1) / block_cols;
    MLA_CHECK(s.ndim == 2 && s.shape[0] == br && s.shape[1] == bc && s.device.is_cpu() && is_floating(s.dtype) &&
                  s.dtype != DType::fp8_e4m3,
              "{}: weight_scale_inv of a {} weight in {} x {} blocks must be a float host tensor [{}, {}], got {}", what,
              v.shape_str(), block_rows, block_cols, br, bc, s.describe());
    for (int64_t i = 0; i < br; ++i)
      for (int64_t j = 0; j < bc; ++j) {
        const double x = num::load(s.ptr_at({i, j}), s.dtype);
        MLA_CHECK(std::isfinite(x), "{}: weight_scale_inv[{}][{}] = {} is not finite", what, i, j, x);
      }
  } else {
    MLA_CHECK(!s.defined(), "{}: weight_scale_inv given for a {} weight (only fp8_e4m3 weights have block scales)",
              what, to_string(v.dtype));
  }
  Tensor out = Tensor::empty({rows, cols}, dtype);
  const TensorView o = out.view();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t gi = row0 + i, gj = col0 + j;
      double x = num::load(v.ptr_at({gi, gj}), v.dtype);
      MLA_CHECK(!std::isnan(x), "{}: element [{}][{}] is NaN", what, gi, gj);
      if (fp8) x *= num::load(s.ptr_at({gi / block_rows, gj / block_cols}), s.dtype);  // exact in float64
      num::store(o.ptr_at({i, j}), dtype, x);
    }
  return out;
}

std::vector<double> yarn_inv_freq(int dim, double theta, double factor, int64_t original_max_positions,
                                  double beta_fast, double beta_slow) {
  MLA_CHECK(dim > 0 && dim % 2 == 0 && theta > 0 && factor > 0, "yarn_inv_freq: needs an even dim > 0, theta > 0 "
            "and factor > 0, got dim {}, theta {}, factor {}", dim, theta, factor);
  std::vector<double> inv(static_cast<std::size_t>(dim / 2));
  // factor 1: plain RoPE (the ramp's two ends are the same frequency).
  if (factor == 1.0) {
    for (int i = 0; i < dim / 2; ++i) inv[i] = 1.0 / std::pow(theta, 2.0 * i / dim);
    return inv;
  }
  const auto orig = static_cast<double>(original_max_positions);
  auto corr_dim = [&](double rot) {
    return dim * std::log(orig / (rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  const double low = std::max(std::floor(corr_dim(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(theta, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[i] = ramp / (factor * pos_freq) + (1.0 - ramp) / pos_freq;
  }
  return inv;
}

namespace {

// YaRN inverse frequencies (DeepSeek's yarn_find_correction_range / linear ramp) and attention factor.
void yarn_tables(const DeepseekConfig& c, std::vector<double>& inv_freq, double& factor) {
  const int dim = c.qk_rope_head_dim;
  factor = 1.0;
  if (!c.has_yarn) {
    inv_freq = yarn_inv_freq(dim, c.rope_theta, 1.0, 1, 1.0, 1.0);
    return;
  }
  const double f = c.yarn_factor;
  inv_freq = yarn_inv_freq(dim, c.rope_theta, f, c.yarn_original_max_position_embeddings, c.yarn_beta_fast,
                           c.yarn_beta_slow);
  if (c.yarn_mscale != 0.0 && c.yarn_mscale_all_dim != 0.0)
    factor = yarn_mscale(f, c.yarn_mscale) / yarn_mscale(f, c.yarn_mscale_all_dim);
  else
    factor = yarn_mscale(f, 1.0);
}

}  // namespace

TensorView DeepseekAttention::Linear::scale_view() const {
  const int64_t nb = scales.size(0), kb = in / 128;
  const int64_t shape[2] = {nb, kb}, stride[2] = {scales.size(1), 1};
  return TensorView(const_cast<void*>(scales.data()), DType::f32, std::span<const int64_t>(shape, 2),
                    std::span<const int64_t>(stride, 2), scales.device());
}

// Rows [row0, row0 + rows) x columns [col0, col0 + cols) of a published [out, in] weight, on the
// block's device: e4m3 codes and padded block scales (w8a8, when the slice is block-aligned), else
// dequantised, transposed, in the layer dtype.
DeepseekAttention::Linear DeepseekAttention::make_linear(const DeepseekLinear& w, const std::string& name, int64_t row0,
                                                         int64_t rows, int64_t col0, int64_t cols) const {
  const DeepseekConfig& c = config_;
  const Device dev = options_.device;
  Linear l;
  l.name = name;
  l.in = cols;
  l.out = rows;
  const int br = c.weight_block_rows, bc = c.weight_block_cols;
  const bool fp8 = w.weight.dtype == DType::fp8_e4m3;
  MLA_CHECK(!options_.fp8_activations || fp8,
            "{}: fp8_activations needs fp8 weights with block scales, but {} is {}", kOp, name, to_string(w.weight.dtype));
  const bool aligned = br == 128 && bc == 128 && row0 % 128 == 0 && col0 % 128 == 0 && cols % 128 == 0 &&
                       (rows % 128 == 0 || row0 + rows == w.weight.shape[0]) &&
                       (!dev.is_cuda() || rows % 16 == 0);
  if (!(options_.fp8_activations && aligned)) {
    Tensor t = block::rank_weight_t(w, c.weight_block_rows, c.weight_block_cols, row0, rows, col0, cols, options_.dtype, name);
    l.w_t = dev.is_cuda() ? t.to(dev) : std::move(t);
    return l;
  }
  // Validates the codes and scales (NaN codes, non-finite scales, shapes) as the dequantised form does.
  (void)dequantize_block_fp8(w, br, bc, row0, rows, col0, cols, DType::bf16, name);
  Tensor codes = Tensor::empty({rows, cols}, DType::fp8_e4m3);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(codes.view().ptr_at({i, 0}), w.weight.ptr_at({row0 + i, col0}), static_cast<std::size_t>(cols));
  const int64_t nb = (rows + 127) / 128, kb = cols / 128, kb4 = (kb + 3) / 4 * 4;
  Tensor scales = Tensor::zeros({nb, kb4}, DType::f32);
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < kb; ++j)
      static_cast<float*>(scales.data())[i * kb4 + j] = static_cast<float>(
          num::load(w.weight_scale_inv.ptr_at({row0 / 128 + i, col0 / 128 + j}), w.weight_scale_inv.dtype));
  l.codes = dev.is_cuda() ? codes.to(dev) : std::move(codes);
  l.scales = dev.is_cuda() ? scales.to(dev) : std::move(scales);
  return l;
}

bool DeepseekAttention::projection_is_fp8(const std::string& name) const {
  for (const Linear* l : {&q_a_, &q_b_, &q_, &kv_a_, &o_})
    if (l->name == name) return l->codes.defined();
  return false;
}

int64_t DeepseekAttention::max_fp8_in() const {
  int64_t k = 0;
  for (const Linear* l : {&q_a_, &q_b_, &q_, &kv_a_, &o_})
    if (l->codes.defined()) k = std::max(k, l->in);
  return k;
}

DeepseekAttention::DeepseekAttention(const DeepseekConfig& config, const DeepseekWeights& w,
                                     const DeepseekOptions& options)
    : config_(config), options_(options) {
  const DeepseekConfig& c = config_;
  MLA_CHECK(options.tp >= 1 && options.rank >= 0 && options.rank < options.tp,
            "{}: rank {} is not in [0, tp = {})", kOp, options.rank, options.tp);
  MLA_CHECK(options.device.is_cpu() || options.device.is_cuda(), "{}: runs on the CPU or CUDA, got device {}", kOp,
            to_string(options.device));
  MLA_CHECK(options.dtype == DType::bf16 || options.dtype == DType::f32 || options.dtype == DType::f64,
            "{}: computes in bf16, f32 or f64, got {}", kOp, to_string(options.dtype));
  MLA_CHECK(options.device.is_cpu() || options.dtype == DType::bf16, "{}: the CUDA block computes in bf16, got {}",
            kOp, to_string(options.dtype));
  check_cache_format(options.cache_format, kOp);
  MLA_CHECK(!cache_format_info(options.cache_format).record,
            "{}: the {} cache format holds DeepSeek-V4 records, which the V2 / V3 block does not read; it takes "
            "bf16, fp8, fp8_ds_mla or f64",
            kOp, to_string(options.cache_format));
  MLA_CHECK(options.device.is_cpu() || cache_format_info(options.cache_format).device,
            "{}: the {} cache format is CPU-only (the float64 oracle's cache); the CUDA block takes {}", kOp,
            to_string(options.cache_format), device_cache_format_names());
  dims_ = c.dims(options.tp);
  const int64_t H = c.hidden_size, h = dims_.num_heads, L = c.kv_lora_rank, P = c.qk_nope_head_dim,
                R = c.qk_rope_head_dim, V = c.v_head_dim, head0 = options.rank * h;
  const Device dev = options.device;
  // Norm weights: f64 on the CPU (the oracle's exact values), f32 on CUDA (exact for bf16 / f32 checkpoints).
  auto norm = [&](const TensorView& t, int64_t n, const char* what) {
    return block::norm_on_device(block::norm_weight(t, n, kOp, what), dev);
  };
  if (c.q_lora_rank > 0) {
    MLA_CHECK(!w.q_proj.weight.defined(), "{}: q_lora_rank = {} uses q_a_proj / q_b_proj, but q_proj was given", kOp,
              c.q_lora_rank);
    check_weight_shape(w.q_a_proj, c.q_lora_rank, H, kOp, "q_a_proj");
    check_weight_shape(w.q_b_proj, int64_t{c.num_attention_heads} * (P + R), c.q_lora_rank, kOp, "q_b_proj");
    q_a_ = make_linear(w.q_a_proj, "q_a_proj", 0, c.q_lora_rank, 0, H);
    q_b_ = make_linear(w.q_b_proj, "q_b_proj", head0 * (P + R), h * (P + R), 0, c.q_lora_rank);
    q_a_norm_ = norm(w.q_a_layernorm, c.q_lora_rank, "q_a_layernorm");
  } else {
    MLA_CHECK(!w.q_a_proj.weight.defined() && !w.q_b_proj.weight.defined(),
              "{}: q_lora_rank is null (V2-Lite: q_proj), but q_a_proj / q_b_proj were given", kOp);
    check_weight_shape(w.q_proj, int64_t{c.num_attention_heads} * (P + R), H, kOp, "q_proj");
    q_ = make_linear(w.q_proj, "q_proj", head0 * (P + R), h * (P + R), 0, H);
  }
  check_weight_shape(w.kv_a_proj_with_mqa, L + R, H, kOp, "kv_a_proj_with_mqa");
  kv_a_ = make_linear(w.kv_a_proj_with_mqa, "kv_a_proj_with_mqa", 0, L + R, 0, H);
  kv_a_norm_ = norm(w.kv_a_layernorm, L, "kv_a_layernorm");
  check_weight_shape(w.o_proj, H, int64_t{c.num_attention_heads} * V, kOp, "o_proj");
  o_ = make_linear(w.o_proj, "o_proj", 0, H, head0 * V, h * V);
  check_weight_shape(w.kv_b_proj, int64_t{c.num_attention_heads} * (P + V), L, kOp, "kv_b_proj");
  // Absorption (W_UK_T, W_UV) from the dequantised rank slice, exact in float64.
  const Tensor kv_b = dequantize_block_fp8(w.kv_b_proj, c.weight_block_rows, c.weight_block_cols, head0 * (P + V),
                                           h * (P + V), 0, L, DType::f64, "kv_b_proj");
  yarn_tables(c, inv_freq_, rope_factor_);
  Tensor inv = Tensor::empty({static_cast<int64_t>(inv_freq_.size())}, DType::f64);
  std::copy(inv_freq_.begin(), inv_freq_.end(), static_cast<double*>(inv.data()));
  inv_freq_t_ = dev.is_cuda() ? inv.to(dev) : std::move(inv);

  LayerOptions lo;
  lo.dims = dims_;
  lo.cache_format = options.cache_format;
  lo.sparse = options.sparse;
  lo.ds_scale = options.ds_scale;
  lo.device = options.device;
  lo.dtype = options.dtype;
  // A w8a8 o_proj reads its input as 1 x 128 fp8 groups: the layer writes them itself (fused output
  // quantisation, docs/SEMANTICS.md §15), with the same codes and scales quantize_fp8_groups gives.
  if (o_.codes.defined()) lo.out_quant = OutputQuant::fp8_group128;
  lo.fp8_prefill = options.fp8_prefill;  // cache format, sparse and scales: checked by the layer
  lo.fp8_prefill_scales = options.fp8_prefill_scales;
  attention_.emplace(lo, kv_b.view());
}

DeepseekAttention DeepseekAttention::load(const Checkpoint& ck, const DeepseekConfig& config, int layer,
                                          const DeepseekOptions& options) {
  block::LayerTensors t(ck, layer, kOp);
  DeepseekWeights w;
  if (config.q_lora_rank > 0) {
    w.q_a_proj = t.linear("q_a_proj");
    w.q_b_proj = t.linear("q_b_proj");
    w.q_a_layernorm = t.tensor("q_a_layernorm.weight");
  } else {
    w.q_proj = t.linear("q_proj");
  }
  w.kv_a_proj_with_mqa = t.linear("kv_a_proj_with_mqa");
  w.kv_a_layernorm = t.tensor("kv_a_layernorm.weight");
  w.kv_b_proj = t.linear("kv_b_proj");
  w.o_proj = t.linear("o_proj");
  return DeepseekAttention(config, w, options);
}

PlannerConfig DeepseekAttention::planner_config() const {
  PlannerConfig pc;
  pc.dims = dims_;
  pc.cache_format = options_.cache_format;
  pc.sparse = options_.sparse;
  if (options_.device.is_cuda()) {  // the device facts the planner and the layer's kernel choices read
    pc.num_sms = multiprocessor_count(options_.device);
    pc.compute_capability = compute_capability(options_.device);
  }
  return pc;
}

DType DeepseekAttention::wide_dtype() const { return options_.dtype == DType::f64 ? DType::f64 : DType::f32; }

// Rows of the projection scratch: the step's tokens rounded up to 4 (a w8a8 GEMM writes the padding
// rows of its quantised activations too: cuBLASLt's token-scale layout, mla/block_ops.h).
static int64_t padded_rows(int64_t T) { return (T + 3) / 4 * 4; }

std::size_t DeepseekAttention::own_bytes(int64_t T) const {
  const DeepseekConfig& c = config_;
  const DType t = options_.dtype, w = wide_dtype();
  const int64_t h = dims_.num_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim, Tp = padded_rows(T);
  std::size_t n = 0;
  if (c.q_lora_rank > 0) {
    n += region_bytes(Tp, c.q_lora_rank, w, "q_a workspace");
    if (bf16_q_n()) n += region_bytes(Tp, c.q_lora_rank, t, "q_n workspace");
  }
  n += region_bytes(Tp, h * c.qk_head_dim(), w, "q_w workspace");
  n += region_bytes(Tp, L + R, w, "kv_w workspace");
  n += region_bytes(T, h * c.qk_head_dim(), t, "q workspace");
  n += region_bytes(T, L, t, "kv_c workspace");
  n += region_bytes(T, R, t, "k_pe workspace");
  n += region_bytes(Tp, h * c.v_head_dim, t, "attn workspace");
  if (const int64_t k = max_fp8_in(); k > 0) {
    n += region_bytes(Tp, k, DType::fp8_e4m3, "fp8 activation codes");
    n += region_bytes(k / 128, Tp, DType::f32, "fp8 activation scales");
    if (o_.codes.defined()) n += region_bytes(Tp, c.hidden_size, t, "o_proj padded output");
  }
  return n;
}

std::size_t DeepseekAttention::workspace_bytes(const Plan& plan) const {
  return own_bytes(plan.num_tokens) + attention_->workspace_bytes(plan);
}

std::size_t DeepseekAttention::max_workspace_bytes(const PlannerConfig& config, int64_t max_num_tokens) const {
  MLA_CHECK(max_num_tokens >= 0, "{}::max_workspace_bytes: max_num_tokens must be >= 0, got {}", kOp, max_num_tokens);
  return own_bytes(max_num_tokens) + attention_->max_workspace_bytes(config, max_num_tokens);
}

void DeepseekAttention::forward(const Plan& plan, const DeepseekForwardArgs& a, const KVCache& cache,
                                const TensorView& workspace, const Context& ctx) const {
  constexpr const char* op = "DeepseekAttention::forward";
  const DeepseekConfig& c = config_;
  const DType t = options_.dtype;
  const int64_t T = plan.num_tokens, t_act = plan.num_actual_tokens, H = c.hidden_size, h = dims_.num_heads,
                L = c.kv_lora_rank, P = c.qk_nope_head_dim, R = c.qk_rope_head_dim, V = c.v_head_dim;
  // The block's own arguments; MlaAttention::forward validates the rest (and the workspace tail)
  // before anything is written. Nothing here writes before these checks.
  for (const auto& [view, name] : {std::pair{&a.hidden, "hidden [T, hidden_size]"}, {&a.out, "out [T, hidden_size]"}}) {
    block::check_token_rows(*view, T, H, t, options_.device, op, name);
  }
  detail::check_defined(a.positions, op, "positions");
  detail::check_ndim(a.positions, 1, op, "positions [T]");
  detail::check_index(a.positions, op, "positions");
  detail::check_device(a.positions, options_.device, op, "positions");
  MLA_CHECK(a.positions.size(0) >= t_act, "{}: positions must hold at least num_actual_tokens = {} entries, got {}",
            op, t_act, a.positions.describe());
  // Values are checked where they are host-readable; a CUDA step rotates by whatever angle it is given
  // (the kernel reads positions[0, t_act) only).
  for (int64_t i = 0; a.positions.device.is_cpu() && i < t_act; ++i) {
    const int64_t pos = num::load_index(a.positions.ptr_at({i}), a.positions.dtype);
    MLA_CHECK(pos >= 0 && pos < plan.config.max_model_len, "{}: positions[{}] = {} is outside [0, max_model_len = {})",
              op, i, pos, plan.config.max_model_len);
  }
  const std::size_t own = own_bytes(T);
  detail::check_defined(workspace, op, "workspace");
  detail::check_ndim(workspace, 1, op, "workspace");
  detail::check_dtype(workspace, DType::u8, op, "workspace");
  detail::check_device(workspace, options_.device, op, "workspace");
  MLA_CHECK(workspace.stride[0] == 1 && static_cast<std::size_t>(workspace.size(0)) >= workspace_bytes(plan) &&
                reinterpret_cast<uintptr_t>(workspace.data) % 16 == 0,
            "{}: workspace must be a contiguous, 16-byte aligned u8 buffer of at least workspace_bytes(plan) = {} "
            "bytes, got {} at {}", op, workspace_bytes(plan), workspace.describe(), workspace.data);
  MLA_CHECK(!(a.hidden.data == a.out.data && t_act > 0), "{}: out must not alias hidden", op);
  // out's rows must neither overlap nor run backwards, and out must not share a byte with hidden or
  // the workspace: the projections that write it run after the cache was written, so each of these
  // would otherwise fail (or corrupt an input) after a write.
  detail::check_strides(a.out, true, op, "out [T, hidden_size]");
  detail::check_strides(a.hidden, false, op, "hidden [T, hidden_size]");
  MLA_CHECK(t_act <= 1 || a.out.stride[0] >= H, "{}: out's rows overlap (row stride {} < hidden_size {}), got {}", op,
            a.out.stride[0], H, a.out.describe());
  if (t_act > 0) {
    const TensorView y = a.out.slice(0, 0, t_act);
    for (const auto& [view, name] : {std::pair{&a.hidden, "hidden"}, {&workspace, "workspace"}})
      MLA_CHECK(!bytes_overlap(y, *view), "{}: out overlaps {}: got out {} at {} and {} {} at {}", op, name,
                y.describe(), y.data, name, view->describe(), view->data);
  }

  // Carve the workspace (layout at the top of this file).
  auto* base = static_cast<std::byte*>(workspace.data);
  std::size_t off = 0;
  const int64_t Tp = padded_rows(T);
  auto region = [&](int64_t rows, int64_t cols, DType dt, const char* what) {
    TensorView v(base + off, dt, {rows, cols}, options_.device);
    off += region_bytes(rows, cols, dt, what);
    return v;
  };
  const DType w = wide_dtype();
  const TensorView q_a = c.q_lora_rank > 0 ? region(Tp, c.q_lora_rank, w, "q_a") : TensorView{};
  // The normalised q latent: in place in the wide dtype, except for a dequantised q_b_proj on CUDA, whose
  // cuBLAS GEMM takes bf16 (a w8a8 q_b_proj quantises the wide values, as the CPU does).
  const TensorView q_n = c.q_lora_rank > 0 ? (bf16_q_n() ? region(Tp, c.q_lora_rank, t, "q_n") : q_a) : TensorView{};
  const TensorView q_w = region(Tp, h * (P + R), w, "q_w"), kv_w = region(Tp, L + R, w, "kv_w");
  const TensorView q = region(T, h * (P + R), t, "q"), kv_c = region(T, L, t, "kv_c"), k_pe = region(T, R, t, "k_pe"),
                   attn = region(Tp, h * V, t, "attn");
  std::byte* act = nullptr;
  TensorView o_pad;
  if (const int64_t k = max_fp8_in(); k > 0) {
    act = base + off;
    off += region_bytes(Tp, k, DType::fp8_e4m3, "fp8 activation codes") +
           region_bytes(k / 128, Tp, DType::f32, "fp8 activation scales");
    if (o_.codes.defined()) o_pad = region(Tp, H, t, "o_proj padded output");
  }
  const TensorView inner(base + own, DType::u8, {workspace.size(0) - static_cast<int64_t>(own)}, options_.device);

  // Projections of the actual tokens (padding rows of the scratch stay unwritten: the layer ignores them).
  const TensorView x = a.hidden.slice(0, 0, t_act);
  auto rows = [&](const TensorView& v) { return v.slice(0, 0, t_act); };
  if (t_act > 0) {
    // kv_a_proj right after the first q projection: both read the hidden states, so a w8a8 pair shares
    // one activation quantisation.
    const Linear& q_first = c.q_lora_rank > 0 ? q_a_ : q_;
    project(q_first, x, c.q_lora_rank > 0 ? q_a : q_w, act, ctx);
    project(kv_a_, x, kv_w, act, ctx, q_first.codes.defined() && kv_a_.codes.defined());
    if (c.q_lora_rank > 0) {
      rms_norm(rows(q_a), q_a_norm_.view(), rows(q_n), c.rms_norm_eps, ctx);
      project(q_b_, rows(q_n), q_w, act, ctx);
    }
    rms_norm(rows(kv_w.slice(1, 0, L)), kv_a_norm_.view(), rows(kv_c), c.rms_norm_eps, ctx);
    // q: nope columns copied, rope columns rotated, per head; k_pe rotated.
    apply_rope(rows(q_w).reshape({t_act, h, P + R}), rows(q).reshape({t_act, h, P + R}), a.positions,
               inv_freq_t_.view(), rope_factor_, R, c.rope_interleave, ctx);
    apply_rope(rows(kv_w.slice(1, L, L + R)).unsqueeze(1), rows(k_pe).unsqueeze(1), a.positions, inv_freq_t_.view(),
               rope_factor_, R, c.rope_interleave, ctx);
  }
  ForwardArgs fa;
  fa.q = q.reshape({T, h, P + R});
  fa.kv_c = kv_c;
  fa.k_pe = k_pe;
  fa.slot_mapping = a.slot_mapping;
  fa.block_table = a.block_table;
  fa.seq_lens = a.seq_lens;
  fa.topk_indices = a.topk_indices;
  fa.metadata = a.metadata;
  if (o_.codes.defined()) {
    // The layer writes o_proj's quantised input straight into the activation codes / scales that
    // project() hands to gemm_fp8_block (round_up(t_act, 4) rows, padding rows zero).
    const int64_t tp = padded_rows(t_act), k = o_.in;
    fa.out = TensorView(act, DType::fp8_e4m3, {tp, k}, options_.device);
    fa.out_scales = TensorView(act + region_bytes(tp, k, DType::fp8_e4m3, "fp8 activation codes"), DType::f32,
                               {k / 128, tp}, options_.device);
  } else {
    fa.out = attn.slice(0, 0, T);
  }
  attention_->forward(plan, fa, cache, inner, ctx);
  if (t_act == 0) return;
  const TensorView y = a.out.slice(0, 0, t_act);
  const bool quantised = o_.codes.defined();
  if (!o_.codes.defined() || t_act % 4 == 0) {
    project(o_, rows(attn), y, act, ctx, quantised);
  } else {
    // w8a8 writes round_up(t_act, 4) rows: into the padded scratch, then the actual rows into out
    // (apply_rope with rope_dim 0 is a converting copy).
    project(o_, rows(attn), o_pad, act, ctx, quantised);
    apply_rope(rows(o_pad).unsqueeze(1), y.unsqueeze(1), a.positions, inv_freq_t_.view().slice(0, 0, 0), 1.0, 0,
               false, ctx);
  }
}

bool DeepseekAttention::bf16_q_n() const {
  return config_.q_lora_rank > 0 && options_.device.is_cuda() && !q_b_.codes.defined();
}

void DeepseekAttention::project(const Linear& l, const TensorView& x, const TensorView& y, std::byte* act,
                                const Context& ctx, bool x_quantised) const {
  const int64_t t = x.size(0);
  if (!l.codes.defined()) {
    gemm(x, l.w_t.view(), y.slice(0, 0, t), 1.0f, 0.0f, ctx);
    return;
  }
  // w8a8: quantise x in 1 x 128 groups into round_up(t, 4) rows of codes (padding rows zero), then the
  // block-scaled GEMM over all of them.
  const int64_t tp = padded_rows(t), k = l.in;
  const TensorView codes(act, DType::fp8_e4m3, {tp, k}, options_.device);
  const TensorView scales(act + region_bytes(tp, k, DType::fp8_e4m3, "fp8 activation codes"), DType::f32,
                          {k / 128, tp}, options_.device);
  if (!x_quantised) quantize_fp8_groups(x, codes, scales, ctx);
  gemm_fp8_block(codes, scales, l.codes.view(), l.scale_view(), y.slice(0, 0, tp), ctx);
}

}  // namespace mla
