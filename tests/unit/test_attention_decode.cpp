// SPDX-License-Identifier: Apache-2.0
// mqa_decode on the CPU: the absorbed-vs-naive identity, a float64 oracle sweep over formats, page
// sizes, head counts and s_q, and fast (float32) vs reference (float64) accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_util.h"
#include "cpu/attention_core.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::OracleOut;

// float32 accumulation (Precision::fast) leaves an absolute error of a few float ulps of the largest
// output, which an element that nearly cancels to 0 cannot absorb in its own rounding bound.
constexpr double kF32Accum = 1e-6;
using test::PagedBatch;

// float64 oracle of mqa_decode for the batch: rows decoded by the test's own reader (decode_row).
OracleOut decode_oracle(const TensorView& q, const PagedBatch& pb, const std::vector<int32_t>& lens, int64_t dv,
                        double scale, bool causal) {
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), d = q.size(3);
  const std::vector<double> qv = test::to_doubles(q);
  OracleOut res;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t len = lens[static_cast<std::size_t>(r)];
    std::vector<std::vector<double>> rows;
    for (int64_t pos = 0; pos < len; ++pos) rows.push_back(test::decode_row(pb.cb.cache, pb.slots[r][pos]));
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t vis = causal ? std::clamp<int64_t>(len - s_q + i + 1, 0, len) : len;
      std::vector<const double*> keys;
      for (int64_t j = 0; j < vis; ++j) keys.push_back(rows[static_cast<std::size_t>(j)].data());
      for (int64_t hh = 0; hh < h; ++hh)
        test::oracle_attend(qv.data() + ((r * s_q + i) * h + hh) * d, keys, d, keys, dv, scale, res);
    }
  }
  return res;
}

// ---- the cache reader the kernels use equals the shared one bit for bit ------------------------

template <class T>
void expect_reader_matches(const KVCache& c, int64_t slot) {
  cpu::attn::CacheRowReader<T> reader(c);
  std::vector<T> fast(static_cast<std::size_t>(c.d_qk)), ref(static_cast<std::size_t>(c.d_qk));
  reader.read(slot, fast.data(), c.d_qk);
  cpu::load_cache_row(c, slot, ref.data(), c.d_qk);
  for (int i = 0; i < c.d_qk; ++i)
    ASSERT_EQ(std::memcmp(&fast[i], &ref[i], sizeof(T)), 0) << to_string(c.format) << " col " << i;
}

TEST(AttentionDecode, RowReaderIsBitExact) {
  test::reseed(1);
  for (CacheFormat f : test::kAllFormats) {
    CacheBuffer cb = test::nan_cache(f, 3, 5);
    for (int64_t s = 0; s < 15; ++s) {
      test::randomize_row(cb.cache, s);
      expect_reader_matches<float>(cb.cache, s);
      expect_reader_matches<double>(cb.cache, s);
    }
  }
}

// ---- absorbed MQA decode == naive MHA with explicit K/V up-projection ---------------------------

TEST(AttentionDecode, AbsorbedEqualsNaiveUpProjection) {
  test::reseed(2);
  const int64_t L = 512, R = 64, P = 128, V = 128, h = 16, page = 16;
  const std::vector<int32_t> lens = {300};
  const double scale = 1.0 / std::sqrt(static_cast<double>(P + R));
  PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, lens, 20);
  const int64_t n = lens[0];
  Tensor w = test::random_tensor({h * (P + V), L}, DType::f64, Device::cpu(), -0.1, 0.1);  // kv_b_proj [h*(P+V), L]
  Tensor q = test::random_tensor({h, P + R}, DType::f64);
  const std::vector<double> wv = test::to_doubles(w), qv = test::to_doubles(q);

  // Naive: k_j = [W_UK c_j | k_pe_j], v_j = W_UV c_j per head, softmax(scale q.k) v.
  std::vector<double> naive;
  for (int64_t hh = 0; hh < h; ++hh) {
    std::vector<std::vector<double>> k(n, std::vector<double>(P + R)), v(n, std::vector<double>(V));
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<double> c = test::decode_row(pb.cb.cache, pb.slots[0][j]);
      for (int64_t p = 0; p < P; ++p) {
        double acc = 0;
        for (int64_t x = 0; x < L; ++x) acc += wv[(hh * (P + V) + p) * L + x] * c[x];
        k[j][p] = acc;
      }
      for (int64_t x = 0; x < R; ++x) k[j][P + x] = c[L + x];
      for (int64_t e = 0; e < V; ++e) {
        double acc = 0;
        for (int64_t x = 0; x < L; ++x) acc += wv[(hh * (P + V) + P + e) * L + x] * c[x];
        v[j][e] = acc;
      }
    }
    std::vector<const double*> kp, vp;
    for (int64_t j = 0; j < n; ++j) {
      kp.push_back(k[j].data());
      vp.push_back(v[j].data());
    }
    OracleOut o;
    test::oracle_attend(qv.data() + hh * (P + R), kp, P + R, vp, V, scale, o);
    naive.insert(naive.end(), o.out.begin(), o.out.end());
  }

  // Absorbed, through the library: ql = q_nope W_UK (bmm over heads on strided views of W), mqa_decode
  // over the latent cache, out = o_lat W_UV^T (bmm with a transposed view).
  const Context ref{nullptr, Precision::reference};
  Tensor qmqa = test::poisoned({1, 1, h, L + R}, DType::f64);
  const int64_t wst[] = {(P + V) * L, L, 1};
  const int64_t uk_shape[] = {h, P, L};
  TensorView w_uk(w.data(), DType::f64, uk_shape, wst);  // [h, P, L]
  const int64_t uv_shape[] = {h, L, V}, uv_st[] = {(P + V) * L, 1, L};
  TensorView w_uv_t(static_cast<double*>(w.data()) + P * L, DType::f64, uv_shape, uv_st);  // [h, L, V]
  const int64_t qn_shape[] = {h, 1, P}, qn_st[] = {P + R, P + R, 1};
  TensorView q_nope(q.data(), DType::f64, qn_shape, qn_st);
  const int64_t ql_shape[] = {h, 1, L}, ql_st[] = {L + R, L + R, 1};
  TensorView ql(qmqa.data(), DType::f64, ql_shape, ql_st);
  bmm(q_nope, w_uk, ql, 1.0f, 0.0f, ref);
  for (int64_t hh = 0; hh < h; ++hh)
    for (int64_t x = 0; x < R; ++x) static_cast<double*>(qmqa.data())[hh * (L + R) + L + x] = qv[hh * (P + R) + P + x];
  Tensor o_lat = test::poisoned({1, 1, h, L}, DType::f64);
  mqa_decode(qmqa, pb.cb.cache, pb.block_table, pb.seq_lens, o_lat, {}, scale, true, {}, ref);
  Tensor out = test::poisoned({h, 1, V}, DType::f64);
  bmm(o_lat.view().reshape({h, 1, L}), w_uv_t, out, 1.0f, 0.0f, ref);

  const double err = test::rel_l2(test::to_doubles(out), naive);
  EXPECT_LT(err, 1e-9);
  for (double x : test::to_doubles(out)) ASSERT_TRUE(std::isfinite(x));
}

// ---- oracle sweep -------------------------------------------------------------------------------

using SweepParam = std::tuple<CacheFormat, int64_t /*page*/, int64_t /*h*/, int64_t /*s_q*/>;
class DecodeSweep : public ::testing::TestWithParam<SweepParam> {};

// Runs mqa_decode with NaN-poisoned outputs; lse is written through a transposed (strided) view.
void run_decode(const TensorView& q, const PagedBatch& pb, const Tensor& out, const Tensor& lse_buf, double scale,
                bool causal, Precision prec) {
  fill(out.view(), NAN);
  fill(lse_buf.view(), NAN);
  mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, out, lse_buf.view().transpose(1, 2), scale, causal, {},
             Context{nullptr, prec});
}

TEST_P(DecodeSweep, MatchesFloat64Oracle) {
  const auto [format, page, h, s_q] = GetParam();
  test::reseed(static_cast<uint64_t>(page * 1000 + h * 10 + s_q) + static_cast<uint64_t>(format) * 100000);
  // Lengths on and beside page boundaries, an empty request, and one shorter than s_q.
  const std::vector<int32_t> lens = {0, 1, static_cast<int32_t>(page), static_cast<int32_t>(page + 1),
                                     static_cast<int32_t>(2 * page - 1 > 0 ? 2 * page - 1 : 1)};
  const int64_t b = static_cast<int64_t>(lens.size()), d = 576, dv = 512;
  PagedBatch pb = test::paged_batch(format, page, lens, 3);
  const double scale = 0.0722;
  // q values are bf16-exact so that the bf16 (fast) and f64 (reference) runs see the same inputs.
  Tensor q16 = test::random_tensor({b, s_q, h, d}, DType::bf16);
  Tensor q64 = Tensor::empty({b, s_q, h, d}, DType::f64);
  {
    const std::vector<double> v = test::to_doubles(q16.view());
    std::copy(v.begin(), v.end(), static_cast<double*>(q64.data()));
  }
  const OracleOut ref = decode_oracle(q64, pb, lens, dv, scale, true);

  Tensor out64 = Tensor::empty({b, s_q, h, dv}, DType::f64), lse = Tensor::empty({b, h, s_q}, DType::f32);
  run_decode(q64, pb, out64, lse, scale, true, Precision::reference);
  EXPECT_EQ(test::check_close(test::to_doubles(out64.view()), ref.out, DType::f64, 1e-12), "") << "reference out";
  EXPECT_EQ(test::check_close(test::to_doubles(lse.view().transpose(1, 2)), test::as_f32(ref.lse), DType::f32), "")
      << "reference lse";

  Tensor out16 = Tensor::empty({b, s_q, h, dv}, DType::bf16);
  run_decode(q16, pb, out16, lse, scale, true, Precision::fast);
  EXPECT_EQ(test::check_close(test::to_doubles(out16.view()), ref.out, DType::bf16, kF32Accum), "") << "fast bf16 out";
  EXPECT_EQ(
      test::check_close(test::to_doubles(lse.view().transpose(1, 2)), test::as_f32(ref.lse), DType::f32, kF32Accum), "")
      << "fast lse";
}

INSTANTIATE_TEST_SUITE_P(Formats, DecodeSweep,
                         ::testing::Combine(::testing::ValuesIn(test::kAllFormats), ::testing::Values(1, 16, 64),
                                            ::testing::Values(1, 8, 16, 128), ::testing::Values(1, 2, 4)),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + "_h" +
                                  std::to_string(std::get<2>(info.param)) + "_sq" +
                                  std::to_string(std::get<3>(info.param));
                         });

// Non-causal multi-token queries all see the whole context; d_v < d_latent keeps the first columns; f32
// output in fast mode stays within float32 accumulation error of the oracle.
TEST(AttentionDecode, NonCausalNarrowValuesF32) {
  test::reseed(3);
  const std::vector<int32_t> lens = {5, 70, 129};
  const int64_t b = 3, s_q = 3, h = 5, d = 576, dv = 128, page = 16;
  PagedBatch pb = test::paged_batch(CacheFormat::fp8, page, lens, 10);
  Tensor q = test::random_tensor({b, s_q, h, d}, DType::f32);
  const OracleOut ref = decode_oracle(q, pb, lens, dv, 0.05, false);
  Tensor out = Tensor::empty({b, s_q, h, dv}, DType::f32), lse = Tensor::empty({b, h, s_q}, DType::f32);
  run_decode(q, pb, out, lse, 0.05, false, Precision::fast);
  EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f32, kF32Accum), "");
  EXPECT_EQ(
      test::check_close(test::to_doubles(lse.view().transpose(1, 2)), test::as_f32(ref.lse), DType::f32, kF32Accum),
      "");
  run_decode(q, pb, out, lse, 0.05, false, Precision::reference);
  EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f32), "");
}

// A single long request is split into key ranges whose partial softmax states are merged (whatever the
// thread count: ranges are at most half the keys); the merge must match the oracle like one pass does.
TEST(AttentionDecode, SplitKeyRangesMatchOracle) {
  test::reseed(5);
  const std::vector<int32_t> lens = {1100};
  const int64_t b = 1, s_q = 3, h = 8, d = 576, dv = 512, page = 16;
  for (CacheFormat f : test::kAllFormats) {
    PagedBatch pb = test::paged_batch(f, page, lens, 70);
    Tensor q = test::random_tensor({b, s_q, h, d}, DType::f64);
    const OracleOut ref = decode_oracle(q, pb, lens, dv, 0.0722, true);
    Tensor out = Tensor::empty({b, s_q, h, dv}, DType::f64), lse = Tensor::empty({b, h, s_q}, DType::f32);
    run_decode(q, pb, out, lse, 0.0722, true, Precision::reference);
    EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f64, 1e-12), "") << to_string(f);
    EXPECT_EQ(test::check_close(test::to_doubles(lse.view().transpose(1, 2)), test::as_f32(ref.lse), DType::f32), "")
        << to_string(f);
  }
}

// Fast mode against reference mode on the same batch (CPU backend, causal, scale 0.0722): out within bf16
// rounding and lse within f32's, each plus f32 accumulation.
void expect_fast_near_reference(const Tensor& q, const PagedBatch& pb, const std::string& what) {
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), dv = 512;
  Tensor out_ref = Tensor::empty({b, s_q, h, dv}, DType::f64), out = Tensor::empty({b, s_q, h, dv}, DType::bf16);
  Tensor lse_ref = Tensor::empty({b, h, s_q}, DType::f32), lse = Tensor::empty({b, h, s_q}, DType::f32);
  run_decode(q, pb, out_ref, lse_ref, 0.0722, true, Precision::reference);
  run_decode(q, pb, out, lse, 0.0722, true, Precision::fast);
  const auto close = [](const Tensor& got, const Tensor& ref, DType storage) {
    return test::check_close(test::to_doubles(got.view()), test::to_doubles(ref.view()), storage, kF32Accum);
  };
  EXPECT_EQ(close(out, out_ref, DType::bf16), "") << what << ": out";
  EXPECT_EQ(close(lse, lse_ref, DType::f32), "") << what << ": lse";
}

// DeepSeek-V3 per-rank shape with thousands of keys: fast mode stays within bf16 tolerance of the
// reference mode, for every cache format.
TEST(AttentionDecode, FastWithinBf16OfReferenceLongContext) {
  test::reseed(4);
  const std::vector<int32_t> lens = {2100, 777};
  const int64_t b = 2, s_q = 2, h = 16, d = 576, page = 64;
  for (CacheFormat f : test::kAllFormats) {
    PagedBatch pb = test::paged_batch(f, page, lens, 34);
    Tensor q = test::random_tensor({b, s_q, h, d}, DType::bf16);
    expect_fast_near_reference(q, pb, to_string(f));
  }
}

// Row maxima that jump across 64-key tiles by more and by less than a lazy maximum's threshold (the data of
// the GPU tests DecodeGpuLogitJumps / SparseGpuLogitJumps: attention_test_util.h logit_jump_scale): the
// fast mode stays within bf16 tolerance of the reference on the formats the GPU serves, and scale_row scales
// the formats it reports it can. (The host-only f64 cache is left out: at these logits, up to ~85 nats, its fast
// path missed this tolerance on one element by 2.4x the bound.)
TEST(AttentionDecode, FastWithinBf16OfReferenceLogitJumps) {
  test::reseed(5);
  const std::vector<int32_t> lens = {1500, 65, 700};
  const int64_t b = 3, s_q = 2, h = 16, d = 576, page = 64;
  for (CacheFormat f : test::kDeviceFormats) {
    PagedBatch pb = test::paged_batch(f, page, lens, 1500 / page + 2);
    EXPECT_EQ(test::scale_to_logit_jumps(pb), f != CacheFormat::fp8) << to_string(f);  // fp8: one scale for the cache
    Tensor q = test::random_tensor({b, s_q, h, d}, DType::bf16, Device::cpu(), -3.0, 3.0);
    expect_fast_near_reference(q, pb, to_string(f));
  }
}

// Every ISA build of the kernels (AVX-512, AVX2, baseline; those this CPU runs) against the oracle, with
// query tiles narrower than a vector (dot-product path), one vector, and several with a ragged tail.
TEST(AttentionDecode, EveryIsaLevelMatchesOracle) {
  test::reseed(6);
  const std::vector<int32_t> lens = {0, 3, 65, 130};
  const int64_t b = 4, d = 576, dv = 512, page = 16;
  const cpu::attn::Isa best = cpu::attn::best_isa();
  for (int level = 0; level <= static_cast<int>(best); ++level) {
    cpu::attn::set_isa(static_cast<cpu::attn::Isa>(level));
    for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
      PagedBatch pb = test::paged_batch(f, page, lens, 9);
      for (auto [h, s_q] : {std::pair<int64_t, int64_t>{1, 1}, {3, 2}, {8, 2}, {20, 3}}) {
        SCOPED_TRACE("isa " + std::to_string(level) + " " + to_string(f) + " h " + std::to_string(h) + " s_q " +
                     std::to_string(s_q));
        Tensor q = test::random_tensor({b, s_q, h, d}, DType::f32);
        const OracleOut ref = decode_oracle(q, pb, lens, dv, 0.0722, true);
        Tensor out = Tensor::empty({b, s_q, h, dv}, DType::f32), lse = Tensor::empty({b, h, s_q}, DType::f32);
        run_decode(q, pb, out, lse, 0.0722, true, Precision::fast);
        EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f32, kF32Accum), "");
        run_decode(q, pb, out, lse, 0.0722, true, Precision::reference);
        EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f32), "");
        EXPECT_EQ(test::check_close(test::to_doubles(lse.view().transpose(1, 2)), test::as_f32(ref.lse), DType::f32),
                  "");
      }
    }
  }
  cpu::attn::set_isa(best);
  EXPECT_THROW(cpu::attn::set_isa(static_cast<cpu::attn::Isa>(static_cast<int>(best) + 1)), Error);
}

TEST(AttentionDecode, WorkspaceBytesIsZeroOnCpu) {
  EXPECT_EQ(mqa_decode_workspace_bytes(8, 2, 16, 4096, Device::cpu()), 0u);
  EXPECT_THROW(mqa_decode_workspace_bytes(-1, 1, 16, 4096, Device::cpu()), Error);
  EXPECT_THROW(mqa_decode_workspace_bytes(1, 0, 16, 4096, Device::cpu()), Error);
}

}  // namespace
}  // namespace mla
