// SPDX-License-Identifier: Apache-2.0
// Front end of merge_attn_states (semantics §7): validation, then backend dispatch.
#include <cmath>

#include "mla/ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {

void merge_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& prefix,
                       const TensorView& prefix_lse, const TensorView& suffix, const TensorView& suffix_lse,
                       int64_t prefill_tokens_with_context, float output_scale, const Context& ctx) {
  constexpr const char* op = "merge_attn_states";
  detail::check_ndim(prefix, 3, op, "prefix [T, H, D]");
  detail::check_activation(prefix, false, op, "prefix", detail::CudaActivations::bf16_f16_f32);
  const int64_t t = prefix.size(0), h = prefix.size(1), d = prefix.size(2);
  const Device dev = prefix.device;
  detail::check_ndim(suffix, 3, op, "suffix [T, H, D]");
  detail::check_activation(suffix, false, op, "suffix", detail::CudaActivations::bf16_f16_f32);
  detail::check_same_dtype_on_cuda(suffix, prefix, op, "suffix", "prefix");
  MLA_CHECK(suffix.shape == prefix.shape, "{}: suffix must have prefix's shape {}, got {}", op, prefix.shape_str(),
            suffix.describe());
  MLA_CHECK(suffix.stride[1] == prefix.stride[1] || h <= 1,
            "{}: prefix and suffix must share the head stride, got {} and {}", op, prefix.describe(),
            suffix.describe());
  detail::check_ndim(out, 3, op, "out [T, H, D]");
  MLA_CHECK(out.shape == prefix.shape, "{}: out must have prefix's shape {}, got {}", op, prefix.shape_str(),
            out.describe());
  if (output_scale != 0.0f) {
    MLA_CHECK(std::isfinite(output_scale) && output_scale > 0.0f,
              "{}: output_scale must be positive and finite (or 0 for none), got {}", op, output_scale);
    detail::check_dtype(out, DType::fp8_e4m3, op, "out (output_scale given)");
    detail::check_inner_contiguous(out, op, "out");
    detail::check_strides(out, true, op, "out");
  } else {
    detail::check_activation(out, true, op, "out", detail::CudaActivations::bf16_f16_f32);
    detail::check_same_dtype_on_cuda(out, prefix, op, "out", "prefix");
  }
  detail::check_lse(prefix_lse, {h, t}, false, op, "prefix_lse [H, T]");
  detail::check_lse(suffix_lse, {h, t}, false, op, "suffix_lse [H, T]");
  if (out_lse.defined()) detail::check_lse(out_lse, {h, t}, true, op, "out_lse [H, T]");
  MLA_CHECK(prefill_tokens_with_context >= -1 && prefill_tokens_with_context <= t,
            "{}: prefill_tokens_with_context must be -1 (all tokens) or in [0, {}], got {}", op, t,
            prefill_tokens_with_context);
  detail::check_devices(dev, op,
                         {{suffix, "suffix"}, {out, "out"}, {prefix_lse, "prefix_lse"}, {suffix_lse, "suffix_lse"},
                          {out_lse, "out_lse"}});
  if (t == 0 || h == 0 || d == 0) return;
  MLA_DISPATCH(dev, merge_attn_states, out, out_lse, prefix, prefix_lse, suffix, suffix_lse,
               prefill_tokens_with_context, output_scale, ctx);
}

void combine_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& parts,
                         const TensorView& part_lses, const Context& ctx, const TensorView& attn_sink) {
  constexpr const char* op = "combine_attn_states";
  detail::check_ndim(parts, 4, op, "parts [N, T, H, D]");
  detail::check_activation(parts, false, op, "parts", detail::CudaActivations::bf16_f16_f32);
  const int64_t n = parts.size(0), t = parts.size(1), h = parts.size(2), d = parts.size(3);
  MLA_CHECK(n >= 1 && n <= kCombineMaxParts, "{}: parts must hold 1 to {} parts, got {}", op, kCombineMaxParts,
            parts.describe());
  const Device dev = parts.device;
  detail::check_ndim(out, 3, op, "out [T, H, D]");
  detail::check_activation(out, true, op, "out", detail::CudaActivations::bf16_f16_f32);
  detail::check_same_dtype_on_cuda(out, parts, op, "out", "parts");
  MLA_CHECK(out.size(0) == t && out.size(1) == h && out.size(2) == d, "{}: out must be [{}, {}, {}] like parts, got {}",
            op, t, h, d, out.describe());
  detail::check_lse(part_lses, {n, t, h}, false, op, "part_lses [N, T, H]");
  if (out_lse.defined()) detail::check_lse(out_lse, {t, h}, true, op, "out_lse [T, H]");
  if (attn_sink.defined()) detail::check_lse(attn_sink, {h}, false, op, "attn_sink [H]");
  detail::check_devices(dev, op,
                         {{out, "out"}, {part_lses, "part_lses"}, {out_lse, "out_lse"}, {attn_sink, "attn_sink"}});
  if (t == 0 || h == 0) return;
  MLA_DISPATCH(dev, combine_attn_states, out, out_lse, parts, part_lses, attn_sink, ctx);
}

}  // namespace mla
