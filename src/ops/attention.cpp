// SPDX-License-Identifier: Apache-2.0
// Front ends of the attention ops (mqa_decode, mha_prefill, sparse_mqa; semantics §6, §9-11): every
// argument is validated (shapes consistent across arguments, dtypes, one device, strides; on the CPU also
// the values of the integer metadata) before the backend runs, so a bad call writes nothing.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <utility>

#include "core/decode_balance.h"
#include "core/decode_regime.h"
#include "core/index_view.h"
#include "core/prefill_fp8.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "ops/dispatch.h"
#include "ops/validate.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla {
namespace {

// Optional LSE output (detail::check_lse when given).
void check_lse_out(const TensorView& lse, std::initializer_list<int64_t> shape, const char* op, const char* arg) {
  if (lse.defined()) detail::check_lse(lse, shape, /*is_output=*/true, op, arg);
}

// Value width of an MQA output: the first d_v latent columns of each cache row.
void check_dv(int64_t dv, const KVCache& cache, const char* op) {
  MLA_CHECK(dv >= 1 && dv <= cache.d_latent(),
            "{}: out's last dim (d_v) must lie in [1, d_latent = {}] (values are latent columns of the cache), got {}",
            op, cache.d_latent(), dv);
}

void check_scale(double softmax_scale, const char* op) {
  MLA_CHECK(std::isfinite(softmax_scale), "{}: softmax_scale must be finite, got {}", op, softmax_scale);
}

}  // namespace

namespace {
// One attribute of a CUDA device's DeviceInfo (cuda_rt::device_info reads it once per device: the query costs
// microseconds and never changes); 0 for the CPU. `which` names the caller in the errors.
template <int DeviceAttr>
int cached_device_attribute(Device device, const char* which) {
  if (device.is_cpu()) return 0;
#if MLA_WITH_CUDA
  MLA_CHECK(device.index >= 0 && device.index < 64, "{}: device index must be in [0, 64), got {}", which,
            device.index);
  const cuda_rt::DeviceInfo& info = cuda_rt::device_info(device.index);  // the runtime's cache
  return DeviceAttr == 0 ? info.sm_count : info.cc_major * 10 + info.cc_minor;
#else
  throw Error(std::string(which) + ": " + to_string(device) + " given, but this build of mla has no CUDA backend");
#endif
}
}  // namespace

int multiprocessor_count(Device device) { return cached_device_attribute<0>(device, "multiprocessor_count"); }
int compute_capability(Device device) { return cached_device_attribute<1>(device, "compute_capability"); }

namespace {
// Bytes of the split-KV partials of num_splits (>= 1) splits: what a CUDA mqa_decode call must be given.
std::size_t decode_split_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int num_splits) {
#if MLA_WITH_CUDA
  return cuda::decode_workspace_bytes(b, s_q, h_q, std::min(num_splits, kDecodeMaxSplits));
#else
  (void)b, (void)s_q, (void)h_q, (void)num_splits;
  throw Error("mqa_decode: a CUDA device given, but this build of mla has no CUDA backend");
#endif
}
}  // namespace

std::size_t mqa_decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, Device device,
                                       int num_splits) {
  MLA_CHECK(b >= 0 && s_q >= 1 && h_q >= 1 && max_seq_len >= 0 && num_splits >= 0,
            "mqa_decode_workspace_bytes: needs b >= 0, s_q >= 1, h_q >= 1, max_seq_len >= 0, num_splits >= 0, got b={} "
            "s_q={} h_q={} max_seq_len={} num_splits={}",
            b, s_q, h_q, max_seq_len, num_splits);
  if (device.is_cpu()) return 0;
#if MLA_WITH_CUDA
  const int sms = multiprocessor_count(device);
  if (num_splits == 0) num_splits = decode_num_splits(b, s_q, h_q, max_seq_len, sms);
  // Two partials a split: the sm90 small kernel's small steps write one per consumer warpgroup (at any row count;
  // core/decode_schedule.h wg_partials), at their own split count where it exceeds the planned one
  // (decode_regime::small_step_splits). 0 bytes for one split.
  const int step_splits = decode_regime::small_step_splits(
      {.rows = s_q * h_q, .batch = b, .context_bound = max_seq_len, .planned_splits = num_splits, .sms = sms});
  const std::size_t uniform = 2 * decode_split_workspace_bytes(b, s_q, h_q, std::max(num_splits, step_splits));
  // The sm90 kernel's balanced schedule (<= 32 query rows, smaller batches) takes (b + SMs) partials.
  const int ctas = max_seq_len > 0 ? balance::ctas_for(b, s_q * h_q, sms) : 0;
  return std::max(uniform, ctas > 0 ? static_cast<std::size_t>(balance::workspace_bytes(b, s_q * h_q, ctas)) : 0);
#else
  throw Error("mqa_decode_workspace_bytes: " + to_string(device) + " given, but this build of mla has no CUDA backend");
#endif
}

void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                const TensorView& workspace, const Context& ctx, int num_splits, bool whole_requests,
                bool batch_invariant, bool fp8_compute) {
  constexpr const char* op = "mqa_decode";
  detail::check_ndim(q, 4, op, "q [b, s_q, h_q, d_qk]");
  detail::check_activation(q, false, op, "q", detail::CudaActivations::bf16_f16_f32);
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), d = q.size(3);
  const Device dev = q.device;
  MLA_CHECK(s_q >= 1 && h_q >= 1, "{}: q needs s_q >= 1 and h_q >= 1, got {}", op, q.describe());
  detail::check_cache(cache, dev, op);
  detail::check_not_record(cache, op);
  MLA_CHECK(d == cache.d_qk, "{}: q's last dim must equal the cache row width d_qk = {}, got {}", op, cache.d_qk,
            q.describe());
  detail::check_block_table(block_table, b, op);
  detail::check_size(block_table, 0, b, op, "block_table [b, max_blocks]");
  detail::check_i32_vector(seq_lens, b, op, "seq_lens [b]");
  detail::check_ndim(out, 4, op, "out [b, s_q, h_q, d_v]");
  detail::check_activation(out, true, op, "out", detail::CudaActivations::bf16_f16_f32);
  detail::check_same_dtype_on_cuda(out, q, op, "out", "q");
  for (int i = 0; i < 3; ++i) detail::check_size(out, i, q.size(i), op, "out [b, s_q, h_q, d_v]");
  check_dv(out.size(3), cache, op);
  check_lse_out(lse, {b, s_q, h_q}, op, "lse [b, s_q, h_q]");
  check_scale(softmax_scale, op);
  detail::check_devices(dev, op,
                         {{block_table, "block_table"}, {seq_lens, "seq_lens"}, {out, "out"}, {lse, "lse"},
                          {workspace, "workspace"}});
  MLA_CHECK(num_splits >= 0 && num_splits <= kDecodeMaxSplits, "{}: num_splits must be in [0, {}] (0 = default), got {}",
            op, kDecodeMaxSplits, num_splits);
  // num_splits 0 would take the policy for this call's batch size.
  MLA_CHECK(!batch_invariant || num_splits >= 1,
            "{}: batch_invariant needs num_splits >= 1 (a batch-invariant plan's DecodeRun::num_splits, "
            "batch_invariant_splits); 0 would choose the split count from the batch",
            op);
  const int64_t page = cache.page_size(), max_len = block_table.size(1) * page;
  if (dev.is_cpu()) {
    detail::check_values_in_range(seq_lens, 0, max_len, op, "seq_lens (bounded by max_blocks * page_size)");
    for (int64_t r = 0; r < b; ++r)
      detail::check_block_ids(block_table, r, 0, index_at(seq_lens, r), page, cache.num_blocks(), op);
  } else {
    if (num_splits == 0) num_splits = decode_num_splits(b, s_q, h_q, max_len, multiprocessor_count(dev));
    // Required: the split-KV partials of num_splits (0 bytes for one split). mqa_decode_workspace_bytes
    // may ask for more: the balanced schedule's partials, which the sm90 kernel uses only when the
    // workspace holds them (a smaller workspace runs the split schedule: same contract, other speed).
    const std::size_t need = decode_split_workspace_bytes(b, s_q, h_q, num_splits);
    const std::size_t have =
        workspace.defined() ? static_cast<std::size_t>(workspace.numel()) * workspace.element_size() : 0;
    MLA_CHECK(have >= need,
              "{}: needs a workspace of at least {} bytes for {} KV splits (mqa_decode_workspace_bytes with "
              "max_seq_len = max_blocks * page_size = {} gives a size that also enables the balanced schedule), got {}",
              op, need, num_splits, max_len, workspace.defined() ? workspace.describe() : std::string("none"));
    if (workspace.defined()) {
      MLA_CHECK(workspace.is_contiguous(), "{}: workspace must be contiguous, got {}", op, workspace.describe());
    }
    // The launchers run fewer splits on a workspace they cannot use (unaligned); batch-invariant calls must not.
    const bool ws_aligned = workspace.defined() && reinterpret_cast<uintptr_t>(workspace.data) % 16 == 0;
    MLA_CHECK(!batch_invariant || num_splits == 1 || ws_aligned,
              "{}: batch_invariant with {} splits needs a 16-byte aligned workspace, got {}", op, num_splits,
              workspace.defined() ? workspace.describe() : std::string("none"));
  }
  if (b == 0) return;
  MLA_DISPATCH(dev, mqa_decode, q, cache, block_table, seq_lens, out, lse, softmax_scale, causal, workspace, ctx,
               num_splits, whole_requests, batch_invariant, fp8_compute);
}

void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                 const Context& ctx) {
  mha_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, softmax_scale,
              causal, PrefillOptions{}, ctx);
}

std::size_t mha_prefill_workspace_bytes(int64_t total_q, int64_t total_k, int64_t heads, int64_t batch, bool fp8,
                                        Device device) {
  MLA_CHECK(total_q >= 0 && total_k >= 0 && heads >= 1 && batch >= 0,
            "mha_prefill_workspace_bytes: needs total_q >= 0, total_k >= 0, heads >= 1, batch >= 0, got total_q={} "
            "total_k={} heads={} batch={}",
            total_q, total_k, heads, batch);
  if (!fp8 || device.is_cpu()) return 0;
  return static_cast<std::size_t>(prefill_fp8::Layout::of(total_q, total_k, heads, batch).total);
}

void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                 const PrefillOptions& opts, const Context& ctx) {
  constexpr const char* op = "mha_prefill";
  detail::check_ndim(q, 3, op, "q [Tq, h, d_nope + d_rope]");
  detail::check_activation(q, false, op, "q");
  const int64_t tq = q.size(0), h = q.size(1);
  const Device dev = q.device;
  MLA_CHECK(h >= 1, "{}: q needs at least one head, got {}", op, q.describe());
  detail::check_ndim(k_nope, 3, op, "k_nope [Tk, h, d_nope]");
  detail::check_activation(k_nope, false, op, "k_nope");
  const int64_t tk = k_nope.size(0), dn = k_nope.size(2);
  detail::check_size(k_nope, 1, h, op, "k_nope [Tk, h, d_nope]");
  detail::check_ndim(k_pe, 3, op, "k_pe [Tk, h, d_rope]");
  detail::check_activation(k_pe, false, op, "k_pe");  // head stride 0 allowed: inputs may broadcast
  detail::check_size(k_pe, 0, tk, op, "k_pe [Tk, h, d_rope]");
  detail::check_size(k_pe, 1, h, op, "k_pe [Tk, h, d_rope]");
  const int64_t dr = k_pe.size(2);
  MLA_CHECK(dn >= 1 && dr >= 1, "{}: k_nope and k_pe need non-empty head dims, got {} and {}", op, k_nope.describe(),
            k_pe.describe());
  detail::check_size(q, 2, dn + dr, op, "q [Tq, h, d_nope + d_rope]");
  detail::check_ndim(v, 3, op, "v [Tk, h, d_v]");
  detail::check_activation(v, false, op, "v");
  detail::check_size(v, 0, tk, op, "v [Tk, h, d_v]");
  detail::check_size(v, 1, h, op, "v [Tk, h, d_v]");
  const int64_t dv = v.size(2);
  MLA_CHECK(dv >= 1, "{}: v needs a non-empty head dim, got {}", op, v.describe());
  detail::check_ndim(out, 3, op, "out [Tq, h, d_v]");
  detail::check_activation(out, true, op, "out");
  detail::check_size(out, 0, tq, op, "out [Tq, h, d_v]");
  detail::check_size(out, 1, h, op, "out [Tq, h, d_v]");
  detail::check_size(out, 2, dv, op, "out [Tq, h, d_v]");
  check_lse_out(lse, {h, tq}, op, "lse [h, Tq]");
  detail::check_i32_vector(cu_seqlens_q, -1, op, "cu_seqlens_q [B+1]");
  MLA_CHECK(cu_seqlens_q.size(0) >= 1, "{}: cu_seqlens_q needs B+1 >= 1 entries, got {}", op, cu_seqlens_q.describe());
  detail::check_i32_vector(cu_seqlens_k, cu_seqlens_q.size(0), op, "cu_seqlens_k [B+1] (as long as cu_seqlens_q)");
  MLA_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, "{}: max_seqlen_q/k must be >= 0, got {} and {}", op, max_seqlen_q,
            max_seqlen_k);
  check_scale(softmax_scale, op);
  detail::check_devices(dev, op,
                         {{k_nope, "k_nope"}, {k_pe, "k_pe"}, {v, "v"}, {out, "out"}, {lse, "lse"},
                          {cu_seqlens_q, "cu_seqlens_q"}, {cu_seqlens_k, "cu_seqlens_k"}});
  if (dev.is_cpu()) {
    detail::check_cu_seqlens_values(cu_seqlens_q, tq, op, "cu_seqlens_q");
    detail::check_cu_seqlens_values(cu_seqlens_k, tk, op, "cu_seqlens_k");
    for (int64_t r = 0; r + 1 < cu_seqlens_q.size(0); ++r) {
      const int64_t sq = index_at(cu_seqlens_q, r + 1) - index_at(cu_seqlens_q, r);
      const int64_t sk = index_at(cu_seqlens_k, r + 1) - index_at(cu_seqlens_k, r);
      MLA_CHECK(sq <= max_seqlen_q && sk <= max_seqlen_k,
                "{}: request {} has {} queries and {} keys, beyond max_seqlen_q = {} / max_seqlen_k = {}", op, r, sq,
                sk, max_seqlen_q, max_seqlen_k);
    }
  }
  if (opts.fp8) {
    for (const auto& [name, s] : {std::pair{"q_scale", opts.q_scale}, std::pair{"k_scale", opts.k_scale},
                                  std::pair{"v_scale", opts.v_scale}})
      MLA_CHECK(std::isfinite(s) && s > 0.0f, "{}: fp8: {} must be positive and finite, got {}", op, name, s);
    if (!dev.is_cpu()) {
      // The one fp8 kernel (sm90_fp8): DeepSeek's head dims on an sm_90 device.
      MLA_CHECK(dn == 128 && dr == 64 && dv == 128,
                "{}: fp8 on CUDA needs d_nope 128, d_rope 64, d_v 128 (the sm90_fp8 kernel), got {}, {}, {}", op, dn,
                dr, dv);
      const int cc = compute_capability(dev);
      MLA_CHECK(cc == 90, "{}: fp8 on CUDA runs on sm_90 devices only (the sm90_fp8 kernel), {} has compute "
                "capability {}.{}", op, to_string(dev), cc / 10, cc % 10);
      const std::size_t need = mha_prefill_workspace_bytes(tq, tk, h, cu_seqlens_q.size(0) - 1, true, dev);
      const TensorView& ws = opts.workspace;
      const std::size_t have = ws.defined() ? static_cast<std::size_t>(ws.numel()) * ws.element_size() : 0;
      MLA_CHECK(have >= need,
                "{}: fp8 needs a workspace of at least {} bytes (mha_prefill_workspace_bytes({}, {}, {}, {})), got {}",
                op, need, tq, tk, h, cu_seqlens_q.size(0) - 1, ws.defined() ? ws.describe() : std::string("none"));
      MLA_CHECK(ws.is_contiguous() && reinterpret_cast<uintptr_t>(ws.data) % prefill_fp8::kBaseAlign == 0,
                "{}: fp8 workspace must be contiguous and {}-byte aligned, got {}", op, prefill_fp8::kBaseAlign,
                ws.describe());
      detail::check_devices(dev, op, {{ws, "workspace"}});
    }
  }
  if (cu_seqlens_q.size(0) == 1 || tq == 0) return;
  MLA_DISPATCH(dev, mha_prefill, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse,
               softmax_scale, causal, opts, ctx);
}

void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const Context& ctx) {
  sparse_mqa(q, kv, indices, topk_length, out, lse, softmax_scale, SparseOptions{}, ctx);
}

namespace {
// One index list of sparse_mqa: indices [T, topk] int32 (unit inner stride), optional topk_length [T]
// (CPU: values in [0, topk]). Returns topk.
int64_t check_sparse_index_list(const TensorView& indices, const TensorView& topk_length, int64_t t, const char* op,
                                const char* idx_arg, const char* len_arg) {
  detail::check_ndim(indices, 2, op, idx_arg);
  detail::check_dtype(indices, DType::i32, op, idx_arg);
  detail::check_size(indices, 0, t, op, idx_arg);
  detail::check_inner_contiguous(indices, op, idx_arg);
  detail::check_strides(indices, false, op, idx_arg);
  const int64_t topk = indices.size(1);
  if (topk_length.defined()) detail::check_i32_vector(topk_length, t, op, len_arg);
  return topk;
}

// The DeepSeek-V4 options against the main call's shapes (ops.h, SparseOptions).
void check_sparse_options(const SparseOptions& o, const KVCache& kv, int64_t t, int64_t h_q, int64_t d_v, Device dev,
                          const char* op) {
  const SparseOutRotation& r = o.out_rotation;
  if (r.defined()) {
    MLA_CHECK(r.rope_dim >= 2 && r.rope_dim % 2 == 0 && r.rope_dim <= d_v && d_v % 2 == 0,
              "{}: out_rotation.rope_dim must be even and in [2, d_v = {}] with d_v even (the pairs start on even "
              "columns), got {}",
              op, d_v, r.rope_dim);
    detail::check_defined(r.positions, op, "out_rotation.positions [T]");
    detail::check_ndim(r.positions, 1, op, "out_rotation.positions [T]");
    detail::check_index(r.positions, op, "out_rotation.positions [T]");
    MLA_CHECK(r.positions.size(0) >= t, "{}: out_rotation.positions must hold at least T = {} entries, got {}", op, t,
              r.positions.describe());
    detail::check_strides(r.positions, false, op, "out_rotation.positions");
    detail::check_defined(r.inv_freq, op, "out_rotation.inv_freq");
    detail::check_ndim(r.inv_freq, 1, op, "out_rotation.inv_freq [rope_dim / 2]");
    detail::check_dtype(r.inv_freq, DType::f64, op, "out_rotation.inv_freq [rope_dim / 2]");
    detail::check_size(r.inv_freq, 0, r.rope_dim / 2, op, "out_rotation.inv_freq [rope_dim / 2]");
    MLA_CHECK(r.inv_freq.size(0) <= 1 || r.inv_freq.stride[0] == 1,
              "{}: out_rotation.inv_freq must be contiguous, got {}", op, r.inv_freq.describe());
    detail::check_devices(dev, op, {{r.positions, "out_rotation.positions"}, {r.inv_freq, "out_rotation.inv_freq"}});
  }
  if (o.attn_sink.defined()) {
    detail::check_ndim(o.attn_sink, 1, op, "attn_sink [h_q]");
    MLA_CHECK(o.attn_sink.dtype == DType::f32 || (o.attn_sink.dtype == DType::f64 && o.attn_sink.device.is_cpu()),
              "{}: attn_sink must be f32 (the CPU also takes f64), got {}", op, o.attn_sink.describe());
    detail::check_size(o.attn_sink, 0, h_q, op, "attn_sink [h_q]");
    detail::check_strides(o.attn_sink, false, op, "attn_sink");
    detail::check_device(o.attn_sink, dev, op, "attn_sink");
  }
  const SparseExtraCache& e = o.extra;
  if (!e.defined()) return;
  MLA_CHECK(e.kv.data.defined() && e.indices.defined(),
            "{}: an extra cache needs both extra.kv and extra.indices [T, extra_topk], got kv {} and indices {}", op,
            e.kv.data.describe(), e.indices.describe());
  detail::check_cache(e.kv, dev, "sparse_mqa (extra cache)");
  // Block-scaled records (the V4 family) may mix formats between the two caches (V4.1: a v41 window
  // cache with a v41_fp4 compressed cache); every other format pairs with itself only.
  const bool records = cache_format_info(kv.format).record && cache_format_info(e.kv.format).record;
  MLA_CHECK((e.kv.format == kv.format || records) && e.kv.d_qk == kv.d_qk && e.kv.d_rope == kv.d_rope,
            "{}: the extra cache must have the main cache's format (or, for a v4 / v41 / v41_fp4 main cache, "
            "another of those), d_qk and d_rope ({}, {}, {}), got {}, {}, {}",
            op, to_string(kv.format), kv.d_qk, kv.d_rope, to_string(e.kv.format), e.kv.d_qk, e.kv.d_rope);
  MLA_CHECK(cache_format_info(kv.format).scale != CacheScale::per_tensor || e.kv.scale == kv.scale,
            "{}: the extra cache's per-tensor scale must equal the main cache's ({}), got {}", op, kv.scale,
            e.kv.scale);
  const int64_t topk = check_sparse_index_list(e.indices, e.topk_length, t, op, "extra.indices [T, extra_topk]",
                                               "extra.topk_length [T]");
  detail::check_devices(dev, op, {{e.indices, "extra.indices"}, {e.topk_length, "extra.topk_length"}});
  if (dev.is_cpu() && e.topk_length.defined())
    detail::check_values_in_range(e.topk_length, 0, topk, op, "extra.topk_length (bounded by extra_topk)");
}
}  // namespace

void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const SparseOptions& opts,
                const Context& ctx) {
  constexpr const char* op = "sparse_mqa";
  detail::check_ndim(q, 3, op, "q [T, h_q, d_qk]");
  detail::check_activation(q, false, op, "q", detail::CudaActivations::bf16_f16_f32);
  const int64_t t = q.size(0), h_q = q.size(1), d = q.size(2);
  const Device dev = q.device;
  MLA_CHECK(h_q >= 1, "{}: q needs at least one head, got {}", op, q.describe());
  detail::check_cache(kv, dev, op);
  MLA_CHECK(d == kv.d_qk, "{}: q's last dim must equal the cache row width d_qk = {}, got {}", op, kv.d_qk,
            q.describe());
  const int64_t topk = check_sparse_index_list(indices, topk_length, t, op, "indices [T, topk]", "topk_length [T]");
  detail::check_ndim(out, 3, op, "out [T, h_q, d_v]");
  detail::check_activation(out, true, op, "out", detail::CudaActivations::bf16_f16_f32);
  detail::check_same_dtype_on_cuda(out, q, op, "out", "q");
  detail::check_size(out, 0, t, op, "out [T, h_q, d_v]");
  detail::check_size(out, 1, h_q, op, "out [T, h_q, d_v]");
  if (opts.values_include_rope)
    MLA_CHECK(out.size(2) >= 1 && out.size(2) <= kv.d_qk,
              "{}: out's last dim (d_v) must lie in [1, d_qk = {}] (values_include_rope: values are the first d_v "
              "columns of each row), got {}",
              op, kv.d_qk, out.size(2));
  else
    check_dv(out.size(2), kv, op);
  check_lse_out(lse, {t, h_q}, op, "lse [T, h_q]");
  check_scale(softmax_scale, op);
  detail::check_devices(dev, op, {{indices, "indices"}, {topk_length, "topk_length"}, {out, "out"}, {lse, "lse"}});
  check_sparse_options(opts, kv, t, h_q, out.size(2), dev, op);
  MLA_CHECK(!cache_format_info(kv.format).record || opts.values_include_rope,
            "{}: a {} cache holds DeepSeek-V4 rows (K = V over all d_qk = {} columns): it needs "
            "SparseOptions::values_include_rope",
            op, to_string(kv.format), kv.d_qk);
  // Index values need no check: any index outside [0, num_slots) is invalid by definition and never read.
  if (dev.is_cpu() && topk_length.defined())
    detail::check_values_in_range(topk_length, 0, topk, op, "topk_length (bounded by topk)");
  if (t == 0) return;
  MLA_DISPATCH(dev, sparse_mqa, q, kv, indices, topk_length, out, lse, softmax_scale, opts, ctx);
}

}  // namespace mla
