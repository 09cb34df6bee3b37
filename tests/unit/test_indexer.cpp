// SPDX-License-Identifier: Apache-2.0
// The lightning indexer on the CPU (docs/INDEXER.md): the K cache writer (byte layout, both scale
// rules, slot -1), the prefill gather, logits (reference mode equals the independent float64 oracle,
// fast mode within fp32 rounding, prefill over the gathered K equals decode over the pages), top-k (the
// tie rule, NaN and -inf, padding, k = 2048 and small k, decode rows), and rejected inputs that write
// nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mla/error.h"
#include "mla/indexer.h"
#include "support/indexer_oracle.h"
#include "support/test_util.h"

namespace mla {
namespace {

namespace ix = test::indexer;
const Context kRef{nullptr, Precision::reference};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  std::memcpy(b.data(), t.data(), b.size());
  return b;
}

TEST(IndexerCache, WriteLayoutAndScaleRules) {
  for (IndexerScale mode : {IndexerScale::ue8m0, IndexerScale::amax}) {
    const int64_t page = 5, blocks = 3;
    IndexerCacheBuffer c = allocate_indexer_cache(blocks, page, Device::cpu());
    std::memset(c.storage.data(), 0xab, c.storage.nbytes());
    // Row 0: amax 2 (ue8m0 scale 2^-7); row 1: tiny values (the 1e-4 floor); row 2: slot -1; row 3: random.
    Tensor k = test::random_tensor({4, 128}, DType::f32, Device::cpu(), -3, 3);
    float* kp = static_cast<float*>(k.data());
    for (int d = 0; d < 128; ++d) kp[d] = d == 7 ? -2.0f : 0.01f * static_cast<float>(d % 13);
    for (int d = 0; d < 128; ++d) kp[128 + d] = 1e-7f * static_cast<float>(d);  // amax < 1e-4: the floor
    Tensor slots = test::int64_tensor({7, 0, -1, 14});
    indexer_write_k(k, slots, c.cache, mode);
    const auto* bytes = static_cast<const uint8_t*>(c.storage.data());
    auto check_row = [&](int row, int64_t slot) {
      const uint8_t* block = bytes + (slot / page) * page * kIndexerEntryBytes;
      float amax = 0;
      for (int d = 0; d < 128; ++d) amax = std::max(amax, std::fabs(kp[row * 128 + d]));
      const float plain = std::max(amax, 1e-4f) / 448.0f;  // fp32 division (the contract)
      const float want = mode == IndexerScale::amax ? plain : static_cast<float>(std::exp2(std::ceil(std::log2(plain))));
      const float s = ix::key_scale(block, page, slot % page);
      EXPECT_EQ(s, want) << "row " << row;
      for (int d = 0; d < 128; ++d)
        ASSERT_EQ(ix::key_codes(block, slot % page)[d], ix::nearest_code(static_cast<double>(kp[row * 128 + d] / s)))
            << "row " << row << " d " << d;
    };
    check_row(0, 7);
    check_row(1, 0);
    check_row(3, 14);
    if (mode == IndexerScale::ue8m0) {
      EXPECT_EQ(ix::key_scale(bytes + page * kIndexerEntryBytes, page, 2), 1.0f / 128);
    }
    // Every byte outside the three written tokens is untouched.
    std::vector<bool> written(c.storage.nbytes(), false);
    for (int64_t slot : {7, 0, 14}) {
      const int64_t base = (slot / page) * page * kIndexerEntryBytes;
      for (int d = 0; d < 128; ++d) written[static_cast<std::size_t>(base + (slot % page) * 128 + d)] = true;
      for (int d = 0; d < 4; ++d) written[static_cast<std::size_t>(base + page * 128 + (slot % page) * 4 + d)] = true;
    }
    for (std::size_t i = 0; i < written.size(); ++i)
      if (!written[i]) {
        ASSERT_EQ(bytes[i], 0xab) << "byte " << i;
      }
  }
}

TEST(IndexerCache, GatherCopiesRequestPrefixes) {
  const int64_t page = 4;
  ix::DecodeProblem p = ix::make_decode_problem({9, 0, 6}, 1, 1, page, 11);
  Tensor cu = test::int_tensor({1, 10, 10, 16});
  Tensor dk = Tensor::empty({18, 128}, DType::fp8_e4m3);
  Tensor ds = Tensor::empty({18}, DType::f32);
  std::memset(dk.data(), 0x11, dk.nbytes());
  fill(ds, -5.0);
  indexer_gather_k(p.cache.cache, dk, ds, p.block_table, cu);
  const auto* bytes = static_cast<const uint8_t*>(p.cache.storage.data());
  const auto* bt = static_cast<const int32_t*>(p.block_table.data());
  const auto* dkb = static_cast<const uint8_t*>(dk.data());
  const auto* dsb = static_cast<const float*>(ds.data());
  const std::vector<std::pair<int64_t, int64_t>> reqs = {{1, 9}, {10, 0}, {10, 6}};
  std::vector<bool> covered(18, false);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < reqs[r].second; ++i) {
      const int64_t row = reqs[r].first + i;
      covered[static_cast<std::size_t>(row)] = true;
      const uint8_t* block = bytes + bt[r * p.max_blocks + i / page] * page * kIndexerEntryBytes;
      EXPECT_EQ(std::memcmp(dkb + row * 128, ix::key_codes(block, i % page), 128), 0) << "row " << row;
      EXPECT_EQ(dsb[row], ix::key_scale(block, page, i % page)) << "row " << row;
    }
  }
  for (int64_t row = 0; row < 18; ++row) {
    if (covered[static_cast<std::size_t>(row)]) continue;
    EXPECT_EQ(dsb[row], -5.0f) << "row " << row << " must be untouched";
    EXPECT_EQ(dkb[row * 128], 0x11) << "row " << row << " must be untouched";
  }
}

// Decode logits: reference mode equals the independent oracle to float64 rounding (then fp32 output
// rounding); fast mode within fp32 sums; prefill over the gathered K (ks = 0, ke = visible) equals
// decode over the pages.
TEST(IndexerLogits, DecodeMatchesOracleAndPrefill) {
  for (int64_t s_q : {1, 3}) {
    for (int64_t page : {1, 16, 64}) {
      SCOPED_TRACE(::testing::Message() << "s_q " << s_q << " page " << page);
      ix::DecodeProblem p = ix::make_decode_problem({37, 0, 2, 130}, s_q, 8, page, 100 + page, 140);
      const int64_t T = p.b * s_q;
      std::vector<double> ref, mag;
      ix::decode_oracle(p, ref, mag);
      for (Precision prec : {Precision::reference, Precision::fast}) {
        Tensor lg = test::poisoned({T, p.width}, DType::f32);
        indexer_logits_decode(p.q, p.weights, p.cache.cache, p.block_table, p.seq_lens_t, s_q, lg,
                              Context{nullptr, prec});
        const std::vector<double> got = test::to_doubles(lg);
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (std::isinf(ref[i])) {
            ASSERT_EQ(got[i], ref[i]) << "masked position " << i;
            continue;
          }
          // reference: float64 sums rounded once to fp32; fast: fp32 sums (128 + h terms).
          const double tol = prec == Precision::reference ? 6e-8 * std::fabs(ref[i]) + 1e-14 * mag[i] : 2e-5 * mag[i];
          ASSERT_LE(std::fabs(got[i] - ref[i]), tol + 1e-30) << "element " << i << " prec " << static_cast<int>(prec);
        }
        if (prec == Precision::fast) continue;
        // The same rows through the prefill op over the gathered K of each request.
        for (int64_t r = 0; r < p.b; ++r) {
          const int64_t len = p.seq_lens[static_cast<std::size_t>(r)];
          if (len == 0) continue;
          Tensor dk = Tensor::empty({len, 128}, DType::fp8_e4m3), ds = Tensor::empty({len}, DType::f32);
          Tensor bt_row = Tensor::empty({1, p.max_blocks}, DType::i32);
          std::memcpy(bt_row.data(), static_cast<int32_t*>(p.block_table.data()) + r * p.max_blocks, p.max_blocks * 4);
          indexer_gather_k(p.cache.cache, dk, ds, bt_row, test::int_tensor({0, static_cast<int32_t>(len)}));
          std::vector<int32_t> ks(static_cast<std::size_t>(s_q), 0), ke;
          for (int64_t i = 0; i < s_q; ++i) ke.push_back(static_cast<int32_t>(ix::decode_visible(p, r * s_q + i)));
          Tensor pl = test::poisoned({s_q, len}, DType::f32);
          indexer_logits_prefill(p.q.view().slice(0, r * s_q, (r + 1) * s_q),
                                 p.weights.view().slice(0, r * s_q, (r + 1) * s_q), dk, ds, test::int_tensor(ks),
                                 test::int_tensor(ke), pl, kRef);
          const std::vector<double> pv = test::to_doubles(pl);
          for (int64_t i = 0; i < s_q; ++i)
            for (int64_t j = 0; j < len; ++j)
              ASSERT_EQ(pv[static_cast<std::size_t>(i * len + j)], got[static_cast<std::size_t>((r * s_q + i) * p.width + j)])
                  << "request " << r << " row " << i << " key " << j;
        }
      }
    }
  }
}

TEST(IndexerLogits, PrefillRaggedRangesAndNaN) {
  std::mt19937_64 g(5);
  const int64_t T = 6, Tk = 50, h = 3;
  Tensor q = Tensor::empty({T, h, 128}, DType::fp8_e4m3), k = Tensor::empty({Tk, 128}, DType::u8);
  ix::fill_codes(static_cast<uint8_t*>(q.data()), T * h * 128, g);
  ix::fill_codes(static_cast<uint8_t*>(k.data()), Tk * 128, g);
  static_cast<uint8_t*>(k.data())[20 * 128 + 5] = 0x7f;  // key 20 holds a NaN code
  Tensor w = test::random_tensor({T, h}, DType::f32, Device::cpu(), -1, 1);
  Tensor s = test::random_tensor({Tk}, DType::f32, Device::cpu(), 0.001, 0.01);
  static_cast<float*>(s.data())[3] = -0.004f;  // a negative scale: relu applies after the scale
  const std::vector<int32_t> ks = {0, 10, -5, 30, 40, 0}, ke = {50, 25, 3, 30, 60, 21};
  Tensor lg = test::poisoned({T, Tk}, DType::f32);
  indexer_logits_prefill(q, w, k, s, test::int_tensor(ks), test::int_tensor(ke), lg, kRef);
  const std::vector<double> got = test::to_doubles(lg);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < Tk; ++j) {
      const double v = got[static_cast<std::size_t>(t * Tk + j)];
      if (j < std::max(ks[t], 0) || j >= std::min<int64_t>(ke[t], Tk)) {
        ASSERT_EQ(v, -std::numeric_limits<double>::infinity()) << t << "," << j;
        continue;
      }
      const double want = ix::logit(static_cast<uint8_t*>(q.data()) + t * h * 128, 128,
                                    static_cast<float*>(w.data()) + t * h, h,
                                    static_cast<uint8_t*>(k.data()) + j * 128, static_cast<float*>(s.data())[j]);
      if (j == 20) {
        ASSERT_TRUE(std::isnan(v)) << "a NaN code makes the logit NaN (row " << t << ")";
        continue;
      }
      const double mag = ix::logit_magnitude(static_cast<uint8_t*>(q.data()) + t * h * 128, 128,
                                             static_cast<float*>(w.data()) + t * h, h,
                                             static_cast<uint8_t*>(k.data()) + j * 128, static_cast<float*>(s.data())[j]);
      ASSERT_NEAR(v, want, 6e-8 * std::fabs(want) + 1e-14 * mag) << t << "," << j;
    }
  }
}

// Top-k against the full-sort oracle on logits with many exact ties, NaN, +-inf, +-0.
TEST(IndexerTopk, TieRuleNaNAndPadding) {
  std::mt19937_64 g(9);
  const int64_t T = 7, N = 3000;
  Tensor lg = Tensor::empty({T, N}, DType::f32);
  float* v = static_cast<float*>(lg.data());
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (int64_t i = 0; i < T * N; ++i) {
    const auto r = g() % 100;
    v[i] = r < 5 ? special[r] : static_cast<float>(static_cast<int>(g() % 40) - 20) * 0.25f;  // heavy ties
  }
  const std::vector<int32_t> starts = {0, 100, 5, 0, 2999, 10, 0}, ends = {3000, 2500, 5, 40, 3000, 2058, 2048};
  for (int64_t K : {1, 7, 2048, 4000}) {
    SCOPED_TRACE(::testing::Message() << "k " << K);
    Tensor out = Tensor::empty({T, K}, DType::i32);
    fill(out, -77);
    indexer_topk(lg, test::int_tensor(starts), test::int_tensor(ends), out);
    const std::vector<int32_t> got = test::to_ints(out);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int32_t> want = ix::topk_row(v + t * N, starts[t], ends[t], K);
      ASSERT_EQ(std::vector<int32_t>(got.begin() + t * K, got.begin() + (t + 1) * K), want) << "row " << t;
    }
  }
}

TEST(IndexerTopk, DecodeRowsAndAbsentStarts) {
  std::mt19937_64 g(10);
  const int64_t b = 3, s_q = 2, N = 300, T = b * s_q, K = 100;
  Tensor lg = test::random_tensor({T, N}, DType::f32, Device::cpu(), -10, 10);
  const std::vector<int32_t> lens = {300, 1, 150};
  Tensor out = Tensor::empty({T, K}, DType::i32);
  indexer_topk_decode(lg, test::int_tensor(lens), s_q, out);
  const std::vector<int32_t> got = test::to_ints(out);
  const float* v = static_cast<const float*>(lg.data());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t end = std::max<int64_t>(lens[static_cast<std::size_t>(t / s_q)] - s_q + t % s_q + 1, 0);
    ASSERT_EQ(std::vector<int32_t>(got.begin() + t * K, got.begin() + (t + 1) * K), ix::topk_row(v + t * N, 0, end, K))
        << "row " << t;
  }
  // No row_starts: rows start at 0.
  std::vector<int32_t> ends(static_cast<std::size_t>(T), N);
  Tensor out2 = Tensor::empty({T, K}, DType::i32);
  indexer_topk(lg, {}, test::int_tensor(ends), out2);
  const std::vector<int32_t> got2 = test::to_ints(out2);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_EQ(std::vector<int32_t>(got2.begin() + t * K, got2.begin() + (t + 1) * K), ix::topk_row(v + t * N, 0, N, K));
}

// End to end on the CPU: top-k of the reference logits equals the oracle's selection (within the
// near-tie tolerance of check_topk_row).
TEST(IndexerTopk, PipelineMatchesOracle) {
  ix::DecodeProblem p = ix::make_decode_problem({3000, 2500, 100}, 2, 16, 64, 77);
  const int64_t T = p.b * p.s_q, K = 2048;
  std::vector<double> ref, mag;
  ix::decode_oracle(p, ref, mag);
  Tensor lg = Tensor::empty({T, p.width}, DType::f32);
  indexer_logits_decode(p.q, p.weights, p.cache.cache, p.block_table, p.seq_lens_t, p.s_q, lg);
  Tensor out = Tensor::empty({T, K}, DType::i32);
  indexer_topk_decode(lg, p.seq_lens_t, p.s_q, out);
  const std::vector<int32_t> got = test::to_ints(out);
  EXPECT_EQ(ix::check_decode_topk(p, ref, mag, got, K, 4e-5), "");
}

// ---- rejected inputs: mla::Error, nothing written ---------------------------------------------

template <class F>
void expect_rejected(F&& f, const Tensor& watched, const char* what) {
  const std::vector<uint8_t> before = bytes_of(watched);
  EXPECT_THROW(f(), Error) << what;
  EXPECT_EQ(bytes_of(watched), before) << what << ": output written";
}

TEST(IndexerErrors, BadInputsWriteNothing) {
  ix::DecodeProblem p = ix::make_decode_problem({10, 20}, 1, 4, 8, 3);
  IndexerKCache& c = p.cache.cache;
  const Tensor& cs = p.cache.storage;
  Tensor k = test::random_tensor({3, 128}, DType::f32);
  expect_rejected([&] { indexer_write_k(k, test::int64_tensor({0, 1, 1}), c); }, cs, "duplicate slot");
  expect_rejected([&] { indexer_write_k(k, test::int64_tensor({0, c.num_slots()}), c); }, cs, "slot past the cache");
  expect_rejected([&] { indexer_write_k(k, test::int64_tensor({0, 1, 2, 3}), c); }, cs, "more slots than rows");
  expect_rejected([&] { indexer_write_k(test::random_tensor({3, 64}, DType::f32), test::int64_tensor({0}), c); }, cs,
                  "k not 128 wide");
  expect_rejected([&] { indexer_write_k(k, test::int64_tensor({0}), c, static_cast<IndexerScale>(7)); }, cs,
                  "bad scale mode");
  IndexerKCache narrow{cs.view().slice(2, 0, 128)};
  expect_rejected([&] { indexer_write_k(k, test::int64_tensor({0}), narrow); }, cs, "cache rows not 132 bytes");

  Tensor dk = Tensor::empty({30, 128}, DType::fp8_e4m3), ds = Tensor::empty({30}, DType::f32);
  std::memset(dk.data(), 0, dk.nbytes());
  expect_rejected([&] { indexer_gather_k(c, dk, ds, p.block_table, test::int_tensor({0, 10, 31})); }, dk,
                  "cu past dst");
  expect_rejected([&] { indexer_gather_k(c, dk, ds, p.block_table, test::int_tensor({0, 10, 9})); }, dk,
                  "cu decreasing");
  expect_rejected([&] { indexer_gather_k(c, dk, ds, p.block_table, test::int_tensor({0, 30})); }, dk,
                  "positions past the table");
  Tensor bad_bt = test::int_tensor_2d({{0, 999, 2}, {3, 4, 5}});
  expect_rejected([&] { indexer_gather_k(c, dk, ds, bad_bt, test::int_tensor({0, 20, 30})); }, dk, "bad block id");
  expect_rejected([&] { indexer_gather_k(c, dk, Tensor::empty({29}, DType::f32), p.block_table, test::int_tensor({0, 1})); },
                  dk, "dst_scale length");

  Tensor lg = test::poisoned({2, 20}, DType::f32);
  auto decode = [&](const TensorView& q, const TensorView& w, const TensorView& bt, const TensorView& sl, int64_t sq,
                    const TensorView& out) { indexer_logits_decode(q, w, c, bt, sl, sq, out); };
  expect_rejected([&] { decode(p.q, p.weights, p.block_table, test::int_tensor({10, 21}), 1, lg); }, lg,
                  "seq_len past the logits width");
  expect_rejected([&] { decode(p.q, p.weights, p.block_table, test::int_tensor({10, 20}), 2, lg); }, lg,
                  "T != b * s_q");
  expect_rejected([&] { decode(p.q, p.weights.view().slice(1, 0, 3), p.block_table, p.seq_lens_t, 1, lg); }, lg,
                  "weights heads");
  expect_rejected([&] { decode(p.q.view().as_dtype(DType::u8), p.weights, p.block_table, test::int_tensor({-1, 3}), 1, lg); },
                  lg, "negative seq_len");
  expect_rejected([&] { decode(p.q, p.weights, bad_bt, p.seq_lens_t, 1, lg); }, lg, "bad block id");
  Tensor qbf = test::random_tensor({2, 4, 128}, DType::bf16);
  expect_rejected([&] { decode(qbf, p.weights, p.block_table, p.seq_lens_t, 1, lg); }, lg, "bf16 q");

  Tensor kk = Tensor::empty({20, 128}, DType::fp8_e4m3), sc = Tensor::empty({20}, DType::f32);
  expect_rejected([&] { indexer_logits_prefill(p.q, p.weights, kk, sc, test::int_tensor({0, 0}), test::int_tensor({1, 1}),
                                               test::poisoned({2, 19}, DType::f32)); }, lg, "logits width != Tk");
  expect_rejected([&] { indexer_logits_prefill(p.q, p.weights, kk, Tensor::empty({19}, DType::f32), test::int_tensor({0, 0}),
                                               test::int_tensor({1, 1}), lg); }, lg, "k_scale length");

  Tensor out = Tensor::empty({2, 5}, DType::i32);
  fill(out, 3);
  expect_rejected([&] { indexer_topk(lg, {}, test::int_tensor({21, 3}), out); }, out, "end past N");
  expect_rejected([&] { indexer_topk(lg, test::int_tensor({-1, 0}), test::int_tensor({4, 3}), out); }, out,
                  "negative start");
  expect_rejected([&] { indexer_topk(lg, {}, test::int_tensor({2}), out); }, out, "row_ends length");
  expect_rejected([&] { indexer_topk(lg, {}, test::int_tensor({2, 2}), Tensor::empty({2, 0}, DType::i32)); }, out,
                  "k = 0");
  expect_rejected([&] { indexer_topk_decode(lg, test::int_tensor({21, 3}), 1, out); }, out, "seq_len past N");
  expect_rejected([&] { indexer_topk_decode(lg, test::int_tensor({2}), 1, out); }, out, "T != b * s_q");
}

// ---- query / key preparation ----------------------------------------------------------------

TEST(IndexerPrepare, MatchesOracle) {
  for (bool hadamard : {true, false}) {
    for (Precision prec : {Precision::reference, Precision::fast}) {
      SCOPED_TRACE(::testing::Message() << "hadamard " << hadamard << " precision " << static_cast<int>(prec));
      ix::PrepareInputs in(6, 64);
      const ix::PrepareOracle o = in.oracle(hadamard);
      Tensor codes = Tensor::empty({in.T, in.h, 128}, DType::fp8_e4m3), w = test::poisoned({in.T, in.h}, DType::f32);
      Tensor kout = test::poisoned({in.T, 128}, DType::f32);
      indexer_prepare(in.q, in.k, in.w_raw, in.positions, in.cos_sin, in.ln_w, in.ln_b, codes, w, kout, 1e-6, hadamard,
                      Context{nullptr, prec});
      const auto* cp = static_cast<const uint8_t*>(codes.data());
      int64_t mismatches = 0;
      for (std::size_t i = 0; i < o.q_scaled.size(); ++i) {
        const uint8_t want = ix::nearest_code(o.q_scaled[i]);
        if (cp[i] == want) continue;
        ++mismatches;  // fp32 arithmetic may cross a rounding boundary: then the neighbouring code
        ASSERT_NE(prec, Precision::reference) << "code " << i;
        ASSERT_EQ(std::abs(static_cast<int>(cp[i] & 0x7f) - static_cast<int>(want & 0x7f)), 1) << "code " << i;
      }
      EXPECT_LE(mismatches, static_cast<int64_t>(o.q_scaled.size() / 500));
      const std::vector<double> wg = test::to_doubles(w), kg = test::to_doubles(kout);
      for (std::size_t i = 0; i < o.weights.size(); ++i)
        ASSERT_NEAR(wg[i], o.weights[i], 1e-6 * std::fabs(o.weights[i])) << "weight " << i;
      for (std::size_t i = 0; i < o.k.size(); ++i) ASSERT_NEAR(kg[i], o.k[i], 2e-6 * 4) << "k " << i;
    }
  }
}

TEST(IndexerPrepare, BadInputsWriteNothing) {
  ix::PrepareInputs in(3, 4);
  Tensor codes = Tensor::empty({3, 4, 128}, DType::fp8_e4m3), w = test::poisoned({3, 4}, DType::f32);
  Tensor kout = test::poisoned({3, 128}, DType::f32);
  std::memset(codes.data(), 0, codes.nbytes());
  auto run = [&](const TensorView& pos, const TensorView& cs, const TensorView& wr, double eps) {
    indexer_prepare(in.q, in.k, wr, pos, cs, in.ln_w, in.ln_b, codes, w, kout, eps);
  };
  expect_rejected([&] { run(test::int_tensor({0, 40, 1}), in.cos_sin, in.w_raw, 1e-6); }, codes, "position past the table");
  expect_rejected([&] { run(test::int_tensor({0, -1, 1}), in.cos_sin, in.w_raw, 1e-6); }, kout, "negative position");
  expect_rejected([&] { run(in.positions, in.cos_sin.view().slice(1, 0, 32), in.w_raw, 1e-6); }, codes, "cos_sin width");
  expect_rejected([&] { run(in.positions, in.cos_sin, in.w_raw.view().slice(1, 0, 3), 1e-6); }, w, "weights_raw heads");
  expect_rejected([&] { run(in.positions, in.cos_sin, in.w_raw, 0.0); }, codes, "eps 0");
}

}  // namespace
}  // namespace mla
