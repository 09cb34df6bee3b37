// SPDX-License-Identifier: Apache-2.0
// MlaAttention, dense mode: the float64 oracle layer (CPU, f64, Precision::reference) against an
// independent naive MHA per token, chunked context against unchunked, and the bf16 fast layer
// against the oracle; layers sharing one plan, metadata upload and workspace.
#include <gtest/gtest.h>

#include "layer_test_util.h"

namespace mla::test::layer {
namespace {

// Decodes with s_q = 2 (uniform spec decode), extends (context + several new tokens, one spanning
// many pages), fresh prefills (one with a single token), CUDA-graph padding rows.
Scenario mixed_dense(CacheFormat format, int64_t page = 16) {
  Scenario sc;
  sc.format = format;
  sc.page_size = page;
  sc.decode_threshold = 2;
  sc.require_uniform = true;
  sc.reqs = {{5, 2}, {30, 2}, {16, 2}, {20, 7}, {1, 3}, {47, 5}, {0, 9}, {0, 1}};
  sc.pad_tokens = 3;
  return sc;
}

// error / tolerance of the oracle layer against the naive MHA (token_tolerance): <= 1 passes.
double oracle_vs_naive(const Scenario& sc) {
  const StepData d = make_step(sc);
  const LayerRun run = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  return error_ratio(run.out, naive_layer(d, run.cache_view), d);
}

TEST(LayerWeights, DerivedMatricesAreSlicesOfKvBProj) {
  Scenario sc;
  sc.h = 3;
  sc.P = 5;
  sc.V = 7;
  reseed(11);
  const Tensor w = random_tensor({sc.h * (sc.P + sc.V), kL}, DType::bf16);
  const MlaAttention layer(sc.options(Device::cpu(), DType::f64), w);
  const std::vector<double> wv = to_doubles(w), uk = to_doubles(layer.w_uk_t()), uv = to_doubles(layer.w_uv()),
                            kvb = to_doubles(layer.w_kv_b());
  const int64_t hpv = sc.h * (sc.P + sc.V);
  for (int64_t n = 0; n < sc.h; ++n)
    for (int64_t l = 0; l < kL; ++l) {
      for (int64_t p = 0; p < sc.P; ++p)
        ASSERT_EQ(uk[(n * sc.P + p) * kL + l], wv[(n * (sc.P + sc.V) + p) * kL + l]) << n << " " << p << " " << l;
      for (int64_t v = 0; v < sc.V; ++v)
        ASSERT_EQ(uv[(n * kL + l) * sc.V + v], wv[(n * (sc.P + sc.V) + sc.P + v) * kL + l]) << n << " " << v;
    }
  for (int64_t l = 0; l < kL; ++l)
    for (int64_t j = 0; j < hpv; ++j) ASSERT_EQ(kvb[l * hpv + j], wv[j * kL + l]);
  EXPECT_EQ(layer.w_uk_t().dtype(), DType::f64);
}

TEST(LayerWeights, RejectsBadWeightAndOptions) {
  Scenario sc;
  const Tensor w = random_tensor({sc.h * (sc.P + sc.V), kL}, DType::bf16);
  const Tensor wrong = random_tensor({sc.h * (sc.P + sc.V) + 1, kL}, DType::bf16);
  EXPECT_THROW(MlaAttention(sc.options(Device::cpu(), DType::f64), wrong), Error);
  EXPECT_THROW(MlaAttention(sc.options(Device::cpu(), DType::i32), w), Error);
  Scenario sp = sc;
  sp.sparse = true;
  sp.topk = 0;
  EXPECT_THROW(MlaAttention(sp.options(Device::cpu(), DType::f64), w), Error);
}

class LayerDenseFormats : public ::testing::TestWithParam<CacheFormat> {};

// bf16 cache: every input is exact, so the oracle equals the naive MHA up to float64 rounding
// (token_tolerance: 1e-9). fp8 caches: the naive reads the same
// dequantised cache (context and decode keys) and the new prefill tokens as computed, as the layer
// does.
TEST_P(LayerDenseFormats, MixedBatchMatchesNaiveMha) {
  const double err = oracle_vs_naive(mixed_dense(GetParam()));
  EXPECT_LE(err, 1.0) << to_string(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerDenseFormats,
                         ::testing::Values(CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(LayerDense, PageSizesOneAndSixtyFour) {
  for (int64_t page : {1, 64}) EXPECT_LE(oracle_vs_naive(mixed_dense(CacheFormat::bf16, page)), 1.0) << page;
}

TEST(LayerDense, SingleTokenDecodesAndVarlenDecodes) {
  Scenario sc;
  sc.reqs = {{3, 1}, {64, 1}, {17, 1}, {10, 6}, {0, 4}};
  EXPECT_LE(oracle_vs_naive(sc), 1.0);
  // Non-uniform decodes (threshold 3, varlen): runs of equal s_q go to mqa_decode one by one.
  sc.decode_threshold = 3;
  sc.reqs = {{3, 1}, {9, 3}, {12, 3}, {40, 2}, {5, 1}, {10, 6}};
  EXPECT_LE(oracle_vs_naive(sc), 1.0);
}

// All requests decode, the last one a zero-length CUDA-graph padding request: its padded rows must
// stay untouched.
TEST(LayerDense, DecodeOnlyWithPaddingRequest) {
  Scenario sc;
  sc.decode_threshold = 2;
  sc.require_uniform = true;
  sc.reqs = {{5, 2}, {9, 2}, {3, 0}};
  sc.pad_tokens = 2;
  const StepData d = make_step(sc);
  ASSERT_EQ(d.plan.split.num_decodes, 3);
  ASSERT_EQ(d.plan.split.num_decode_tokens, 6);
  const LayerRun run = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  EXPECT_LE(error_ratio(run.out, naive_layer(d, run.cache_view), d), 1.0);
}

TEST(LayerDense, PrefillOnlyWithoutContext) {
  Scenario sc;
  sc.reqs = {{0, 5}, {0, 1}, {0, 13}};
  EXPECT_LE(oracle_vs_naive(sc), 1.0);
}

// Chunked context: small context workspaces split the context into many chunks (zero-length shares
// for short contexts, page-rounded chunk sizes); the result equals the single-chunk one and the naive
// MHA, to 1e-9 relative (token_tolerance).
TEST(LayerChunked, WorkspaceSizesEqualUnchunked) {
  for (int64_t page : {1, 16}) {
    Scenario sc;
    sc.page_size = page;
    sc.reqs = {{10, 1}, {37, 4}, {5, 2}, {64, 3}, {0, 6}};
    const StepData whole = make_step(sc);
    ASSERT_EQ(whole.plan.context.chunks.size(), 1u);
    const LayerRun ref = run_layer(whole, Device::cpu(), DType::f64, Precision::reference);
    const std::vector<double> whole_tol = token_tolerance(whole);
    ASSERT_LE(error_ratio(ref.out, naive_layer(whole, ref.cache_view), whole), 1.0);
    const std::vector<int64_t> rows =
        page == 1 ? std::vector<int64_t>{3, 7, 20, 50} : std::vector<int64_t>{48, 50, 64, 100};
    for (int64_t ws_rows : rows) {
      Scenario chunked = sc;
      chunked.context_workspace_rows = ws_rows;
      const StepData d = make_step(chunked);  // same seed: same inputs
      ASSERT_GT(d.plan.context.chunks.size(), 1u) << ws_rows;
      bool zero_share = false;
      for (const auto& c : d.plan.context.chunks)
        for (int32_t len : c.lens) zero_share |= len == 0;
      EXPECT_TRUE(zero_share) << ws_rows;
      const LayerRun run = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
      std::vector<double> tol = token_tolerance(d);
      for (std::size_t t = 0; t < tol.size(); ++t) tol[t] += whole_tol[t];
      EXPECT_LE(error_ratio(run.out, ref.out, d, tol), 1.0)
          << "page " << page << " rows " << ws_rows << " chunks " << d.plan.context.chunks.size();
      EXPECT_LE(error_ratio(run.out, naive_layer(d, run.cache_view), d), 1.0) << "page " << page << " rows " << ws_rows;
    }
  }
}

// bf16 storage with float32 accumulation, against the oracle: the layer rounds q_abs, o_lat, the
// up-projected K/V and the running context result to bf16, so errors reach a few bf16 ulps of the
// output's magnitude.
// Plan once, upload once, run every layer (mla/step.h) on the CPU: two layers with their own weights,
// caches and inputs share one plan, one uploaded metadata buffer and one workspace, and each gives
// exactly the output of its own single-layer step; a CPU layer without ForwardArgs::metadata reads the
// plan's host copy and gives the same bits.
// Issue 51: a device buffer the upload cannot copy to (no such CUDA device, an unknown device type)
// or a bad staging buffer is refused before the staging buffer is written.
TEST(LayerStep, UploadRefusesBeforeWritingTheStaging) {
  Scenario sc = mixed_dense(CacheFormat::fp8);
  sc.context_workspace_rows = 48;
  const StepData d = make_step(sc);
  const std::size_t n = d.plan.metadata.bytes();
  ASSERT_GT(n, 0u);
  PinnedBuffer staging(n + 64);
  alignas(16) static uint8_t aligned[1 << 16];
  ASSERT_LE(n, sizeof aligned);
  Device unknown = Device::cpu();
  unknown.type = static_cast<DeviceType>(7);
  const std::vector<std::pair<const char*, TensorView>> bad = {
      {"a CUDA device that is not there", TensorView(aligned, DType::u8, {int64_t(n)}, Device::cuda(1000))},
      {"a device type outside the enum", TensorView(aligned, DType::u8, {int64_t(n)}, unknown)},
      {"overlapping the staging buffer", TensorView(static_cast<uint8_t*>(staging.view().data) + 16, DType::u8,
                                                    {int64_t(n)}, Device::cpu())},
  };
  for (const auto& [what, dev] : bad) {
    std::memset(staging.view().data, 0x5a, n + 64);
    EXPECT_THROW(upload_step_metadata(d.plan, staging.view(), dev), Error) << what;
    for (std::size_t i = 0; i < n + 64; ++i)
      ASSERT_EQ(static_cast<const uint8_t*>(staging.view().data)[i], 0x5a) << what << ": staging written";
  }
  Tensor meta = Tensor::empty({static_cast<int64_t>(n)}, DType::u8);
  std::memset(staging.view().data, 0x5a, n + 64);
  EXPECT_THROW(upload_step_metadata(d.plan, staging.view().slice(0, 0, int64_t(n) - 1), meta), Error);
  EXPECT_EQ(static_cast<const uint8_t*>(staging.view().data)[0], 0x5a);
  upload_step_metadata(d.plan, staging.view(), meta);  // the good call; in place (staging as the copy) too
  EXPECT_EQ(std::memcmp(meta.data(), d.plan.metadata.data.data(), n), 0);
  upload_step_metadata(d.plan, staging.view(), staging.view());
  EXPECT_EQ(std::memcmp(staging.view().data, d.plan.metadata.data.data(), n), 0);
}

TEST(LayerStep, LayersShareOnePlanUploadAndWorkspace) {
  Scenario sc = mixed_dense(CacheFormat::fp8);
  sc.context_workspace_rows = 48;  // several context chunks: metadata for every chunk
  std::vector<StepData> steps;
  for (uint64_t seed : {3, 4}) {
    sc.seed = seed;
    steps.push_back(make_step(sc));
  }
  const Plan& plan = steps[0].plan;
  ASSERT_GT(plan.metadata.bytes(), 0u);
  PinnedBuffer staging(max_step_metadata_bytes(plan.config, plan.num_tokens));
  Tensor meta = Tensor::empty({static_cast<int64_t>(staging.size())}, DType::u8);
  upload_step_metadata(plan, staging.view(), meta);
  std::size_t ws_bytes = 0;
  std::vector<MlaAttention> layers;
  for (const StepData& d : steps) {
    layers.emplace_back(sc.options(Device::cpu(), DType::f64), d.weight);
    ws_bytes = std::max(ws_bytes, layers.back().workspace_bytes(plan));
  }
  Tensor ws = Tensor::empty({static_cast<int64_t>(ws_bytes)}, DType::u8);
  const Context ref{nullptr, Precision::reference};
  auto same = [](const std::vector<double>& x, const std::vector<double>& y) {  // NaN padding rows included
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
    return true;
  };
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const StepData& d = steps[k];
    CacheBuffer cb = make_cache(d, Device::cpu());
    DeviceArgs a = device_args(d, Device::cpu(), DType::f64);
    ForwardArgs args = a.args();
    args.metadata = meta;
    layers[k].forward(plan, args, cb.cache, ws.view(), ref);
    const std::vector<double> shared = to_doubles(a.out);
    EXPECT_TRUE(same(shared, run_layer(d, Device::cpu(), DType::f64, Precision::reference).out)) << "layer " << k;
    EXPECT_LE(error_ratio(shared, naive_layer(d, cb.cache), d), 1.0) << "layer " << k;

    CacheBuffer cb2 = make_cache(d, Device::cpu());
    DeviceArgs a2 = device_args(d, Device::cpu(), DType::f64);
    ForwardArgs from_plan = a2.args();
    from_plan.metadata = {};
    layers[k].forward(plan, from_plan, cb2.cache, ws.view(), ref);
    EXPECT_TRUE(same(to_doubles(a2.out), shared)) << "layer " << k << " reading the plan's host metadata";
  }
  // forward() reads the uploaded copy, not the plan's vectors: a corrupted copy (a prefill query range
  // past the tokens) is what the CPU ops' value checks then refuse.
  Tensor bad = Tensor::empty({meta.size(0)}, DType::u8);
  std::memcpy(bad.data(), meta.data(), static_cast<std::size_t>(meta.size(0)));
  static_cast<int32_t*>(bad.data())[plan.metadata.prefill_qsl + 1] = 1 << 20;
  CacheBuffer cb = make_cache(steps[0], Device::cpu());
  DeviceArgs a = device_args(steps[0], Device::cpu(), DType::f64);
  ForwardArgs args = a.args();
  args.metadata = bad;
  EXPECT_THROW(layers[0].forward(plan, args, cb.cache, ws.view(), ref), Error);
}

TEST(LayerFast, Bf16LayerWithinToleranceOfOracle) {
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    Scenario sc = mixed_dense(f);
    sc.context_workspace_rows = 48;  // several chunks: the bf16 running merge is exercised too
    const StepData d = make_step(sc);
    const LayerRun oracle = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
    const LayerRun fast = run_layer(d, Device::cpu(), DType::bf16, Precision::fast);
    const int64_t n = d.t_act * sc.h * sc.V;
    const std::vector<double> got(fast.out.begin(), fast.out.begin() + n);
    const std::vector<double> ref(oracle.out.begin(), oracle.out.begin() + n);
    EXPECT_LT(rel_l2(got, ref), 1e-2) << to_string(f);
    EXPECT_EQ(check_close(got, ref, DType::bf16, 2e-2), "") << to_string(f);
    for (std::size_t i = n; i < fast.out.size(); ++i) ASSERT_TRUE(std::isnan(fast.out[i])) << "padding row written";
  }
}

}  // namespace
}  // namespace mla::test::layer
