// SPDX-License-Identifier: Apache-2.0
// fp8 mha_prefill on CUDA (sm90_fp8, SEMANTICS §10.1) against the exact-codes oracle of the CPU backend
// (tests/unit/prefill_fp8_oracle.h: element-wise bound on out and lse, NaN / inf in the same places): varlen
// batches with empty requests, sq > sk, lengths on and beside the 128-row / 128-key tiles, causal and non-causal
// (the context-chunk form), h 1 .. 128, k_pe shared or per head, peaked and flat softmax, strided lse, and a
// workspace and out poisoned before the call (NaN codes, NaN bf16) so an unwritten element shows; each case runs
// both fp8 variants (sm90_fp8, and sm90_fp8_persist: persistent from 2 units per SM, which the h 16 / 128 sweeps
// and PersistentManyUnits reach). Then the refusals: a forced bf16 variant, a missing workspace.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_util.h"
#include "runtime/device_api.h"
#include "unit/prefill_fp8_oracle.h"
#include "variant_test_util.h"

namespace mla {
namespace {

constexpr double kScale = 0.0722;
using Lens = std::vector<std::pair<int32_t, int32_t>>;

struct Batch {
  Tensor q, kn, kp_store, v, cu_q, cu_k;
  TensorView kp;
  int64_t tq = 0, tk = 0, max_q = 0, max_k = 0, h = 0;
};

Batch make_batch(int64_t h, const Lens& lens, bool shared_rope, double q_range) {
  Batch b;
  b.h = h;
  const test::Varlen vl = test::varlen(lens);
  b.max_q = vl.max_q;
  b.max_k = vl.max_k;
  b.tq = vl.total_q;
  b.tk = vl.total_k;
  b.q = test::random_tensor({b.tq, h, 192}, DType::bf16, Device::cpu(), -q_range, q_range);
  b.kn = test::random_tensor({b.tk, h, 128}, DType::bf16);
  b.v = test::random_tensor({b.tk, h, 128}, DType::bf16);
  b.kp_store = test::random_tensor({b.tk, shared_rope ? 1 : h, 64}, DType::bf16);
  const int64_t shape[] = {b.tk, h, 64}, stride[] = {(shared_rope ? 1 : h) * 64, shared_rope ? 0 : 64, 1};
  b.kp = TensorView(b.kp_store.data(), DType::bf16, shape, stride);
  b.cu_q = vl.cu_q;
  b.cu_k = vl.cu_k;
  return b;
}

PrefillOptions fp8_opts(double q_range) {
  PrefillOptions o;
  o.fp8 = true;
  o.q_scale = static_cast<float>(q_range / 256);  // |q| / q_scale <= 256: inside e4m3's range
  o.k_scale = 1.0f / 128;
  o.v_scale = 1.0f / 256;
  return o;
}

TensorView on(const Tensor& dev_storage, TensorView v) {
  v.data = dev_storage.data();
  v.device = dev_storage.device();
  return v;
}

// The fp8 variants: the automatic choice and the persistent schedule (comparison).
const std::vector<std::string> kFp8Variants = {"sm90_fp8", "sm90_fp8_persist"};

// The GPU run of each fp8 variant against the oracle; lse through a transposed [Tq, h] buffer when `strided_lse`.
void check_batch(const Batch& b, bool causal, bool strided_lse, double q_range, const std::string& what) {
  const PrefillOptions opts = fp8_opts(q_range);
  const test::Fp8Oracle ref = test::fp8_oracle(
      {b.q.view(), b.kn.view(), b.kp, b.v.view(), b.cu_q.view(), b.cu_k.view(), b.max_q, b.max_k, kScale, causal, opts});
  const Device gpu = Device::cuda(0);
  Tensor q = b.q.to(gpu), kn = b.kn.to(gpu), kp = b.kp_store.to(gpu), v = b.v.to(gpu), cq = b.cu_q.to(gpu),
         ck = b.cu_k.to(gpu);
  Tensor out = test::poisoned({b.tq, b.h, 128}, DType::bf16, gpu);
  Tensor lse_store = strided_lse ? test::poisoned({b.tq, b.h}, DType::f32, gpu) : test::poisoned({b.h, b.tq}, DType::f32, gpu);
  const TensorView lse = strided_lse ? lse_store.view().transpose(0, 1) : lse_store.view();
  const std::size_t bytes = mha_prefill_workspace_bytes(b.tq, b.tk, b.h, b.cu_q.size(0) - 1, true, gpu);
  Tensor ws = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, gpu);
  PrefillOptions o = opts;
  o.workspace = ws.view();
  for (const std::string& variant : kFp8Variants) {
    ForceVariant force("mha_prefill", variant);
    fill(out.view(), NAN);
    fill(lse_store.view(), NAN);
    fill(ws.view(), 255.0);  // e4m3 NaN codes: a byte the quantise pass does not write and the kernel reads shows
    mha_prefill(q, kn, on(kp, b.kp), v, cq, ck, b.max_q, b.max_k, out, lse, kScale, causal, o, Context{});
    cuda_rt::synchronize(0);
    EXPECT_EQ(last_variant("mha_prefill"), variant) << what;
    const std::vector<double> got_out = test::to_doubles(out.view());
    const std::vector<double> got_lse = test::to_doubles(test::to_host(lse_store, lse).view);
    EXPECT_EQ(test::check_fp8(ref, got_out, got_lse), "") << variant << ": " << what;
  }
}

bool sm90() { return test::have_gpu() && compute_capability(Device::cuda(0)) == 90; }
#define MLA_SKIP_WITHOUT_SM90()                                            \
  do {                                                                     \
    MLA_SKIP_WITHOUT_GPU();                                                \
    if (!sm90()) GTEST_SKIP() << "fp8 mha_prefill runs on sm_90 devices only"; \
  } while (0)

const Lens kSmallHeadLens = {{0, 0}, {0, 5}, {5, 0}, {1, 1},    {3, 1},     {64, 64},   {65, 130},
                             {100, 37}, {130, 200}, {128, 128}, {127, 383}, {257, 129}, {300, 300}};
const Lens kLargeHeadLens = {{0, 3}, {5, 0}, {1, 1}, {64, 64}, {65, 130}, {100, 37}, {128, 128}, {129, 257}};

using SweepParam = std::tuple<int64_t /*h*/, bool /*causal*/>;
class PrefillFp8GpuSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(PrefillFp8GpuSweep, MatchesExactCodesOracle) {
  MLA_SKIP_WITHOUT_SM90();
  const auto [h, causal] = GetParam();
  test::reseed(static_cast<uint64_t>(h * 2 + causal) + 300);
  const Batch b = make_batch(h, h >= 64 ? kLargeHeadLens : kSmallHeadLens, true, 2.0);
  check_batch(b, causal, false, 2.0, "h " + std::to_string(h) + (causal ? " causal" : " non-causal"));
}

INSTANTIATE_TEST_SUITE_P(All, PrefillFp8GpuSweep,
                         ::testing::Combine(::testing::Values(1, 3, 16, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string("h") + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// Long requests (many key tiles, mask-free tiles between diagonal ones), per-head rope, strided lse; a peaked
// softmax (q range 16: a few keys carry each row, so a key order mix-up between P and V^T moves out by ~|v|,
// far past the bound) and a flat one.
TEST(PrefillFp8Gpu, LongRequestsPeakedAndFlat) {
  MLA_SKIP_WITHOUT_SM90();
  for (double q_range : {16.0, 0.5}) {
    test::reseed(static_cast<uint64_t>(q_range * 10) + 301);
    const Batch b = make_batch(3, {{300, 700}, {17, 17}, {0, 40}, {520, 520}, {1000, 1000}}, false, q_range);
    check_batch(b, true, true, q_range, "causal, q range " + std::to_string(q_range));
    check_batch(b, false, true, q_range, "non-causal, q range " + std::to_string(q_range));
  }
}

// A context chunk's form: few queries against many keys, non-causal (the layer's chunked-context path).
TEST(PrefillFp8Gpu, ContextChunk) {
  MLA_SKIP_WITHOUT_SM90();
  test::reseed(302);
  const Batch b = make_batch(16, {{200, 2000}, {1, 700}, {33, 0}, {129, 1500}}, true, 4.0);
  check_batch(b, false, false, 4.0, "context chunk");
}

// Many long units per CTA under the persistent schedule: 16 heads x 6 query tiles x 6 requests, units of up to 8
// key tiles, requests without keys, a non-causal request of 900 keys.
TEST(PrefillFp8Gpu, PersistentManyUnits) {
  MLA_SKIP_WITHOUT_SM90();
  test::reseed(304);
  const Batch b = make_batch(16, {{520, 520}, {700, 650}, {0, 40}, {130, 900}, {260, 260}, {90, 0}}, true, 4.0);
  check_batch(b, true, false, 4.0, "persistent causal");
  check_batch(b, false, false, 4.0, "persistent non-causal");
}

TEST(PrefillFp8Gpu, Refusals) {
  MLA_SKIP_WITHOUT_SM90();
  test::reseed(303);
  const Batch b = make_batch(2, {{10, 10}}, true, 1.0);
  const Device gpu = Device::cuda(0);
  Tensor q = b.q.to(gpu), kn = b.kn.to(gpu), kp = b.kp_store.to(gpu), v = b.v.to(gpu), cq = b.cu_q.to(gpu),
         ck = b.cu_k.to(gpu);
  Tensor out = Tensor::empty({b.tq, 2, 128}, DType::bf16, gpu);
  PrefillOptions o = fp8_opts(1.0);
  EXPECT_THROW(mha_prefill(q, kn, on(kp, b.kp), v, cq, ck, b.max_q, b.max_k, out, {}, kScale, true, o), Error)
      << "no workspace";
  Tensor ws = Tensor::empty({static_cast<int64_t>(mha_prefill_workspace_bytes(b.tq, b.tk, 2, 1, true, gpu))},
                            DType::u8, gpu);
  o.workspace = ws.view();
  {
    ForceVariant force("mha_prefill", "sm90");
    EXPECT_THROW(mha_prefill(q, kn, on(kp, b.kp), v, cq, ck, b.max_q, b.max_k, out, {}, kScale, true, o),
                 VariantUnsupported)
        << "the bf16 kernel declines fp8";
  }
  o.workspace = ws.view().slice(0, 0, ws.size(0) - 256);
  EXPECT_THROW(mha_prefill(q, kn, on(kp, b.kp), v, cq, ck, b.max_q, b.max_k, out, {}, kScale, true, o), Error)
      << "workspace too small";
}

}  // namespace
}  // namespace mla
