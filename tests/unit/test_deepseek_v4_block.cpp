// SPDX-License-Identifier: Apache-2.0
// DeepseekV4Attention (mla/deepseek_v4.h) against a naive float64 formulation written in the test
// (unit/v4_block_test_util.h): every layer kind (sliding only, ratio 4 with top-k picks, ratio 8 with
// every causal entry), V4 and V4.1 (no query head norm), tensor-parallel ranks, every dtype, the caches
// of every format the block takes; its pieces on their own (the per-head norm, the inverse RoPE, the
// grouped o projection, the sink); the config reader; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "core/numeric.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "unit/v4_block_test_util.h"

namespace mla {
namespace {

using test::v4::small_config;
using test::v4::Trace;
using test::v4::Weights;

DeepseekV4Options opts(DType dt, CacheFormat main, CacheFormat extra, int tp = 1, int rank = 0) {
  return test::v4::options(dt, main, extra, tp, rank);
}

// f() must throw an mla::Error whose message holds `what`.
template <class F>
void expect_refused(F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << "accepted (expected an error naming '" << what << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

class V4BlockLayers : public ::testing::TestWithParam<int> {};

// The float64 block with the exact f64 caches equals the naive formulation to rounding; f32 within
// 1e-5 and bf16 within the bf16 rule (1e-2), every step of the trace.
TEST_P(V4BlockLayers, MatchesNaiveFloat64) {
  const int layer = GetParam();
  for (const bool q_norm : {true, false}) {
    const DeepseekV4Config c = small_config(q_norm);
    const Weights w(c);
    const Trace tr(c, c.compress_ratio(layer), 11 + layer);
    const std::vector<double> ref = tr.naive(c, c.compress_ratio(layer), w);
    using test::v4::Mode;
    for (const Mode m : {Mode{DType::f64, Precision::reference, CacheFormat::f64, 1e-12},
                         Mode{DType::f32, Precision::fast, CacheFormat::f64, 1e-5},
                         Mode{DType::bf16, Precision::fast, CacheFormat::bf16, 1e-2}}) {
      const DeepseekV4Attention blk(c, layer, w.w, opts(m.dt, m.cache, m.cache));
      const std::vector<double> got = tr.serve(blk, m.precision);
      const double e = test::rel_l2(got, ref);
      std::printf("  layer %d q_norm %d %s, %s cache: rel-L2 %.3e\n", layer, q_norm ? 1 : 0, to_string(m.dt),
                  to_string(m.cache), e);
      EXPECT_LE(e, m.bound) << "layer " << layer << " q_norm " << q_norm << " " << to_string(m.dt) << " cache "
                            << to_string(m.cache);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, V4BlockLayers, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "layer" + std::to_string(info.param); });

// The V4 records as the block's caches (main v4 / v41, extra any of the three; V4.1's v41 + v41_fp4):
// the float64 block reads the codes exactly, so its error against the naive result is the caches' own
// quantisation (e4m3: 2^-4 relative at most; e2m1 coarser), nonzero and bounded.
TEST(V4Block, RecordCachesWithinTheirQuantisation) {
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const Trace tr(c, c.compress_ratio(1), 21);
  const std::vector<double> ref = tr.naive(c, c.compress_ratio(1), w);
  struct Pair {
    CacheFormat main, extra;
    double bound;
  };
  for (const Pair p : {Pair{CacheFormat::v4, CacheFormat::v4, 6e-2}, Pair{CacheFormat::v41, CacheFormat::v41, 6e-2},
                       Pair{CacheFormat::v41, CacheFormat::v41_fp4, 1e-1}, Pair{CacheFormat::v4, CacheFormat::v41_fp4, 1e-1}}) {
    const DeepseekV4Attention blk(c, 1, w.w, opts(DType::f64, p.main, p.extra));
    const double e = test::rel_l2(tr.serve(blk, Precision::reference), ref);
    std::printf("  %s + %s caches, f64 block: rel-L2 %.3e\n", to_string(p.main), to_string(p.extra), e);
    EXPECT_GT(e, 1e-6) << to_string(p.main) << " + " << to_string(p.extra) << " stores codes, not the values";
    EXPECT_LE(e, p.bound) << to_string(p.main) << " + " << to_string(p.extra);
  }
}

// Ranks of tp = 2 (one group of two heads each) give partial sums: each equals the naive rank formula,
// and the two add up to the whole block.
TEST(V4Block, TensorParallelRanksSumToTheBlock) {
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const Trace tr(c, 4, 5);
  const std::vector<double> whole = tr.serve(DeepseekV4Attention(c, 1, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64)),
                                             Precision::reference);
  std::vector<double> sum(whole.size(), 0.0);
  for (int r = 0; r < 2; ++r) {
    const DeepseekV4Attention blk(c, 1, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64, 2, r));
    EXPECT_EQ(blk.heads(), 2);
    const std::vector<double> part = tr.serve(blk, Precision::reference);
    EXPECT_LE(test::rel_l2(part, tr.naive(c, 4, w, 2, r)), 1e-12) << "rank " << r;
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  EXPECT_LE(test::rel_l2(sum, whole), 1e-12);
}

// Each piece changes the result: the naive formulation without it (or with other weights for it) is
// far from the block, so the agreement above covers each one: the per-head norm (V4 vs V4.1), the
// inverse rope on the output, the grouping of o_a_proj, the sink.
TEST(V4Block, EveryPieceMatters) {
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const Trace tr(c, 4, 8);
  const DeepseekV4Attention blk(c, 1, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64));
  const std::vector<double> got = tr.serve(blk, Precision::reference);
  ASSERT_LE(test::rel_l2(got, tr.naive(c, 4, w)), 1e-12);
  EXPECT_GT(test::rel_l2(got, tr.naive(small_config(false), 4, w)), 1e-3) << "query head norm";
  EXPECT_GT(test::rel_l2(got, tr.naive(c, 4, w, 1, 0, /*unrotate=*/false)), 1e-3) << "inverse rope";
  Weights swapped = w;  // group 0's o_a rows read by group 1's heads and the other way round
  const std::size_t half = swapped.o_a.size() / 2;
  std::rotate(swapped.o_a.begin(), swapped.o_a.begin() + static_cast<std::ptrdiff_t>(half), swapped.o_a.end());
  EXPECT_GT(test::rel_l2(got, tr.naive(c, 4, swapped)), 1e-3) << "o_a_proj groups";
  Weights sunk = w;
  for (double& x : sunk.sinks) x += 2.0;
  EXPECT_GT(test::rel_l2(got, tr.naive(c, 4, sunk)), 1e-3) << "sink";
}

// fp8 weights with block scales (as published) give the block of their dequantised values exactly: each
// Linear is rebuilt as e4m3 codes times a power-of-two scale per 128 x 128 block (64 x 64 here, the
// config's weight_block_size), and the bf16 weights of the same values serve the same trace bit for bit.
TEST(V4Block, Fp8WeightsEqualTheirDequantisedValues) {
  DeepseekV4Config c = small_config();
  c.fp8_weights = true;
  c.weight_block_rows = c.weight_block_cols = 64;
  const Weights w(c);
  std::vector<Tensor> keep;
  DeepseekV4Weights q = w.w, d = w.w;
  for (auto [dst, deq] : {std::pair{&q.q_a_proj, &d.q_a_proj}, {&q.q_b_proj, &d.q_b_proj}, {&q.kv_proj, &d.kv_proj},
                          {&q.o_a_proj, &d.o_a_proj}, {&q.o_b_proj, &d.o_b_proj}}) {
    const int64_t rows = dst->weight.shape[0], cols = dst->weight.shape[1], br = (rows + 63) / 64, bc = (cols + 63) / 64;
    Tensor codes = Tensor::empty({rows, cols}, DType::fp8_e4m3), scale = Tensor::empty({br, bc}, DType::f32),
           exact = Tensor::empty({rows, cols}, DType::bf16);
    for (int64_t i = 0; i < br * bc; ++i)
      static_cast<float*>(scale.data())[i] = std::ldexp(1.0f, static_cast<int>(i % 5) - 9);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float sc = static_cast<float*>(scale.data())[(i / 64) * bc + j / 64];
        const uint8_t code = num::float_to_e4m3(static_cast<float>(test::uniform(-448, 448)));
        static_cast<uint8_t*>(codes.data())[i * cols + j] = code;
        num::store(exact.view().ptr_at({i, j}), DType::bf16, static_cast<double>(num::e4m3_to_float(code)) * sc);
      }
    dst->weight = codes.view();
    dst->weight_scale_inv = scale.view();
    deq->weight = exact.view();
    keep.insert(keep.end(), {codes, scale, exact});
  }
  const Trace tr(c, 4, 3);
  for (const DType dt : {DType::f64, DType::bf16}) {
    const CacheFormat f = dt == DType::f64 ? CacheFormat::f64 : CacheFormat::bf16;
    const Precision p = dt == DType::f64 ? Precision::reference : Precision::fast;
    const std::vector<double> a = tr.serve(DeepseekV4Attention(c, 1, q, opts(dt, f, f)), p);
    const std::vector<double> b = tr.serve(DeepseekV4Attention(c, 1, d, opts(dt, f, f)), p);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << to_string(dt);
  }
  // A scale tensor of the wrong shape is refused, naming the weight.
  DeepseekV4Weights bad = q;
  bad.kv_proj.weight_scale_inv = q.q_a_proj.weight_scale_inv;
  expect_refused([&] { DeepseekV4Attention(c, 1, bad, opts(DType::bf16, CacheFormat::bf16, CacheFormat::bf16)); },
                 "kv_proj: weight_scale_inv");
}

// The inverse rotation on its own: apply_rope with the negated table undoes apply_rope (the block's
// output epilogue), exactly to rounding in float64.
TEST(V4Block, InverseRopeUndoesRope) {
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const DeepseekV4Attention blk(c, 1, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64));
  const int64_t T = 5, h = 3, D = 512, R = 64;
  Tensor x = test::random_tensor({T, h, D}, DType::f64), y = Tensor::empty({T, h, D}, DType::f64);
  std::vector<double> inv, neg;
  for (int i = 0; i < R / 2; ++i) inv.push_back(blk.inv_freq(i)), neg.push_back(-blk.inv_freq(i));
  Tensor ti = Tensor::empty({R / 2}, DType::f64), tn = Tensor::empty({R / 2}, DType::f64);
  std::copy(inv.begin(), inv.end(), static_cast<double*>(ti.data()));
  std::copy(neg.begin(), neg.end(), static_cast<double*>(tn.data()));
  const Tensor pos = test::int64_tensor({0, 3, 17, 1000, 65535});
  apply_rope(x.view(), y.view(), pos.view(), ti.view(), 1.0, R, true);
  const std::vector<double> rotated = test::to_doubles(y.view());
  EXPECT_GT(test::rel_l2(rotated, test::to_doubles(x.view())), 1e-3);  // it moved
  apply_rope(y.view(), y.view(), pos.view(), tn.view(), 1.0, R, true);
  EXPECT_LE(test::rel_l2(test::to_doubles(y.view()), test::to_doubles(x.view())), 1e-14);
  // And the layer's table is the formula's (YaRN for a compressed layer, plain for a sliding one).
  const std::vector<double> f1 = test::v4::naive_inv_freq(c, 4);
  const DeepseekV4Attention sliding(c, 0, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64));
  const std::vector<double> f0 = test::v4::naive_inv_freq(c, 0);
  for (int i = 0; i < R / 2; ++i) {
    EXPECT_NEAR(blk.inv_freq(i), f1[static_cast<std::size_t>(i)], 1e-15 * f1[static_cast<std::size_t>(i)] + 1e-300) << i;
    EXPECT_NEAR(sliding.inv_freq(i), f0[static_cast<std::size_t>(i)], 1e-15 * f0[static_cast<std::size_t>(i)]) << i;
  }
  EXPECT_NE(blk.inv_freq(R / 2 - 1), sliding.inv_freq(R / 2 - 1));
}

TEST(V4Block, ConfigFromTransformersJson) {
  const DeepseekV4Config c = DeepseekV4Config::from_json(R"({
    "model_type": "deepseek_v4", "hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
    "index_topk": 512, "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.125, "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                    "compressed_sparse_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
                        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16,
                                     "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                                     "attention_factor": 1.0, "partial_rotary_factor": 0.125}}})");
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 128, 4}));
  EXPECT_TRUE(c.compress_yarn);
  EXPECT_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_TRUE(c.q_head_norm);
  EXPECT_TRUE(DeepseekV4Config::is_v4_json(R"({"model_type": "deepseek_v4"})"));
  EXPECT_FALSE(DeepseekV4Config::is_v4_json(R"({"model_type": "deepseek_v3"})"));
  // Legacy names (the published configs): compress_ratios, qk_rope_head_dim, flat rope_scaling.
  const DeepseekV4Config l = DeepseekV4Config::from_json(R"({"hidden_size": 64, "num_attention_heads": 4,
    "o_groups": 2, "qk_rope_head_dim": 64, "compress_ratios": [4, 0], "num_hidden_layers": 2,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536}})");
  EXPECT_EQ(l.compress_ratios, (std::vector<int>{4, 0}));
  EXPECT_TRUE(l.compress_yarn);
  // Presets.
  EXPECT_EQ(DeepseekV4Config::preset("v4-pro").num_attention_heads, 128);
  EXPECT_EQ(DeepseekV4Config::preset("v4-pro").o_groups, 16);
  EXPECT_FALSE(DeepseekV4Config::preset("v41-flash").q_head_norm);
  EXPECT_TRUE(DeepseekV4Config::preset("v4-flash").q_head_norm);
  // Refusals say what was expected.
  auto refused = [](const char* json, const char* what) {
    expect_refused([&] { (void)DeepseekV4Config::from_json(json); }, what);
  };
  refused(R"({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2})", "one shared key/value head");
  refused(R"({"hidden_size": 64, "num_attention_heads": 6, "o_groups": 4})", "must divide num_attention_heads");
  refused(R"({"hidden_size": 64, "num_attention_heads": 4, "o_groups": 2, "layer_types": ["full"]})", "layer_types entry");
  refused(R"({"hidden_size": 64, "num_attention_heads": 4, "o_groups": 2, "rope_scaling": {"type": "yarn", "factor": 16,
           "attention_factor": 1.2}})", "attention_factor must be 1.0");
  EXPECT_THROW((void)DeepseekV4Config::preset("v5"), Error);
  EXPECT_THROW((void)small_config().compress_ratio(3), Error);
}

TEST(V4Block, RefusesBadConfigurationsAndArguments) {
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const auto& refused = expect_refused<std::function<void()>>;
  // CUDA: bf16 activations and device cache formats only (refused before anything touches the device).
  refused([&] {
    DeepseekV4Options o = opts(DType::f32, CacheFormat::bf16, CacheFormat::bf16);
    o.device = Device::cuda(0);
    DeepseekV4Attention(c, 1, w.w, o);
  }, "computes in bf16");
  refused([&] {
    DeepseekV4Options o = opts(DType::bf16, CacheFormat::f64, CacheFormat::f64);
    o.device = Device::cuda(0);
    DeepseekV4Attention(c, 1, w.w, o);
  }, "CPU-only");
  refused([&] { DeepseekV4Attention(c, 1, w.w, opts(DType::bf16, CacheFormat::fp8_ds_mla, CacheFormat::bf16)); },
          "cache format");
  refused([&] { DeepseekV4Attention(c, 1, w.w, opts(DType::bf16, CacheFormat::bf16, CacheFormat::v41_fp4)); },
          "both must be V4 records");
  refused([&] { DeepseekV4Attention(c, 1, w.w, opts(DType::bf16, CacheFormat::bf16, CacheFormat::bf16, 4, 0)); },
          "must divide o_groups");
  refused([&] { DeepseekV4Attention(c, 7, w.w, opts(DType::bf16, CacheFormat::bf16, CacheFormat::bf16)); }, "layer 7");
  {
    DeepseekV4Weights bad = w.w;
    bad.o_a_proj.weight = w.w.o_b_proj.weight;
    refused([&] { DeepseekV4Attention(c, 1, bad, opts(DType::bf16, CacheFormat::bf16, CacheFormat::bf16)); }, "o_a_proj");
  }
  {
    DeepseekV4Weights bad = w.w;
    bad.sinks = TensorView{};
    refused([&] { DeepseekV4Attention(c, 1, bad, opts(DType::bf16, CacheFormat::bf16, CacheFormat::bf16)); }, "sinks");
  }
  // Step arguments: refused before the caches or out are written.
  const DeepseekV4Attention blk(c, 1, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64));
  const DeepseekV4Attention sliding(c, 0, w.w, opts(DType::f64, CacheFormat::f64, CacheFormat::f64));
  CacheBuffer main = allocate_cache(CacheFormat::f64, 4, 4, Device::cpu(), 1.0f, 512, 64);
  CacheBuffer extra = allocate_cache(CacheFormat::f64, 4, 2, Device::cpu(), 1.0f, 512, 64);
  std::memset(main.storage.data(), 0x7f, main.storage.nbytes());
  std::memset(extra.storage.data(), 0x7f, extra.storage.nbytes());
  const int64_t T = 2;
  const Tensor x = test::random_tensor({T, 64}, DType::f64), y = test::poisoned({T, 64}, DType::f64);
  const Tensor pos = test::int64_tensor({0, 1}), slots = test::int64_tensor({5, 6}), req = test::int_tensor({0, 0}),
               bt = test::int_tensor_2d({{1, 2}}), ebt = test::int_tensor_2d({{3}}),
               topk = test::int_tensor_2d({{-1, -1, -1}, {0, -1, -1}}), ekv = test::random_tensor({1, 512}, DType::f64),
               eslot = test::int64_tensor({6}), neg = test::int64_tensor({0, -1}), far = test::int64_tensor({5, 99});
  Tensor ws = Tensor::empty({static_cast<int64_t>(blk.workspace_bytes(T, 3))}, DType::u8);
  const test::v4::Step good{x, pos, req, bt, slots, topk, ebt, ekv, eslot, y};
  auto args = [&] { return good.args(); };
  const std::vector<uint8_t> main0(static_cast<uint8_t*>(main.storage.data()),
                                   static_cast<uint8_t*>(main.storage.data()) + main.storage.nbytes());
  auto step = [&](const DeepseekV4Attention& b, const DeepseekV4ForwardArgs& a) {
    b.forward(a, main.cache, extra.cache, ws.view(), Context{nullptr, Precision::reference});
  };
  refused([&] { auto a = args(); a.positions = neg.view(); step(blk, a); }, "positions[1]");
  refused([&] { auto a = args(); a.slot_mapping = far.view(); step(blk, a); }, "slot_mapping[1] = 99");
  const Tensor eslot_far = test::int64_tensor({8}), req_far = test::int_tensor({0, 1});
  refused([&] { auto a = args(); a.extra_slot_mapping = eslot_far.view(); step(blk, a); },
          "extra_slot_mapping[0] = 8");
  refused([&] { auto a = args(); a.req_id = req_far.view(); step(blk, a); }, "req_id[1] = 1");
  refused([&] { auto a = args(); a.extra_topk = TensorView{}; step(blk, a); }, "extra_topk");
  refused([&] { auto a = args(); a.extra_slot_mapping = TensorView{}; step(blk, a); }, "come together");
  refused([&] { step(sliding, args()); }, "sliding window only");
  const Tensor ekv_wide = test::random_tensor({1, 1024}, DType::f64);
  refused([&] {
    auto a = args();
    a.extra_kv = ekv_wide.view().reshape({1, 512, 2}).select(2, 0);
    step(blk, a);
  }, "unit inner stride");
  refused([&] { auto a = args(); a.out = x.view(); step(blk, a); }, "out overlaps hidden");
  refused([&] {
    auto a = args();
    blk.forward(a, main.cache, extra.cache, ws.view().slice(0, 0, 100), Context{nullptr, Precision::reference});
  }, "workspace");
  refused([&] {
    CacheBuffer bf = allocate_cache(CacheFormat::bf16, 4, 4, Device::cpu(), 1.0f, 512, 64);
    blk.forward(args(), bf.cache, extra.cache, ws.view(), Context{nullptr, Precision::reference});
  }, "main cache must be f64");
  EXPECT_EQ(std::memcmp(main0.data(), main.storage.data(), main0.size()), 0) << "a refused step wrote the cache";
  EXPECT_TRUE(std::isnan(test::to_doubles(y.view())[0])) << "a refused step wrote out";
  // The good step runs.
  EXPECT_NO_THROW(step(blk, args()));
  EXPECT_TRUE(std::isfinite(test::to_doubles(y.view())[0]));
}

}  // namespace
}  // namespace mla
