// SPDX-License-Identifier: Apache-2.0
// MlaAttention, sparse (DSA) mode: the float64 oracle layer against naive attention over each
// token's top-k set (explicit up-projection), for a bf16 cache, a per-tensor fp8 cache and the
// fp8_ds_mla cache in both its mixed-batch (h < 32) and separate (h >= 32, upconverted bf16 prefill
// workspace) modes; and the bf16 fast layer against the oracle.
#include <gtest/gtest.h>

#include "layer_test_util.h"

namespace mla::test::layer {
namespace {

// Two single-token decodes (the first token sees no index, the second names one outside its block
// table), a prefill with context and a fresh one.
Scenario sparse_small_heads(CacheFormat format) {
  Scenario sc;
  sc.sparse = true;
  sc.format = format;
  sc.topk = 16;
  sc.max_model_len = 128;
  sc.reqs = {{20, 1}, {40, 1}, {10, 6}, {0, 12}};
  return sc;
}

// h = 32: fp8_ds_mla prefills go through the upconverted workspace, split into two chunks
// (sequence lengths 15 + 20 fit 40 rows, the next 20 start a new chunk); decodes are uniform s_q = 2.
Scenario sparse_separate() {
  Scenario sc;
  sc.sparse = true;
  sc.format = CacheFormat::fp8_ds_mla;
  sc.h = 32;
  sc.P = 16;
  sc.V = 16;
  sc.topk = 12;
  sc.max_model_len = 40;
  sc.sparse_workspace_rows = 40;
  sc.decode_threshold = 2;
  sc.reqs = {{30, 2}, {12, 2}, {10, 5}, {15, 5}, {0, 20}};
  return sc;
}

double oracle_vs_naive(const StepData& d) {
  const LayerRun run = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  return error_ratio(run.out, naive_layer(d, run.cache_view), d);
}

TEST(LayerSparse, Bf16CacheMatchesNaiveTopk) {
  const StepData d = make_step(sparse_small_heads(CacheFormat::bf16));
  EXPECT_LE(oracle_vs_naive(d), 1.0);
}

TEST(LayerSparse, Fp8CacheMatchesNaiveTopk) {
  const StepData d = make_step(sparse_small_heads(CacheFormat::fp8));
  EXPECT_LE(oracle_vs_naive(d), 1.0);
}

TEST(LayerSparse, DsMlaMixedBatchMatchesNaiveTopk) {
  const StepData d = make_step(sparse_small_heads(CacheFormat::fp8_ds_mla));
  ASSERT_TRUE(d.plan.sparse_mixed_batch);
  EXPECT_LE(oracle_vs_naive(d), 1.0);
}

// Prefill tokens read the bf16-rounded dequantised rows (the upconvert workspace is bf16 by
// definition, §11.5); decode tokens read the cache itself.
TEST(LayerSparse, DsMlaSeparateModeMatchesNaiveTopk) {
  const StepData d = make_step(sparse_separate());
  ASSERT_FALSE(d.plan.sparse_mixed_batch);
  ASSERT_EQ(d.plan.sparse_chunks.size(), 2u);
  EXPECT_LE(oracle_vs_naive(d), 1.0);
}

// PlannerConfig::sparse_prefill_mode against §11.4's head rule: 16 heads in the separate mode (prefills
// through the upconverted workspace, two chunks) and 32 heads in the mixed batch, each against naive
// attention over the top-k sets.
TEST(LayerSparse, DsMlaModeChosenAgainstTheHeadRule) {
  Scenario h16 = sparse_separate();
  h16.h = 16;
  h16.sparse_prefill_mode = SparsePrefillMode::separate;
  const StepData sep = make_step(h16);
  ASSERT_FALSE(sep.plan.sparse_mixed_batch);
  ASSERT_EQ(sep.plan.sparse_chunks.size(), 2u);
  EXPECT_LE(oracle_vs_naive(sep), 1.0);
  Scenario h32 = sparse_separate();
  h32.sparse_prefill_mode = SparsePrefillMode::mixed_batch;
  const StepData mixed = make_step(h32);
  ASSERT_TRUE(mixed.plan.sparse_mixed_batch);
  EXPECT_LE(oracle_vs_naive(mixed), 1.0);
}

TEST(LayerSparse, DecodeOnlyAndPrefillOnlyBatches) {
  Scenario sc = sparse_small_heads(CacheFormat::bf16);
  sc.reqs = {{20, 1}, {40, 1}, {3, 1}};
  EXPECT_LE(oracle_vs_naive(make_step(sc)), 1.0);
  Scenario sep = sparse_separate();
  sep.reqs = {{10, 9}, {0, 7}};
  EXPECT_LE(oracle_vs_naive(make_step(sep)), 1.0);
}

TEST(LayerFast, SparseBf16LayerWithinToleranceOfOracle) {
  for (const Scenario& sc : {sparse_small_heads(CacheFormat::bf16), sparse_small_heads(CacheFormat::fp8_ds_mla),
                             sparse_separate()}) {
    const StepData d = make_step(sc);
    const LayerRun oracle = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
    const LayerRun fast = run_layer(d, Device::cpu(), DType::bf16, Precision::fast);
    const int64_t n = d.t_act * sc.h * sc.V;
    const std::vector<double> got(fast.out.begin(), fast.out.begin() + n);
    const std::vector<double> ref(oracle.out.begin(), oracle.out.begin() + n);
    EXPECT_LT(rel_l2(got, ref), 1e-2) << to_string(sc.format) << " h=" << sc.h;
    EXPECT_EQ(check_close(got, ref, DType::bf16, 2e-2), "") << to_string(sc.format) << " h=" << sc.h;
  }
}

}  // namespace
}  // namespace mla::test::layer
