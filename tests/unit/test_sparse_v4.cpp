// SPDX-License-Identifier: Apache-2.0
// sparse_mqa's DeepSeek-V4 options on the CPU (SparseOptions, SEMANTICS §11.8) against the float64
// formula of sparse_v4_test_util.h: a per-head attention sink (lonely rows give out 0, lse = sink), an
// extra cache at its own page size attended in the same softmax (main-only, extra-only and lonely
// tokens, duplicate / -1 / out-of-range entries, odd top-k, NaN rows wherever an entry must not be read),
// d_qk 512 with K = V over the whole row (values_include_rope), every CPU cache format; and the front
// end's rejections (nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "mla/block_ops.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "sparse_v4_test_util.h"
#include "support/test_util.h"

namespace mla {
namespace {

struct V4Shape {
  CacheFormat format;
  int d_qk;
  int64_t dv;
  bool whole_row;  // values_include_rope
  int64_t page_main, page_extra, h, topk_main, topk_extra;
};

std::string name_of(const V4Shape& s) {
  return std::string(to_string(s.format)) + " d_qk " + std::to_string(s.d_qk) + " d_v " + std::to_string(s.dv) +
         " pages " + std::to_string(s.page_main) + "/" + std::to_string(s.page_extra) + " h " + std::to_string(s.h) +
         " topk " + std::to_string(s.topk_main) + "+" + std::to_string(s.topk_extra);
}

// Runs one shape with and without the sink, extra lengths and main lengths; reference precision must
// match the oracle to 1e-12, fast precision (f32 accumulation, bf16 out) within the usual rule.
void run_v4(const V4Shape& s, uint64_t seed) {
  test::reseed(seed);
  const int64_t t = 7;
  const test::V4Cache main = test::v4_cache(s.format, s.d_qk, (300 + s.page_main - 1) / s.page_main, s.page_main);
  const test::V4Cache extra = test::v4_cache(s.format, s.d_qk, (90 + s.page_extra - 1) / s.page_extra, s.page_extra);
  const test::V4List ml = test::v4_list(main, t, s.topk_main, false), el = test::v4_list(extra, t, s.topk_extra, true);
  const Tensor m_idx = test::int_tensor_2d(ml.rows), m_len = test::int_tensor(ml.lengths);
  const Tensor e_idx = test::int_tensor_2d(el.rows), e_len = test::int_tensor(el.lengths);
  Tensor sink = Tensor::empty({s.h}, DType::f32);
  std::vector<double> sinks;
  for (int64_t hh = 0; hh < s.h; ++hh) {
    // Mixed magnitudes: below, within and above the scores; one head without a sink (-inf).
    const float v = hh == 1 ? -INFINITY : static_cast<float>(test::uniform(-3.0, 3.0));
    static_cast<float*>(sink.data())[hh] = v;
    sinks.push_back(v);
  }
  Tensor q16 = test::random_tensor({t, s.h, s.d_qk}, DType::bf16);
  const std::vector<double> qv = test::to_doubles(q16.view());
  Tensor q64 = Tensor::empty({t, s.h, s.d_qk}, DType::f64);
  std::copy(qv.begin(), qv.end(), static_cast<double*>(q64.data()));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d_qk));

  for (int variant = 0; variant < 4; ++variant) {
    const bool with_sink = variant != 1, use_len = variant != 2, with_extra = variant != 3;
    SCOPED_TRACE("sink " + std::to_string(with_sink) + " lengths " + std::to_string(use_len) + " extra " +
                 std::to_string(with_extra));
    SparseOptions o;
    if (with_sink) o.attn_sink = sink.view();
    if (with_extra) o.extra = {extra.cb.cache, e_idx.view(), use_len ? e_len.view() : TensorView{}};
    o.values_include_rope = s.whole_row;
    const test::OracleOut ref =
        test::v4_oracle(qv, t, s.h, s.d_qk, s.dv, scale, main.cb.cache, ml, use_len, with_extra ? &extra.cb.cache : nullptr,
                        &el, use_len, with_sink ? sinks : std::vector<double>{});
    const TensorView len = use_len ? m_len.view() : TensorView{};

    Tensor out64 = test::poisoned({t, s.h, s.dv}, DType::f64), lse64 = test::poisoned({t, s.h}, DType::f64);
    sparse_mqa(q64, main.cb.cache, m_idx, len, out64, lse64, scale, o, Context{nullptr, Precision::reference});
    EXPECT_EQ(test::check_close(test::to_doubles(out64.view()), ref.out, DType::f64, 1e-12), "") << "reference out";
    EXPECT_EQ(test::check_close(test::to_doubles(lse64.view()), ref.lse, DType::f64, 1e-12), "") << "reference lse";
    // Token 0 has no valid key: out 0 and lse = the sink (-inf without one, and for head 1).
    const std::vector<double> l = test::to_doubles(lse64.view()), ov = test::to_doubles(out64.view());
    for (int64_t hh = 0; hh < s.h; ++hh) {
      EXPECT_EQ(l[static_cast<std::size_t>(hh)], with_sink ? sinks[static_cast<std::size_t>(hh)] : -INFINITY);
      for (int64_t x = 0; x < s.dv; ++x) ASSERT_EQ(ov[static_cast<std::size_t>(hh * s.dv + x)], 0.0);
    }

    Tensor out16 = test::poisoned({t, s.h, s.dv}, DType::bf16), lse32 = test::poisoned({t, s.h}, DType::f32);
    sparse_mqa(q16, main.cb.cache, m_idx, len, out16, lse32, scale, o, Context{});
    EXPECT_EQ(test::check_close(test::to_doubles(out16.view()), ref.out, DType::bf16, 1e-6), "") << "fast out";
    EXPECT_EQ(test::check_close(test::to_doubles(lse32.view()), test::as_f32(ref.lse), DType::f32, 1e-6), "")
        << "fast lse";
  }
}

TEST(SparseV4, DeepSeekV4ShapeEveryFormat) {
  uint64_t seed = 800;
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::f64})
    for (auto [pm, pe] : {std::pair<int64_t, int64_t>{64, 4}, {16, 1}, {1, 64}}) {
      const V4Shape s{f, 512, 512, true, pm, pe, 5, 37, 13};
      SCOPED_TRACE(name_of(s));
      run_v4(s, seed++);
    }
}

// V3.2-shaped rows (d_qk 576, d_v 512 latent values) with the V4 options, fp8_ds_mla included; values
// whole-row at d_v 576 on the CPU.
TEST(SparseV4, V32RowsWithSinkAndExtra) {
  uint64_t seed = 900;
  for (CacheFormat f : {CacheFormat::fp8_ds_mla, CacheFormat::bf16}) {
    for (const V4Shape& s : {V4Shape{f, 576, 512, false, 64, 16, 3, 33, 70}, V4Shape{f, 576, 576, true, 16, 64, 2, 9, 5}}) {
      SCOPED_TRACE(name_of(s));
      run_v4(s, seed++);
    }
  }
}

// Long key lists are split over threads and merged (token 3: ~1,800 keys, split whenever OpenMP runs two
// threads or more); the sink must enter once, after the merge.
TEST(SparseV4, SplitRangesTakeTheSinkOnce) {
  run_v4(V4Shape{CacheFormat::bf16, 512, 512, true, 64, 16, 16, 1500, 333}, 950);
}

// The sink enters the denominator only: with two equal keys of value v and a sink equal to their score,
// out = 2v / 3 and lse = score + ln 3; a NaN sink makes its head NaN, a -inf sink changes nothing.
TEST(SparseV4, SinkArithmetic) {
  CacheBuffer cb = test::nan_cache(CacheFormat::bf16, 1, 4);
  Tensor row = Tensor::zeros({576}, DType::f64);
  static_cast<double*>(row.data())[0] = 3.0;
  for (int r = 0; r < 2; ++r)
    for (int x = 0; x < 576; ++x)
      num::store(const_cast<uint8_t*>(test::row_ptr(cb.cache, r)) + 2 * x, DType::bf16,
                 static_cast<double*>(row.data())[x]);
  Tensor q = Tensor::zeros({1, 3, 576}, DType::f64);
  for (int hh = 0; hh < 3; ++hh) static_cast<double*>(q.data())[hh * 576] = 0.5;  // score 1.5 per key
  Tensor sink = Tensor::empty({3}, DType::f32);
  static_cast<float*>(sink.data())[0] = 1.5f;
  static_cast<float*>(sink.data())[1] = NAN;
  static_cast<float*>(sink.data())[2] = -INFINITY;
  const Tensor idx = test::int_tensor_2d({{0, -1, 1}});
  Tensor out = test::poisoned({1, 3, 512}, DType::f64), lse = test::poisoned({1, 3}, DType::f64);
  SparseOptions o;
  o.attn_sink = sink.view();
  sparse_mqa(q, cb.cache, idx, {}, out, lse, 1.0, o, Context{nullptr, Precision::reference});
  const std::vector<double> ov = test::to_doubles(out.view()), lv = test::to_doubles(lse.view());
  EXPECT_NEAR(ov[0], 2.0, 1e-12);
  EXPECT_NEAR(lv[0], 1.5 + std::log(3.0), 1e-12);
  EXPECT_TRUE(std::isnan(ov[512]) && std::isnan(lv[1]));
  EXPECT_NEAR(ov[1024], 3.0, 1e-12);
  EXPECT_NEAR(lv[2], 1.5 + std::log(2.0), 1e-12);
  // No key at all with a NaN sink: NaN as well (never mistaken for an empty row).
  const Tensor none = test::int_tensor_2d({{-1, -1, -1}});
  sparse_mqa(q, cb.cache, none, {}, out, lse, 1.0, o, Context{nullptr, Precision::reference});
  const std::vector<double> lv2 = test::to_doubles(lse.view());
  EXPECT_EQ(lv2[0], 1.5);
  EXPECT_TRUE(std::isnan(lv2[1]));
  EXPECT_EQ(lv2[2], -INFINITY);
}

// Default options are the V3.2 op exactly (bit for bit).
TEST(SparseV4, DefaultOptionsAreTheV32Op) {
  test::reseed(5);
  const test::V4Cache c = test::v4_cache(CacheFormat::fp8_ds_mla, 576, 4, 16);
  const test::V4List l = test::v4_list(c, 5, 21, false);
  const Tensor idx = test::int_tensor_2d(l.rows), len = test::int_tensor(l.lengths);
  Tensor q = test::random_tensor({5, 4, 576}, DType::bf16);
  Tensor a = test::poisoned({5, 4, 512}, DType::f32), b = test::poisoned({5, 4, 512}, DType::f32);
  Tensor la = test::poisoned({5, 4}, DType::f32), lb = test::poisoned({5, 4}, DType::f32);
  sparse_mqa(q, c.cb.cache, idx, len, a, la, 0.07);
  sparse_mqa(q, c.cb.cache, idx, len, b, lb, 0.07, SparseOptions{});
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.nbytes()), 0);
}

// Rejected calls name the argument and write nothing.
// The output rotation (SparseOptions::out_rotation) is apply_rope of the unrotated output: bit for bit in
// reference precision (both turn the float64 row with float64 cos / sin), within one bf16 rounding of apply_rope
// over the rounded output in fast precision; int32 and int64 positions, rope_dim 64 and the whole row, and the
// LSE untouched.
TEST(SparseV4, OutRotationIsApplyRopeOfTheOutput) {
  test::reseed(31);
  const int64_t t = 6, h = 5, D = 512;
  const test::V4Cache main = test::v4_cache(CacheFormat::bf16, D, 5, 64);
  const test::V4Cache extra = test::v4_cache(CacheFormat::bf16, D, 4, 16);
  const test::V4List ml = test::v4_list(main, t, 37, false), el = test::v4_list(extra, t, 13, true);
  const Tensor m_idx = test::int_tensor_2d(ml.rows), e_idx = test::int_tensor_2d(el.rows);
  const Tensor m_len = test::int_tensor(ml.lengths), e_len = test::int_tensor(el.lengths);
  Tensor sink = test::random_tensor({h}, DType::f32);
  Tensor q16 = test::random_tensor({t, h, D}, DType::bf16);
  Tensor q64 = Tensor::empty({t, h, D}, DType::f64);
  const std::vector<double> qv = test::to_doubles(q16.view());
  std::copy(qv.begin(), qv.end(), static_cast<double*>(q64.data()));
  Tensor pos32 = test::int_tensor({0, 3, 17, 1000, 123456, 7});  // apply_rope takes positions >= 0
  Tensor pos64 = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i)
    static_cast<int64_t*>(pos64.data())[i] = static_cast<const int32_t*>(pos32.data())[i] * int64_t{3};
  for (const int64_t R : {int64_t{64}, D}) {
    Tensor inv = Tensor::empty({R / 2}, DType::f64);
    for (int64_t i = 0; i < R / 2; ++i)  // DeepSeek's frequencies, negated (the block's inverse rotation)
      static_cast<double*>(inv.data())[i] = -std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(R));
    for (const Tensor* pos : {&pos32, &pos64}) {
      SCOPED_TRACE("rope_dim " + std::to_string(R) + (pos == &pos64 ? " int64" : " int32"));
      SparseOptions plain;
      plain.attn_sink = sink.view();
      plain.extra = {extra.cb.cache, e_idx.view(), e_len.view()};
      plain.values_include_rope = true;
      SparseOptions turned = plain;
      turned.out_rotation = {pos->view(), inv.view(), R};
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      for (const bool ref : {true, false}) {
        const Context ctx = ref ? Context{nullptr, Precision::reference} : Context{};
        const DType od = ref ? DType::f64 : DType::bf16, ld = ref ? DType::f64 : DType::f32;
        const Tensor& q = ref ? q64 : q16;
        Tensor a = test::poisoned({t, h, D}, od), la = test::poisoned({t, h}, ld);
        Tensor b = test::poisoned({t, h, D}, od), lb = test::poisoned({t, h}, ld);
        sparse_mqa(q, main.cb.cache, m_idx, m_len, a, la, scale, plain, ctx);
        sparse_mqa(q, main.cb.cache, m_idx, m_len, b, lb, scale, turned, ctx);
        EXPECT_EQ(test::to_doubles(la.view()), test::to_doubles(lb.view())) << "the LSE is not rotated";
        if (ref) {
          // apply_rope in place over the float64 output: the same float64 operations.
          apply_rope(a.view(), a.view(), pos->view(), inv.view(), 1.0, R, true);
          EXPECT_EQ(test::to_doubles(a.view()), test::to_doubles(b.view()));
        } else {
          // apply_rope over the rounded plain output: a rotated column is within a few bf16 roundings of the
          // pair's magnitude (the plain output's two roundings, then the rotated one's), not of its own value (a
          // rotation may cancel).
          Tensor af = Tensor::empty({t, h, D}, DType::f64);
          apply_rope(a.view(), af.view(), pos->view(), inv.view(), 1.0, R, true);
          const std::vector<double> av = test::to_doubles(a.view()), bv = test::to_doubles(b.view());
          const std::vector<double> fv = test::to_doubles(af.view());
          for (int64_t r = 0; r < t * h; ++r)
            for (int64_t c = D - R; c < D; c += 2) {
              const std::size_t x = static_cast<std::size_t>(r * D + c);
              const double bound = std::ldexp(std::fabs(av[x]) + std::fabs(av[x + 1]), -7) + 1e-30;
              ASSERT_LE(std::fabs(bv[x] - fv[x]), bound) << "row " << r << " column " << c;
              ASSERT_LE(std::fabs(bv[x + 1] - fv[x + 1]), bound) << "row " << r << " column " << c + 1;
            }
          // The columns before the rope part are the plain output.
          for (int64_t r = 0; r < t * h; ++r)
            for (int64_t c = 0; c < D - R; ++c)
              ASSERT_EQ(av[static_cast<std::size_t>(r * D + c)], bv[static_cast<std::size_t>(r * D + c)]);
        }
      }
    }
  }
}

TEST(SparseV4, FrontEndRejects) {
  test::reseed(6);
  const int64_t t = 3, h = 2;
  const test::V4Cache main = test::v4_cache(CacheFormat::bf16, 512, 2, 16);
  const test::V4Cache extra = test::v4_cache(CacheFormat::bf16, 512, 3, 4);
  const test::V4Cache other_fmt = test::v4_cache(CacheFormat::fp8, 512, 3, 4);
  const test::V4Cache other_dqk = test::v4_cache(CacheFormat::bf16, 576, 3, 4);
  const test::V4List ml = test::v4_list(main, t, 8, false), el = test::v4_list(extra, t, 5, true);
  const Tensor m_idx = test::int_tensor_2d(ml.rows), e_idx = test::int_tensor_2d(el.rows);
  const Tensor e_len = test::int_tensor(el.lengths);
  Tensor q = test::random_tensor({t, h, 512}, DType::bf16);
  Tensor out = test::poisoned({t, h, 512}, DType::f32), lse = test::poisoned({t, h}, DType::f32);
  Tensor sink = test::random_tensor({h}, DType::f32);
  auto good = [&] {
    SparseOptions o;
    o.attn_sink = sink.view();
    o.extra = {extra.cb.cache, e_idx.view(), e_len.view()};
    o.values_include_rope = true;
    return o;
  };
  EXPECT_NO_THROW(sparse_mqa(q, main.cb.cache, m_idx, {}, out, lse, 0.05, good()));

  Tensor sink_h = test::random_tensor({h + 1}, DType::f32), sink_bf = test::random_tensor({h}, DType::bf16);
  Tensor e_idx_t = test::int_tensor_2d({{0, 1}}), e_len_bad = test::int_tensor({6, 0, 0});
  Tensor e_len_neg = test::int_tensor({-1, 0, 0}), e_idx64 = Tensor::zeros({t, 5}, DType::i64);
  Tensor rot_pos = test::int_tensor({5, 6, 7}), rot_short = test::int_tensor({5, 6});
  Tensor rot_f = Tensor::zeros({32}, DType::f64), rot_f32 = Tensor::zeros({32}, DType::f32);
  Tensor rot_fpos = Tensor::zeros({t}, DType::f32);
  const std::vector<std::pair<std::string, std::function<void(SparseOptions&)>>> bad = {
      {"attn_sink", [&](SparseOptions& o) { o.attn_sink = sink_h.view(); }},
      {"attn_sink must be f32", [&](SparseOptions& o) { o.attn_sink = sink_bf.view(); }},
      {"attn_sink", [&](SparseOptions& o) { o.attn_sink = test::on_fake_cuda(sink.view()); }},
      {"needs both extra.kv and extra.indices", [&](SparseOptions& o) { o.extra.indices = {}; }},
      {"needs both extra.kv and extra.indices", [&](SparseOptions& o) { o.extra.kv = KVCache{}; }},
      {"main cache's format", [&](SparseOptions& o) { o.extra.kv = other_fmt.cb.cache; }},
      {"main cache's format", [&](SparseOptions& o) { o.extra.kv = other_dqk.cb.cache; }},
      {"extra.indices", [&](SparseOptions& o) { o.extra.indices = e_idx_t.view(); }},
      {"extra.indices", [&](SparseOptions& o) { o.extra.indices = e_idx64.view(); }},
      {"extra.topk_length", [&](SparseOptions& o) { o.extra.topk_length = e_len_bad.view(); }},
      {"extra.topk_length", [&](SparseOptions& o) { o.extra.topk_length = e_len_neg.view(); }},
      {"extra.topk_length", [&](SparseOptions& o) { o.extra.topk_length = m_idx.view(); }},
      {"d_v", [&](SparseOptions& o) { o.values_include_rope = false; }},
      {"out_rotation.rope_dim", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), rot_f.view(), 63}; }},
      {"out_rotation.rope_dim", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), rot_f.view(), 514}; }},
      {"out_rotation.rope_dim", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), rot_f.view(), 0}; }},
      {"out_rotation.inv_freq", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), rot_f.view(), 32}; }},
      {"out_rotation.inv_freq", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), rot_f32.view(), 64}; }},
      {"out_rotation.inv_freq", [&](SparseOptions& o) { o.out_rotation = {rot_pos.view(), {}, 64}; }},
      {"out_rotation.positions", [&](SparseOptions& o) { o.out_rotation = {rot_short.view(), rot_f.view(), 64}; }},
      {"out_rotation.positions", [&](SparseOptions& o) { o.out_rotation = {rot_fpos.view(), rot_f.view(), 64}; }},
      {"out_rotation.positions",
       [&](SparseOptions& o) { o.out_rotation = {test::on_fake_cuda(rot_pos.view()), rot_f.view(), 64}; }},
  };
  for (const auto& [what, edit] : bad) {
    SCOPED_TRACE(what);
    SparseOptions o = good();
    edit(o);
    fill(out.view(), 7.0);
    fill(lse.view(), 7.0);
    try {
      sparse_mqa(q, main.cb.cache, m_idx, {}, out, lse, 0.05, o);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    for (double v : test::to_doubles(out.view())) ASSERT_EQ(v, 7.0);
    for (double v : test::to_doubles(lse.view())) ASSERT_EQ(v, 7.0);
  }
  // d_v past d_qk even with whole-row values.
  Tensor wide = test::poisoned({t, h, 513}, DType::f32);
  EXPECT_THROW(sparse_mqa(q, main.cb.cache, m_idx, {}, wide, lse, 0.05, good()), Error);
}

}  // namespace
}  // namespace mla
