// SPDX-License-Identifier: Apache-2.0
// Issue 9's accuracy item: single output elements of the CUDA prefill path were seen 0.6-0.7 off at
// |x| ~ 3 in 128-head mixed batches with page 16, against a float64 reference that rounds to bf16 where
// vLLM's does, while the CPU backend stayed within 0.5. This test builds such a batch with inputs that
// peak the softmax (logits of standard deviation ~2, outputs up to |x| ~ 4: the regime where single
// elements move) and measures, on the same inputs, the CUDA layer and three CPU references:
//   f64     the float64 oracle layer (nothing rounded)
//   bf16ref the CPU layer in bf16 with float64 accumulation: rounds exactly where the layer stores bf16
//           (up-projected K / V, absorbed queries, context partials, output): "vLLM's rounding points"
//   cpu     the CPU layer in bf16 with float32 accumulation (the CPU backend as users run it)
// For each pair it prints the largest element difference, where it sits (decode token, prefill token
// with context, fresh prefill token) and how many elements differ by more than 0.1 / 0.25, and it
// requires DESIGN §5 against both references: the GPU's error is at most twice the CPU backend's plus
// one bf16 quantum of the output magnitude. docs/LAB.md (dense prefill, accuracy) records the figures.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "layer_gpu_util.h"
#include "mla/variants.h"
#include "variant_test_util.h"

namespace mla::test::layer {
namespace {

using ::mla::test::variants_of;

struct Diff {
  double max = 0, at_mag = 0;
  int64_t at = -1, over_01 = 0, over_025 = 0;
};

Diff diff(const std::vector<double>& a, const std::vector<double>& b, int64_t n) {
  Diff d;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(a[i] - b[i]);
    d.over_01 += e > 0.1;
    d.over_025 += e > 0.25;
    if (e > d.max) {
      d.max = e;
      d.at = i;
      d.at_mag = std::fabs(b[i]);
    }
  }
  return d;
}

TEST(PrefillAccuracyGpu, PeakedSoftmaxMixedH128Page16) {
  MLA_SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.h = 128;
  sc.P = 128;
  sc.V = 128;
  sc.page_size = 16;
  sc.max_model_len = 2048;
  sc.decode_threshold = 1;
  // 3 decodes, 2 prefills with context (chunked through 512 rows: 3 chunks), a fresh prefill.
  sc.reqs = {{300, 1}, {517, 1}, {64, 1}, {700, 260}, {1200, 130}, {0, 300}};
  sc.context_workspace_rows = 512;
  sc.seed = 909;
  StepData d = make_step(sc);
  // Peaked softmax: k_nope / v of std ~1.5 (|v| up to ~5), q in [-3, 3] -> logits of std ~2.
  fill_random(d.weight.view(), -0.2, 0.2);
  fill_random(d.q.view(), -3.0, 3.0);

  const LayerRun f64 = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  const LayerRun bref = run_layer(d, Device::cpu(), DType::bf16, Precision::reference);
  const LayerRun cpu = run_layer(d, Device::cpu(), DType::bf16, Precision::fast);
  const int64_t hv = sc.h * sc.V, n = d.t_act * hv;
  double mag = 0;
  for (int64_t i = 0; i < n; ++i) mag = std::max(mag, std::fabs(f64.out[i]));
  const int64_t t_dec = d.plan.split.num_decodes;  // one token per decode request here
  const int64_t t_ctx = t_dec + 260 + 130;          // prefill tokens with context end here
  auto where = [&](int64_t i) {
    if (i < 0) return std::string("-");
    const int64_t t = i / hv, h = (i % hv) / sc.V, col = i % sc.V;
    const char* kind = t < t_dec ? "decode" : t < t_ctx ? "prefill+context" : "fresh prefill";
    return std::string(kind) + " token " + std::to_string(t) + " head " + std::to_string(h) + " col " +
           std::to_string(col);
  };
  auto report = [&](const std::string& name, const std::vector<double>& x, const std::vector<double>& ref) {
    const Diff e = diff(x, ref, n);
    const auto at = [&](const std::vector<double>& v) { return e.at >= 0 ? v[e.at] : 0.0; };
    std::printf("  %-26s max %.4f at |x| %.3f (%s): this %.4f f64 %.4f bf16ref %.4f cpu %.4f; > 0.1: %lld, > 0.25: %lld\n",
                name.c_str(), e.max, e.at_mag, where(e.at).c_str(), at(x), at(f64.out), at(bref.out), at(cpu.out),
                static_cast<long long>(e.over_01), static_cast<long long>(e.over_025));
    return e;
  };
  std::printf("  %lld elements, max |out| %.3f\n", static_cast<long long>(n), mag);
  const Diff c_f64 = report("cpu vs f64", cpu.out, f64.out);
  report("bf16ref vs f64", bref.out, f64.out);
  const Diff c_bref = report("cpu vs bf16ref", cpu.out, bref.out);
  // The CUDA layer with each mha_prefill variant the device runs (sm90 schedules, portable).
  for (const std::string& v : variants_of("mha_prefill")) {
    // The sm90_fp8 variants run fp8 compute only (LayerOptions::fp8_prefill; test_prefill_fp8_gpu.cpp).
    if (v.find("fp8") != std::string::npos || !variant_runs_on_device("mha_prefill", v, 0)) continue;
    const ForceVariant forced("mha_prefill", v);
    const LayerRun gpu = run_layer(d, Device::cuda(0), DType::bf16, Precision::fast);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(gpu.out[i])) << v << ": element " << i;
    const Diff g_f64 = report("gpu " + v + " vs f64", gpu.out, f64.out);
    const Diff g_bref = report("gpu " + v + " vs bf16ref", gpu.out, bref.out);
    report("gpu " + v + " vs cpu", gpu.out, cpu.out);
    EXPECT_LE(g_f64.max, 2 * c_f64.max + bf16_quantum(mag)) << v << ": DESIGN §5 against the float64 oracle";
    EXPECT_LE(g_bref.max, 2 * c_bref.max + bf16_quantum(mag)) << v << ": DESIGN §5 against the bf16-rounding reference";
  }
}

}  // namespace
}  // namespace mla::test::layer
