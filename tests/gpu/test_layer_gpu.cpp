// SPDX-License-Identifier: Apache-2.0
// MlaAttention on CUDA (bf16) against the float64 CPU oracle layer on the same inputs: dense mixed
// batches in every cache format, chunked context, and sparse mode in both fp8_ds_mla modes. Every
// step kind captured in a CUDA graph: test_layer_graph_gpu.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "layer_gpu_util.h"

namespace mla::test::layer {
namespace {

Scenario mixed_dense(CacheFormat format, int64_t page) {
  Scenario sc;
  sc.format = format;
  sc.h = 16;
  sc.P = 128;
  sc.V = 128;
  sc.page_size = page;
  sc.max_model_len = 512;
  sc.decode_threshold = 2;
  sc.require_uniform = true;
  sc.reqs = {{5, 2}, {130, 2}, {63, 2}, {200, 17}, {1, 3}, {64, 33}, {0, 40}, {0, 1}};
  sc.pad_tokens = 5;
  return sc;
}

void run_and_compare(const Scenario& sc, const char* what) {
  const StepData d = make_step(sc);
  {
    const MlaAttention layer(sc.options(Device::cuda(0), DType::bf16), d.weight);
    EXPECT_LE(layer.workspace_bytes(d.plan), layer.max_workspace_bytes(sc.config(), d.T)) << what;
  }
  const LayerRun gpu = run_layer(d, Device::cuda(0), DType::bf16, Precision::fast);
  expect_matches_oracle(d, gpu.out, what);
  // bf16 and fp8 caches are written bit for bit like the CPU backend (RNE, satfinite).
  if (sc.format != CacheFormat::fp8_ds_mla) {
    const LayerRun cpu = run_layer(d, Device::cpu(), DType::bf16, Precision::fast);
    EXPECT_EQ(std::memcmp(gpu.cache.data(), cpu.cache.data(), cpu.cache.nbytes()), 0) << what << ": caches differ";
  }
}

TEST(LayerGpu, SmallMixedDenseAllFormats) {
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla})
    for (int64_t page : {16, 64}) {
      SCOPED_TRACE(std::string(to_string(f)) + " page " + std::to_string(page));
      run_and_compare(mixed_dense(f, page), to_string(f));
    }
}

TEST(LayerGpu, ChunkedContext) {
  MLA_SKIP_WITHOUT_GPU();
  Scenario sc = mixed_dense(CacheFormat::bf16, 16);
  sc.context_workspace_rows = 64;  // 3 prefills with context: 16-row chunks, many of them
  run_and_compare(sc, "chunked");
}

// On CUDA the workspace also holds mqa_decode's split-KV partials, sized per decode run: the
// bound must still cover every plan.
TEST(LayerGpu, WorkspaceBoundCoversRandomPlans) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(5);
  for (int64_t threshold : {1, 4}) {
    Scenario sc = mixed_dense(CacheFormat::bf16, 64);
    sc.max_model_len = 4096;
    sc.max_num_seqs = 64;
    sc.decode_threshold = threshold;
    sc.require_uniform = true;
    const PlannerConfig pc = sc.config();
    reseed(1);
    const Tensor w = random_tensor({sc.h * (sc.P + sc.V), kL}, DType::bf16);
    const MlaAttention layer(sc.options(Device::cuda(0), DType::bf16), w);
    const int64_t n = 512;
    const std::size_t bound = layer.max_workspace_bytes(pc, n);
    int plans = 0;
    for (int i = 0; i < 300; ++i) {
      Plan p;
      try {
        p = make_plan(random_batch(pc, n, g), pc);
      } catch (const Error&) {
        continue;
      }
      ++plans;
      ASSERT_LE(layer.workspace_bytes(p), bound) << "threshold " << threshold << " plan " << i;
    }
    EXPECT_GT(plans, 100);
  }
}

// The sparse tests run once per sparse_mqa variant (per_sparse_variant).
TEST(LayerGpu, SmallSparseBf16AndFp8Caches) {
  MLA_SKIP_WITHOUT_GPU();
  per_sparse_variant([] { run_and_compare(sparse_scenario(CacheFormat::bf16, 16, 64), "sparse bf16"); });
  per_sparse_variant([] { run_and_compare(sparse_scenario(CacheFormat::fp8, 16, 64), "sparse fp8"); });
}

TEST(LayerGpu, SparseDsMlaMixedBatch) {
  MLA_SKIP_WITHOUT_GPU();
  const Scenario sc = sparse_scenario(CacheFormat::fp8_ds_mla, 16, 64);
  ASSERT_TRUE(make_step(sc).plan.sparse_mixed_batch);
  per_sparse_variant([&] { run_and_compare(sc, "fp8_ds_mla mixed"); });
}

TEST(LayerGpu, SparseDsMlaSeparateMode) {
  MLA_SKIP_WITHOUT_GPU();
  for (int h : {32, 128}) per_sparse_variant([&] {
    Scenario sc = sparse_scenario(CacheFormat::fp8_ds_mla, h, 100);
    sc.sparse_workspace_rows = 400;  // prefill sequences 70 + 250 fill one chunk, 100 starts a second
    const StepData d = make_step(sc);
    ASSERT_FALSE(d.plan.sparse_mixed_batch);
    ASSERT_GE(d.plan.sparse_chunks.size(), 2u);
    run_and_compare(sc, h == 32 ? "fp8_ds_mla separate h=32" : "fp8_ds_mla separate h=128");
  });
}

}  // namespace
}  // namespace mla::test::layer
