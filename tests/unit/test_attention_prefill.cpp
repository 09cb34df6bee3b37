// SPDX-License-Identifier: Apache-2.0
// mha_prefill on the CPU against a float64 formula: varlen batches with zero-length requests,
// sq != sk (bottom-right causal alignment), a k_pe shared by all heads (head stride 0), a strided
// [h, Tq] lse, padding rows past cu_seqlens_q[B] left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_test_util.h"
#include "cpu/attention_core.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

struct PrefillCase {
  std::vector<int32_t> sq, sk;
  int64_t h, dn, dr, dv;
  bool causal, shared_pe;
  int64_t pad_q = 0;  // rows of q/out past cu_q[B], never written
};

void run_case(const PrefillCase& c, uint64_t seed) {
  test::reseed(seed);
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (std::size_t r = 0; r < c.sq.size(); ++r) {
    cu_q.push_back(cu_q.back() + c.sq[r]);
    cu_k.push_back(cu_k.back() + c.sk[r]);
  }
  const int64_t tq = cu_q.back() + c.pad_q, tk = cu_k.back(), d = c.dn + c.dr;
  int64_t max_q = 0, max_k = 0;
  for (std::size_t r = 0; r < c.sq.size(); ++r) {
    max_q = std::max<int64_t>(max_q, c.sq[r]);
    max_k = std::max<int64_t>(max_k, c.sk[r]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Inputs are bf16-exact values held in bf16 (fast run) and f64 (reference run) tensors.
  Tensor q16 = test::random_tensor({tq, c.h, d}, DType::bf16);
  Tensor kn16 = test::random_tensor({tk, c.h, c.dn}, DType::bf16);
  Tensor pe16 =
      c.shared_pe ? test::random_tensor({tk, 1, c.dr}, DType::bf16) : test::random_tensor({tk, c.h, c.dr}, DType::bf16);
  Tensor v16 = test::random_tensor({tk, c.h, c.dv}, DType::bf16);
  auto widen = [](const Tensor& t) {
    Tensor w = Tensor::empty(std::span<const int64_t>(t.view().shape.data(), t.view().ndim), DType::f64);
    const std::vector<double> v = test::to_doubles(t.view());
    std::copy(v.begin(), v.end(), static_cast<double*>(w.data()));
    return w;
  };
  Tensor q64 = widen(q16), kn64 = widen(kn16), pe64 = widen(pe16), v64 = widen(v16);
  // k_pe view [tk, h, dr]: head stride 0 when one rope row serves every head.
  auto pe_view = [&](const Tensor& t) {
    if (!c.shared_pe) return t.view();
    const int64_t shape[] = {tk, c.h, c.dr}, stride[] = {c.dr, 0, 1};
    return TensorView(t.data(), t.dtype(), shape, stride);
  };

  // Oracle.
  const std::vector<double> qv = test::to_doubles(q64), knv = test::to_doubles(kn64), pev = test::to_doubles(pe64),
                            vv = test::to_doubles(v64);
  std::vector<double> ref_out(static_cast<std::size_t>(tq * c.h * c.dv), std::numeric_limits<double>::quiet_NaN());
  std::vector<double> ref_lse(static_cast<std::size_t>(c.h * tq), std::numeric_limits<double>::quiet_NaN());
  for (std::size_t r = 0; r < c.sq.size(); ++r) {
    for (int64_t hh = 0; hh < c.h; ++hh) {
      std::vector<std::vector<double>> keys(c.sk[r], std::vector<double>(d));
      std::vector<const double*> kp, vp;
      for (int64_t j = 0; j < c.sk[r]; ++j) {
        const int64_t row = cu_k[r] + j;
        for (int64_t x = 0; x < c.dn; ++x) keys[j][x] = knv[(row * c.h + hh) * c.dn + x];
        const int64_t pe_head = c.shared_pe ? 0 : hh, pe_heads = c.shared_pe ? 1 : c.h;
        for (int64_t x = 0; x < c.dr; ++x) keys[j][c.dn + x] = pev[(row * pe_heads + pe_head) * c.dr + x];
      }
      for (int64_t i = 0; i < c.sq[r]; ++i) {
        const int64_t vis = c.causal ? std::clamp<int64_t>(c.sk[r] - c.sq[r] + i + 1, 0, c.sk[r]) : c.sk[r];
        kp.clear();
        vp.clear();
        for (int64_t j = 0; j < vis; ++j) {
          kp.push_back(keys[j].data());
          vp.push_back(vv.data() + ((cu_k[r] + j) * c.h + hh) * c.dv);
        }
        const int64_t row = cu_q[r] + i;
        test::OracleOut o;
        test::oracle_attend(qv.data() + (row * c.h + hh) * d, kp, d, vp, c.dv, scale, o);
        std::copy(o.out.begin(), o.out.end(), ref_out.begin() + (row * c.h + hh) * c.dv);
        ref_lse[static_cast<std::size_t>(hh * tq + row)] = o.lse[0];
      }
    }
  }

  const Tensor cuq = test::int_tensor(cu_q), cuk = test::int_tensor(cu_k);
  // lse [h, Tq] written through the transpose of a [Tq, h] buffer.
  Tensor lse_buf = Tensor::empty({tq, c.h}, DType::f32);
  const TensorView lse = lse_buf.view().transpose(0, 1);

  Tensor out64 = test::poisoned({tq, c.h, c.dv}, DType::f64);
  fill(lse_buf.view(), NAN);
  mha_prefill(q64, kn64, pe_view(pe64), v64, cuq, cuk, max_q, max_k, out64, lse, scale, c.causal,
              Context{nullptr, Precision::reference});
  EXPECT_EQ(test::check_close(test::to_doubles(out64.view()), ref_out, DType::f64, 1e-12), "") << "reference out";
  EXPECT_EQ(test::check_close(test::to_doubles(lse), test::as_f32(ref_lse), DType::f32), "") << "reference lse";

  Tensor out16 = test::poisoned({tq, c.h, c.dv}, DType::bf16);
  fill(lse_buf.view(), NAN);
  mha_prefill(q16, kn16, pe_view(pe16), v16, cuq, cuk, max_q, max_k, out16, lse, scale, c.causal, Context{});
  // float32 accumulation: absolute error of a few float ulps of the largest output.
  EXPECT_EQ(test::check_close(test::to_doubles(out16.view()), ref_out, DType::bf16, 1e-6), "") << "fast out";
  EXPECT_EQ(test::check_close(test::to_doubles(lse), test::as_f32(ref_lse), DType::f32, 1e-6), "") << "fast lse";
}

TEST(AttentionPrefill, CausalVarlenWithEmptyRequests) {
  // Tiles of 64 queries and blocks of 64 keys: 130 crosses both; (0, 5) and (4, 0) are empty in one side.
  run_case({{5, 0, 130, 4, 1, 3}, {5, 5, 130, 0, 1, 9}, 3, 16, 8, 12, true, false}, 11);
}

TEST(AttentionPrefill, CausalBottomRightWhenQueriesOutnumberKeys) {
  // sq > sk: the first sq - sk queries see no key (out 0, lse -inf); sq < sk: all context visible.
  run_case({{7, 3, 70}, {3, 7, 65}, 2, 16, 8, 16, true, false}, 12);
}

TEST(AttentionPrefill, NonCausalChunkWithSharedRope) {
  run_case({{3, 66, 0, 2}, {100, 1, 4, 0}, 4, 32, 16, 8, false, true, 3}, 13);
}

TEST(AttentionPrefill, DeepSeekDimsSharedRopeCausal) { run_case({{67, 2}, {67, 2}, 2, 128, 64, 128, true, true}, 14); }

// The AVX2 and baseline builds of the kernels (when this CPU has wider ones) on the causal case.
TEST(AttentionPrefill, EveryIsaLevel) {
  const cpu::attn::Isa best = cpu::attn::best_isa();
  for (int level = 0; level < static_cast<int>(best); ++level) {
    SCOPED_TRACE("isa " + std::to_string(level));
    cpu::attn::set_isa(static_cast<cpu::attn::Isa>(level));
    run_case({{7, 3, 70}, {3, 7, 65}, 2, 16, 8, 16, true, false}, 15);
    run_case({{3, 66, 0, 2}, {100, 1, 4, 0}, 4, 32, 16, 8, false, true, 3}, 16);
  }
  cpu::attn::set_isa(best);
}

}  // namespace
}  // namespace mla
