// SPDX-License-Identifier: Apache-2.0
// CUDA mha_prefill against the CPU backend's float64 reference (DESIGN.md §5), every variant
// (portable: 64-row tiles, sm90: 128-row / 128-key tiles): varlen batches with empty requests, sq > sk
// (causal rows with no key), lengths on / beside both tile sizes, causal and non-causal, h in {1..128},
// k_pe shared by all heads (head stride 0) or per head, strided LSE and out, and unaligned views
// (portable's element-copy path; sm90 declines them and the dispatch falls back).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_util.h"
#include "runtime/device_api.h"
#include "unit/attention_test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

constexpr double kScale = 0.0722;
constexpr int64_t kNope = 128, kRope = 64, kV = 128;

// Host inputs of one varlen batch; k_pe is a view ([Tk, h, 64], head stride 0 when shared).
struct Batch {
  Tensor q, k_nope, k_pe_store, v, cu_q, cu_k;
  TensorView k_pe;
  int64_t tq = 0, tk = 0, max_q = 0, max_k = 0, h = 0;
};

Batch make_batch(int64_t h, const std::vector<std::pair<int32_t, int32_t>>& lens, bool shared_rope) {
  Batch b;
  b.h = h;
  const test::Varlen vl = test::varlen(lens);
  b.max_q = vl.max_q;
  b.max_k = vl.max_k;
  b.tq = vl.total_q;
  b.tk = vl.total_k;
  b.q = test::random_tensor({b.tq, h, kNope + kRope}, DType::bf16, Device::cpu(), -2.0, 2.0);
  b.k_nope = test::random_tensor({b.tk, h, kNope}, DType::bf16);
  b.v = test::random_tensor({b.tk, h, kV}, DType::bf16);
  b.k_pe_store = test::random_tensor({b.tk, shared_rope ? 1 : h, kRope}, DType::bf16);
  const int64_t shape[] = {b.tk, h, kRope}, stride[] = {(shared_rope ? 1 : h) * kRope, shared_rope ? 0 : kRope, 1};
  b.k_pe = TensorView(b.k_pe_store.data(), DType::bf16, shape, stride);
  b.cu_q = vl.cu_q;
  b.cu_k = vl.cu_k;
  return b;
}

TensorView on(const Tensor& dev_storage, TensorView v) {
  v.data = dev_storage.data();
  v.device = dev_storage.device();
  return v;
}

// The float64 oracle's out [Tq, h, 128] and lse [h, Tq] of the batch.
struct Reference {
  Tensor out, lse;
};
Reference oracle(const Batch& b, bool causal) {
  Reference r{test::poisoned({b.tq, b.h, kV}, DType::f64), test::poisoned({b.h, b.tq}, DType::f32)};
  mha_prefill(b.q, b.k_nope, b.k_pe, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, r.out, r.lse, kScale, causal,
              test::reference_ctx());
  return r;
}

// The batch's inputs on GPU 0 (k_pe as the stored tensor: view it with on(kp, b.k_pe)).
struct OnGpu {
  Tensor q, kn, kp, v, cq, ck;
};
OnGpu upload(const Batch& b) {
  const Device gpu = Device::cuda(0);
  return {b.q.to(gpu), b.k_nope.to(gpu), b.k_pe_store.to(gpu), b.v.to(gpu), b.cu_q.to(gpu), b.cu_k.to(gpu)};
}

// Oracle and GPU run; lse is written through a transposed [Tq, h] buffer when `strided_lse`.
void check_batch(const Batch& b, bool causal, bool strided_lse, const std::string& what) {
  const Reference ref = oracle(b, causal);
  const Device gpu = Device::cuda(0);
  const auto [q, kn, kp, v, cq, ck] = upload(b);
  Tensor out = test::poisoned({b.tq, b.h, kV}, DType::bf16, gpu);
  Tensor lse_store = strided_lse ? test::poisoned({b.tq, b.h}, DType::f32, gpu) : test::poisoned({b.h, b.tq}, DType::f32, gpu);
  const TensorView lse = strided_lse ? lse_store.view().transpose(0, 1) : lse_store.view();
  mha_prefill(q, kn, on(kp, b.k_pe), v, cq, ck, b.max_q, b.max_k, out, lse, kScale, causal, Context{});
  cuda_rt::synchronize(0);
  test::expect_attention_close(out, ref.out, test::to_host(lse_store, lse).view, ref.lse, what);
}

using Lens = std::vector<std::pair<int32_t, int32_t>>;
// (sq, sk) per request: empty requests, no keys, sq > sk, tile boundaries (64) and beside them.
const Lens kSmallHeadLens = {{0, 0}, {0, 5}, {5, 0}, {1, 1},    {3, 1},     {64, 64},  {65, 130},
                             {100, 37}, {130, 200}, {128, 128}, {127, 383}, {257, 129}, {300, 300}};
const Lens kLargeHeadLens = {{0, 3}, {5, 0}, {1, 1}, {64, 64}, {65, 130}, {100, 37}, {128, 128}, {129, 257}};

using SweepParam = std::tuple<int64_t /*h*/, bool /*causal*/, std::string /*variant*/>;
class PrefillGpuSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(PrefillGpuSweep, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [h, causal, variant] = GetParam();
  MLA_FORCE_VARIANT("mha_prefill", variant);
  test::reseed(static_cast<uint64_t>(h * 2 + causal) + 100);
  const Batch b = make_batch(h, h >= 64 ? kLargeHeadLens : kSmallHeadLens, true);
  MLA_SKIP_IF_DECLINED(check_batch(b, causal, false, "h " + std::to_string(h) + (causal ? " causal" : " non-causal")));
  test::expect_variant_ran("mha_prefill", variant);
}

INSTANTIATE_TEST_SUITE_P(All, PrefillGpuSweep,
                         ::testing::Combine(::testing::Values(1, 3, 8, 16, 32, 64, 128), ::testing::Bool(),
                                            ::testing::ValuesIn(test::variants_of("mha_prefill"))),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string("h") + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_causal" : "_full") + "_" + std::get<2>(info.param);
                         });

// One k_pe row per head (head stride 64), LSE through a transposed view, long requests (several key
// tiles of both variants, mask-free tiles between the causal diagonal ones), per variant.
class PrefillGpuVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefillGpuVariant, PerHeadRopeStridedLseLongRequest) {
  MLA_SKIP_WITHOUT_GPU();
  MLA_FORCE_VARIANT("mha_prefill", GetParam());
  test::reseed(201);
  const Batch b = make_batch(3, {{300, 700}, {17, 17}, {0, 40}, {520, 520}}, false);
  MLA_SKIP_IF_DECLINED(check_batch(b, true, true, "per-head rope causal"));
  check_batch(b, false, true, "per-head rope non-causal");
  test::expect_variant_ran("mha_prefill", GetParam());
}

// out written through views with padded rows: an even head stride (paired stores) and an odd one.
TEST_P(PrefillGpuVariant, StridedOut) {
  MLA_SKIP_WITHOUT_GPU();
  MLA_FORCE_VARIANT("mha_prefill", GetParam());
  test::reseed(203);
  const Batch b = make_batch(2, {{150, 260}, {0, 7}, {40, 40}}, true);
  const Reference ref = oracle(b, true);
  const Device gpu = Device::cuda(0);
  const auto [q, kn, kp, v, cq, ck] = upload(b);
  for (int64_t width : {kV + 2, kV + 1}) {
    Tensor store = test::poisoned({b.tq, b.h, width}, DType::bf16, gpu);
    Tensor lse = test::poisoned({b.h, b.tq}, DType::f32, gpu);
    const TensorView out = store.view().slice(2, 0, kV);
    MLA_SKIP_IF_DECLINED(
        mha_prefill(q, kn, on(kp, b.k_pe), v, cq, ck, b.max_q, b.max_k, out, lse, kScale, true, Context{}));
    cuda_rt::synchronize(0);
    test::expect_variant_ran("mha_prefill", GetParam());
    Tensor host = Tensor::empty({b.tq, b.h, kV}, DType::bf16);
    copy(host.view(), test::to_host(store, out).view);
    test::expect_attention_close(host, ref.out, lse, ref.lse, "out row width " + std::to_string(width));
  }
}

INSTANTIATE_TEST_SUITE_P(All, PrefillGpuVariant, ::testing::ValuesIn(test::variants_of("mha_prefill")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Persistent launches with several long units per CTA (the sweeps' units have at most 3 key tiles):
// 16 heads x 6 query tiles x 6 requests = 576 units >= 2 per SM, so sm90 (causal), sm90_persist and the
// comparison variants loop over units of up to 8 key tiles (sm90_loads: the next unit's Q prefetched 4
// tiles before the end, its first K / V loaded before its Q), with half first tiles, requests without
// keys and a non-causal request of 900 keys.
// The oracle runs once per mask; every sm90 variant the device runs is compared with it.
TEST(PrefillGpu, PersistentLongUnits) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(204);
  const Batch b = make_batch(16, {{520, 520}, {700, 650}, {0, 40}, {130, 900}, {260, 260}, {90, 0}}, true);
  const auto [q, kn, kp, v, cq, ck] = upload(b);
  const Device gpu = Device::cuda(0);
  for (bool causal : {true, false}) {
    const Reference ref = oracle(b, causal);
    for (const std::string& name : test::variants_of("mha_prefill")) {
      // The sm90_fp8 variants run fp8 compute only (test_prefill_fp8_gpu.cpp).
      if (name.rfind("sm90", 0) != 0 || name.find("fp8") != std::string::npos ||
          !variant_runs_on_device("mha_prefill", name, 0))
        continue;
      ForceVariant force("mha_prefill", name);
      Tensor out = test::poisoned({b.tq, b.h, kV}, DType::bf16, gpu), lse = test::poisoned({b.h, b.tq}, DType::f32, gpu);
      mha_prefill(q, kn, on(kp, b.k_pe), v, cq, ck, b.max_q, b.max_k, out, lse, kScale, causal, Context{});
      cuda_rt::synchronize(0);
      test::expect_variant_ran("mha_prefill", name);
      test::expect_attention_close(out, ref.out, lse, ref.lse, name + (causal ? " causal" : " non-causal"));
    }
  }
}

// Views whose rows are not 16-byte aligned (q, k_nope and v inside padded storage) take the element-copy
// loader; results must not change.
TEST(PrefillGpu, UnalignedViews) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(202);
  const int64_t h = 4;
  const Lens lens = {{70, 90}, {0, 0}, {33, 33}};
  Batch b = make_batch(h, lens, true);
  const Reference ref = oracle(b, true);

  // Same values placed at an odd element offset inside wider rows.
  const Device gpu = Device::cuda(0);
  auto padded = [&](const Tensor& t, int64_t width) {
    Tensor store = test::poisoned({t.size(0), h, width + 3}, DType::bf16);
    copy(store.view().slice(2, 1, width + 1), t.view());
    return store.to(gpu);
  };
  Tensor qs = padded(b.q, kNope + kRope), kns = padded(b.k_nope, kNope), vs = padded(b.v, kV);
  Tensor kp = b.k_pe_store.to(gpu), cq = b.cu_q.to(gpu), ck = b.cu_k.to(gpu);
  Tensor out = test::poisoned({b.tq, h, kV}, DType::bf16, gpu), lse = test::poisoned({h, b.tq}, DType::f32, gpu);
  mha_prefill(qs.view().slice(2, 1, kNope + kRope + 1), kns.view().slice(2, 1, kNope + 1), on(kp, b.k_pe),
              vs.view().slice(2, 1, kV + 1), cq, ck, b.max_q, b.max_k, out, lse, kScale, true, Context{});
  test::expect_attention_close(out, ref.out, lse, ref.lse, "unaligned");
  EXPECT_EQ(last_variant("mha_prefill"), "portable") << "views TMA cannot read take the portable kernel";
}

}  // namespace
}  // namespace mla
