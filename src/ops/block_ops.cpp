// SPDX-License-Identifier: Apache-2.0
// Front ends of the DeepSeek block's ops (mla/block_ops.h): shapes, dtypes, devices, strides and
// aliasing are checked before dispatch, so a refused call writes nothing.
#include "mla/block_ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/checked.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {
namespace {

// Bytes [first, last) a view with non-negative strides can touch.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  const auto p = reinterpret_cast<uintptr_t>(t.data);
  return {p, p + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(dtype_size(t.dtype)))};
}

// `out` is `in` itself (same start, dtype and strides: an in-place update) or does not overlap it.
void check_in_place_or_disjoint(const TensorView& in, const TensorView& out, const char* op, const char* in_arg,
                                const char* out_arg) {
  if (in.numel() == 0 || out.numel() == 0) return;
  bool same = in.data == out.data && in.dtype == out.dtype && in.ndim == out.ndim;
  for (int d = 0; same && d < in.ndim; ++d) same = in.stride[d] == out.stride[d];
  if (same) return;
  const auto [a0, a1] = byte_span(in);
  const auto [b0, b1] = byte_span(out);
  MLA_CHECK(a1 <= b0 || b1 <= a0, "{}: {} overlaps {} without being the same view (in place): got {} and {}", op,
            out_arg, in_arg, out.describe(), in.describe());
}

void check_f32_matrix(const TensorView& t, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
  detail::check_ndim(t, 2, op, arg);
  detail::check_dtype(t, DType::f32, op, arg);
  detail::check_inner_contiguous(t, op, arg);
  detail::check_strides(t, false, op, arg);
}

void check_codes(const TensorView& t, bool is_output, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
  detail::check_ndim(t, 2, op, arg);
  detail::check_dtype(t, DType::fp8_e4m3, op, arg);
  detail::check_inner_contiguous(t, op, arg);
  detail::check_strides(t, is_output, op, arg);
  if (t.device.is_cuda())
    MLA_CHECK((t.size(0) <= 1 || t.stride[0] % 16 == 0) && reinterpret_cast<uintptr_t>(t.data) % 16 == 0,
              "{}: on CUDA {} must start 16-byte aligned with a row stride multiple of 16, got {} at {}", op, arg,
              t.describe(), t.data);
}

// A defined activation view of `nd` dims (bf16 / f16 / f32 on CUDA; any float on the CPU).
void check_act(const TensorView& t, int nd, bool is_output, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
  detail::check_ndim(t, nd, op, arg);
  detail::check_activation(t, is_output, op, arg, detail::CudaActivations::bf16_f16_f32);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& y, double eps, const Context& ctx) {
  constexpr const char* op = "rms_norm";
  check_act(x, 2, false, op, "x [T, n]");
  check_act(y, 2, true, op, "y [T, n]");
  detail::check_size(y, 0, x.size(0), op, "y [T, n] (T = x.size(0))");
  detail::check_size(y, 1, x.size(1), op, "y [T, n] (n = x.size(1))");
  detail::check_defined(weight, op, "weight");
  detail::check_ndim(weight, 1, op, "weight [n]");
  detail::check_size(weight, 0, x.size(1), op, "weight [n] (n = x.size(1))");
  if (x.device.is_cuda()) {
    detail::check_dtype(weight, DType::f32, op, "weight [n]");
    MLA_CHECK(weight.size(0) <= 1 || weight.stride[0] == 1, "{}: weight must be contiguous on CUDA, got {}", op,
              weight.describe());
  } else {
    detail::check_float(weight, op, "weight [n]");
  }
  detail::check_strides(weight, false, op, "weight");
  detail::check_devices(x.device, op, {{y, "y"}, {weight, "weight"}});
  MLA_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and >= 0, got {}", op, eps);
  check_in_place_or_disjoint(x, y, op, "x", "y");
  if (x.numel() == 0) return;
  MLA_DISPATCH(x.device, rms_norm, x, weight, y, eps, ctx);
}

void apply_rope(const TensorView& src, const TensorView& dst, const TensorView& positions, const TensorView& inv_freq,
                double attention_factor, int64_t rope_dim, bool interleave, const Context& ctx) {
  constexpr const char* op = "apply_rope";
  check_act(src, 3, false, op, "src [T, G, D]");
  check_act(dst, 3, true, op, "dst [T, G, D]");
  for (int d = 0; d < 3; ++d) detail::check_size(dst, d, src.size(d), op, "dst [T, G, D] (src's shape)");
  const int64_t T = src.size(0), D = src.size(2);
  MLA_CHECK(rope_dim >= 0 && rope_dim <= D && rope_dim % 2 == 0,
            "{}: rope_dim must be even and in [0, D = {}], got {}", op, D, rope_dim);
  MLA_CHECK(std::isfinite(attention_factor), "{}: attention_factor must be finite, got {}", op, attention_factor);
  detail::check_defined(positions, op, "positions");
  detail::check_ndim(positions, 1, op, "positions [T]");
  detail::check_index(positions, op, "positions [T]");
  MLA_CHECK(positions.size(0) >= T, "{}: positions must hold at least T = {} entries, got {}", op, T,
            positions.describe());
  detail::check_strides(positions, false, op, "positions");
  detail::check_defined(inv_freq, op, "inv_freq");
  detail::check_ndim(inv_freq, 1, op, "inv_freq [rope_dim / 2]");
  detail::check_dtype(inv_freq, DType::f64, op, "inv_freq [rope_dim / 2]");
  detail::check_size(inv_freq, 0, rope_dim / 2, op, "inv_freq [rope_dim / 2]");
  MLA_CHECK(inv_freq.size(0) <= 1 || inv_freq.stride[0] == 1, "{}: inv_freq must be contiguous, got {}", op,
            inv_freq.describe());
  detail::check_devices(src.device, op, {{dst, "dst"}, {positions, "positions"}, {inv_freq, "inv_freq"}});
  check_in_place_or_disjoint(src, dst, op, "src", "dst");
  if (src.numel() == 0) return;
  if (positions.device.is_cpu())
    detail::check_values_in_range(positions.slice(0, 0, T), 0, std::numeric_limits<int64_t>::max(), op, "positions");
  MLA_DISPATCH(src.device, apply_rope, src, dst, positions, inv_freq, attention_factor, rope_dim, interleave, ctx);
}

void sliding_window_positions(const TensorView& positions, const TensorView& out, const Context& ctx) {
  constexpr const char* op = "sliding_window_positions";
  detail::check_defined(positions, op, "positions [T]");
  detail::check_ndim(positions, 1, op, "positions [T]");
  detail::check_index(positions, op, "positions [T]");
  detail::check_strides(positions, false, op, "positions");
  detail::check_defined(out, op, "out [T, W]");
  detail::check_ndim(out, 2, op, "out [T, W]");
  detail::check_dtype(out, DType::i32, op, "out [T, W]");
  detail::check_size(out, 0, positions.size(0), op, "out [T, W] (T = positions.size(0))");
  detail::check_strides(out, true, op, "out");
  MLA_CHECK(out.numel() == 0 || out.size(1) <= 1 || out.stride[1] == 1, "{}: out must have unit column stride, got {}",
            op, out.describe());
  MLA_CHECK(out.size(0) <= 1 || out.size(1) == 0 || out.stride[0] >= out.size(1),
            "{}: out's rows overlap (row stride {} < W = {}), got {}", op, out.stride[0], out.size(1), out.describe());
  detail::check_devices(positions.device, op, {{out, "out"}});
  if (out.numel() == 0) return;
  if (positions.device.is_cpu())
    detail::check_values_in_range(positions, 0, std::numeric_limits<int64_t>::max(), op, "positions");
  MLA_DISPATCH(positions.device, sliding_window_positions, positions, out, ctx);
}

void quantize_fp8_groups(const TensorView& x, const TensorView& codes, const TensorView& scales, const Context& ctx) {
  constexpr const char* op = "quantize_fp8_groups";
  check_act(x, 2, false, op, "x [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  MLA_CHECK(K % 128 == 0, "{}: K must be a multiple of 128 (groups of 128 columns), got x {}", op, x.describe());
  check_codes(codes, true, op, "codes [M_pad, K]");
  detail::check_size(codes, 1, K, op, "codes [M_pad, K] (K = x.size(1))");
  const int64_t M_pad = codes.size(0);
  MLA_CHECK(M_pad >= M, "{}: codes must have at least M = {} rows, got {}", op, M, codes.describe());
  check_f32_matrix(scales, op, "scales [K / 128, M_pad]");
  detail::check_size(scales, 0, K / 128, op, "scales [K / 128, M_pad]");
  detail::check_size(scales, 1, M_pad, op, "scales [K / 128, M_pad] (M_pad = codes.size(0))");
  MLA_CHECK(scales.numel() == 0 || scales.size(0) <= 1 || scales.stride[0] == M_pad,
            "{}: scales must be contiguous [K / 128, M_pad], got {}", op, scales.describe());
  detail::check_devices(x.device, op, {{codes, "codes"}, {scales, "scales"}});
  if (codes.numel() == 0) return;
  MLA_DISPATCH(x.device, quantize_fp8_groups, x, codes, scales, ctx);
}

const char* to_string(OutputQuant q) {
  switch (q) {
    case OutputQuant::none: return "none";
    case OutputQuant::fp8: return "fp8";
    case OutputQuant::fp8_group128: return "fp8_group128";
    case OutputQuant::fp8_group64: return "fp8_group64";
    case OutputQuant::nvfp4: return "nvfp4";
  }
  return "invalid";
}

namespace {
constexpr const char* kOutputQuantKeys = "none, fp8, fp8_group128, fp8_group64 or nvfp4";
}  // namespace

OutputQuant parse_output_quant(const std::string& key) {
  for (OutputQuant q : {OutputQuant::none, OutputQuant::fp8, OutputQuant::fp8_group128, OutputQuant::fp8_group64,
                        OutputQuant::nvfp4})
    if (key == to_string(q)) return q;
  throw Error(fmt::format("output quantisation key must be {}, got '{}'", kOutputQuantKeys, key));
}

void check_output_quant(OutputQuant q, const char* what) {
  MLA_CHECK(static_cast<uint8_t>(q) <= static_cast<uint8_t>(OutputQuant::nvfp4),
            "{}: the output quantisation must be {}, got the value {}", what, kOutputQuantKeys,
            static_cast<int>(q));
}

int64_t output_quant_group(OutputQuant q) {
  switch (q) {
    case OutputQuant::fp8_group128: return 128;
    case OutputQuant::fp8_group64: return 64;
    case OutputQuant::nvfp4: return 16;
    default: return 0;
  }
}

namespace detail {

namespace {

// The quantised-output arguments of quantize_output / up_project_quantized for an x of [M, K] on `device`.
void check_quant_targets(int64_t M, int64_t K, Device device, OutputQuant key, const TensorView& codes,
                         const TensorView& scales, float scale, const char* op) {
  const int64_t G = output_quant_group(key);
  const bool fp4 = key == OutputQuant::nvfp4;
  // Codes and nvfp4 scales are bytes: fp8_e4m3 or u8 views of them are both taken (torch without float8).
  auto check_bytes = [&](const TensorView& t, const char* arg) {
    detail::check_defined(t, op, arg);
    detail::check_ndim(t, 2, op, arg);
    MLA_CHECK(t.dtype == DType::fp8_e4m3 || t.dtype == DType::u8, "{}: {} must be fp8_e4m3 (or u8) bytes, got {}", op,
              arg, t.describe());
    detail::check_inner_contiguous(t, op, arg);
    detail::check_strides(t, true, op, arg);
    MLA_CHECK(t.size(0) <= 1 || t.stride[0] >= t.size(1), "{}: {}'s rows overlap, got {}", op, arg, t.describe());
  };
  check_bytes(codes, fp4 ? "codes [M_pad, K / 2] (two e2m1 codes per byte)" : "codes [M_pad, K]");
  detail::check_size(codes, 1, fp4 ? K / 2 : K, op, fp4 ? "codes [M_pad, K / 2]" : "codes [M_pad, K]");
  const int64_t M_pad = codes.size(0);
  MLA_CHECK(M_pad >= M, "{}: codes must have at least M = {} rows, got {}", op, M, codes.describe());
  if (key == OutputQuant::fp8 || fp4)
    MLA_CHECK(std::isfinite(scale) && scale > 0, "{}: {} needs a finite {} scale > 0, got {}", op, to_string(key),
              fp4 ? "global" : "static", scale);
  if (key == OutputQuant::fp8) {
    MLA_CHECK(!scales.defined(), "{}: fp8 has one static scale (the scale argument); scales must be undefined, got {}",
              op, scales.describe());
  } else if (fp4) {
    check_bytes(scales, "scales [M_pad, K / 16] (e4m3)");
    detail::check_size(scales, 0, M_pad, op, "scales [M_pad, K / 16] (M_pad = codes.size(0))");
    detail::check_size(scales, 1, K / 16, op, "scales [M_pad, K / 16]");
  } else {
    check_f32_matrix(scales, op, "scales [K / G, M_pad]");
    detail::check_size(scales, 0, K / G, op, "scales [K / G, M_pad]");
    detail::check_size(scales, 1, M_pad, op, "scales [K / G, M_pad] (M_pad = codes.size(0))");
    // Group-major rows of M_pad scales: contiguous, or a column slice of a wider scale matrix.
    MLA_CHECK(scales.numel() == 0 || scales.size(0) <= 1 || scales.stride[0] >= M_pad,
              "{}: scales [K / G, M_pad] must have unit inner stride and a row stride of at least M_pad, got {}", op,
              scales.describe());
  }
  detail::check_devices(device, op, {{codes, "codes"}});
  if (scales.defined()) detail::check_devices(device, op, {{scales, "scales"}});
}

// No two of the defined, non-empty views share a byte.
void check_disjoint(std::initializer_list<std::pair<const TensorView*, const char*>> list, const char* op) {
  const std::vector<std::pair<const TensorView*, const char*>> views(list);
  for (std::size_t i = 0; i < views.size(); ++i)
    for (std::size_t j = i + 1; j < views.size(); ++j) {
      const TensorView &a = *views[i].first, &b = *views[j].first;
      if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) continue;
      const auto [a0, a1] = byte_span(a);
      const auto [b0, b1] = byte_span(b);
      MLA_CHECK(a1 <= b0 || b1 <= a0, "{}: {} overlaps {}", op, views[j].second, views[i].second);
    }
}

}  // namespace

void check_quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                           float scale, const char* op) {
  check_output_quant(key, op);
  MLA_CHECK(key != OutputQuant::none, "{}: key none has no quantised form (the activation is its own output)", op);
  check_act(x, 2, false, op, "x [M, K]");
  const int64_t M = x.size(0), K = x.size(1), G = output_quant_group(key);
  if (G > 0)
    MLA_CHECK(K % G == 0, "{}: {} needs K a multiple of {} (its scale groups), got x {}", op, to_string(key), G,
              x.describe());
  check_quant_targets(M, K, x.device, key, codes, scales, scale, op);
  // The outputs share no byte with x or with each other.
  check_disjoint({{&x, "x"}, {&codes, "codes"}, {&scales, "scales"}}, op);
}

}  // namespace detail

void quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                     float scale, const Context& ctx) {
  detail::check_quantize_output(x, key, codes, scales, scale, "quantize_output");
  if (codes.numel() == 0) return;
  MLA_DISPATCH(x.device, quantize_output, x, key, codes, scales, scale, ctx);
}

void up_project_quantized(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                          const TensorView& scales, float scale, const Context& ctx) {
  constexpr const char* op = "up_project_quantized";
  check_output_quant(key, op);
  MLA_CHECK(key != OutputQuant::none, "{}: key none has no quantised form (bmm writes the unquantised product)", op);
  detail::check_defined(o_lat, op, "o_lat [M, h, L]");
  detail::check_ndim(o_lat, 3, op, "o_lat [M, h, L]");
  detail::check_activation(o_lat, false, op, "o_lat [M, h, L]");
  detail::check_defined(w_uv, op, "w_uv [h, L, V]");
  detail::check_ndim(w_uv, 3, op, "w_uv [h, L, V]");
  detail::check_activation(w_uv, false, op, "w_uv [h, L, V]");
  detail::check_dtype(w_uv, o_lat.dtype, op, "w_uv [h, L, V] (o_lat's dtype)");
  const int64_t M = o_lat.size(0), h = o_lat.size(1), L = o_lat.size(2), V = w_uv.size(2);
  detail::check_size(w_uv, 0, h, op, "w_uv [h, L, V] (h = o_lat.size(1))");
  detail::check_size(w_uv, 1, L, op, "w_uv [h, L, V] (L = o_lat.size(2))");
  const int64_t G = std::max<int64_t>(output_quant_group(key), 16);
  MLA_CHECK(V % G == 0, "{}: {} needs V a multiple of {} (whole scale groups and 16-column blocks per head), got "
            "w_uv {}", op, to_string(key), G, w_uv.describe());
  if (o_lat.device.is_cuda())
    MLA_CHECK(L % 8 == 0, "{}: on CUDA L must be a multiple of 8 (16-byte rows), got o_lat {}", op, o_lat.describe());
  detail::check_devices(o_lat.device, op, {{w_uv, "w_uv"}});
  detail::check_quant_targets(M, detail::checked_mul(h, V, "h * V"), o_lat.device, key, codes, scales, scale, op);
  detail::check_disjoint({{&o_lat, "o_lat"}, {&w_uv, "w_uv"}, {&codes, "codes"}, {&scales, "scales"}}, op);
  if (codes.numel() == 0) return;
  MLA_DISPATCH(o_lat.device, up_project_quantized, o_lat, w_uv, key, codes, scales, scale, ctx);
}

void abs_max(const TensorView& x, const TensorView& out, const Context& ctx) {
  constexpr const char* op = "abs_max";
  check_act(x, 2, false, op, "x [M, K]");
  detail::check_defined(out, op, "out");
  detail::check_ndim(out, 1, op, "out [1]");
  detail::check_size(out, 0, 1, op, "out [1]");
  detail::check_dtype(out, DType::f32, op, "out [1]");
  detail::check_devices(x.device, op, {{out, "out"}});
  if (x.numel() > 0) {
    const auto [a0, a1] = byte_span(x);
    const auto [b0, b1] = byte_span(out);
    MLA_CHECK(a1 <= b0 || b1 <= a0, "{}: out overlaps x", op);
  }
  MLA_DISPATCH(x.device, abs_max, x, out, ctx);
}

void gemm_fp8_block(const TensorView& a, const TensorView& a_scales, const TensorView& w, const TensorView& w_scales,
                    const TensorView& c, const Context& ctx) {
  constexpr const char* op = "gemm_fp8_block";
  check_codes(a, false, op, "a [M, K]");
  check_codes(w, false, op, "w [N, K]");
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  detail::check_size(w, 1, K, op, "w [N, K] (K = a.size(1))");
  MLA_CHECK(K % 128 == 0 && K > 0, "{}: K must be a positive multiple of 128, got a {}", op, a.describe());
  const int64_t kb = K / 128, nb = (N + 127) / 128, kb4 = (kb + 3) / 4 * 4;
  check_f32_matrix(a_scales, op, "a_scales [K / 128, M]");
  detail::check_size(a_scales, 0, kb, op, "a_scales [K / 128, M]");
  detail::check_size(a_scales, 1, M, op, "a_scales [K / 128, M] (M = a.size(0))");
  MLA_CHECK(a_scales.size(0) <= 1 || a_scales.stride[0] == M, "{}: a_scales must be contiguous [K / 128, M], got {}",
            op, a_scales.describe());
  check_f32_matrix(w_scales, op, "w_scales [ceil(N / 128), K / 128]");
  detail::check_size(w_scales, 0, nb, op, "w_scales [ceil(N / 128), K / 128]");
  detail::check_size(w_scales, 1, kb, op, "w_scales [ceil(N / 128), K / 128]");
  MLA_CHECK(w_scales.size(0) <= 1 || w_scales.stride[0] == kb4,
            "{}: w_scales rows must be round_up(K / 128, 4) = {} apart (cuBLASLt's block-scale layout), got {}", op,
            kb4, w_scales.describe());
  detail::check_defined(c, op, "c");
  detail::check_ndim(c, 2, op, "c [M, N]");
  MLA_CHECK(c.dtype == DType::bf16 || c.dtype == DType::f32 || (c.device.is_cpu() && c.dtype == DType::f64),
            "{}: c must be bf16 or f32 (f64 too on the CPU), got {}", op, c.describe());
  detail::check_size(c, 0, M, op, "c [M, N] (M = a.size(0))");
  detail::check_size(c, 1, N, op, "c [M, N] (N = w.size(0))");
  detail::check_inner_contiguous(c, op, "c [M, N]");
  detail::check_strides(c, true, op, "c [M, N]");
  MLA_CHECK(c.size(0) <= 1 || c.stride[0] >= N, "{}: c's rows overlap (row stride < N), got {}", op, c.describe());
  detail::check_devices(a.device, op, {{a_scales, "a_scales"}, {w, "w"}, {w_scales, "w_scales"}, {c, "c"}});
  if (a.device.is_cuda()) {
    MLA_CHECK(M % 4 == 0, "{}: on CUDA M must be a multiple of 4 (cuBLASLt's token-scale layout; "
                          "quantize_fp8_groups pads the rows), got a {}", op, a.describe());
    MLA_CHECK(N % 16 == 0, "{}: on CUDA N must be a multiple of 16, got w {}", op, w.describe());
    const int64_t esize = static_cast<int64_t>(dtype_size(c.dtype));
    MLA_CHECK(c.size(0) <= 1 || (c.stride[0] * esize) % 16 == 0,
              "{}: on CUDA c's row stride must be a multiple of 16 bytes, got {}", op, c.describe());
  }
  for (const auto& [in, name] : {std::pair{&a, "a"}, {&a_scales, "a_scales"}, {&w, "w"}, {&w_scales, "w_scales"}})
    if (in->numel() > 0 && c.numel() > 0) {
      const auto [i0, i1] = byte_span(*in);
      const auto [o0, o1] = byte_span(c);
      MLA_CHECK(i1 <= o0 || o1 <= i0, "{}: c overlaps {}", op, name);
    }
  if (M == 0 || N == 0) return;
  MLA_DISPATCH(a.device, gemm_fp8_block, a, a_scales, w, w_scales, c, ctx);
}

}  // namespace mla
