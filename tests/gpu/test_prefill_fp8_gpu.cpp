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
#include "core/numeric.h"
#include "core/prefill_fp8.h"
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

// The fp8 variant (its schedule by common/prefill_schedule.h's rule: the h 128 sweep's causal cases and
// PersistentManyUnits' causal batch run persistent pairs, the rest one CTA per unit).
const std::vector<std::string> kFp8Variants = {"sm90_fp8"};

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

// The quantise pass's codes, byte for byte: the workspace after a call against e4m3(float(x) / scale) computed
// here in the layout of core/prefill_fp8.h (q8, k8 with zero rows in every tail and gap, vt8 transposed with the
// keys of every 16 at their P-fragment positions, zeros past each request's keys). Inputs with NaN, infinities,
// values past e4m3's range and bf16 subnormals; the three divisions of plan.h (power-of-two scales, others in
// [2^-32, 2^32], one outside); 16-byte aligned inputs and inputs one element off (the element loads).
TEST(PrefillFp8Gpu, QuantisePassCodesExact) {
  MLA_SKIP_WITHOUT_SM90();
  // Position of key k (0..15) of a 16-key group in vt8's columns: 4t + i holds key 2t + i (i < 2), 8 + 2t + i - 2.
  auto vt_position = [](int64_t k) { return k < 8 ? 4 * (k / 2) + k % 2 : 4 * ((k - 8) / 2) + 2 + (k - 8) % 2; };
  const Device gpu = Device::cuda(0);
  const uint16_t kSpecials[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x4700, 0xc6ff, 0x0001, 0x8003, 0x0080, 0x3b80};
  struct Scales {
    float q, k, v;
  };
  int round = 0;
  // Each division of plan.h's quant_scale: correct, multiply, correct; multiply, correct, multiply; divide (a
  // scale below 2^-32: every code saturates), multiply, correct.
  for (const Scales sc : {Scales{0.0722f / 64, 1.0f / 128, 0.0097f}, Scales{1.0f / 256, 0.011f, 1.0f / 512},
                          Scales{1.5f * 0x1p-33f, 1.0f / 64, 0.0722f}}) {
    for (const bool shared_rope : {true, false}) {
      for (const bool misaligned : {false, true}) {
        test::reseed(310 + round++);
        const int64_t h = 3;
        const Batch b = make_batch(h, {{5, 0}, {37, 300}, {0, 17}, {130, 129}, {1, 1}, {20, 16}}, shared_rope, 2.0);
        // Specials at pseudo-random places of each input.
        for (const Tensor* t : {&b.q, &b.kn, &b.kp_store, &b.v}) {
          uint16_t* x = static_cast<uint16_t*>(const_cast<void*>(t->data()));
          const int64_t n = t->numel();
          for (int64_t i = 0; i < 40; ++i) x[(i * 7919 + 13) % n] = kSpecials[i % 10];
        }
        PrefillOptions o;
        o.fp8 = true;
        o.q_scale = sc.q;
        o.k_scale = sc.k;
        o.v_scale = sc.v;
        // Device copies, one element past a 16-byte boundary when `misaligned` (q, k_nope, v).
        const int64_t off = misaligned ? 1 : 0;
        auto place = [&](const Tensor& host, Tensor& store) {
          store = Tensor::empty({host.numel() + 8}, DType::bf16, gpu);
          TensorView v = host.view();
          v.data = static_cast<uint16_t*>(store.data()) + off;
          v.device = gpu;
          cuda_rt::memcpy(v.data, gpu, host.data(), Device::cpu(), static_cast<std::size_t>(host.numel()) * 2);
          return v;
        };
        Tensor qs, kns, vs;
        const TensorView q = place(b.q, qs), kn = place(b.kn, kns), v = place(b.v, vs);
        Tensor kp = b.kp_store.to(gpu), cq = b.cu_q.to(gpu), ck = b.cu_k.to(gpu);
        Tensor out = Tensor::empty({b.tq, h, 128}, DType::bf16, gpu);
        const int64_t batch = b.cu_q.size(0) - 1;
        const std::size_t bytes = mha_prefill_workspace_bytes(b.tq, b.tk, h, batch, true, gpu);
        Tensor ws = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, gpu);
        fill(ws.view(), 255.0);
        o.workspace = ws.view();
        mha_prefill(q, kn, on(kp, b.kp), v, cq, ck, b.max_q, b.max_k, out, {}, kScale, true, o, Context{});
        cuda_rt::synchronize(0);
        const Tensor got_t = ws.to(Device::cpu());
        const uint8_t* got = static_cast<const uint8_t*>(got_t.data());

        const prefill_fp8::Layout l = prefill_fp8::Layout::of(b.tq, b.tk, h, batch);
        std::vector<uint8_t> want(static_cast<std::size_t>(l.total), 0);
        auto at = [](const Tensor& t, TensorView view, int64_t r, int64_t hh, int64_t c) {
          view.data = const_cast<void*>(t.data());
          return static_cast<const uint16_t*>(view.data)[r * view.stride[0] + hh * view.stride[1] + c * view.stride[2]];
        };
        auto code = [&](uint16_t x, float s) { return num::float_to_e4m3(num::bf16_to_float(x) / s); };
        for (int64_t hh = 0; hh < h; ++hh)
          for (int64_t t = 0; t < b.tq; ++t)
            for (int64_t c = 0; c < 192; ++c)
              want[static_cast<std::size_t>(l.q_off + (hh * b.tq + t) * 192 + c)] = code(at(b.q, b.q.view(), t, hh, c), sc.q);
        const int32_t* cu_k = static_cast<const int32_t*>(b.cu_k.data());
        for (int64_t r = 0; r < batch; ++r) {
          const int64_t start = (cu_k[r] + 15) / 16 * 16 + 128 * r;
          for (int64_t j = 0; j < cu_k[r + 1] - cu_k[r]; ++j) {
            const int64_t key = cu_k[r] + j, R = start + j;
            for (int64_t hh = 0; hh < h; ++hh) {
              for (int64_t c = 0; c < 192; ++c)
                want[static_cast<std::size_t>(l.k_off + (hh * l.k_rows + R) * 192 + c)] =
                    c < 128 ? code(at(b.kn, b.kn.view(), key, hh, c), sc.k) : code(at(b.kp_store, b.kp, key, hh, c - 128), sc.k);
              for (int64_t d = 0; d < 128; ++d)
                want[static_cast<std::size_t>(l.v_off + (hh * 128 + d) * l.v_cols + (R & ~int64_t{15}) + vt_position(R & 15))] =
                    code(at(b.v, b.v.view(), key, hh, d), sc.v);
            }
          }
        }
        const std::string what = "scales " + std::to_string(sc.q) + " " + std::to_string(sc.k) + " " +
                                 std::to_string(sc.v) + (shared_rope ? ", shared rope" : ", per-head rope") +
                                 (misaligned ? ", misaligned" : ", aligned");
        struct Region {
          const char* name;
          int64_t off, n;
        };
        for (const Region g : {Region{"q8", l.q_off, h * b.tq * 192}, Region{"k8", l.k_off, h * l.k_rows * 192},
                               Region{"vt8", l.v_off, h * 128 * l.v_cols}}) {
          int64_t bad = 0, first = -1;
          for (int64_t i = g.off; i < g.off + g.n; ++i)
            if (got[i] != want[static_cast<std::size_t>(i)] && bad++ == 0) first = i - g.off;
          EXPECT_EQ(bad, 0) << g.name << ": first at byte " << first << " (got " << int(got[g.off + first]) << ", want "
                            << int(want[static_cast<std::size_t>(g.off + first)]) << "); " << what;
        }
      }
    }
  }
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
