// SPDX-License-Identifier: Apache-2.0
// DeepseekV4Attention (mla/deepseek_v4.h, docs/SEMANTICS.md §17): weight loading for a rank, the layer's
// RoPE table, and the step on the CPU or CUDA: projections through mla::gemm, RMSNorm and RoPE through
// mla::rms_norm / mla::apply_rope, the caches written by write_cache, each token's window by
// sliding_window_positions and convert_topk_indices, the attention by sparse_mqa with the V4 options (sink,
// extra cache, whole-row values), the inverse RoPE by apply_rope with negated frequencies, and the grouped
// low-rank o projection as one GEMM per group plus o_b_proj. Every op runs on the block's device; on CUDA the
// step reads no device value on the host (graph-capturable), so the device-side indices are not checked
// there (the ops skip slots outside the cache and read only listed rows).
//
// Workspace layout (own_bytes(T, K), each region a multiple of 256 bytes from the 16-byte aligned base;
// wide = f32, f64 for the f64 block; D = head_dim, h = heads of the rank, W = sliding_window):
//   q_a      [T, q_lora_rank]  wide   q_a_proj output, RMSNorm in place on the CPU: q_b_proj's input
//   q_n      [T, q_lora_rank]  dtype  CUDA only: RMSNorm(q_a) in bf16, q_b_proj's input (cuBLAS reads bf16)
//   q_w      [T, h * D]        wide   q_b_proj output, the per-head RMSNorm in place (V4)
//   kv_w     [T, D]            wide   kv_proj output, RMSNorm in place
//   q        [T, h * D]        dtype  RoPE(q_w): sparse_mqa's query
//   kv       [T, D]            dtype  RoPE(kv_w): the cache row of each token
//   attn     [T, h * D]        dtype  sparse_mqa output, inverse RoPE in place: o_a_proj's input
//   o_a      [T, G_r * o_lora] dtype  o_a_proj output of the rank's G_r groups: o_b_proj's input
//   win_pos  [T, W]            int32  request-local positions of each token's window (-1: before 0)
//   win_rows [T, W]            int32  the same as main-cache rows (convert_topk_indices)
//   ext_rows [T, K]            int32  extra_topk as extra-cache rows (layers with an extra cache)
#include "mla/deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "block/block_util.h"
#include "core/check.h"
#include "core/numeric.h"
#include "mla/block_ops.h"
#include "mla/ops.h"

namespace mla {

namespace {

constexpr const char* kOp = "DeepseekV4Attention";

using block::region_bytes;

Tensor f64_vector(const std::vector<double>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::f64);
  std::copy(v.begin(), v.end(), static_cast<double*>(t.data()));
  return t;
}

void check_index_vector(const TensorView& v, int64_t n, Device dev, const char* op, const char* name) {
  detail::check_defined(v, op, name);
  detail::check_ndim(v, 1, op, name);
  detail::check_index(v, op, name);
  detail::check_device(v, dev, op, name);
  detail::check_size(v, 0, n, op, name);
}

void check_int32_matrix(const TensorView& v, int64_t rows, Device dev, const char* op, const char* name) {
  detail::check_defined(v, op, name);
  detail::check_ndim(v, 2, op, name);
  detail::check_dtype(v, DType::i32, op, name);
  detail::check_device(v, dev, op, name);
  if (rows >= 0) detail::check_size(v, 0, rows, op, name);
}

// Slots of a slot mapping are -1 (or any negative: not written) or rows of the cache (host slots only).
void check_slots(const TensorView& slots, const KVCache& cache, const char* op, const char* name) {
  for (int64_t i = 0; slots.device.is_cpu() && i < slots.size(0); ++i) {
    const int64_t s = num::load_index(slots.ptr_at({i}), slots.dtype);
    MLA_CHECK(s < cache.num_slots(), "{}: {}[{}] = {} is outside the cache's {} slots", op, name, i, s,
              cache.num_slots());
  }
}

}  // namespace

DeepseekV4Attention::DeepseekV4Attention(const DeepseekV4Config& config, int layer, const DeepseekV4Weights& w,
                                         const DeepseekV4Options& options)
    : config_(config), options_(options), layer_(layer) {
  const DeepseekV4Config& c = config_;
  c.validate();
  MLA_CHECK(options.device.is_cpu() || options.device.is_cuda(), "{}: runs on the CPU or CUDA, got device {}", kOp,
            to_string(options.device));
  MLA_CHECK(options.dtype == DType::bf16 || options.dtype == DType::f32 || options.dtype == DType::f64,
            "{}: computes in bf16, f32 or f64, got {}", kOp, to_string(options.dtype));
  MLA_CHECK(options.device.is_cpu() || options.dtype == DType::bf16, "{}: the CUDA block computes in bf16, got {}",
            kOp, to_string(options.dtype));
  MLA_CHECK(options.tp >= 1 && options.rank >= 0 && options.rank < options.tp, "{}: rank {} is not in [0, tp = {})",
            kOp, options.rank, options.tp);
  MLA_CHECK(c.o_groups % options.tp == 0,
            "{}: tensor-parallel size {} must divide o_groups = {} (a rank holds whole groups of heads)", kOp,
            options.tp, c.o_groups);
  check_cache_format(options.cache_format, kOp);
  check_cache_format(options.extra_cache_format, kOp);
  for (const CacheFormat f : {options.cache_format, options.extra_cache_format}) {
    const CacheFormatInfo& info = cache_format_info(f);
    MLA_CHECK(info.admits(c.head_dim, c.qk_rope_head_dim),
              "{}: the {} cache format cannot hold rows of head_dim {} with {} rope columns", kOp, to_string(f),
              c.head_dim, c.qk_rope_head_dim);
    MLA_CHECK(f != CacheFormat::fp8 && f != CacheFormat::fp8_ds_mla,
              "{}: the V4 block takes the bf16, f64, v4, v41 or v41_fp4 cache formats, got {}", kOp, to_string(f));
    MLA_CHECK(options.device.is_cpu() || info.device,
              "{}: the {} cache format is CPU-only (the float64 oracle's cache); the CUDA block takes bf16, v4, v41 or "
              "v41_fp4", kOp, to_string(f));
  }
  MLA_CHECK(options.cache_format == options.extra_cache_format ||
                (cache_format_info(options.cache_format).record && cache_format_info(options.extra_cache_format).record),
            "{}: the extra cache must have the main cache's format, or both must be V4 records (v4, v41, v41_fp4), "
            "got {} and {}", kOp, to_string(options.cache_format), to_string(options.extra_cache_format));
  ratio_ = c.compress_ratio(layer);
  MLA_CHECK(ratio_ >= 0, "{}: layer {} has a negative compression ratio {}", kOp, layer, ratio_);
  const int64_t H = c.hidden_size, D = c.head_dim, G = c.o_groups, OL = c.o_lora_rank, QL = c.q_lora_rank,
                heads_all = c.num_attention_heads, hpg = heads_all / G;
  heads_ = static_cast<int>(heads_all / options.tp);
  groups_ = static_cast<int>(G / options.tp);
  const int64_t head0 = int64_t{options.rank} * heads_, g0 = int64_t{options.rank} * groups_;
  const DType t = options.dtype;
  const int br = c.weight_block_rows, bc = c.weight_block_cols;
  block::check_weight_shape(w.q_a_proj, QL, H, kOp, "q_a_proj");
  block::check_weight_shape(w.q_b_proj, heads_all * D, QL, kOp, "q_b_proj");
  block::check_weight_shape(w.kv_proj, D, H, kOp, "kv_proj");
  block::check_weight_shape(w.o_a_proj, G * OL, hpg * D, kOp, "o_a_proj");
  block::check_weight_shape(w.o_b_proj, H, G * OL, kOp, "o_b_proj");
  q_a_t_ = block::rank_weight_t(w.q_a_proj, br, bc, 0, QL, 0, H, t, "q_a_proj");
  q_b_t_ = block::rank_weight_t(w.q_b_proj, br, bc, head0 * D, heads_ * D, 0, QL, t, "q_b_proj");
  kv_t_ = block::rank_weight_t(w.kv_proj, br, bc, 0, D, 0, H, t, "kv_proj");
  for (int64_t g = 0; g < groups_; ++g)
    o_a_t_.push_back(block::rank_weight_t(w.o_a_proj, br, bc, (g0 + g) * OL, OL, 0, hpg * D, t, "o_a_proj"));
  o_b_t_ = block::rank_weight_t(w.o_b_proj, br, bc, 0, H, g0 * OL, groups_ * OL, t, "o_b_proj");
  q_a_norm_ = block::norm_weight(w.q_a_norm, QL, kOp, "q_a_norm");
  kv_norm_ = block::norm_weight(w.kv_norm, D, kOp, "kv_norm");
  ones_ = f64_vector(std::vector<double>(static_cast<std::size_t>(D), 1.0));
  // Sinks: fp32 (sparse_mqa's type; exact for bf16 / fp32 checkpoints); -inf is no sink, NaN refused.
  const TensorView& s = w.sinks;
  MLA_CHECK(s.defined() && s.ndim == 1 && s.shape[0] == heads_all && s.device.is_cpu() && is_floating(s.dtype) &&
                s.dtype != DType::fp8_e4m3,
            "{}: sinks must be a float host tensor [{}], got {}", kOp, heads_all, s.describe());
  sinks_ = Tensor::empty({heads_}, DType::f32);
  for (int64_t i = 0; i < heads_; ++i) {
    const double x = num::load(s.ptr_at({head0 + i}), s.dtype);
    MLA_CHECK(!std::isnan(x), "{}: sinks[{}] is NaN", kOp, head0 + i);
    static_cast<float*>(sinks_.data())[i] = static_cast<float>(x);
  }
  // RoPE of the layer: plain with rope_theta for sliding-only layers, YaRN with compress_rope_theta for
  // layers with a compressor; cos / sin unscaled in both.
  const int R = c.qk_rope_head_dim;
  if (ratio_ == 0 || !c.compress_yarn)
    inv_freq_ = yarn_inv_freq(R, ratio_ == 0 ? c.rope_theta : c.compress_rope_theta, 1.0, 1, 1.0, 1.0);
  else
    inv_freq_ = yarn_inv_freq(R, c.compress_rope_theta, c.yarn_factor, c.yarn_original_max_position_embeddings,
                              c.yarn_beta_fast, c.yarn_beta_slow);
  inv_freq_t_ = f64_vector(inv_freq_);
  std::vector<double> neg(inv_freq_);
  for (double& x : neg) x = -x;
  neg_inv_freq_t_ = f64_vector(neg);
  // On CUDA every tensor the step reads lives on the device: the weights in the layer dtype, the norm weights
  // and the per-head norm's ones as f32 (exact for bf16 / f32 checkpoints; rms_norm's CUDA weight type), the sinks
  // f32, the RoPE tables f64.
  const Device dev = options.device;
  if (dev.is_cuda()) {
    q_a_t_ = q_a_t_.to(dev);
    q_b_t_ = q_b_t_.to(dev);
    kv_t_ = kv_t_.to(dev);
    o_b_t_ = o_b_t_.to(dev);
    for (Tensor& g : o_a_t_) g = g.to(dev);
    q_a_norm_ = block::norm_on_device(q_a_norm_, dev);
    kv_norm_ = block::norm_on_device(kv_norm_, dev);
    ones_ = block::norm_on_device(ones_, dev);
    sinks_ = sinks_.to(dev);
    inv_freq_t_ = inv_freq_t_.to(dev);
    neg_inv_freq_t_ = neg_inv_freq_t_.to(dev);
  }
}

DeepseekV4Attention DeepseekV4Attention::load(const Checkpoint& ck, const DeepseekV4Config& config, int layer,
                                              const DeepseekV4Options& options) {
  block::LayerTensors t(ck, layer, kOp);
  DeepseekV4Weights w;
  w.q_a_proj = t.linear("q_a_proj");
  w.q_b_proj = t.linear("q_b_proj");
  w.kv_proj = t.linear("kv_proj");
  w.o_a_proj = t.linear("o_a_proj");
  w.o_b_proj = t.linear("o_b_proj");
  w.q_a_norm = t.tensor("q_a_norm.weight");
  w.kv_norm = t.tensor("kv_norm.weight");
  w.sinks = t.tensor("sinks");
  return DeepseekV4Attention(config, layer, w, options);
}

DType DeepseekV4Attention::wide_dtype() const { return options_.dtype == DType::f64 ? DType::f64 : DType::f32; }

std::size_t DeepseekV4Attention::own_bytes(int64_t T, int64_t K) const {
  const DeepseekV4Config& c = config_;
  const DType t = options_.dtype, w = wide_dtype();
  const int64_t D = c.head_dim, h = heads_;
  std::size_t n = 0;
  n += region_bytes(T, c.q_lora_rank, w, "q_a workspace");
  if (options_.device.is_cuda()) n += region_bytes(T, c.q_lora_rank, t, "q_n workspace");
  n += region_bytes(T, h * D, w, "q_w workspace");
  n += region_bytes(T, D, w, "kv_w workspace");
  n += region_bytes(T, h * D, t, "q workspace");
  n += region_bytes(T, D, t, "kv workspace");
  n += region_bytes(T, h * D, t, "attn workspace");
  n += region_bytes(T, int64_t{groups_} * c.o_lora_rank, t, "o_a workspace");
  n += 2 * region_bytes(T, c.sliding_window, DType::i32, "window workspace");
  n += region_bytes(T, K, DType::i32, "extra rows workspace");
  return n;
}

std::size_t DeepseekV4Attention::workspace_bytes(int64_t num_tokens, int64_t extra_topk) const {
  MLA_CHECK(num_tokens >= 0 && extra_topk >= 0, "{}::workspace_bytes: needs num_tokens >= 0 and extra_topk >= 0, got "
            "{} and {}", kOp, num_tokens, extra_topk);
  return own_bytes(num_tokens, extra_topk);
}

void DeepseekV4Attention::forward(const DeepseekV4ForwardArgs& a, const KVCache& cache, const KVCache& extra,
                                  const TensorView& workspace, const Context& ctx) const {
  constexpr const char* op = "DeepseekV4Attention::forward";
  const DeepseekV4Config& c = config_;
  const DType t = options_.dtype, wd = wide_dtype();
  const int64_t H = c.hidden_size, D = c.head_dim, R = c.qk_rope_head_dim, h = heads_, W = c.sliding_window,
                OL = c.o_lora_rank;
  const Device dev = options_.device;
  // ---- every check before the first write (values: host tensors only) ----
  detail::check_defined(a.hidden, op, "hidden [T, hidden_size]");
  detail::check_ndim(a.hidden, 2, op, "hidden [T, hidden_size]");
  const int64_t T = a.hidden.size(0);
  for (const auto& [view, name] : {std::pair{&a.hidden, "hidden [T, hidden_size]"}, {&a.out, "out [T, hidden_size]"}}) {
    block::check_token_rows(*view, T, H, t, dev, op, name);
  }
  detail::check_strides(a.out, true, op, "out [T, hidden_size]");
  detail::check_strides(a.hidden, false, op, "hidden [T, hidden_size]");
  MLA_CHECK(T <= 1 || a.out.stride[0] >= H, "{}: out's rows overlap (row stride {} < hidden_size {}), got {}", op,
            a.out.stride[0], H, a.out.describe());
  check_index_vector(a.positions, T, dev, op, "positions [T]");
  check_index_vector(a.slot_mapping, T, dev, op, "slot_mapping [T]");
  detail::check_defined(a.req_id, op, "req_id [T]");
  detail::check_ndim(a.req_id, 1, op, "req_id [T]");
  detail::check_dtype(a.req_id, DType::i32, op, "req_id [T]");
  detail::check_size(a.req_id, 0, T, op, "req_id [T]");
  detail::check_device(a.req_id, dev, op, "req_id [T]");
  check_int32_matrix(a.block_table, -1, dev, op, "block_table [R, max_blocks]");
  const int64_t num_reqs = a.block_table.size(0);
  for (int64_t i = 0; dev.is_cpu() && i < T; ++i) {
    const int64_t p = num::load_index(a.positions.ptr_at({i}), a.positions.dtype);
    MLA_CHECK(p >= 0 && p <= std::numeric_limits<int32_t>::max() - W, "{}: positions[{}] = {} is outside [0, 2^31 - "
              "sliding_window)", op, i, p);
    const int32_t r = *static_cast<const int32_t*>(a.req_id.ptr_at({i}));
    MLA_CHECK(r >= 0 && r < num_reqs, "{}: req_id[{}] = {} is not a row of block_table ({} requests)", op, i, r,
              num_reqs);
  }
  validate_cache(cache, "DeepseekV4Attention::forward: cache");
  MLA_CHECK(cache.data.device == dev, "{}: the main cache must be on the block's device {}, got {}", op, to_string(dev),
            to_string(cache.data.device));
  MLA_CHECK(cache.format == options_.cache_format && cache.d_qk == D && cache.d_rope == R,
            "{}: the main cache must be {} with rows of {} ({} rope), got {} with d_qk {}, d_rope {}", op,
            to_string(options_.cache_format), D, R, to_string(cache.format), cache.d_qk, cache.d_rope);
  check_slots(a.slot_mapping, cache, op, "slot_mapping");
  int64_t K = 0;
  if (ratio_ == 0) {
    MLA_CHECK(!a.extra_kv.defined() && !a.extra_slot_mapping.defined() && !a.extra_topk.defined() &&
                  !a.extra_block_table.defined(),
              "{}: layer {} attends its sliding window only (compress ratio 0); it takes no extra_kv, "
              "extra_slot_mapping, extra_block_table or extra_topk", op, layer_);
  } else {
    validate_cache(extra, "DeepseekV4Attention::forward: extra cache");
    MLA_CHECK(extra.data.device == dev, "{}: the extra cache must be on the block's device {}, got {}", op,
              to_string(dev), to_string(extra.data.device));
    MLA_CHECK(extra.format == options_.extra_cache_format && extra.d_qk == D && extra.d_rope == R,
              "{}: the extra cache must be {} with rows of {} ({} rope), got {} with d_qk {}, d_rope {}", op,
              to_string(options_.extra_cache_format), D, R, to_string(extra.format), extra.d_qk, extra.d_rope);
    check_int32_matrix(a.extra_topk, T, dev, op, "extra_topk [T, K]");
    check_int32_matrix(a.extra_block_table, num_reqs, dev, op, "extra_block_table [R, max_blocks]");
    K = a.extra_topk.size(1);
    MLA_CHECK(a.extra_kv.defined() == a.extra_slot_mapping.defined(),
              "{}: extra_kv and extra_slot_mapping come together (the compressed rows and their slots)", op);
    if (a.extra_kv.defined()) {
      detail::check_ndim(a.extra_kv, 2, op, "extra_kv [N_e, head_dim]");
      detail::check_size(a.extra_kv, 1, D, op, "extra_kv [N_e, head_dim]");
      detail::check_device(a.extra_kv, dev, op, "extra_kv [N_e, head_dim]");
      MLA_CHECK(is_floating(a.extra_kv.dtype) && a.extra_kv.dtype != DType::fp8_e4m3 &&
                    (a.extra_kv.size(0) == 0 || a.extra_kv.stride[1] == 1),
                "{}: extra_kv must be a float tensor (bf16, f32 or f64) with unit inner stride, got {}", op,
                a.extra_kv.describe());
      check_index_vector(a.extra_slot_mapping, a.extra_kv.size(0), dev, op, "extra_slot_mapping [N_e]");
      check_slots(a.extra_slot_mapping, extra, op, "extra_slot_mapping");
    }
  }
  const std::size_t need = own_bytes(T, K);
  detail::check_defined(workspace, op, "workspace");
  detail::check_ndim(workspace, 1, op, "workspace");
  detail::check_dtype(workspace, DType::u8, op, "workspace");
  detail::check_device(workspace, dev, op, "workspace");
  MLA_CHECK(workspace.stride[0] == 1 && static_cast<std::size_t>(workspace.size(0)) >= need &&
                reinterpret_cast<uintptr_t>(workspace.data) % 16 == 0,
            "{}: workspace must be a contiguous, 16-byte aligned u8 buffer of at least workspace_bytes({}, {}) = {} "
            "bytes, got {} at {}", op, T, K, need, workspace.describe(), workspace.data);
  if (T > 0) {
    for (const auto& [view, name] : {std::pair{&a.hidden, "hidden"}, {&workspace, "workspace"}})
      MLA_CHECK(!block::bytes_overlap(a.out, *view), "{}: out overlaps {}: got out {} at {} and {} {} at {}", op, name,
                a.out.describe(), a.out.data, name, view->describe(), view->data);
  }

  // ---- carve the workspace (layout at the top of this file) ----
  auto* base = static_cast<std::byte*>(workspace.data);
  std::size_t off = 0;
  auto region = [&](int64_t rows, int64_t cols, DType dt, const char* what) {
    TensorView v(base + off, dt, {rows, cols}, dev);
    off += region_bytes(rows, cols, dt, what);
    return v;
  };
  const TensorView q_a = region(T, c.q_lora_rank, wd, "q_a");
  const TensorView q_n = dev.is_cuda() ? region(T, c.q_lora_rank, t, "q_n") : q_a;
  const TensorView q_w = region(T, h * D, wd, "q_w"),
                   kv_w = region(T, D, wd, "kv_w"), q = region(T, h * D, t, "q"), kv = region(T, D, t, "kv"),
                   attn = region(T, h * D, t, "attn"), o_a = region(T, int64_t{groups_} * OL, t, "o_a"),
                   win_pos = region(T, W, DType::i32, "window"), win_rows = region(T, W, DType::i32, "window"),
                   ext_rows = region(T, K, DType::i32, "extra rows");

  if (T > 0) {
    // q: q_a_proj, RMSNorm, q_b_proj, the per-head RMSNorm (V4), RoPE on each head's last R columns.
    gemm(a.hidden, q_a_t_.view(), q_a, 1.0f, 0.0f, ctx);
    rms_norm(q_a, q_a_norm_.view(), q_n, c.rms_norm_eps, ctx);
    gemm(q_n, q_b_t_.view(), q_w, 1.0f, 0.0f, ctx);
    const TensorView q_heads = q_w.reshape({T * h, D});
    if (c.q_head_norm) rms_norm(q_heads, ones_.view(), q_heads, c.rms_norm_eps, ctx);
    apply_rope(q_w.reshape({T, h, D}), q.reshape({T, h, D}), a.positions, inv_freq_t_.view(), 1.0, R, true, ctx);
    // kv: kv_proj, RMSNorm, RoPE: the token's one row (K = V).
    gemm(a.hidden, kv_t_.view(), kv_w, 1.0f, 0.0f, ctx);
    rms_norm(kv_w, kv_norm_.view(), kv_w, c.rms_norm_eps, ctx);
    apply_rope(kv_w.unsqueeze(1), kv.unsqueeze(1), a.positions, inv_freq_t_.view(), 1.0, R, true, ctx);
    write_cache(kv.slice(1, 0, D - R), kv.slice(1, D - R, D), a.slot_mapping, cache, DsMlaScale::amax, ctx);
  }
  if (ratio_ > 0 && a.extra_kv.defined() && a.extra_kv.size(0) > 0)
    write_cache(a.extra_kv.slice(1, 0, D - R), a.extra_kv.slice(1, D - R, D), a.extra_slot_mapping, extra, DsMlaScale::amax, ctx);
  if (T == 0) return;

  // The window: positions p - W + 1 .. p of the token's request, as main-cache rows.
  sliding_window_positions(a.positions, win_pos, ctx);
  convert_topk_indices(a.req_id, a.block_table, win_pos, win_rows, cache.page_size(), 0, {}, {}, {}, {}, ctx);
  SparseOptions so;
  so.attn_sink = sinks_.view();
  so.values_include_rope = true;
  // The values carried the keys' rope: each head's rope columns turned back by -position in the op's epilogue.
  so.out_rotation = {a.positions, neg_inv_freq_t_.view(), R};
  if (ratio_ > 0) {
    if (K > 0)
      convert_topk_indices(a.req_id, a.extra_block_table, a.extra_topk, ext_rows, extra.page_size(), 0, {}, {}, {}, {},
                           ctx);
    if (K > 0) {
      so.extra.kv = extra;
      so.extra.indices = ext_rows;
    }
  }
  sparse_mqa(q.reshape({T, h, D}), cache, win_rows, {}, attn.reshape({T, h, D}), {}, c.softmax_scale(), so, ctx);
  // Grouped o projection: group g of the rank reads its heads' outputs (hpg * D contiguous columns).
  const int64_t gw = (h / groups_) * D;
  for (int64_t g = 0; g < groups_; ++g)
    gemm(attn.slice(1, g * gw, (g + 1) * gw), o_a_t_[static_cast<std::size_t>(g)].view(),
         o_a.slice(1, g * OL, (g + 1) * OL), 1.0f, 0.0f, ctx);
  gemm(o_a, o_b_t_.view(), a.out, 1.0f, 0.0f, ctx);
}

}  // namespace mla
