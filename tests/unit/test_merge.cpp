// SPDX-License-Identifier: Apache-2.0
// merge_attn_states (semantics §7 with the [PIN] edge rules) on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cache_test_util.h"
#include "core/numeric.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The §7 formula in double, written out independently of the backend.
struct Merged {
  std::vector<double> out, lse;  // out [T, H, D], lse [H, T]
};
Merged reference_merge(const std::vector<double>& p, const std::vector<double>& pl, const std::vector<double>& s,
                       const std::vector<double>& sl, int64_t T, int64_t H, int64_t D, int64_t with_context) {
  Merged m{std::vector<double>(T * H * D), std::vector<double>(H * T)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t o = (t * H + h) * D, l = h * T + t;
      if (t >= with_context) {
        for (int64_t d = 0; d < D; ++d) m.out[o + d] = s[o + d];
        m.lse[l] = sl[l];
        continue;
      }
      double a = std::isinf(pl[l]) ? -kInf : pl[l], b = std::isinf(sl[l]) ? -kInf : sl[l];
      if (a == -kInf && b == -kInf) {
        for (int64_t d = 0; d < D; ++d) m.out[o + d] = p[o + d];
        m.lse[l] = -kInf;
        continue;
      }
      const double mx = std::max(a, b), wa = std::exp(a - mx), wb = std::exp(b - mx);
      const bool nan = std::isnan(a) || std::isnan(b);
      for (int64_t d = 0; d < D; ++d) m.out[o + d] = nan ? NAN : (p[o + d] * wa + s[o + d] * wb) / (wa + wb);
      m.lse[l] = nan ? NAN : mx + std::log(wa + wb);
    }
  return m;
}

// Random [H, T] lse values, some pairs far apart so that one side's weight underflows.
Tensor random_lse(int64_t H, int64_t T, double lo, double hi) {
  return test::random_tensor({H, T}, DType::f32, Device::cpu(), lo, hi);
}

TEST(Merge, RandomInputsMatchTheFormula) {
  test::reseed(700);
  const int64_t T = 7, H = 4, D = 32;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor p = test::random_tensor({T, H, D}, dt), s = test::random_tensor({T, H, D}, dt);
    Tensor pl = random_lse(H, T, -5, 5), sl = random_lse(H, T, -90, 5);
    Tensor out = test::poisoned({T, H, D}, dt), out_lse = test::poisoned({H, T}, DType::f32);
    const Context ctx{nullptr, dt == DType::f64 ? Precision::reference : Precision::fast};
    merge_attn_states(out, out_lse, p, pl, s, sl, -1, 0.0f, ctx);
    const auto ref = reference_merge(test::to_doubles(p), test::to_doubles(pl), test::to_doubles(s),
                                     test::to_doubles(sl), T, H, D, T);
    // f64 in reference mode: a few double roundings; else the float result rounded to storage, with
    // float accumulation (a few float ulps of max|ref|) before the final rounding.
    const double extra = dt == DType::f64 ? 1e-14 : 1e-6;
    EXPECT_EQ(test::check_close(test::to_doubles(out), ref.out, dt == DType::f64 ? DType::f64 : dt, extra), "")
        << to_string(dt);
    EXPECT_EQ(test::check_close(test::to_doubles(out_lse), ref.lse, DType::f32, 1e-6), "") << to_string(dt);
  }
}

// The float64 oracle keeps LSEs in f64 (accepted on the CPU only): the merged output and lse then
// carry no fp32 rounding (~1e-8 relative on the weights), which the f32 path cannot avoid.
TEST(Merge, F64LseKeepsFullPrecision) {
  test::reseed(702);
  const int64_t T = 5, H = 3, D = 16;
  Tensor p = test::random_tensor({T, H, D}, DType::f64), s = test::random_tensor({T, H, D}, DType::f64);
  Tensor pl = test::random_tensor({H, T}, DType::f64, Device::cpu(), 3, 9);
  Tensor sl = test::random_tensor({H, T}, DType::f64, Device::cpu(), 3, 9);
  Tensor out = test::poisoned({T, H, D}, DType::f64), out_lse = test::poisoned({H, T}, DType::f64);
  const Context ref_ctx{nullptr, Precision::reference};
  merge_attn_states(out, out_lse, p, pl, s, sl, -1, 0.0f, ref_ctx);
  const auto ref = reference_merge(test::to_doubles(p), test::to_doubles(pl), test::to_doubles(s),
                                   test::to_doubles(sl), T, H, D, T);
  EXPECT_EQ(test::check_close(test::to_doubles(out), ref.out, DType::f64, 1e-14), "");
  EXPECT_EQ(test::check_close(test::to_doubles(out_lse), ref.lse, DType::f64, 1e-14), "");
  // The same merge through fp32 LSEs misses the f64 bound: the f64 path is really taken above.
  Tensor pl32 = Tensor::empty({H, T}, DType::f32), sl32 = Tensor::empty({H, T}, DType::f32);
  const auto pv = test::to_doubles(pl), sv = test::to_doubles(sl);
  for (int64_t i = 0; i < H * T; ++i) {
    static_cast<float*>(pl32.data())[i] = static_cast<float>(pv[i]);
    static_cast<float*>(sl32.data())[i] = static_cast<float>(sv[i]);
  }
  Tensor out32 = test::poisoned({T, H, D}, DType::f64);
  merge_attn_states(out32, {}, p, pl32, s, sl32, -1, 0.0f, ref_ctx);
  EXPECT_NE(test::check_close(test::to_doubles(out32), ref.out, DType::f64, 1e-14), "");
  // CUDA never takes f64 LSEs; on the CPU an integer LSE is refused.
  Tensor bad = Tensor::empty({H, T}, DType::i32);
  EXPECT_THROW(merge_attn_states(out, {}, p, bad, s, sl, -1, 0.0f, ref_ctx), Error);
}

TEST(Merge, EdgeRules) {
  // One head; each token one (prefix_lse, suffix_lse) case.
  const std::vector<double> pls = {kInf, 1.0, -kInf, -kInf, kInf, kInf, -kInf, NAN, 0.0, 3.0};
  const std::vector<double> sls = {1.0, kInf, 2.0, -kInf, kInf, -kInf, kInf, 0.0, NAN, 3.0};
  const int64_t T = static_cast<int64_t>(pls.size()), D = 8;
  test::reseed(701);
  Tensor p = test::random_tensor({T, 1, D}, DType::f32), s = test::random_tensor({T, 1, D}, DType::f32);
  Tensor pl = Tensor::empty({1, T}, DType::f32), sl = Tensor::empty({1, T}, DType::f32);
  for (int64_t t = 0; t < T; ++t) {
    static_cast<float*>(pl.data())[t] = static_cast<float>(pls[t]);
    static_cast<float*>(sl.data())[t] = static_cast<float>(sls[t]);
  }
  for (Precision prec : {Precision::fast, Precision::reference}) {
    Tensor out = test::poisoned({T, 1, D}, DType::f32), out_lse = test::poisoned({1, T}, DType::f32);
    merge_attn_states(out, out_lse, p, pl, s, sl, -1, 0.0f, Context{nullptr, prec});
    const auto o = test::to_doubles(out), l = test::to_doubles(out_lse);
    const auto pv = test::to_doubles(p), sv = test::to_doubles(s);
    auto row_is = [&](int64_t t, const std::vector<double>& src) {
      for (int64_t d = 0; d < D; ++d)
        if (o[t * D + d] != src[t * D + d]) return false;
      return true;
    };
    EXPECT_TRUE(row_is(0, sv) && l[0] == 1.0) << "+inf prefix -> suffix";
    EXPECT_TRUE(row_is(1, pv) && l[1] == 1.0) << "+inf suffix -> prefix";
    EXPECT_TRUE(row_is(2, sv) && l[2] == 2.0) << "-inf prefix -> suffix";
    for (int64_t t : {3, 4, 5, 6}) EXPECT_TRUE(row_is(t, pv) && l[t] == -kInf) << "both empty at token " << t;
    for (int64_t t : {7, 8}) {
      EXPECT_TRUE(std::isnan(l[t])) << t;
      for (int64_t d = 0; d < D; ++d) EXPECT_TRUE(std::isnan(o[t * D + d])) << t;
    }
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o[9 * D + d], 0.5 * (pv[9 * D + d] + sv[9 * D + d]), 1e-6);
    EXPECT_NEAR(l[9], 3.0 + std::log(2.0), 1e-6);
  }
}

TEST(Merge, TokensWithoutContextCopyTheSuffix) {
  test::reseed(702);
  const int64_t T = 6, H = 3, D = 16;
  Tensor p = test::random_tensor({T, H, D}, DType::bf16), s = test::random_tensor({T, H, D}, DType::bf16);
  Tensor pl = random_lse(H, T, -3, 3), sl = random_lse(H, T, -3, 3);
  static_cast<float*>(sl.data())[1 * T + 4] = INFINITY;  // copied as is past the context tokens
  for (int64_t with_context : {0, 2, 6}) {
    Tensor out = test::poisoned({T, H, D}, DType::bf16), out_lse = test::poisoned({H, T}, DType::f32);
    merge_attn_states(out, out_lse, p, pl, s, sl, with_context);
    const auto ref = reference_merge(test::to_doubles(p), test::to_doubles(pl), test::to_doubles(s),
                                     test::to_doubles(sl), T, H, D, with_context);
    EXPECT_EQ(test::check_close(test::to_doubles(out), ref.out, DType::bf16, 1e-6), "") << with_context;
    const auto got_lse = test::to_doubles(out_lse);
    EXPECT_EQ(test::check_close(got_lse, ref.lse, DType::f32, 1e-6), "") << with_context;
    const auto o = test::to_doubles(out), sv = test::to_doubles(s);
    for (int64_t k = with_context * H * D; k < T * H * D; ++k) ASSERT_EQ(o[k], sv[k]) << with_context;
    if (with_context <= 4) { EXPECT_EQ(got_lse[1 * T + 4], kInf); }
  }
}

TEST(Merge, StridedLseViewsPaddedOutputAndNoOutLse) {
  test::reseed(703);
  const int64_t T = 5, H = 3, D = 8;
  Tensor p = test::random_tensor({T, H, D}, DType::f32), s = test::random_tensor({T, H, D}, DType::f32);
  Tensor pl_th = test::random_tensor({T, H}, DType::f32, Device::cpu(), -4, 4);  // [T, H] buffer
  Tensor sl_wide = test::random_tensor({H, T + 4}, DType::f32, Device::cpu(), -4, 4);
  const TensorView pl = pl_th.view().transpose(0, 1), sl = sl_wide.view().slice(1, 2, 2 + T);
  Tensor out_buf = test::poisoned({T, H + 2, D}, DType::f32);
  Tensor lse_th = test::poisoned({T, H}, DType::f32);
  const TensorView out = out_buf.view().slice(1, 0, H), out_lse = lse_th.view().transpose(0, 1);
  merge_attn_states(out, out_lse, p, pl, s, sl);
  const auto ref =
      reference_merge(test::to_doubles(p), test::to_doubles(pl), test::to_doubles(s), test::to_doubles(sl), T, H, D, T);
  EXPECT_EQ(test::check_close(test::to_doubles(out), ref.out, DType::f32, 1e-6), "");
  EXPECT_EQ(test::check_close(test::to_doubles(out_lse), ref.lse, DType::f32, 1e-6), "");
  for (double v : test::to_doubles(out_buf.view().slice(1, H, H + 2))) ASSERT_TRUE(std::isnan(v));
  Tensor out2 = test::poisoned({T, H, D}, DType::f32);
  merge_attn_states(out2, {}, p, pl, s, sl);
  EXPECT_EQ(test::to_doubles(out2), test::to_doubles(out));
}

TEST(Merge, Fp8OutputWithScale) {
  test::reseed(704);
  const int64_t T = 4, H = 2, D = 64;
  const float scale = 0.01f;  // |out| > 4.48 saturates
  Tensor p = test::random_tensor({T, H, D}, DType::f32, Device::cpu(), -6, 6);
  Tensor s = test::random_tensor({T, H, D}, DType::f32, Device::cpu(), -6, 6);
  Tensor pl = random_lse(H, T, -2, 2), sl = random_lse(H, T, -2, 2);
  Tensor out = Tensor::zeros({T, H, D}, DType::fp8_e4m3);
  merge_attn_states(out, {}, p, pl, s, sl, 3, scale);
  const auto ref = reference_merge(test::to_doubles(p), test::to_doubles(pl), test::to_doubles(s),
                                   test::to_doubles(sl), T, H, D, 3);
  const auto got = test::to_doubles(out);
  int saturated = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double y = ref.out[k] / scale;
    if (std::fabs(y) >= 448) {
      ASSERT_EQ(got[k], std::copysign(448.0, y)) << k;
      ++saturated;
    } else {
      ASSERT_LE(std::fabs(got[k] - y), test::e4m3_step(y)) << k;
    }
  }
  EXPECT_GT(saturated, 0);
}

TEST(Merge, BadInputsThrowAndWriteNothing) {
  const int64_t T = 3, H = 2, D = 8;
  Tensor p = test::random_tensor({T, H, D}, DType::f32), s = test::random_tensor({T, H, D}, DType::f32);
  Tensor pl = random_lse(H, T, -1, 1), sl = random_lse(H, T, -1, 1);
  Tensor out = test::poisoned({T, H, D}, DType::f32), out_lse = test::poisoned({H, T}, DType::f32);
  Tensor lse_bf16 = test::random_tensor({H, T}, DType::bf16), lse_th = random_lse(T, H, -1, 1);
  Tensor out_fp8 = Tensor::zeros({T, H, D}, DType::fp8_e4m3), out_short = test::poisoned({T, H, D - 1}, DType::f32);
  Tensor s_pad = test::random_tensor({T, H + 1, D}, DType::f32), ints = Tensor::zeros({T, H, D}, DType::i32);
  const TensorView s_strided = s_pad.view().slice(1, 0, H);  // head stride D, prefix's is D too: fine
  Tensor s_heads = test::random_tensor({T, D, H}, DType::f32);
  const TensorView s_other_stride = s_heads.view().transpose(1, 2);  // [T, H, D] with head stride 1: no
  auto untouched = [&] {
    for (double v : test::to_doubles(out))
      if (!std::isnan(v)) return false;
    for (double v : test::to_doubles(out_lse))
      if (!std::isnan(v)) return false;
    for (double v : test::to_doubles(out_fp8))
      if (v != 0) return false;
    return true;
  };
  auto expect_rejected = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_TRUE(untouched()) << what;
  };
  expect_rejected([&] { merge_attn_states(out, out_lse, p, lse_bf16, s, sl); }, "lse dtype");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, lse_th, s, sl); }, "lse [T, H] instead of [H, T]");
  expect_rejected([&] { merge_attn_states(out_short, out_lse, p, pl, s, sl); }, "out shape");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, pl, s_other_stride, sl); }, "head strides differ");
  expect_rejected([&] { merge_attn_states(out, out_lse, ints, pl, s, sl); }, "prefix dtype");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, pl, s, sl, -1, 0.5f); }, "output_scale, f32 out");
  expect_rejected([&] { merge_attn_states(out_fp8, {}, p, pl, s, sl); }, "fp8 out without scale");
  expect_rejected([&] { merge_attn_states(out_fp8, {}, p, pl, s, sl, -1, -1.0f); }, "negative scale");
  expect_rejected([&] { merge_attn_states(out_fp8, {}, p, pl, s, sl, -1, NAN); }, "NaN scale");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, pl, s, sl, T + 1); }, "prefill tokens > T");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, pl, s, sl, -2); }, "prefill tokens < -1");
  expect_rejected([&] { merge_attn_states(out, out_lse, p, pl, s, test::on_fake_cuda(sl)); }, "lse device");
  expect_rejected([&] { merge_attn_states(out, out_lse.view().as_dtype(DType::i32), p, pl, s, sl); }, "out_lse dtype");
  TensorView overlapping = out.view();
  overlapping.stride[0] = 0;
  expect_rejected([&] { merge_attn_states(overlapping, out_lse, p, pl, s, sl); }, "out rows overlap");
  // A suffix slice with the same head stride is accepted.
  EXPECT_NO_THROW(merge_attn_states(out, out_lse, p, pl, s_strided, sl));
}

}  // namespace
}  // namespace mla
