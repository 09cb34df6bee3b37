// SPDX-License-Identifier: Apache-2.0
// The DeepSeek block on CUDA (docs/BLOCK.md): its ops (mla/block_ops.h) against the CPU backend's
// float64 results, and DeepseekAttention on the fixture checkpoints (tests/fixtures/block) against
// transformers' float64 output and the float64 CPU block, V3 and V2-Lite shapes, fp8 and bf16 weights
// (each checkpoint also converted to the other form), every step split (one prefill, chunked prefill,
// prefill then decodes), in both fp8 modes (dequantised weights; w8a8 block-scaled GEMMs); and the
// `mla bench` block rows (bench/block_bench.cu) at their quick sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "bench.h"
#include "gpu/gpu_test_util.h"
#include "mla/block_ops.h"
#include "mla/error.h"
#include "unit/block_ops_util.h"
#include "unit/block_test_util.h"

namespace mla {
namespace {

const Device kGpu = Device::cuda(0);

std::vector<double> run_rms_norm(const Tensor& x, const Tensor& w, DType out, Device dev) {
  const Tensor xd = dev.is_cuda() ? x.to(dev) : x, wd = dev.is_cuda() ? w.to(dev) : w;
  Tensor y = test::poisoned({x.size(0), x.size(1)}, out, dev);
  rms_norm(xd.view(), wd.view(), y.view(), 1e-6, test::reference_ctx());
  return test::to_doubles(y.view());
}

TEST(BlockOpsGpu, RmsNormMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(21);
  for (const DType in : {DType::f32, DType::bf16})
    for (const int64_t n : {int64_t{512}, int64_t{1536}, int64_t{100}}) {
      const Tensor x = test::random_tensor({37, n}, in, Device::cpu(), -4.0, 4.0);
      const Tensor w = test::random_tensor({n}, DType::f32, Device::cpu(), 0.5, 1.5);
      const std::vector<double> ref = run_rms_norm(x, w, DType::f64, Device::cpu());
      const std::string bad = test::check_close(run_rms_norm(x, w, DType::bf16, kGpu), ref, DType::bf16);
      EXPECT_EQ(bad, "") << to_string(in) << " n = " << n;
    }
}

TEST(BlockOpsGpu, ApplyRopeMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(22);
  const int64_t T = 33, G = 16, D = 192, R = 64;
  const Tensor src = test::random_tensor({T, G, D}, DType::f32, Device::cpu(), -2.0, 2.0);
  std::vector<int64_t> p(T);
  for (int64_t t = 0; t < T; ++t) p[t] = (t * 4993) % 163840;
  Tensor inv = Tensor::empty({R / 2}, DType::f64);
  for (int64_t i = 0; i < R / 2; ++i) static_cast<double*>(inv.data())[i] = std::pow(10000.0, -2.0 * i / R) / 3.0;
  for (const bool interleave : {true, false})
    for (const bool i64 : {true, false}) {
      std::vector<int32_t> p32(p.begin(), p.end());
      const Tensor pos = i64 ? test::int64_tensor(p) : test::int_tensor(p32);
      Tensor ref = test::poisoned({T, G, D}, DType::f64);
      apply_rope(src.view(), ref.view(), pos.view(), inv.view(), 0.9, R, interleave);
      const Tensor sd = src.to(kGpu), pd = pos.to(kGpu), id = inv.to(kGpu);
      Tensor out = test::poisoned({T, G, D}, DType::bf16, kGpu);
      apply_rope(sd.view(), out.view(), pd.view(), id.view(), 0.9, R, interleave);
      // The GPU rotates in float (cos / sin computed in float64, rounded to float): one extra float
      // rounding of the rotated pair on top of the bf16 rule.
      EXPECT_EQ(test::check_close(test::to_doubles(out.view()), test::to_doubles(ref.view()), DType::bf16, 1e-6), "")
          << "interleave " << interleave << " i64 " << i64;
      // In place on the device (f32): same values.
      Tensor inplace = src.to(kGpu);
      const TensorView iv = inplace.view();
      apply_rope(iv, iv, pd.view(), id.view(), 0.9, R, interleave);
      EXPECT_LT(test::rel_l2(test::to_doubles(iv), test::to_doubles(ref.view())), 1e-6);
    }
}

// DeepSeek-V4's window positions: the CUDA kernel's int32 rows equal the CPU's (int32 and int64 positions, rows
// before the request's start, positions near 2^31).
TEST(BlockOpsGpu, SlidingWindowPositionsMatchCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(23);
  std::vector<int64_t> p(301);
  std::uniform_int_distribution<int64_t> u(0, 5000);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = i % 50 == 7 ? 2147483647 - static_cast<int64_t>(i % 3) : u(test::rng());
  p[0] = 0;
  p[1] = 3;
  for (const int64_t W : {int64_t{1}, int64_t{128}, int64_t{129}})
    for (const bool i64 : {true, false}) {
      std::vector<int32_t> p32(p.begin(), p.end());
      const Tensor pos = i64 ? test::int64_tensor(p) : test::int_tensor(p32);
      const int64_t T = static_cast<int64_t>(p.size());
      Tensor cpu = test::poisoned({T, W}, DType::i32), gpu = test::poisoned({T, W}, DType::i32, kGpu);
      sliding_window_positions(pos.view(), cpu.view());
      const Tensor pd = pos.to(kGpu);
      sliding_window_positions(pd.view(), gpu.view(), test::reference_ctx());
      EXPECT_EQ(test::to_doubles(gpu.view()), test::to_doubles(cpu.view())) << "W " << W << (i64 ? " int64" : " int32");
    }
}

TEST(BlockOpsGpu, QuantizeFp8GroupsBitExactWithCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(23);
  for (const DType in : {DType::bf16, DType::f32})
    for (const int64_t shift : {int64_t{0}, int64_t{1}}) {  // 1: rows off the vector alignment (scalar loads)
      const int64_t M = 37, M_pad = 40, K = 512;
      Tensor x = test::random_tensor({M, K + shift}, in, Device::cpu(), -30.0, 30.0);
      const TensorView xv = x.view().slice(1, shift, K + shift);
      for (int64_t j = 0; j < 128; ++j) num::store(xv.ptr_at({3, j}), in, 0.0);
      Tensor codes = test::poisoned({M_pad, K}, DType::fp8_e4m3), scales = test::poisoned({K / 128, M_pad}, DType::f32);
      quantize_fp8_groups(xv, codes.view(), scales.view());
      const Tensor xd = x.to(kGpu);
      Tensor cd = test::poisoned({M_pad, K}, DType::fp8_e4m3, kGpu),
             sd = test::poisoned({K / 128, M_pad}, DType::f32, kGpu);
      quantize_fp8_groups(test::rebase(xv, x, xd), cd.view(), sd.view());
      EXPECT_EQ(test::byte_diff(test::host_bytes(cd), test::host_bytes(codes)), "") << to_string(in) << shift;
      EXPECT_EQ(test::byte_diff(test::host_bytes(sd), test::host_bytes(scales), 4), "") << to_string(in) << shift;
    }
}

// cuBLASLt's block-scaled GEMM against the CPU's float64 sum. The fp8 tensor cores accumulate each
// 128-deep k block at reduced precision before the fp32 promotion: measured rel-L2 2.1e-4 on f32
// outputs at every shape (H200), bounded by 5e-4; bf16 outputs get the bf16 rule widened
// by 1e-3 of the largest |c| (near-cancelling sums of 7168 products keep that accumulation error).
TEST(BlockOpsGpu, GemmFp8BlockMatchesFloat64) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(24);
  using test::block_ops::scale_view;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{4, 576, 128}, {256, 384, 128}, {260, 3072, 1536},
                               {128, 7168, 2048}, {1024, 1536, 7168}, {8, 576, 7168}}) {
    const int64_t kb = K / 128, kb4 = (kb + 3) / 4 * 4, nb = (N + 127) / 128;
    const Tensor a = test::block_ops::random_codes(M, K), w = test::block_ops::random_codes(N, K);
    const Tensor as = test::block_ops::random_scales(kb, M, M), ws = test::block_ops::random_scales(nb, kb, kb4);
    Tensor ref = Tensor::empty({M, N}, DType::f64);
    gemm_fp8_block(a.view(), as.view(), w.view(), scale_view(ws, kb), ref.view(), test::reference_ctx());
    const std::vector<double> r = test::to_doubles(ref.view());
    const Tensor ad = a.to(kGpu), asd = as.to(kGpu), wd = w.to(kGpu), wsd = ws.to(kGpu);
    for (const DType dt : {DType::f32, DType::bf16}) {
      Tensor c = test::poisoned({M, N}, dt, kGpu);
      gemm_fp8_block(ad.view(), asd.view(), wd.view(), scale_view(wsd, kb), c.view());
      const std::vector<double> g = test::to_doubles(c.view());
      const double err = test::rel_l2(g, r);
      std::printf("  gemm_fp8_block M %ld N %ld K %ld -> %s: rel-L2 %.3e\n", static_cast<long>(M), static_cast<long>(N),
                  static_cast<long>(K), to_string(dt), err);
      if (dt == DType::f32)
        EXPECT_LT(err, 5e-4) << M << " " << N << " " << K;
      else
        EXPECT_EQ(test::check_close(g, r, DType::bf16, 1e-3), "") << M << " " << N << " " << K;
    }
  }
  // M not a multiple of 4 is refused on CUDA (cuBLASLt's token-scale layout), nothing written.
  const Tensor a = test::block_ops::random_codes(3, 128).to(kGpu), w = test::block_ops::random_codes(128, 128).to(kGpu);
  const Tensor as = test::block_ops::random_scales(1, 3, 3).to(kGpu), ws = test::block_ops::random_scales(1, 1, 4).to(kGpu);
  Tensor c = test::poisoned({3, 128}, DType::f32, kGpu);
  EXPECT_THROW(gemm_fp8_block(a.view(), as.view(), w.view(), scale_view(ws, 1), c.view()), Error);
  for (double v : test::to_doubles(c.view())) EXPECT_TRUE(std::isnan(v));
}

using test::block::Form;
using test::block::Split;

// One checkpoint form, both fp8 modes where they apply, every split: the CUDA block (bf16) against
//  - transformers' float64 output: rel-L2 <= 1e-2 (dequantised weights; the bf16 rule), or the
//    w8a8 bound of the CPU test (kW8a8Bound: the activation rounding), or with fp8_prefill (over an fp8_ds_mla
//    cache) the CPU test's kFp8PrefillBound (the e4m3 rounding of q, k, v and P);
//  - the float64 CPU block of the same mode and split: DESIGN §5 in rel-L2 form, at most twice the
//    error of the bf16 CPU block of the same mode plus 1e-3, and (dequantised, bf16 prefill) <= 1e-2.
void check_form(const Form& form, bool fp8_prefill = false) {
  const test::block::Fixture f = test::block::load_fixture(form.fixture);
  test::TempDir tmp("block_gpu");
  DeepseekConfig cfg;
  const Checkpoint ck(test::block::form_dir(f, form, tmp.path.string(), cfg));
  for (const bool w8a8 : {false, true}) {
    if (w8a8 && !cfg.fp8_weights) continue;
    auto make = [&](Device dev, DType dt) {
      DeepseekOptions o;
      o.device = dev;
      o.dtype = dt;
      o.fp8_activations = w8a8;
      if (fp8_prefill) {
        o.fp8_prefill = true;
        o.cache_format = CacheFormat::fp8_ds_mla;
      }
      return DeepseekAttention::load(ck, cfg, test::block::kLayer, o);
    };
    const DeepseekAttention gpu = make(kGpu, DType::bf16), f64 = make(Device::cpu(), DType::f64),
                            bf16 = make(Device::cpu(), DType::bf16);
    // The CUDA block plans for its device (the split-KV schedule, the sparse prefill mode and the output
    // quantisation path read these); the CPU block leaves them unknown.
    EXPECT_EQ(gpu.planner_config().num_sms, multiprocessor_count(kGpu));
    EXPECT_EQ(gpu.planner_config().compute_capability, compute_capability(kGpu));
    EXPECT_EQ(f64.planner_config().num_sms, 0);
    EXPECT_EQ(f64.planner_config().compute_capability, 0);
    for (const Split& s : test::block::splits(f.T, true)) {
      const std::vector<double> g = test::block::serve(gpu, f.hidden, s.steps, Precision::fast);
      const std::vector<double> o = test::block::serve(f64, f.hidden, s.steps, Precision::reference);
      const std::vector<double> b = test::block::serve(bf16, f.hidden, s.steps, Precision::fast);
      const double vs_hf = test::rel_l2(g, f.out_ref), vs_f64 = test::rel_l2(g, o), cpu_bf16 = test::rel_l2(b, o);
      const std::string what = f.name + (form.convert ? " (converted)" : "") + (w8a8 ? " w8a8" : "") +
                               (fp8_prefill ? " fp8 prefill " : " ") + s.name;
      std::printf("  %s: CUDA vs transformers %.3e, vs f64 CPU block %.3e (bf16 CPU block vs f64: %.3e)\n",
                  what.c_str(), vs_hf, vs_f64, cpu_bf16);
      for (double v : g) ASSERT_TRUE(std::isfinite(v)) << what;
      EXPECT_LE(vs_hf, fp8_prefill ? 2.0e-1 : w8a8 ? 1.3e-1 : 1e-2) << what;
      EXPECT_LE(vs_f64, 2 * cpu_bf16 + 1e-3) << what;
      if (!w8a8 && !fp8_prefill) {
        EXPECT_LE(vs_f64, 1e-2) << what;
      }
    }
  }
}

TEST(DeepseekBlockGpu, V3Fp8MatchesTransformersAndCpu) {
  MLA_SKIP_WITHOUT_GPU();
  check_form({"v3_fp8", false});
}
TEST(DeepseekBlockGpu, V3DequantisedBf16MatchesTransformersAndCpu) {
  MLA_SKIP_WITHOUT_GPU();
  check_form({"v3_fp8", true});
}
TEST(DeepseekBlockGpu, V2LiteBf16MatchesTransformersAndCpu) {
  MLA_SKIP_WITHOUT_GPU();
  check_form({"v2lite_bf16", false});
}
TEST(DeepseekBlockGpu, V2LiteQuantisedFp8MatchesTransformersAndCpu) {
  MLA_SKIP_WITHOUT_GPU();
  check_form({"v2lite_bf16", true});
}

// fp8 prefill attention in the block (DeepseekOptions::fp8_prefill, the sm90_fp8 kernel) over an fp8_ds_mla cache,
// with dequantised weights and with w8a8 (its o_proj reading the layer's fused group-128 output).
TEST(DeepseekBlockGpu, V3Fp8PrefillMatchesTransformersAndCpu) {
  MLA_SKIP_WITHOUT_GPU();
  if (compute_capability(Device::cuda(0)) != 90) GTEST_SKIP() << "fp8 prefill runs on sm_90 devices only";
  check_form({"v3_fp8", false}, /*fp8_prefill=*/true);
}

// `mla bench --ops block` (bench/block_bench.cu) at its quick sizes: every row runs, the w8a8 ones
// included. Each row also times the block's MlaAttention alone with its own ForwardArgs; a w8a8 block's
// layer quantises its output for o_proj (out_quant fp8_group128), so those arguments must be the codes
// and scales, not a bf16 out (the bench once handed it bf16 and its w8a8 rows failed: "block FAILED:
// MlaAttention::forward: codes [M_pad, K] must be fp8_e4m3 (or u8) bytes").
TEST(DeepseekBlockGpu, BenchBlockRowsRun) {
  MLA_SKIP_WITHOUT_GPU();
  bench::BenchOptions o;
  o.ops = {"block"};
  o.quick = true;
  o.warmup = 1;
  o.iters = 2;
  EXPECT_EQ(bench::run(o), 0) << "a `mla bench --ops block --quick` section failed (its FAILED line is above)";
  if (compute_capability(Device::cuda(0)) != 90) return;  // fp8 prefill: sm_90 only
  o.fp8_prefill = true;  // and the fp8-prefill rows
  EXPECT_EQ(bench::run(o), 0) << "`mla bench --ops block --quick --fp8-prefill` failed (its FAILED line is above)";
}

}  // namespace
}  // namespace mla
