// SPDX-License-Identifier: Apache-2.0
// The DeepSeek block's ops on the CPU (mla/block_ops.h): RMSNorm and RoPE against their formulas
// (in place, interleaved and half-split pairs, the rope_dim 0 copy), the 1 x 128 quantiser (codes,
// scale layout, padding rows, all-zero groups), the block-scaled fp8 GEMM against a float64 sum, and
// refused arguments (nothing written).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <numbers>

#include "mla/block_ops.h"
#include "mla/error.h"
#include "unit/block_ops_util.h"

namespace mla {
namespace {

using test::block_ops::gemm_fp8_block_ref;
using test::block_ops::random_codes;
using test::block_ops::random_scales;
using test::block_ops::scale_view;

TEST(BlockOps, RmsNormMatchesFormulaInPlaceAndOut) {
  test::reseed(11);
  const int64_t T = 5, n = 96;
  const Tensor x = test::random_tensor({T, n}, DType::f32), w = test::random_tensor({n}, DType::f32);
  const std::vector<double> xv = test::to_doubles(x.view()), wv = test::to_doubles(w.view());
  std::vector<double> ref(static_cast<std::size_t>(T * n));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xv[t * n + i] * xv[t * n + i];
    const double r = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) ref[t * n + i] = xv[t * n + i] * r * wv[i];
  }
  Tensor y = test::poisoned({T, n}, DType::f64);
  rms_norm(x.view(), w.view(), y.view(), 1e-6, Context{nullptr, Precision::reference});
  EXPECT_LT(test::rel_l2(test::to_doubles(y.view()), ref), 1e-7);  // x and w are f32: exact inputs
  Tensor z = test::random_tensor({T, n}, DType::f32);
  copy(z.view(), x.view());
  rms_norm(z.view(), w.view(), z.view(), 1e-6);  // in place
  EXPECT_LT(test::rel_l2(test::to_doubles(z.view()), ref), 1e-6);
  // Overlap that is not in place is refused.
  EXPECT_THROW(rms_norm(z.view().slice(0, 0, 4), w.view(), z.view().slice(0, 1, 5), 1e-6), Error);
  EXPECT_THROW(rms_norm(x.view(), w.view(), y.view(), -1.0), Error);
}

TEST(BlockOps, ApplyRopeMatchesFormula) {
  test::reseed(12);
  const int64_t T = 4, G = 3, D = 24, R = 8;
  const Tensor src = test::random_tensor({T, G, D}, DType::f64);
  const Tensor pos = test::int64_tensor({0, 7, 100, 4095});
  Tensor inv = Tensor::empty({R / 2}, DType::f64);
  for (int64_t i = 0; i < R / 2; ++i) static_cast<double*>(inv.data())[i] = std::pow(10000.0, -2.0 * i / R) * 0.3;
  const std::vector<double> s = test::to_doubles(src.view());
  const auto* invp = static_cast<const double*>(inv.data());
  for (const bool interleave : {true, false}) {
    Tensor dst = test::poisoned({T, G, D}, DType::f64);
    apply_rope(src.view(), dst.view(), pos.view(), inv.view(), 0.75, R, interleave);
    const std::vector<double> d = test::to_doubles(dst.view());
    const int64_t p[4] = {0, 7, 100, 4095};
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t o = (t * G + g) * D;
        for (int64_t j = 0; j < D - R; ++j) EXPECT_EQ(d[o + j], s[o + j]);
        for (int64_t i = 0; i < R / 2; ++i) {
          const int64_t ia = D - R + (interleave ? 2 * i : i), ib = D - R + (interleave ? 2 * i + 1 : i + R / 2);
          const double c = std::cos(p[t] * invp[i]) * 0.75, sn = std::sin(p[t] * invp[i]) * 0.75;
          EXPECT_NEAR(d[o + ia], s[o + ia] * c - s[o + ib] * sn, 1e-14);
          EXPECT_NEAR(d[o + ib], s[o + ib] * c + s[o + ia] * sn, 1e-14);
        }
      }
  }
  // rope_dim 0: a converting copy; negative positions and odd rope_dim are refused.
  Tensor bf = test::poisoned({T, G, D}, DType::bf16);
  apply_rope(src.view(), bf.view(), pos.view(), inv.view().slice(0, 0, 0), 1.0, 0, true);
  const std::vector<double> b = test::to_doubles(bf.view());
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], num::round_bf16(static_cast<float>(s[i])));
  const Tensor neg = test::int64_tensor({0, -1, 2, 3});
  Tensor untouched = test::poisoned({T, G, D}, DType::f64);
  EXPECT_THROW(apply_rope(src.view(), untouched.view(), neg.view(), inv.view(), 1.0, R, true), Error);
  EXPECT_THROW(apply_rope(src.view(), untouched.view(), pos.view(), inv.view(), 1.0, R - 1, true), Error);
  for (double v : test::to_doubles(untouched.view())) EXPECT_TRUE(std::isnan(v));
}

// The V4 window: p - W + 1 + j, -1 before the request's start; int32 and int64 positions, a strided view, a wider
// output row; refused arguments write nothing.
TEST(BlockOps, SlidingWindowPositionsMatchFormula) {
  const std::vector<int64_t> p = {0, 1, 5, 6, 7, 1000, 2147483647};
  const int64_t T = static_cast<int64_t>(p.size()), W = 7;
  auto expect_rows = [&](const Tensor& out, const char* what) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t pos = p[static_cast<std::size_t>(t)] - W + 1 + j;
        EXPECT_EQ(*static_cast<const int32_t*>(out.view().ptr_at({t, j})), pos < 0 ? -1 : pos)
            << what << " t " << t << " j " << j;
      }
  };
  const Tensor p64 = test::int64_tensor(p);
  Tensor out = test::poisoned({T, W}, DType::i32);
  sliding_window_positions(p64.view(), out.view());
  expect_rows(out, "int64");
  std::vector<int32_t> p32(p.begin(), p.end());
  const Tensor pos32 = test::int_tensor(p32);
  Tensor out32 = test::poisoned({T, W}, DType::i32);
  sliding_window_positions(pos32.view(), out32.view());
  expect_rows(out32, "int32");
  // Every other entry of a longer positions tensor, into the first W columns of wider rows.
  std::vector<int64_t> spread(2 * p.size(), 123456);
  for (std::size_t i = 0; i < p.size(); ++i) spread[2 * i] = p[i];
  const Tensor ps = test::int64_tensor(spread);
  const std::array<int64_t, 1> shape{T}, stride{2};
  const TensorView strided(ps.data(), DType::i64, shape, stride, Device::cpu());
  Tensor wide = test::poisoned({T, W + 3}, DType::i32);
  sliding_window_positions(strided, wide.view().slice(1, 0, W));
  Tensor narrow = test::poisoned({T, W}, DType::i32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j)
      *static_cast<int32_t*>(narrow.view().ptr_at({t, j})) = *static_cast<const int32_t*>(wide.view().ptr_at({t, j}));
  expect_rows(narrow, "strided");
  // A negative position, a wrong dtype, a row count that differs: refused, nothing written.
  const Tensor neg = test::int64_tensor({0, -1, 2, 3, 4, 5, 6});
  Tensor untouched = test::poisoned({T, W}, DType::i32);
  const std::vector<double> before = test::to_doubles(untouched.view());
  EXPECT_THROW(sliding_window_positions(neg.view(), untouched.view()), Error);
  Tensor f32 = test::poisoned({T, W}, DType::f32);
  EXPECT_THROW(sliding_window_positions(p64.view(), f32.view()), Error);
  EXPECT_THROW(sliding_window_positions(p64.view().slice(0, 0, T - 1), untouched.view()), Error);
  EXPECT_EQ(test::to_doubles(untouched.view()), before);
}

TEST(BlockOps, QuantizeFp8GroupsCodesScalesAndPadding) {
  test::reseed(13);
  const int64_t M = 5, M_pad = 8, K = 256;
  Tensor x = test::random_tensor({M, K}, DType::bf16, Device::cpu(), -3.0, 3.0);
  for (int64_t j = 128; j < 256; ++j) num::store(x.view().ptr_at({2, j}), DType::bf16, 0.0);  // an all-zero group
  const std::vector<double> xv = test::to_doubles(x.view());
  Tensor codes = test::poisoned({M_pad, K}, DType::fp8_e4m3), scales = test::poisoned({K / 128, M_pad}, DType::f32);
  quantize_fp8_groups(x.view(), codes.view(), scales.view());
  const auto* cp = static_cast<const uint8_t*>(codes.data());
  const auto* sp = static_cast<const float*>(scales.data());
  for (int64_t t = 0; t < M_pad; ++t)
    for (int64_t g = 0; g < K / 128; ++g) {
      const float s = t < M ? test::block_ops::group_scale(xv, t, K, g) : 1.0f;
      EXPECT_EQ(sp[g * M_pad + t], s) << t << " " << g;
      for (int64_t j = g * 128; j < g * 128 + 128; ++j) {
        const uint8_t want = t < M ? num::float_to_e4m3(static_cast<float>(xv[t * K + j]) / s) : uint8_t{0};
        EXPECT_EQ(cp[t * K + j], want) << t << " " << j;
      }
    }
  EXPECT_EQ(sp[1 * M_pad + 2], 1.0f);  // the all-zero group
  Tensor bad_scales = Tensor::empty({K / 128, M}, DType::f32);
  EXPECT_THROW(quantize_fp8_groups(x.view(), codes.view(), bad_scales.view()), Error);  // M_pad mismatch
  EXPECT_THROW(quantize_fp8_groups(x.view().slice(1, 0, 100), codes.view(), scales.view()), Error);  // K % 128
}

TEST(BlockOps, GemmFp8BlockMatchesFloat64Sum) {
  test::reseed(14);
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 200, 256}, {8, 576, 640}, {1, 128, 128}}) {
    const int64_t kb = K / 128, kb4 = (kb + 3) / 4 * 4, nb = (N + 127) / 128;
    const Tensor a = random_codes(M, K), w = random_codes(N, K);
    const Tensor as = random_scales(kb, M, M), ws = random_scales(nb, kb, kb4);
    const std::vector<double> ref = gemm_fp8_block_ref(a, as, w, ws);
    for (const DType dt : {DType::f64, DType::f32}) {
      Tensor c = test::poisoned({M, N}, dt);
      const Precision p = dt == DType::f64 ? Precision::reference : Precision::fast;
      gemm_fp8_block(a.view(), as.view(), w.view(), scale_view(ws, kb), c.view(), Context{nullptr, p});
      EXPECT_LT(test::rel_l2(test::to_doubles(c.view()), ref), dt == DType::f64 ? 1e-14 : 1e-6) << M << " " << N;
    }
  }
  // Refused: w_scales rows not round_up(K / 128, 4) apart, K not a multiple of 128, c overlapping a.
  const Tensor a = random_codes(4, 256), w = random_codes(256, 256);
  const Tensor as = random_scales(2, 4, 4), ws = random_scales(2, 2, 2);
  Tensor c = test::poisoned({4, 256}, DType::f32);
  EXPECT_THROW(gemm_fp8_block(a.view(), as.view(), w.view(), scale_view(ws, 2), c.view()), Error);
  EXPECT_THROW(gemm_fp8_block(a.view().slice(1, 0, 200), as.view(), w.view().slice(1, 0, 200), scale_view(ws, 2),
                              c.view()),
               Error);
  for (double v : test::to_doubles(c.view())) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace mla
