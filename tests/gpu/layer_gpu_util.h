// SPDX-License-Identifier: Apache-2.0
#pragma once
// The MlaAttention GPU tests' acceptance rule (DESIGN §5 applied to a whole layer), shared by
// test_layer_gpu.cpp, test_layer_graph_gpu.cpp and test_layer_pdl_gpu.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "mla/variants.h"
#include "unit/layer_test_util.h"

namespace mla::test::layer {

// One bf16 quantum (ulp) at magnitude m.
inline double bf16_quantum(double m) { return m > 0 ? std::ldexp(1.0, std::ilogb(m) - 7) : 0.0; }

// The CPU layers a GPU layer's output is judged against: the float64 oracle and the same computation in bf16.
struct OracleRuns {
  LayerRun oracle, cpu;
};
inline OracleRuns oracle_runs(const StepData& d) {
  return {run_layer(d, Device::cpu(), DType::f64, Precision::reference),
          run_layer(d, Device::cpu(), DType::bf16, Precision::fast)};
}

// DESIGN §5 for a whole layer: the GPU's error against the float64 oracle is at most twice the
// error of the same computation at the same storage precision (the bf16 CPU layer), plus one bf16
// quantum of the output's magnitude. Padding rows stay unwritten.
inline void expect_matches_oracle(const StepData& d, const OracleRuns& ref, const std::vector<double>& gpu,
                                  const char* what) {
  const LayerRun &oracle = ref.oracle, &cpu = ref.cpu;
  const int64_t n = d.t_act * d.sc.h * d.sc.V;
  double mag = 0, err_gpu = 0, err_cpu = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << ": element " << i << " is " << gpu[i];
    mag = std::max(mag, std::fabs(oracle.out[i]));
    err_gpu = std::max(err_gpu, std::fabs(gpu[i] - oracle.out[i]));
    err_cpu = std::max(err_cpu, std::fabs(cpu.out[i] - oracle.out[i]));
  }
  for (std::size_t i = n; i < gpu.size(); ++i) ASSERT_TRUE(std::isnan(gpu[i])) << what << ": padding row written";
  EXPECT_LE(err_gpu, 2 * err_cpu + bf16_quantum(mag)) << what << ": max error " << err_gpu << " vs CPU bf16 "
                                                       << err_cpu << " at magnitude " << mag;
  const std::vector<double> g(gpu.begin(), gpu.begin() + n), r(oracle.out.begin(), oracle.out.begin() + n);
  EXPECT_LT(rel_l2(g, r), 1e-2) << what;
}
inline void expect_matches_oracle(const StepData& d, const std::vector<double>& gpu, const char* what) {
  expect_matches_oracle(d, oracle_runs(d), gpu, what);
}

// Runs `body` once per sparse_mqa variant the device runs, forced, so that the layer's sparse path is
// checked with each kernel; a variant that declines one of the scenario's launches (VariantUnsupported,
// e.g. sm90 and an fp8 per-tensor cache) is skipped for that scenario, and the skip is printed.
template <class Body>
void per_sparse_variant(Body&& body) {
  for (const VariantInfo& v : list_variants("sparse_mqa")) {
    if (!variant_runs_on_device("sparse_mqa", v.name, 0)) continue;
    SCOPED_TRACE("sparse_mqa variant " + v.name);
    ForceVariant force("sparse_mqa", v.name);
    try {
      body();
    } catch (const VariantUnsupported& e) {
      std::printf("[ declined ] sparse_mqa %s: %s\n", v.name.c_str(), e.what());
    }
  }
}

// Sparse scenario of the GPU tests: V3 MHA dims (P = V = 128), page 64, three decodes of 2 tokens, a
// prefill with short and one with long context, a fresh prefill, 3 padded token rows.
inline Scenario sparse_scenario(CacheFormat format, int h, int topk) {
  Scenario sc;
  sc.sparse = true;
  sc.format = format;
  sc.h = h;
  sc.P = 128;
  sc.V = 128;
  sc.topk = topk;
  sc.page_size = 64;
  sc.max_model_len = 400;
  sc.decode_threshold = 2;
  sc.reqs = {{20, 2}, {300, 2}, {70, 2}, {10, 60}, {150, 100}, {0, 100}};
  sc.pad_tokens = 3;
  return sc;
}

}  // namespace mla::test::layer
