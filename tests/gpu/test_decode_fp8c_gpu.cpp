// SPDX-License-Identifier: Apache-2.0
// The fp8-compute mqa_decode (fp8_compute = true; the sm90_fp8c kernel, attention/sm90/fp8c/kernel.cuh) against its
// float64 oracle and bound (docs/SEMANTICS.md §14.10): the oracle over the query rounded as the kernel rounds it
// (e4m3(q · 2^e_r) · 2^-e_r per query row) and the cache's exact codes; out within w (2^-3 + 2^-10 (1 + a)) +
// 2^-17 n max|v| + 2^-8 |out| + 1e-6 (w = sum_j p_j |v_j| / sum_j p_j per element: P's e4m3 rounding; a = tau
// max_j sum_c |q_c k_jc|: the fp8 tensor cores' narrow adder on the scores; n keys' weights below e4m3's range),
// lse within 2^-11 a + 1e-5 |lse| + 1e-6, NaN and inf in the same places. Page sizes 1 .. 128, 64-row tiles whole,
// padded and several per request, s_q 1 / 2 (causal limits per row), lengths on and beside page boundaries, empty
// requests, NaN-poisoned pages past every length, split-KV, and the rule: fp8c runs only when asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attention_gpu_util.h"
#include "core/numeric.h"
#include "runtime/device_api.h"
#include "unit/attention_test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

using test::PagedBatch;

constexpr double kScale = 0.0722;  // 1/sqrt(192)

// The query row's exponent (SEMANTICS §14.10): 2^e brings max |q| into (224, 448]; INT_MIN flags inf / NaN rows.
int q_exponent(float amax) {
  if (amax == 0.0f) return 0;
  uint32_t bits;
  std::memcpy(&bits, &amax, sizeof(bits));
  const int biased = static_cast<int>(bits >> 23);
  if (biased == 255) return INT_MIN;
  const int e = ((bits & 0x7fffffu) <= 0x600000u ? 8 : 7) - (biased - 127);
  return std::clamp(e, -120, 120);
}

struct Fp8cOracle {
  std::vector<double> out, w, lse, a, n;  // out, w [rows][dv]; lse, a, n [rows] (rows in q's order)
  double max_v = 0.0;
};

Fp8cOracle fp8c_oracle(const Tensor& q_host, const PagedBatch& pb, const std::vector<int32_t>& lens, bool causal,
                       int64_t dv) {
  const int64_t b = q_host.size(0), s_q = q_host.size(1), h = q_host.size(2), d = q_host.size(3);
  const std::vector<double> q = test::to_doubles(q_host.view());
  const KVCache& c = pb.cb.cache;
  const auto* codes = static_cast<const uint8_t*>(c.data.data);
  Fp8cOracle o;
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t g = 0; g < b; ++g) {
    const int64_t len = lens[static_cast<std::size_t>(g)];
    std::vector<double> kv(static_cast<std::size_t>(len * d));
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot = pb.slots[static_cast<std::size_t>(g)][static_cast<std::size_t>(pos)];
      const uint8_t* row = codes + (slot / c.page_size()) * c.data.stride[0] + (slot % c.page_size()) * c.data.stride[1];
      for (int64_t x = 0; x < d; ++x) {
        kv[static_cast<std::size_t>(pos * d + x)] = static_cast<double>(num::e4m3_to_float(row[x])) * c.scale;
        if (x < dv) o.max_v = std::max(o.max_v, std::fabs(kv[static_cast<std::size_t>(pos * d + x)]));
      }
    }
    for (int64_t i = 0; i < s_q; ++i)
      for (int64_t hh = 0; hh < h; ++hh) {
        const double* qr = q.data() + ((g * s_q + i) * h + hh) * d;
        float amax = 0.0f;
        for (int64_t x = 0; x < d; ++x) amax = std::max(amax, std::fabs(static_cast<float>(qr[x])));
        const int e = q_exponent(amax);
        std::vector<double> qd(static_cast<std::size_t>(d));
        for (int64_t x = 0; x < d; ++x)
          qd[static_cast<std::size_t>(x)] =
              e == INT_MIN ? NAN
                           : std::ldexp(static_cast<double>(num::e4m3_to_float(
                                            num::float_to_e4m3(static_cast<float>(std::ldexp(qr[x], e))))),
                                        -e);
        const int64_t limit = std::min<int64_t>(causal ? len - s_q + i : len - 1, len - 1);
        const int64_t nk = std::max<int64_t>(limit + 1, 0);
        std::vector<double> s(static_cast<std::size_t>(nk));
        double m = -inf, amx = 0.0;
        for (int64_t j = 0; j < nk; ++j) {
          double acc = 0.0, mag = 0.0;
          for (int64_t x = 0; x < d; ++x) {
            const double t = qd[static_cast<std::size_t>(x)] * kv[static_cast<std::size_t>(j * d + x)];
            acc += t;
            mag += std::fabs(t);
          }
          s[static_cast<std::size_t>(j)] = acc * kScale;
          m = std::max(m, s[static_cast<std::size_t>(j)]);
          amx = std::max(amx, mag * kScale);
        }
        std::vector<double> out(static_cast<std::size_t>(dv), 0.0), w(static_cast<std::size_t>(dv), 0.0);
        double l = 0.0;
        for (int64_t j = 0; j < nk; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(j)] - m);
          l += p;
          for (int64_t x = 0; x < dv; ++x) {
            out[static_cast<std::size_t>(x)] += p * kv[static_cast<std::size_t>(j * d + x)];
            w[static_cast<std::size_t>(x)] += p * std::fabs(kv[static_cast<std::size_t>(j * d + x)]);
          }
        }
        for (int64_t x = 0; x < dv; ++x) {
          o.out.push_back(nk == 0 ? 0.0 : out[static_cast<std::size_t>(x)] / l);
          o.w.push_back(nk == 0 ? 0.0 : w[static_cast<std::size_t>(x)] / l);
        }
        o.lse.push_back(nk == 0 ? -inf : m + std::log(l));
        o.a.push_back(amx);
        o.n.push_back(static_cast<double>(nk));
      }
  }
  return o;
}

// "" when out / lse meet the bound of the file comment, else the first violations.
std::string check_fp8c(const Tensor& out, const Tensor& lse, const Fp8cOracle& o, int64_t dv) {
  const std::vector<double> got = test::to_doubles(out.view()), gl = test::to_doubles(lse.view());
  std::string msg;
  int bad = 0;
  auto same_special = [](double x, double y) {
    return (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
  };
  for (std::size_t r = 0; r < o.lse.size(); ++r) {
    for (int64_t x = 0; x < dv; ++x) {
      const std::size_t k = r * static_cast<std::size_t>(dv) + static_cast<std::size_t>(x);
      const double ref = o.out[k], g = got[k];
      const bool special = !std::isfinite(ref) || !std::isfinite(g);
      const double tol = o.w[k] * (0x1p-3 + 0x1p-10 * (1.0 + o.a[r])) + 0x1p-17 * o.n[r] * o.max_v +
                         0x1p-8 * std::fabs(ref) + 1e-6;
      if (special ? !same_special(ref, g) : !(std::fabs(g - ref) <= tol)) {
        if (bad++ < 6)
          msg += "out[" + std::to_string(r) + "][" + std::to_string(x) + "] " + std::to_string(g) + " vs " +
                 std::to_string(ref) + " (bound " + std::to_string(tol) + "); ";
      }
    }
    const double ref = o.lse[r], g = gl[r];
    const bool special = !std::isfinite(ref) || !std::isfinite(g);
    const double tol = 0x1p-11 * o.a[r] + 1e-5 * std::fabs(ref) + 1e-6;
    if (special ? !same_special(ref, g) : !(std::fabs(g - ref) <= tol)) {
      if (bad++ < 12)
        msg += "lse[" + std::to_string(r) + "] " + std::to_string(g) + " vs " + std::to_string(ref) + " (bound " +
               std::to_string(tol) + "); ";
    }
  }
  if (bad > 0) msg = std::to_string(bad) + " outside the bound: " + msg;
  return msg;
}

// The CUDA op with fp8_compute on a device copy of the host cache; outputs NaN-poisoned first. num_splits 0: the
// planner's, with mqa_decode_workspace_bytes of scratch.
struct Fp8cRun {
  Tensor out, lse;
};
Fp8cRun run_fp8c(const Tensor& q_host, const PagedBatch& pb, bool causal, int num_splits = 0, bool fp8_compute = true) {
  const int64_t b = q_host.size(0), s_q = q_host.size(1), h = q_host.size(2);
  const Device gpu = Device::cuda(0);
  test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
  Tensor q = q_host.to(gpu), bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
  Fp8cRun r;
  r.out = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu);
  r.lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
  Tensor ws;
  const std::size_t need = mqa_decode_workspace_bytes(b, s_q, h, pb.block_table.size(1) * pb.cb.cache.page_size(), gpu,
                                                      num_splits);
  if (need > 0) ws = Tensor::empty({static_cast<int64_t>(need)}, DType::u8, gpu);
  mqa_decode(q, dc.cache, bt, sl, r.out, r.lse, kScale, causal, ws.view(), Context{}, num_splits, false, false,
             fp8_compute);
  cuda_rt::synchronize(0);
  return r;
}

using Param = std::tuple<int64_t /*page*/, int64_t /*h*/, int64_t /*s_q*/>;
class DecodeFp8cGpu : public ::testing::TestWithParam<Param> {};

TEST_P(DecodeFp8cGpu, WithinTheFp8ComputeBound) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [page, h, s_q] = GetParam();
  MLA_FORCE_VARIANT("mqa_decode", "sm90_fp8c");
  test::reseed(static_cast<uint64_t>(page * 1000 + h * 10 + s_q) + 4242);
  const std::vector<int32_t> lens = test::boundary_lens(page, test::rng());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  PagedBatch pb = test::paged_batch(CacheFormat::fp8, page, lens, (max_len + page - 1) / page + 1);
  const Tensor q = test::random_tensor({static_cast<int64_t>(lens.size()), s_q, h, 576}, DType::bf16);
  Fp8cRun r;
  MLA_SKIP_IF_DECLINED(r = run_fp8c(q, pb, true));
  test::expect_variant_ran("mqa_decode", "sm90_fp8c");
  EXPECT_EQ(check_fp8c(r.out, r.lse, fp8c_oracle(q, pb, lens, true, 512), 512), "");
}

INSTANTIATE_TEST_SUITE_P(All, DecodeFp8cGpu,
                         ::testing::Combine(::testing::Values(1, 16, 64, 128), ::testing::Values(40, 64, 128),
                                            ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return "page" + std::to_string(std::get<0>(info.param)) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_sq" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Long requests over many splits (the combine merging fp8-compute partials), explicit and planned, and peakier rows
// (q in [-4, 4]).
TEST(DecodeFp8cGpu, SplitsAndLargeLogits) {
  MLA_SKIP_WITHOUT_GPU();
  MLA_FORCE_VARIANT("mqa_decode", "sm90_fp8c");
  test::reseed(77);
  const std::vector<int32_t> lens = {4096, 3001, 0, 65};
  PagedBatch pb = test::paged_batch(CacheFormat::fp8, 64, lens, 65);
  Tensor q = test::random_tensor({4, 1, 128, 576}, DType::bf16, Device::cpu(), -4.0, 4.0);
  const Fp8cOracle o = fp8c_oracle(q, pb, lens, true, 512);
  for (int splits : {0, 1, 5}) {
    Fp8cRun r;
    MLA_SKIP_IF_DECLINED(r = run_fp8c(q, pb, true, splits));
    test::expect_variant_ran("mqa_decode", "sm90_fp8c");
    EXPECT_EQ(check_fp8c(r.out, r.lse, o, 512), "") << "splits " << splits;
  }
}

// The rule: fp8 compute asked for takes sm90_fp8c above 32 rows; not asked, the converter kernel; a forced sm90_fp8c
// declines a call that did not ask.
TEST(DecodeFp8cGpu, RunsOnlyWhenAsked) {
  MLA_SKIP_WITHOUT_GPU();
  if (compute_capability(Device::cuda(0)) != 90) GTEST_SKIP() << "the sm90 kernels";
  test::reseed(78);
  const std::vector<int32_t> lens = {300, 77};
  PagedBatch pb = test::paged_batch(CacheFormat::fp8, 64, lens, 6);
  Tensor q = test::random_tensor({2, 1, 128, 576}, DType::bf16);
  run_fp8c(q, pb, true, 0, true);
  EXPECT_EQ(last_variant("mqa_decode"), "sm90_fp8c");
  run_fp8c(q, pb, true, 0, false);
  EXPECT_EQ(last_variant("mqa_decode"), "sm90_convert");
  Tensor q16 = test::random_tensor({2, 1, 16, 576}, DType::bf16);
  run_fp8c(q16, pb, true, 0, true);
  EXPECT_EQ(last_variant("mqa_decode"), "sm90_raw");
  ForceVariant force("mqa_decode", "sm90_fp8c");
  EXPECT_THROW(run_fp8c(q, pb, true, 0, false), VariantUnsupported);
}

}  // namespace
}  // namespace mla
