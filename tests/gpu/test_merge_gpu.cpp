// SPDX-License-Identifier: Apache-2.0
// merge_attn_states on CUDA against the CPU backend (float64 reference). Tolerance: DESIGN.md §5
// (check_close at the output's storage precision) plus extra_rel 1e-6 of max|ref| because the GPU
// forms the two weights and the lse with fp32 exp/log (a few ulp each) where the oracle uses double;
// rows copied from one side (empty-context rules, tokens past prefill_tokens_with_context) are bit
// copies and must match exactly. Covered: edge lse values (+-inf, both -inf, NaN), head-padded and
// transposed views, lse output present/absent, fp8 output with a scale, D not a multiple of 8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "gpu_test_util.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::Mirror;

// Random lse [H, T] with a sprinkling of the edge values the merge rules name.
Tensor make_lse(int64_t H, int64_t T, bool edges) {
  Tensor l = test::random_tensor({H, T}, DType::f32, Device::cpu(), -6, 6);
  if (!edges) return l;
  auto* p = static_cast<float*>(l.data());
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_int_distribution<int> pick(0, 9);
  for (int64_t i = 0; i < H * T; ++i) {
    switch (pick(test::rng())) {
      case 0: p[i] = inf; break;
      case 1: p[i] = -inf; break;
      case 2: if (i % 3 == 0) p[i] = std::numeric_limits<float>::quiet_NaN(); break;
      default: break;
    }
  }
  return l;
}

struct MergeCase {
  int64_t T, H, D;
  int64_t with_context;  // -1 = all
  bool edges, out_lse, transposed_lse, fp8_out;
  DType act = DType::bf16;  // prefix / suffix (and out unless fp8_out) dtype
};

void run_case(const MergeCase& c) {
  SCOPED_TRACE(::testing::Message() << "T=" << c.T << " H=" << c.H << " D=" << c.D << " ctx=" << c.with_context
                                    << " edges=" << c.edges << " fp8=" << c.fp8_out << " act=" << to_string(c.act));
  // prefix/suffix [T, H, D] share a head stride (D + 8: head-padded storage); out is head-padded to H + 3.
  const int64_t hs = c.D + 8;
  Mirror pre(test::random_tensor({c.T, c.H, hs}, c.act, Device::cpu(), -4, 4));
  Mirror suf(test::random_tensor({c.T, c.H, hs}, c.act, Device::cpu(), -4, 4));
  const TensorView ph = pre.host.view().slice(2, 0, c.D), sh = suf.host.view().slice(2, 0, c.D);
  const DType out_t = c.fp8_out ? DType::fp8_e4m3 : c.act;
  Mirror out(test::poisoned({c.T, c.H + 3, c.D}, out_t));
  const TensorView oh = out.host.view().slice(1, 0, c.H);
  // LSEs [H, T], or transposed views of [T, H] buffers.
  auto lse_view = [&](Mirror& m) { return c.transposed_lse ? m.host.view().transpose(0, 1) : m.host.view(); };
  Tensor pl = make_lse(c.H, c.T, c.edges), sl = make_lse(c.H, c.T, c.edges);
  if (c.transposed_lse) {  // same values, stored [T, H]
    Tensor pt = Tensor::empty({c.T, c.H}, DType::f32), st = Tensor::empty({c.T, c.H}, DType::f32);
    copy(pt.view().transpose(0, 1), pl);
    copy(st.view().transpose(0, 1), sl);
    pl = pt;
    sl = st;
  }
  Mirror plm(pl), slm(sl);
  const int64_t l0 = c.transposed_lse ? c.T : c.H, l1 = c.transposed_lse ? c.H : c.T;
  Mirror olm(test::poisoned({l0, l1}, DType::f32));
  const TensorView olh = c.out_lse ? lse_view(olm) : TensorView{};
  const float scale = c.fp8_out ? 0.02f : 0.0f;

  merge_attn_states(oh, olh, ph, lse_view(plm), sh, lse_view(slm), c.with_context, scale, test::reference_ctx());
  merge_attn_states(out.on_dev(oh), c.out_lse ? olm.on_dev(olh) : TensorView{}, pre.on_dev(ph), plm.on_dev(lse_view(plm)),
                    suf.on_dev(sh), slm.on_dev(lse_view(slm)), c.with_context, scale);

  // Whole padded storage: padding heads must stay poisoned on both sides.
  EXPECT_EQ(test::check_close(test::to_doubles(out.dev), test::to_doubles(out.host), out_t, 1e-6), "");
  if (c.out_lse) {
    EXPECT_EQ(test::check_close(test::to_doubles(olm.dev), test::to_doubles(olm.host), DType::f32, 1e-6), "");
  }
}

TEST(MergeGpu, Shapes) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(31);
  for (const MergeCase& c : {MergeCase{7, 16, 128, -1, false, true, false, false},
                             MergeCase{5, 3, 512, -1, true, true, false, false},
                             MergeCase{33, 128, 128, 20, true, true, true, false},
                             MergeCase{4, 1, 512, 0, true, false, false, false},
                             MergeCase{9, 8, 128, 4, true, true, false, true},
                             MergeCase{6, 5, 36, -1, true, true, true, false},
                             MergeCase{6, 5, 36, 3, true, true, false, true},
                             MergeCase{1, 64, 512, -1, true, true, true, false}})
    run_case(c);
}

// f16 and f32 activations (vLLM's merge takes the model dtype): same kernel body, Act-typed loads and
// stores; copies stay bit copies (check_close demands equality where the oracle copies).
TEST(MergeGpu, F16AndF32Activations) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(32);
  for (DType act : {DType::f16, DType::f32}) {
    for (MergeCase c : {MergeCase{7, 16, 128, -1, true, true, false, false},
                        MergeCase{33, 128, 128, 20, true, true, true, false},
                        MergeCase{5, 3, 512, 2, true, true, false, true},
                        MergeCase{6, 5, 36, -1, true, true, true, false}}) {
      c.act = act;
      run_case(c);
    }
  }
}

// Exactness of the copy rules on their own: both lse -inf -> prefix bits and -inf; tokens past
// prefill_tokens_with_context -> suffix bits and the raw suffix lse.
TEST(MergeGpuEdge, CopyRulesAreBitExact) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(32);
  const int64_t T = 6, H = 4, D = 128;
  Tensor pre = test::random_tensor({T, H, D}, DType::bf16), suf = test::random_tensor({T, H, D}, DType::bf16);
  Tensor pl = test::random_tensor({H, T}, DType::f32), sl = test::random_tensor({H, T}, DType::f32);
  auto* p = static_cast<float*>(pl.data());
  auto* s = static_cast<float*>(sl.data());
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < H; ++h) {
    p[h * T + 0] = -inf, s[h * T + 0] = -inf;
    p[h * T + 1] = inf, s[h * T + 1] = -inf;
    p[h * T + 2] = inf, s[h * T + 2] = inf;
  }
  Tensor out = test::poisoned({T, H, D}, DType::bf16, Device::cuda(0));
  Tensor olse = test::poisoned({H, T}, DType::f32, Device::cuda(0));
  const Device g = Device::cuda(0);
  merge_attn_states(out, olse, pre.to(g), pl.to(g), suf.to(g), sl.to(g), 4);
  const auto o = test::host_bytes(out), pb = test::host_bytes(pre), sb = test::host_bytes(suf);
  const auto lse = test::to_doubles(olse);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const bool copy_prefix = t < 3, copy_suffix = t >= 4;
      if (!copy_prefix && !copy_suffix) continue;
      const auto& src = copy_prefix ? pb : sb;
      const std::size_t off = static_cast<std::size_t>((t * H + h) * D * 2);
      EXPECT_TRUE(std::equal(o.begin() + off, o.begin() + off + D * 2, src.begin() + off)) << t << " " << h;
      const double want = copy_prefix ? -inf : s[h * T + t];
      EXPECT_EQ(lse[static_cast<std::size_t>(h * T + t)], want) << t << " " << h;
    }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// combine_attn_states on CUDA against the CPU float64 reference: N parts (1 .. 40, over the warp's 32
// lanes), edge lse values (±inf empty parts whose outputs are NaN, NaN lse), head-padded parts and
// out (vector path) and D = 36 with odd strides (element path), bf16 / f16 / f32; the out padding
// heads must stay poisoned. Each case runs without and with a per-head sink (strided: every second float of a
// buffer; finite values, -inf, NaN and +inf among them).
TEST(CombineGpu, MatchesReference) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(33);
  struct Case {
    int64_t n, t, h, d, pad;
    DType act;
  };
  for (const Case& c : {Case{1, 5, 16, 512, 8, DType::bf16}, Case{2, 33, 128, 512, 0, DType::bf16},
                        Case{4, 7, 3, 512, 8, DType::f16}, Case{40, 3, 5, 128, 8, DType::f32},
                        Case{3, 6, 5, 36, 3, DType::bf16}, Case{8, 4, 2, 36, 1, DType::f32}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " t=" << c.t << " h=" << c.h << " d=" << c.d
                                      << " act=" << to_string(c.act));
    Mirror parts(test::random_tensor({c.n, c.t, c.h, c.d + c.pad}, c.act, Device::cpu(), -4, 4));
    Tensor l = test::random_tensor({c.n, c.t, c.h}, DType::f32, Device::cpu(), -6, 6);
    auto* lp = static_cast<float*>(l.data());
    std::uniform_int_distribution<int> pick(0, 11);
    for (int64_t i = 0; i < c.n * c.t * c.h; ++i) {
      const int k = pick(test::rng());
      if (k == 0) lp[i] = std::numeric_limits<float>::infinity();
      if (k == 1) lp[i] = -std::numeric_limits<float>::infinity();
      if (k == 2 && i % 5 == 0) lp[i] = std::numeric_limits<float>::quiet_NaN();
    }
    // Empty parts (lse ±inf) hold NaN outputs: the combine must never read them.
    for (int64_t i = 0; i < c.n * c.t * c.h; ++i)
      if (std::isinf(lp[i])) {
        char* row = static_cast<char*>(parts.host.data()) + i * (c.d + c.pad) * static_cast<int64_t>(dtype_size(c.act));
        std::memset(row, 0xff, static_cast<std::size_t>(c.d) * dtype_size(c.act));
      }
    parts.sync();
    Mirror lse(l);
    Mirror out(test::poisoned({c.t, c.h + 2, c.d}, c.act)), olse(test::poisoned({c.t, c.h}, DType::f32));
    const TensorView ph = parts.host.view().slice(3, 0, c.d), oh = out.host.view().slice(1, 0, c.h);
    Tensor sink_store = test::random_tensor({c.h, 2}, DType::f32, Device::cpu(), -6, 6);
    auto* sp = static_cast<float*>(sink_store.data());
    sp[0] = -std::numeric_limits<float>::infinity();
    if (c.h > 2) sp[2 * 2] = std::numeric_limits<float>::quiet_NaN();
    if (c.h > 3) sp[2 * 3] = std::numeric_limits<float>::infinity();
    Mirror sink(sink_store);
    for (bool with_sink : {false, true}) {
      SCOPED_TRACE(with_sink ? "sink" : "no sink");
      const TensorView sh = with_sink ? sink.host.view().select(1, 0) : TensorView{};
      combine_attn_states(oh, olse.host, ph, lse.host, test::reference_ctx(), sh);
      combine_attn_states(out.on_dev(oh), olse.dev, parts.on_dev(ph), lse.dev, {},
                          with_sink ? sink.on_dev(sh) : TensorView{});
      EXPECT_EQ(test::check_close(test::to_doubles(out.dev), test::to_doubles(out.host), c.act, 1e-6), "");
      EXPECT_EQ(test::check_close(test::to_doubles(olse.dev), test::to_doubles(olse.host), DType::f32, 1e-6), "");
    }
  }
}

}  // namespace
}  // namespace mla
