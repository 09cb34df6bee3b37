// SPDX-License-Identifier: Apache-2.0
#include "oracle.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "mla/error.h"

namespace mla::app {

UpProjectedKeys::UpProjectedKeys(const OracleModel& model, std::vector<double> rows) : rows_(std::move(rows)) {
  const ModelDims& d = model.dims;
  row_width_ = d.kv_lora_rank + d.qk_rope_head_dim;
  kv_width_ = static_cast<int64_t>(d.num_heads) * (d.qk_nope_head_dim + d.v_head_dim);
  if (row_width_ <= 0 || rows_.size() % static_cast<std::size_t>(row_width_) != 0)
    throw Error(fmt::format("oracle: {} latent values are not whole rows of {}", rows_.size(), row_width_));
  n_ = static_cast<int64_t>(rows_.size()) / row_width_;
  kv_.assign(static_cast<std::size_t>(n_ * kv_width_), 0.0);
  if (n_ == 0) return;
  // kv[j, :] = sum_l rows[j, l] * W[:, l] over the L latent columns (the rope part is not projected).
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n_), static_cast<blasint>(kv_width_),
              d.kv_lora_rank, 1.0, rows_.data(), static_cast<blasint>(row_width_), model.kv_b_proj.data(),
              d.kv_lora_rank, 0.0, kv_.data(), static_cast<blasint>(kv_width_));
}

std::vector<double> oracle_attention(const OracleModel& model, const double* q, const UpProjectedKeys& keys,
                                     const std::vector<int64_t>& visible) {
  const ModelDims& d = model.dims;
  if (visible.empty()) throw Error("oracle: a query with no visible key has no reference output");
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, V = d.v_head_dim,
                L = d.kv_lora_rank;
  const int64_t n = static_cast<int64_t>(visible.size());
  std::vector<double> out(static_cast<std::size_t>(H * V), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    const double* qh = q + h * (P + R);
    std::vector<double> s(static_cast<std::size_t>(n));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t key = visible[static_cast<std::size_t>(j)];
      const double* k_nope = keys.kv(key) + h * (P + V);
      const double* k_pe = keys.latent_row(key) + L;
      double dot = 0;
      for (int64_t i = 0; i < P; ++i) dot += qh[i] * k_nope[i];
      for (int64_t i = 0; i < R; ++i) dot += qh[P + i] * k_pe[i];
      s[static_cast<std::size_t>(j)] = dot * d.softmax_scale;
      m = std::max(m, s[static_cast<std::size_t>(j)]);
    }
    double denom = 0;
    double* oh = out.data() + h * V;
    for (int64_t j = 0; j < n; ++j) {
      const double p = std::exp(s[static_cast<std::size_t>(j)] - m);
      denom += p;
      const double* v = keys.kv(visible[static_cast<std::size_t>(j)]) + h * (P + V) + P;
      for (int64_t i = 0; i < V; ++i) oh[i] += p * v[i];
    }
    for (int64_t i = 0; i < V; ++i) oh[i] /= denom;
  }
  return out;
}

void dequantize_cache_row(CacheFormat format, float fp8_scale, const uint8_t* row, int d_qk, int d_rope, double* out) {
  auto bf16_at = [&](int64_t byte_offset) {
    uint16_t h;
    std::memcpy(&h, row + byte_offset, 2);
    return static_cast<double>(num::bf16_to_float(h));
  };
  switch (format) {
    case CacheFormat::bf16:
      for (int i = 0; i < d_qk; ++i) out[i] = bf16_at(2 * i);
      return;
    case CacheFormat::fp8:  // one per-tensor scale for latent and rope alike: value = q * scale
      for (int i = 0; i < d_qk; ++i) out[i] = static_cast<double>(num::e4m3_to_float(row[i])) * fp8_scale;
      return;
    case CacheFormat::fp8_ds_mla: {
      // 512 e4m3 | 4 fp32 scales (one per 128 latent values) | 64 bf16 rope (bytes 528..655).
      if (d_qk != 576 || d_rope != 64)
        throw Error(fmt::format("oracle: fp8_ds_mla rows are 512 + 64 wide, got d_qk {} d_rope {}", d_qk, d_rope));
      float scales[4];
      std::memcpy(scales, row + 512, sizeof(scales));
      for (int i = 0; i < 512; ++i)
        out[i] = static_cast<double>(num::e4m3_to_float(row[i])) * static_cast<double>(scales[i / 128]);
      for (int i = 0; i < 64; ++i) out[512 + i] = bf16_at(528 + 2 * i);
      return;
    }
    case CacheFormat::f64:  // float64 values as stored (the CPU-only oracle format)
      for (int i = 0; i < d_qk; ++i) std::memcpy(out + i, row + 8 * i, 8);
      return;
    case CacheFormat::v4:
    case CacheFormat::v41:
    case CacheFormat::v41_fp4:
      throw Error(fmt::format("oracle: the {} cache (DeepSeek-V4 records) has no mla run mode to check", to_string(format)));
  }
  throw Error("oracle: unknown cache format");
}

// kappa: bf16 roundings between the bf16 inputs and the bf16 output on the longest path of the
// layer, each worth at most about one unit roundoff of the output row's scale:
//   decode / sparse: ql = q_nope·W_UK_T, the latent output o_lat, and (fp8_ds_mla prefill in the
//   separate sparse mode) the bf16 upconvert of the cache rows;
//   prefill: up-projected k_nope and v, the new-token and per-chunk partial outputs merged by LSE;
//   GPU attention kernels also round the softmax weights to bf16 for the tensor-core P·V product.
// Four covers the longest of these paths. Measured over dense and sparse runs, every cache format,
// page sizes 1/16/64 and 2..128 heads, the largest kappa a token needed was 0.71 on the CPU backend
// and about 1.1 on an H200.
// The bound stays tight enough to see structural errors: one key too many or too few among n moves
// an output by about 1/sqrt(n) of its size, above 4 u for n up to a few thousand keys.
Tolerance bf16_layer_tolerance() { return Tolerance{4.0}; }
Tolerance fp8_prefill_tolerance() { return Tolerance{32.0}; }

namespace {
double bf16_round(double x) { return num::round_bf16(static_cast<float>(x)); }
double bf16_ulp(double x) {  // one unit in the last place of bf16 at |x|, floored at the smallest normal
  const double a = std::fabs(x);
  int e = a > 0 ? std::ilogb(a) : -126;
  e = std::max(e, -126);
  return std::ldexp(1.0, e - 7);
}
}  // namespace

Comparison compare_bf16(const std::vector<double>& got, const std::vector<double>& ref, const Tolerance& tol,
                        const std::vector<double>* extra) {
  Comparison c;
  if (got.size() != ref.size() || (extra && extra->size() != got.size())) {
    c.ok = false;
    c.problem = fmt::format("{} outputs against {} reference values", got.size(), ref.size());
    return c;
  }
  for (double r : ref) c.max_ref = std::max(c.max_ref, std::fabs(r));
  const double row_term = tol.kappa * 0x1.0p-8 * c.max_ref;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(g)) {
      c.ok = false;
      c.worst_index = static_cast<int64_t>(i);
      c.got_at_worst = g;
      c.ref_at_worst = r;
      c.worst_ratio = std::numeric_limits<double>::infinity();
      c.problem = fmt::format("output element {} is {} (reference {:.6g})", i, g, r);
      return c;
    }
    const double err = std::fabs(g - r);
    const double base = 2.0 * std::fabs(bf16_round(r) - r) + bf16_ulp(r) + (extra ? (*extra)[i] : 0.0);
    const double bound = base + row_term;
    c.max_abs_err = std::max(c.max_abs_err, err);
    if (c.max_ref > 0) c.kappa_needed = std::max(c.kappa_needed, (err - base) / (0x1.0p-8 * c.max_ref));
    if (err / bound > c.worst_ratio || c.worst_index < 0) {
      c.worst_ratio = err / bound;
      c.worst_index = static_cast<int64_t>(i);
      c.bound_at_worst = bound;
      c.got_at_worst = g;
      c.ref_at_worst = r;
    }
  }
  if (c.worst_ratio > 1.0) {
    c.ok = false;
    c.problem = fmt::format("element {} is {:.6g}, reference {:.6g}: error {:.3g} > bound {:.3g}", c.worst_index,
                            c.got_at_worst, c.ref_at_worst, std::fabs(c.got_at_worst - c.ref_at_worst),
                            c.bound_at_worst);
  }
  return c;
}

}  // namespace mla::app
