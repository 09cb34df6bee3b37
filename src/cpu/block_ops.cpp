// SPDX-License-Identifier: Apache-2.0
// CPU backend of the DeepSeek block's ops (mla/block_ops.h): RMSNorm and RoPE per element in float64
// (rounded once into the output dtype, as a fused epilogue would), the 1 x 128 activation quantiser,
// and the block-scaled fp8 GEMM as dequantise-then-gemm (the codes times their scales are exact in
// float64; the product goes through cpu::gemm: float64 with Precision::reference, else float32).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {

void rms_norm(const TensorView& x, const TensorView& w, const TensorView& y, double eps, const Context&) {
  const int64_t rows = x.shape[0], n = x.shape[1];
  std::vector<double> wd(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) wd[static_cast<std::size_t>(i)] = num::load(w.ptr_at({i}), w.dtype);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = num::load(x.ptr_at({t, i}), x.dtype);
      ss += v * v;
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      num::store(y.ptr_at({t, i}), y.dtype, num::load(x.ptr_at({t, i}), x.dtype) * r * wd[static_cast<std::size_t>(i)]);
  }
}

void sliding_window_positions(const TensorView& positions, const TensorView& out, const Context&) {
  const int64_t T = out.shape[0], W = out.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = num::load_index(positions.ptr_at({t}), positions.dtype);
    auto* row = static_cast<int32_t*>(out.ptr_at({t, 0}));
    for (int64_t j = 0; j < W; ++j) {
      const int64_t pos = p - W + 1 + j;
      row[j] = pos < 0 || pos > std::numeric_limits<int32_t>::max() ? -1 : static_cast<int32_t>(pos);
    }
  }
}

void apply_rope(const TensorView& src, const TensorView& dst, const TensorView& positions, const TensorView& inv_freq,
                double factor, int64_t rope_dim, bool interleave, const Context&) {
  const int64_t rows = src.shape[0], groups = src.shape[1], D = src.shape[2], nope = D - rope_dim, half = rope_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t i = 0; i < nope; ++i)
        num::store(dst.ptr_at({t, g, i}), dst.dtype, num::load(src.ptr_at({t, g, i}), src.dtype));
    if (half == 0) continue;
    const auto pos = static_cast<double>(num::load_index(positions.ptr_at({t}), positions.dtype));
    for (int64_t i = 0; i < half; ++i) {
      const double ang = pos * num::load(inv_freq.ptr_at({i}), inv_freq.dtype);
      const double c = std::cos(ang) * factor, s = std::sin(ang) * factor;
      const int64_t ia = nope + (interleave ? 2 * i : i), ib = nope + (interleave ? 2 * i + 1 : i + half);
      for (int64_t g = 0; g < groups; ++g) {
        const double a = num::load(src.ptr_at({t, g, ia}), src.dtype), b = num::load(src.ptr_at({t, g, ib}), src.dtype);
        num::store(dst.ptr_at({t, g, ia}), dst.dtype, a * c - b * s);
        num::store(dst.ptr_at({t, g, ib}), dst.dtype, b * c + a * s);
      }
    }
  }
}

void quantize_fp8_groups(const TensorView& x, const TensorView& codes, const TensorView& scales, const Context&) {
  const int64_t M = x.shape[0], K = x.shape[1], M_pad = codes.shape[0], groups = K / 128;
  auto* sc = static_cast<float*>(scales.data);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < M_pad; ++t) {
    auto* out = static_cast<uint8_t*>(codes.ptr_at({t, 0}));
    for (int64_t g = 0; g < groups; ++g) {
      if (t >= M) {
        std::fill(out + g * 128, out + g * 128 + 128, uint8_t{0});
        sc[g * M_pad + t] = 1.0f;
        continue;
      }
      // The scale is the float amax / 448 (as the CUDA kernel and DeepSeek's act_quant compute it);
      // the codes round x / scale in float.
      float amax = 0;
      for (int64_t j = g * 128; j < g * 128 + 128; ++j)
        amax = std::max(amax, std::fabs(static_cast<float>(num::load(x.ptr_at({t, j}), x.dtype))));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      sc[g * M_pad + t] = s;
      for (int64_t j = g * 128; j < g * 128 + 128; ++j)
        out[j] = num::float_to_e4m3(static_cast<float>(num::load(x.ptr_at({t, j}), x.dtype)) / s);
    }
  }
}

namespace {

// max |v| over values that propagates NaN (std::max and fmax drop it).
float abs_max_nan(float m, float v) {
  if (std::isnan(m)) return m;
  const float a = std::fabs(v);
  return (std::isnan(a) || a > m) ? a : m;
}

float value_at(const TensorView& x, int64_t t, int64_t j) {
  return static_cast<float>(num::load(x.ptr_at({t, j}), x.dtype));
}

}  // namespace

// docs/SEMANTICS.md §15. Every quantity is a float computed with IEEE float operations in this order,
// so the CUDA kernels (quantize_output.cu) give the same bytes.
void quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                     float scale, const Context&) {
  const int64_t M = x.shape[0], K = x.shape[1], M_pad = codes.shape[0], G = output_quant_group(key);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < M_pad; ++t) {
    auto* out = static_cast<uint8_t*>(codes.ptr_at({t, 0}));
    const bool pad = t >= M;
    switch (key) {
      case OutputQuant::fp8:
        for (int64_t j = 0; j < K; ++j) out[j] = pad ? uint8_t{0} : num::float_to_e4m3(value_at(x, t, j) / scale);
        break;
      case OutputQuant::fp8_group128:
      case OutputQuant::fp8_group64: {
        auto* sc = static_cast<float*>(scales.data);
        const int64_t ss = scales.stride[0];  // >= M_pad (a column slice of a wider scale matrix)
        for (int64_t g = 0; g < K / G; ++g) {
          if (pad) {
            std::fill(out + g * G, out + (g + 1) * G, uint8_t{0});
            sc[g * ss + t] = 1.0f;
            continue;
          }
          float amax = 0;
          for (int64_t j = g * G; j < (g + 1) * G; ++j) amax = abs_max_nan(amax, value_at(x, t, j));
          const float s = amax == 0.0f ? 1.0f : amax / 448.0f;
          sc[g * ss + t] = s;
          for (int64_t j = g * G; j < (g + 1) * G; ++j) out[j] = num::float_to_e4m3(value_at(x, t, j) / s);
        }
        break;
      }
      case OutputQuant::nvfp4: {
        auto* sc = static_cast<uint8_t*>(scales.ptr_at({t, 0}));
        for (int64_t b = 0; b < K / 16; ++b) {
          if (pad) {
            std::fill(out + b * 8, out + b * 8 + 8, uint8_t{0});
            sc[b] = 0;
            continue;
          }
          float amax = 0;
          for (int64_t j = b * 16; j < b * 16 + 16; ++j) amax = abs_max_nan(amax, value_at(x, t, j));
          const uint8_t s_code = num::float_to_e4m3(scale * (amax / 6.0f));
          sc[b] = s_code;
          const float s = num::e4m3_to_float(s_code);
          const float m = s / scale;  // one code step of the block is m (dequantised: code * s / scale)
          for (int64_t i = 0; i < 8; ++i) {
            const int64_t j = b * 16 + 2 * i;
            const uint8_t lo = s == 0.0f ? uint8_t{0} : num::float_to_e2m1(value_at(x, t, j) / m);
            const uint8_t hi = s == 0.0f ? uint8_t{0} : num::float_to_e2m1(value_at(x, t, j + 1) / m);
            out[b * 8 + i] = static_cast<uint8_t>(lo | (hi << 4));
          }
        }
        break;
      }
      case OutputQuant::none: break;  // refused by the front end
    }
  }
}

// The product as bmm computes it (cpu::bmm, rounded once into o_lat's dtype) in a host buffer, then
// quantize_output of it: quantize(unfused output) by construction.
void up_project_quantized(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                          const TensorView& scales, float scale, const Context& ctx) {
  const int64_t M = o_lat.shape[0], h = o_lat.shape[1], V = w_uv.shape[2];
  Tensor x = Tensor::empty({M, h * V}, o_lat.dtype);
  if (M > 0) {
    const TensorView heads = x.view().reshape({M, h, V});
    cpu::bmm(o_lat.transpose(0, 1), w_uv, heads.transpose(0, 1), 1.0f, 0.0f, ctx);
  }
  cpu::quantize_output(x.view(), key, codes, scales, scale, ctx);
}

void abs_max(const TensorView& x, const TensorView& out, const Context&) {
  float m = 0;
  for (int64_t t = 0; t < x.shape[0]; ++t)
    for (int64_t j = 0; j < x.shape[1]; ++j) m = abs_max_nan(m, value_at(x, t, j));
  *static_cast<float*>(out.data) = m;
}

void gemm_fp8_block(const TensorView& a, const TensorView& a_scales, const TensorView& w, const TensorView& w_scales,
                    const TensorView& c, const Context& ctx) {
  const int64_t M = a.shape[0], K = a.shape[1], N = w.shape[0];
  const DType acc = ctx.precision == Precision::reference ? DType::f64 : DType::f32;
  Tensor ad = Tensor::empty({M, K}, acc), wd = Tensor::empty({N, K}, acc);
  const TensorView av = ad.view(), wv = wd.view();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      num::store(av.ptr_at({m, k}), acc,
                 static_cast<double>(num::e4m3_to_float(*static_cast<const uint8_t*>(a.ptr_at({m, k})))) *
                     num::load(a_scales.ptr_at({k / 128, m}), a_scales.dtype));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      num::store(wv.ptr_at({n, k}), acc,
                 static_cast<double>(num::e4m3_to_float(*static_cast<const uint8_t*>(w.ptr_at({n, k})))) *
                     num::load(w_scales.ptr_at({n / 128, k / 128}), w_scales.dtype));
  cpu::gemm(av, wv.transpose(0, 1), c, 1.0f, 0.0f, ctx);
}

}  // namespace mla::cpu
