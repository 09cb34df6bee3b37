// SPDX-License-Identifier: Apache-2.0
// Helpers of the block traces of `mla run` (run_block_util.h).
#include "run_block_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "commands.h"
#include "core/numeric.h"
#include "mla/ops.h"
#include "synth.h"

namespace mla::app {

void BlockCheck::add(double e, double ce) {
  const double bound = step_bound(ce);
  worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  worst_cache = std::max(worst_cache, std::isnan(ce) ? INFINITY : ce);
  worst_ratio = std::max(worst_ratio, std::isnan(e) || std::isnan(ce) ? INFINITY : e / bound);
  if (!(e <= bound)) ++failures;
}

void BlockCheck::print(bool enabled, const std::string& caches) const {
  const std::string verdict = failures == 0 ? "PASS" : fmt::format("FAIL ({} steps)", failures);
  if (enabled && !exact)
    fmt::print("check         every step against the float64 CPU block: worst rel-L2 {:.3e} (rule {:.0e}): {}\n", worst,
               kBlockRule, verdict);
  else if (enabled)
    fmt::print("check         every step against the float64 CPU block with the same cache: worst rel-L2 {:.3e}; "
               "bound {:.0e} + 2 x {} own error (worst {:.3e}, the twin against the f64-cache block); "
               "worst error / bound {:.2f}: {}\n",
               worst, kBlockRule, caches, worst_cache, worst_ratio, verdict);
  else
    fmt::print("check         skipped (--check-samples 0)\n");
}

nlohmann::json BlockCheck::json(bool enabled) const {
  if (!enabled) return nlohmann::json(nullptr);
  return nlohmann::json{{"worst_rel_l2", worst},
                        {"rule", kBlockRule},
                        {"worst_cache_error", exact ? nlohmann::json(worst_cache) : nlohmann::json(nullptr)},
                        {"worst_error_over_bound", worst_ratio},
                        {"failed_steps", failures}};
}

int BlockCheck::finish(bool enabled, nlohmann::json j, int64_t steps, int64_t tokens, double forward_seconds,
                       double wall_seconds, OutputFile& out) const {
  if (out.enabled()) {
    j["steps"] = steps;
    j["tokens"] = tokens;
    j["forward_seconds"] = forward_seconds;
    j["wall_seconds"] = wall_seconds;
    j["check"] = json(enabled);
    out.write(j.dump(2) + "\n");
  }
  return enabled && failures > 0 ? kExitCheckFailed : kExitOk;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

DeepseekLinear random_linear(int64_t out, int64_t in, bool fp8, int block_rows, int block_cols, uint64_t seed,
                             std::vector<Tensor>& keep) {
  DeepseekLinear l;
  const double a = std::sqrt(3.0 / static_cast<double>(in));
  if (fp8) {
    FastRng g(seed);
    Tensor codes = Tensor::empty({out, in}, DType::fp8_e4m3);
    auto* p = static_cast<uint8_t*>(codes.data());
    for (int64_t i = 0; i < out * in; ++i) p[i] = num::float_to_e4m3(static_cast<float>(g.uniform(-448.0, 448.0)));
    const int64_t br = (out + block_rows - 1) / block_rows, bc = (in + block_cols - 1) / block_cols;
    Tensor scale = Tensor::empty({br, bc}, DType::f32);
    fill(scale.view(), a / 448.0);
    l.weight = codes.view();
    l.weight_scale_inv = scale.view();
    keep.push_back(codes);
    keep.push_back(scale);
  } else {
    Tensor wt = Tensor::empty({out, in}, DType::bf16);
    fill_uniform_bf16(static_cast<uint16_t*>(wt.data()), out * in, seed, -a, a);
    l.weight = wt.view();
    keep.push_back(wt);
  }
  return l;
}

TensorView random_bf16_vector(int64_t n, uint64_t seed, double lo, double hi, std::vector<Tensor>& keep) {
  Tensor t = Tensor::empty({n}, DType::bf16);
  fill_uniform_bf16(static_cast<uint16_t*>(t.data()), n, seed, lo, hi);
  keep.push_back(t);
  return t.view();
}

TensorView on_device(const TensorView& host, const Tensor& buf) {
  if (!host.defined() || buf.device().is_cpu()) return host;
  TensorView d(buf.data(), host.dtype, std::span<const int64_t>(host.shape.data(), host.ndim), buf.device());
  if (host.numel() > 0) copy(d, host);
  return d;
}

TensorView on_host(const TensorView& view, const Tensor& buf) {
  if (view.device.is_cpu()) return view;
  const TensorView h = buf.view().slice(0, 0, view.shape[0]);
  copy(h, view);
  return h;
}

Tensor as_dtype(const Tensor& bf16, DType dtype) {
  if (dtype == DType::bf16) return bf16;
  Tensor t = Tensor::empty({bf16.size(0), bf16.size(1)}, dtype);
  const auto* s = static_cast<const uint16_t*>(bf16.data());
  for (int64_t i = 0; i < bf16.numel(); ++i)
    num::store(static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(dtype)), dtype, num::bf16_to_float(s[i]));
  return t;
}

double rel_l2(const TensorView& got, const TensorView& ref) {
  double num = 0, den = 0;
  const int64_t n = got.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double g = num::load(static_cast<const char*>(got.data) + i * got.element_size(), got.dtype);
    const double r = num::load(static_cast<const char*>(ref.data) + i * ref.element_size(), ref.dtype);
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 || std::isnan(num) ? INFINITY : 0.0);
}

}  // namespace mla::app
