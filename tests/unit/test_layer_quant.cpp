// SPDX-License-Identifier: Apache-2.0
// MlaAttention's quantised output (LayerOptions::out_quant, docs/SEMANTICS.md §15) and KV scales from
// the data (LayerOptions::kv_scales, §16) on the CPU: every key's codes and scales equal
// quantize_output of the unquantised output (dense mixed batches with padding, sparse, the float64
// oracle layer), padding rows are zero, bad keys and combinations are refused before anything is
// written, and the first batch's max |kv_c| / 200 becomes the fp8 cache's scale for good.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "unit/layer_quant_util.h"

namespace mla::test::layer {
namespace {

constexpr OutputQuant kKeys[] = {OutputQuant::fp8, OutputQuant::fp8_group128, OutputQuant::fp8_group64,
                                 OutputQuant::nvfp4};

float key_scale(OutputQuant k) { return k == OutputQuant::nvfp4 ? 448.0f * 6.0f / 4.0f : 1.0f / 32.0f; }

Scenario mixed_dense() {
  Scenario sc;
  sc.decode_threshold = 2;
  sc.require_uniform = true;
  sc.reqs = {{5, 2}, {30, 2}, {20, 7}, {0, 9}};
  sc.pad_tokens = 3;
  return sc;
}

void expect_quantised_equals_unfused(const Scenario& sc, DType dtype, Precision precision) {
  const StepData d = make_step(sc);
  const int64_t rows = d.t_act + 2;  // two padding rows past the actual tokens
  for (OutputQuant k : kKeys) {
    const QuantOut got = run_layer_quantised(d, Device::cpu(), dtype, precision, k, key_scale(k), rows);
    const QuantOut want = quantise_unfused(d, Device::cpu(), dtype, precision, k, key_scale(k), rows);
    EXPECT_EQ(host_bytes(got.codes), host_bytes(want.codes)) << to_string(k) << " " << to_string(dtype);
    EXPECT_EQ(host_bytes(got.scales), host_bytes(want.scales)) << to_string(k) << " " << to_string(dtype);
    // The padding rows are zero codes (the reference's quantize_output pads the same way).
    const std::vector<uint8_t> c = host_bytes(got.codes);
    const std::size_t row_bytes = c.size() / static_cast<std::size_t>(rows);
    for (std::size_t i = static_cast<std::size_t>(d.t_act) * row_bytes; i < c.size(); ++i)
      ASSERT_EQ(c[i], 0) << to_string(k) << " padding byte " << i;
  }
}

TEST(LayerOutputQuant, DenseEveryKeyEqualsQuantizeOfUnfusedOutput) {
  expect_quantised_equals_unfused(mixed_dense(), DType::bf16, Precision::fast);
  expect_quantised_equals_unfused(mixed_dense(), DType::f64, Precision::reference);
}

TEST(LayerOutputQuant, SparseEveryKeyEqualsQuantizeOfUnfusedOutput) {
  Scenario sc;
  sc.sparse = true;
  sc.format = CacheFormat::fp8_ds_mla;
  sc.decode_threshold = 1;
  sc.reqs = {{7, 1}, {20, 1}, {3, 6}};
  expect_quantised_equals_unfused(sc, DType::bf16, Precision::fast);
}

// Dequantised, the codes stay within one code of the float64 oracle layer's own output: the layer
// quantises its output once, rounding each value to a neighbouring code.
TEST(LayerOutputQuant, Fp8Group128WithinOneCodeOfTheOracle) {
  const StepData d = make_step(mixed_dense());
  const LayerRun ref = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  const QuantOut q = run_layer_quantised(d, Device::cpu(), DType::f64, Precision::reference,
                                         OutputQuant::fp8_group128, 1.0f, d.t_act);
  const int64_t W = d.sc.h * d.sc.V;
  const auto* codes = static_cast<const uint8_t*>(q.codes.data());
  const auto* scales = static_cast<const float*>(q.scales.data());
  for (int64_t t = 0; t < d.t_act; ++t)
    for (int64_t j = 0; j < W; ++j) {
      const double s = scales[(j / 128) * d.t_act + t], x = ref.out[static_cast<std::size_t>(t * W + j)];
      const double got = num::e4m3_to_float(codes[t * W + j]) * s;
      const double step = std::ldexp(1.0, std::max(std::ilogb(std::fabs(x / s) + 1e-30), -6) - 3) * s;
      ASSERT_LE(std::fabs(got - x), step) << "token " << t << " column " << j;
    }
}

TEST(LayerOutputQuant, RefusesBadKeysAndCombinations) {
  Scenario sc = mixed_dense();
  const StepData d = make_step(sc);
  auto opts = [&](OutputQuant k, float scale) { return quant_options(d, Device::cpu(), DType::bf16, k, scale); };
  EXPECT_THROW(MlaAttention(opts(static_cast<OutputQuant>(5), 1.0f), d.weight), Error);
  EXPECT_THROW(MlaAttention(opts(OutputQuant::fp8, 0.0f), d.weight), Error);
  EXPECT_THROW(MlaAttention(opts(OutputQuant::nvfp4, std::nanf("")), d.weight), Error);
  // h_q * V = 3 * 32 = 96 columns: no groups of 128 or 64 fit, nvfp4's 16 do.
  Scenario narrow = sc;
  narrow.h = 3;
  const StepData n = make_step(narrow);
  try {
    MlaAttention(quant_options(n, Device::cpu(), DType::bf16, OutputQuant::fp8_group128, 1.0f), n.weight);
    FAIL() << "fp8_group128 over 96 columns accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MlaAttention(quant_options(n, Device::cpu(), DType::bf16, OutputQuant::fp8_group64, 1.0f), n.weight),
               Error);
  EXPECT_NO_THROW(MlaAttention(quant_options(n, Device::cpu(), DType::bf16, OutputQuant::nvfp4, 1.0f), n.weight));

  // Bad step arguments: refused before the cache or the output is written.
  const MlaAttention layer(opts(OutputQuant::fp8_group128, 1.0f), d.weight);
  const MlaAttention plain(d.sc.options(Device::cpu(), DType::bf16), d.weight);
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8);
  const int64_t W = d.sc.h * d.sc.V;
  auto expect_refused = [&](const MlaAttention& l, const QuantOut& q, const TensorView& out, const TensorView& scales,
                            const char* what) {
    CacheBuffer cb = make_cache(d, Device::cpu());
    const std::vector<uint8_t> cache_before = host_bytes(cb.storage), out_before = host_bytes(q.codes);
    DeviceArgs a = device_args(d, Device::cpu(), DType::bf16);
    ForwardArgs fa = a.args();
    fa.out = out;
    fa.out_scales = scales;
    EXPECT_THROW(l.forward(d.plan, fa, cb.cache, ws.view()), Error) << what;
    EXPECT_EQ(host_bytes(cb.storage), cache_before) << what << ": cache written";
    EXPECT_EQ(host_bytes(q.codes), out_before) << what << ": out written";
  };
  const QuantOut q = quant_out(OutputQuant::fp8_group128, d.t_act, W, Device::cpu());
  expect_refused(layer, q, q.codes, {}, "no scales");
  expect_refused(layer, q, q.codes.view().slice(0, 0, d.t_act - 1),
                 q.scales.view().slice(1, 0, d.t_act - 1), "fewer rows than the actual tokens");
  const QuantOut g64 = quant_out(OutputQuant::fp8_group64, d.t_act, W, Device::cpu());
  expect_refused(layer, q, q.codes, g64.scales, "group-64 scales");
  const Tensor bf16_out = poisoned({d.T, W}, DType::bf16);
  expect_refused(layer, q, bf16_out, q.scales, "bf16 out for a quantised layer");
  expect_refused(plain, q, bf16_out, q.scales, "out_scales for out_quant none");
}

// §16: the first step's max |kv_c| (actual tokens) / 200 becomes the scale; later steps keep it.
TEST(LayerKvScales, FirstBatchSetsTheScaleThenItStaysFixed) {
  Scenario sc;
  sc.format = CacheFormat::fp8;
  sc.reqs = {{0, 5}, {0, 3}};  // no context: the cache holds this step's rows only
  sc.pad_tokens = 2;           // NaN rows past the actual tokens: not part of the maximum
  StepData d = make_step(sc);
  LayerOptions o = d.sc.options(Device::cpu(), DType::bf16);
  o.kv_scales = KvScales::from_first_batch;
  const MlaAttention layer(o, d.weight);
  EXPECT_FALSE(layer.kv_scale().has_value());
  double amax = 0;
  const std::vector<double> kv = to_doubles(d.kv_c.view().slice(0, 0, d.t_act));
  for (double v : kv) amax = std::max(amax, std::fabs(v));
  const float want = static_cast<float>(amax) / 200.0f;

  CacheBuffer cb = make_cache(d, Device::cpu());
  DeviceArgs a = device_args(d, Device::cpu(), DType::bf16);
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8);
  layer.forward(d.plan, a.args(), cb.cache, ws.view());
  ASSERT_TRUE(layer.kv_scale().has_value());
  EXPECT_EQ(*layer.kv_scale(), want);

  // The rows were written with that scale and the output is a fixed-scale layer's with it.
  CacheBuffer ref = make_cache(d, Device::cpu());
  ref.cache.scale = want;
  write_cache(d.kv_c.view().slice(0, 0, d.t_act), d.k_pe.view().slice(0, 0, d.t_act),
              d.slots.view().slice(0, 0, d.t_act), ref.cache);
  EXPECT_EQ(host_bytes(cb.storage), host_bytes(ref.storage));
  const MlaAttention fixed(d.sc.options(Device::cpu(), DType::bf16), d.weight);
  CacheBuffer fcb = make_cache(d, Device::cpu());
  fcb.cache.scale = want;
  DeviceArgs fa = device_args(d, Device::cpu(), DType::bf16);
  fixed.forward(d.plan, fa.args(), fcb.cache, ws.view());
  EXPECT_EQ(host_bytes(a.out), host_bytes(fa.out));

  // A second step with larger values keeps the scale (and writes with it whatever cache.scale says).
  fill(a.kv_c.view().slice(0, 0, d.t_act), 3.0);
  CacheBuffer cb2 = make_cache(d, Device::cpu());
  cb2.cache.scale = 1.0f;
  layer.forward(d.plan, a.args(), cb2.cache, ws.view());
  EXPECT_EQ(*layer.kv_scale(), want);
  const auto* row = static_cast<const uint8_t*>(cb2.cache.data.ptr_at({d.bt[0][0], 0, 0}));
  EXPECT_EQ(row[0], num::float_to_e4m3(3.0f / want));
}

TEST(LayerKvScales, RefusesOtherCachesAndNonFiniteBatches) {
  Scenario sc;
  sc.reqs = {{0, 4}};
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    sc.format = f;
    const StepData d = make_step(sc);
    LayerOptions o = d.sc.options(Device::cpu(), DType::bf16);
    o.kv_scales = KvScales::from_first_batch;
    EXPECT_THROW(MlaAttention(o, d.weight), Error) << to_string(f);
  }
  sc.format = CacheFormat::fp8;
  const StepData d = make_step(sc);
  LayerOptions o = d.sc.options(Device::cpu(), DType::bf16);
  o.kv_scales = KvScales::from_first_batch;
  const MlaAttention layer(o, d.weight);
  CacheBuffer cb = make_cache(d, Device::cpu());
  const std::vector<uint8_t> before = host_bytes(cb.storage);
  DeviceArgs a = device_args(d, Device::cpu(), DType::bf16);
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8);
  // An all-zero first batch sets nothing; a NaN one is refused before anything is written.
  fill(a.kv_c.view(), 0.0);
  layer.forward(d.plan, a.args(), cb.cache, ws.view());
  EXPECT_FALSE(layer.kv_scale().has_value());
  CacheBuffer cb2 = make_cache(d, Device::cpu());
  fill(a.kv_c.view().slice(0, 1, 2), NAN);
  EXPECT_THROW(layer.forward(d.plan, a.args(), cb2.cache, ws.view()), Error);
  EXPECT_EQ(host_bytes(cb2.storage), before);
  EXPECT_FALSE(layer.kv_scale().has_value());
  EXPECT_THROW(MlaAttention([&] {
                 LayerOptions b = o;
                 b.kv_scales = static_cast<KvScales>(3);
                 return b;
               }(), d.weight),
               Error);
}

}  // namespace
}  // namespace mla::test::layer
