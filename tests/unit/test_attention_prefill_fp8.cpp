// SPDX-License-Identifier: Apache-2.0
// fp8 compute of mha_prefill on the CPU (SEMANTICS §10.1): the quantisation rule on one-key rows (exact), the
// LSE of codes-exact inputs equal to the bf16 op's, the P-quantisation bound against the unquantised-P
// attention, the bound against the unquantised inputs, empty and NaN rows, and the refusals. Then the CUDA
// launchers' host decisions: the sm90 prefill schedule rule (cuda/attention/sm90/common/prefill_schedule.h) and the
// reciprocal the fp8 quantise pass multiplies by (cuda/attention/sm90/prefill_fp8/plan.h).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numeric.h"
#include "cuda/attention/sm90/common/prefill_schedule.h"
#include "cuda/attention/sm90/prefill_fp8/plan.h"
#include "mla/ops.h"
#include "support/test_util.h"
#include "unit/prefill_fp8_oracle.h"

namespace mla {
namespace {

PrefillOptions fp8_opts(float sq, float sk, float sv) {
  PrefillOptions o;
  o.fp8 = true;
  o.q_scale = sq;
  o.k_scale = sk;
  o.v_scale = sv;
  return o;
}

const Context kRef{nullptr, Precision::reference};

// One key per request: P8 = 256 = l, so out = s_v e4m3(v / s_v) exactly and lse = the codes' score.
TEST(AttentionPrefillFp8, OneKeyRowsShowTheQuantisationRule) {
  const int64_t h = 2, d = 4, dn = 3, dr = 1, dv = 5;
  const float sq = 0.5f, sk = 2.0f, sv = 0.25f;
  Tensor q = Tensor::empty({1, h, d}, DType::f32), kn = Tensor::empty({1, h, dn}, DType::f32);
  Tensor pe = Tensor::empty({1, h, dr}, DType::f32), v = Tensor::empty({1, h, dv}, DType::f32);
  const std::vector<float> qv = {0.3f, -100.0f, 1e-4f, 7.7f, 1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> kv = {1.1f, 2000.0f, -0.01f, 0.9f, 3.3f, -3.3f};
  const std::vector<float> pv = {5.0f, -1.5f};
  const std::vector<float> vv = {0.1f, 200.0f, -0.33f, 1e-6f, 3.0f, 1.0f, 2.0f, 0.05f, -7.0f, 112.5f};
  std::copy(qv.begin(), qv.end(), static_cast<float*>(q.data()));
  std::copy(kv.begin(), kv.end(), static_cast<float*>(kn.data()));
  std::copy(pv.begin(), pv.end(), static_cast<float*>(pe.data()));
  std::copy(vv.begin(), vv.end(), static_cast<float*>(v.data()));
  const Tensor cu = test::int_tensor({0, 1});
  Tensor out = Tensor::empty({1, h, dv}, DType::f64), lse = Tensor::empty({h, 1}, DType::f64);
  const double tau = 0.3;
  mha_prefill(q.view(), kn.view(), pe.view(), v.view(), cu.view(), cu.view(), 1, 1, out.view(), lse.view(), tau, true,
              fp8_opts(sq, sk, sv), kRef);
  auto code = [](float x, float s) { return static_cast<double>(num::e4m3_to_float(num::float_to_e4m3(x / s))); };
  const std::vector<double> o = test::to_doubles(out.view()), l = test::to_doubles(lse.view());
  for (int64_t hh = 0; hh < h; ++hh) {
    double s = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      const float kc = c < dn ? kv[hh * dn + c] : pv[hh * dr + c - dn];
      s += code(qv[hh * d + c], sq) * code(kc, sk);
    }
    EXPECT_DOUBLE_EQ(l[hh], s * sq * sk * tau) << "head " << hh;
    for (int64_t c = 0; c < dv; ++c)
      EXPECT_DOUBLE_EQ(o[hh * dv + c], code(vv[hh * dv + c], sv) * sv) << "head " << hh << " col " << c;
  }
  // Saturation: 2000 / 2 -> 448, 200 / 0.25 -> 448.
  EXPECT_DOUBLE_EQ(code(2000.0f, sk), 448.0);
  EXPECT_DOUBLE_EQ(o[1], 448.0 * sv);
}

struct Batch {
  Tensor q, kn, pe, v, cu_q, cu_k;
  int64_t max_q = 0, max_k = 0;
};

// Random bf16 inputs; `exact`: every value is an e4m3 code times its scale (quantisation is then exact).
Batch make_batch(int64_t h, const std::vector<std::pair<int32_t, int32_t>>& lens, const PrefillOptions& o, bool exact,
                 double q_range = 1.0) {
  Batch b;
  const test::Varlen vl = test::varlen(lens);
  b.max_q = vl.max_q;
  b.max_k = vl.max_k;
  b.q = test::random_tensor({vl.total_q, h, 192}, DType::bf16, Device::cpu(), -q_range, q_range);
  b.kn = test::random_tensor({vl.total_k, h, 128}, DType::bf16);
  b.pe = test::random_tensor({vl.total_k, h, 64}, DType::bf16);
  b.v = test::random_tensor({vl.total_k, h, 128}, DType::bf16);
  if (exact) {
    for (auto [t, s] : {std::pair{&b.q, o.q_scale}, {&b.kn, o.k_scale}, {&b.pe, o.k_scale}, {&b.v, o.v_scale}}) {
      const Tensor d = test::dequantised(t->view(), s, false);  // e4m3 values times a power of two: bf16-exact
      const double* src = static_cast<const double*>(d.data());
      for (int64_t i = 0; i < t->numel(); ++i) num::store(static_cast<uint16_t*>(t->data()) + i, DType::bf16, src[i]);
    }
  }
  b.cu_q = vl.cu_q;
  b.cu_k = vl.cu_k;
  return b;
}

test::Fp8PrefillCase case_of(const Batch& b, bool causal, const PrefillOptions& o, double scale = 0.0722) {
  return {b.q.view(), b.kn.view(), b.pe.view(), b.v.view(), b.cu_q.view(), b.cu_k.view(), b.max_q, b.max_k,
          scale,      causal,      o};
}

// Codes-exact inputs: the scores are the bf16 op's exactly, so the LSE is (l uses unquantised p); out differs by
// P's quantisation only: at most 2^-4 w + 2^-18 n s_v max|v8| per element (one rounding), and not zero.
TEST(AttentionPrefillFp8, CodesExactInputsMatchTheBf16OpButForP) {
  test::reseed(21);
  const PrefillOptions o = fp8_opts(0.5f, 0.25f, 0.125f);
  for (bool causal : {true, false}) {
    const Batch b = make_batch(3, {{5, 9}, {0, 4}, {70, 70}, {3, 0}}, o, true);
    const test::Fp8Oracle f = test::fp8_oracle(case_of(b, causal, o));
    Tensor out = Tensor::empty({b.q.size(0), 3, 128}, DType::f64), lse = Tensor::empty({3, b.q.size(0)}, DType::f64);
    mha_prefill(b.q.view(), b.kn.view(), b.pe.view(), b.v.view(), b.cu_q.view(), b.cu_k.view(), b.max_q, b.max_k,
                out.view(), lse.view(), 0.0722, causal, kRef);
    const std::vector<double> ro = test::to_doubles(out.view()), rl = test::to_doubles(lse.view());
    double moved = 0.0;
    for (std::size_t i = 0; i < rl.size(); ++i) {
      if (std::isinf(rl[i])) {
        EXPECT_EQ(f.lse[i], rl[i]);
      } else {
        EXPECT_NEAR(f.lse[i], rl[i], 1e-12 * (1 + std::fabs(rl[i]))) << i;
      }
    }
    for (int64_t t = 0; t < f.tq; ++t)
      for (int64_t hh = 0; hh < 3; ++hh)
        for (int64_t d = 0; d < 128; ++d) {
          const std::size_t i = static_cast<std::size_t>((t * 3 + hh) * 128 + d), r = static_cast<std::size_t>(hh * f.tq + t);
          const double tol = f.w[i] / 16 + std::ldexp(f.n[r] * o.v_scale * f.max_v8, -18) + 1e-12;
          EXPECT_LE(std::fabs(f.out[i] - ro[i]), tol) << "t " << t << " h " << hh << " d " << d;
          moved = std::max(moved, std::fabs(f.out[i] - ro[i]));
        }
    EXPECT_GT(moved, 0.0) << "P is quantised";
  }
}

// Unquantised bf16 inputs against the float64 op: the input roundings move the scores by about 2^-3 A at most and
// the values by 2^-4 w + 2^-10 s_v (SEMANTICS §10.1); P adds 2^-4 w.
TEST(AttentionPrefillFp8, BoundAgainstTheUnquantisedInputs) {
  test::reseed(22);
  const PrefillOptions o = fp8_opts(1.0f / 64, 1.0f / 128, 1.0f / 256);
  const Batch b = make_batch(2, {{40, 40}, {7, 130}}, o, false);
  const test::Fp8Oracle f = test::fp8_oracle(case_of(b, true, o));
  Tensor out = Tensor::empty({b.q.size(0), 2, 128}, DType::f64), lse = Tensor::empty({2, b.q.size(0)}, DType::f64);
  mha_prefill(b.q.view(), b.kn.view(), b.pe.view(), b.v.view(), b.cu_q.view(), b.cu_k.view(), b.max_q, b.max_k,
              out.view(), lse.view(), 0.0722, true, kRef);
  const std::vector<double> ro = test::to_doubles(out.view()), rl = test::to_doubles(lse.view());
  for (int64_t t = 0; t < f.tq; ++t)
    for (int64_t hh = 0; hh < 2; ++hh) {
      const std::size_t r = static_cast<std::size_t>(hh * f.tq + t);
      const double ds = 0.125 * f.a[r] + 1e-9;  // largest move of a score (|q|, |k| far above the subnormals)
      EXPECT_NEAR(f.lse[r], rl[r], ds) << "lse t " << t << " h " << hh;
      for (int64_t d = 0; d < 128; ++d) {
        const std::size_t i = static_cast<std::size_t>((t * 2 + hh) * 128 + d);
        const double tol = std::expm1(2 * ds) * 1.0 + f.w[i] / 8 + std::ldexp(o.v_scale, -10) + 1e-12;
        EXPECT_NEAR(f.out[i], ro[i], tol) << "t " << t << " h " << hh << " d " << d;
      }
    }
}

TEST(AttentionPrefillFp8, EmptyAndNanRows) {
  test::reseed(23);
  const PrefillOptions o = fp8_opts(1.0f, 1.0f, 1.0f);
  Batch b = make_batch(1, {{4, 0}, {3, 5}}, o, false);
  static_cast<uint16_t*>(b.q.data())[(5) * 192 + 7] = 0x7fc0;  // NaN in request 1's query 1
  Tensor out = Tensor::empty({7, 1, 128}, DType::f32), lse = Tensor::empty({1, 7}, DType::f32);
  mha_prefill(b.q.view(), b.kn.view(), b.pe.view(), b.v.view(), b.cu_q.view(), b.cu_k.view(), b.max_q, b.max_k,
              out.view(), lse.view(), 0.0722, true, o);
  const std::vector<double> ov = test::to_doubles(out.view()), lv = test::to_doubles(lse.view());
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(lv[t], -INFINITY);
    for (int d = 0; d < 128; ++d) EXPECT_EQ(ov[t * 128 + d], 0.0);
  }
  EXPECT_TRUE(std::isnan(lv[5]));
  EXPECT_TRUE(std::isnan(ov[5 * 128]));
  EXPECT_TRUE(std::isfinite(lv[4]) && std::isfinite(lv[6]));
}

TEST(AttentionPrefillFp8, RefusesBadScales) {
  const Batch b = make_batch(1, {{2, 2}}, fp8_opts(1, 1, 1), false);
  Tensor out = Tensor::empty({2, 1, 128}, DType::f32);
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    for (int which = 0; which < 3; ++which) {
      PrefillOptions o = fp8_opts(1, 1, 1);
      (which == 0 ? o.q_scale : which == 1 ? o.k_scale : o.v_scale) = bad;
      fill(out.view(), 7.0);
      EXPECT_THROW(mha_prefill(b.q.view(), b.kn.view(), b.pe.view(), b.v.view(), b.cu_q.view(), b.cu_k.view(), 2, 2,
                               out.view(), {}, 0.0722, true, o),
                   Error);
      EXPECT_EQ(test::to_doubles(out.view())[0], 7.0) << "nothing written";
    }
  }
  EXPECT_EQ(mha_prefill_workspace_bytes(100, 100, 16, 2, true, Device::cpu()), 0u);
  EXPECT_THROW(mha_prefill_workspace_bytes(-1, 0, 1, 0, true, Device::cpu()), Error);
}

// The sm90 prefill schedule (bf16 and fp8 kernels): persistent pairs for causal launches of at most 32 query tiles that give every SM two
// units; one CTA per unit for longer causal requests, non-causal launches and small grids.
TEST(AttentionPrefillFp8, Sm90ScheduleRule) {
  using cuda::prefill_io::use_persistent;
  constexpr int64_t kSms = 132;
  EXPECT_TRUE(use_persistent(true, 32, 32 * 16 * 4, kSms));    // b 4 s 4096 h 16
  EXPECT_TRUE(use_persistent(true, 32, 32 * 128 * 4, kSms));   // b 4 s 4096 h 128
  EXPECT_FALSE(use_persistent(true, 128, 128 * 128, kSms));    // b 1 s 16384 h 128
  EXPECT_FALSE(use_persistent(true, 33, 33 * 128, kSms));
  EXPECT_FALSE(use_persistent(false, 32, 32 * 128 * 4, kSms)); // non-causal (context chunks)
  EXPECT_TRUE(use_persistent(true, 8, 2 * kSms, kSms));
  EXPECT_FALSE(use_persistent(true, 8, 2 * kSms - 1, kSms));  // fewer than two units per SM
  EXPECT_FALSE(use_persistent(true, 8, 1000, 0));
}

// The quantise pass's division (plan.h quant_scale): for a power-of-two scale x * (1 / s) is x / s to the bit for
// every bf16 x; for the others in [2^-32, 2^32] the corrected product is x / s to the bit wherever the quotient
// can reach a nonzero e4m3 code (|x / s| >= 2^-12, finite), and gives x / s's e4m3 code for every bf16 x.
TEST(AttentionPrefillFp8, Sm90QuantiseDivisionIsExact) {
  using cuda::prefill_sm90_fp8::QuantDivision;
  using cuda::prefill_sm90_fp8::corrected_quotient;
  using cuda::prefill_sm90_fp8::quant_scale;
  int multiply = 0;
  for (int e = -149; e <= 127; ++e) {
    const float s = std::ldexp(1.0f, e);
    const auto qs = quant_scale(s);
    if (qs.division != QuantDivision::multiply) {
      EXPECT_TRUE(e < -127 && qs.division == QuantDivision::divide) << s;  // 1 / s overflows a float
      continue;
    }
    ++multiply;
    for (uint32_t b = 0; b < 65536; ++b) {
      const float x = std::bit_cast<float>(b << 16);
      const float q = x / s, m = x * qs.recip;
      if (std::isnan(q)) {
        EXPECT_TRUE(std::isnan(m));
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(q), std::bit_cast<uint32_t>(m)) << "s " << s << " x " << x;
      }
    }
  }
  EXPECT_EQ(multiply, 255);  // 2^-127 .. 2^127

  // Every 61st float mantissa of s against every bf16 mantissa of x, the quotient in (1/2, 2).
  for (uint32_t ms = 0; ms < (1u << 23); ms += 61) {
    const float s = std::bit_cast<float>((127u << 23) | ms);
    const auto qs = quant_scale(s);
    ASSERT_EQ(qs.division, ms == 0 ? QuantDivision::multiply : QuantDivision::correct);
    for (uint32_t mx = 0; mx < 256; ++mx) {
      const float x = std::bit_cast<float>((127u << 23) | (mx << 16));
      ASSERT_EQ(std::bit_cast<uint32_t>(corrected_quotient(x, s, qs.recip)), std::bit_cast<uint32_t>(x / s))
          << "s " << s << " x " << x;
    }
  }
  // Every bf16 x (zeros, subnormals, infinities, NaN) at scales across the range.
  for (float s : {0.0722f, 3.0f, 1.0f / 3, 0.0097f, 1e-5f, 7e4f, 1.37f * std::ldexp(1.0f, -32),
                  0.77f * std::ldexp(1.0f, 32)}) {
    const auto qs = quant_scale(s);
    ASSERT_EQ(qs.division, QuantDivision::correct) << s;
    for (uint32_t b = 0; b < 65536; ++b) {
      const float x = std::bit_cast<float>(b << 16), q = x / s, c = corrected_quotient(x, s, qs.recip);
      ASSERT_EQ(num::float_to_e4m3(c), num::float_to_e4m3(q)) << "s " << s << " x " << x;
      if (std::isfinite(q) && std::fabs(q) >= std::ldexp(1.0f, -12)) {
        ASSERT_EQ(std::bit_cast<uint32_t>(c), std::bit_cast<uint32_t>(q)) << "s " << s << " x " << x;
      }
    }
  }
  for (float s : {0.0f, -0.5f, NAN, INFINITY, 1.5f * std::ldexp(1.0f, -33), 1.5f * std::ldexp(1.0f, 33)})
    EXPECT_EQ(quant_scale(s).division, QuantDivision::divide) << s;
  EXPECT_EQ(quant_scale(1.0f / 256).recip, 256.0f);
  EXPECT_EQ(quant_scale(std::ldexp(1.0f, 40)).division, QuantDivision::multiply);
}

}  // namespace
}  // namespace mla
