// SPDX-License-Identifier: Apache-2.0
// sparse_mqa on the CPU against a float64 formula: invalid (negative, >= num_slots), duplicate and
// beyond-topk_length indices, lonely rows (out 0, lse -inf), every cache format and page size.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "attention_test_util.h"
#include "cpu/attention_core.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

struct SparseInputs {
  std::vector<std::vector<int32_t>> idx;  // [T][topk]
  std::vector<int32_t> len;               // topk_length
};

// Per token: a random mix of valid rows (some duplicated), -1, other negatives, indices >= num_slots and
// random values past topk_length; token 1 is lonely by invalid entries, token 2 by topk_length 0.
SparseInputs make_indices(int64_t t, int64_t topk, int64_t num_slots, const std::vector<int64_t>& valid_rows) {
  SparseInputs s;
  std::uniform_int_distribution<std::size_t> pick(0, valid_rows.size() - 1);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int64_t> len_d(1, topk);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int32_t> row;
    for (int64_t x = 0; x < topk; ++x) {
      const int k = kind(test::rng());
      if (i == 1)
        row.push_back(k < 5 ? -1 : static_cast<int32_t>(num_slots + k));
      else if (k == 0)
        row.push_back(-1);
      else if (k == 1)
        row.push_back(-7);
      else if (k == 2)
        row.push_back(static_cast<int32_t>(num_slots));
      else if (k == 3 && x > 0)
        row.push_back(row[static_cast<std::size_t>(x - 1)] >= 0 ? row[x - 1] : 0);  // duplicate
      else
        row.push_back(static_cast<int32_t>(valid_rows[pick(test::rng())]));
    }
    s.idx.push_back(row);
    s.len.push_back(i == 2 ? 0 : static_cast<int32_t>(len_d(test::rng())));
  }
  return s;
}

void run_sparse(CacheFormat format, int64_t page, int64_t h, uint64_t seed) {
  test::reseed(seed);
  const int64_t t = 6, topk = 80, num_blocks = 5, d = 576, dv = 512;
  CacheBuffer cb = test::nan_cache(format, num_blocks, page);
  const int64_t num_slots = cb.cache.num_slots();
  // Half of the rows hold data; the other half stays NaN and is never indexed.
  std::vector<int64_t> valid_rows;
  for (int64_t s = 0; s < num_slots; s += 2) {
    test::randomize_row(cb.cache, s);
    valid_rows.push_back(s);
  }
  const SparseInputs in = make_indices(t, topk, num_slots, valid_rows);
  const Tensor indices = test::int_tensor_2d(in.idx), topk_len = test::int_tensor(in.len);
  const double scale = 0.0722;

  for (bool use_len : {true, false}) {
    Tensor q16 = test::random_tensor({t, h, d}, DType::bf16);
    Tensor q64 = Tensor::empty({t, h, d}, DType::f64);
    const std::vector<double> qv = test::to_doubles(q16.view());
    std::copy(qv.begin(), qv.end(), static_cast<double*>(q64.data()));

    test::OracleOut ref;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<std::vector<double>> rows;
      const int64_t len = use_len ? in.len[static_cast<std::size_t>(i)] : topk;
      for (int64_t x = 0; x < len; ++x) {
        const int64_t r = in.idx[static_cast<std::size_t>(i)][static_cast<std::size_t>(x)];
        if (r >= 0 && r < num_slots) rows.push_back(test::decode_row(cb.cache, r));
      }
      std::vector<const double*> keys;
      for (const auto& r : rows) keys.push_back(r.data());
      for (int64_t hh = 0; hh < h; ++hh)
        test::oracle_attend(qv.data() + (i * h + hh) * d, keys, d, keys, dv, scale, ref);
    }
    const TensorView len_view = use_len ? topk_len.view() : TensorView{};

    Tensor out64 = test::poisoned({t, h, dv}, DType::f64), lse = test::poisoned({t, h}, DType::f32);
    sparse_mqa(q64, cb.cache, indices, len_view, out64, lse, scale, Context{nullptr, Precision::reference});
    EXPECT_EQ(test::check_close(test::to_doubles(out64.view()), ref.out, DType::f64, 1e-12), "") << "reference";
    EXPECT_EQ(test::check_close(test::to_doubles(lse.view()), test::as_f32(ref.lse), DType::f32), "") << "reference";
    // Lonely tokens: 1 (only invalid entries) and, with topk_length, 2.
    EXPECT_EQ(test::to_doubles(lse.view())[static_cast<std::size_t>(1 * h)], -INFINITY);
    if (use_len) {
      EXPECT_EQ(test::to_doubles(lse.view())[static_cast<std::size_t>(2 * h)], -INFINITY);
    }

    Tensor out16 = test::poisoned({t, h, dv}, DType::bf16);
    fill(lse.view(), NAN);
    sparse_mqa(q16, cb.cache, indices, len_view, out16, lse, scale, Context{});
    // float32 accumulation: absolute error of a few float ulps of the largest output.
    EXPECT_EQ(test::check_close(test::to_doubles(out16.view()), ref.out, DType::bf16, 1e-6), "") << "fast";
    EXPECT_EQ(test::check_close(test::to_doubles(lse.view()), test::as_f32(ref.lse), DType::f32, 1e-6), "") << "fast";
  }
}

TEST(AttentionSparse, AllFormatsAndPages) {
  uint64_t seed = 100;
  for (CacheFormat f : test::kAllFormats)
    for (int64_t page : {1, 16, 64})
      for (int64_t h : {1, 16}) {
        SCOPED_TRACE(std::string(to_string(f)) + " page " + std::to_string(page) + " h " + std::to_string(h));
        run_sparse(f, page, h, seed++);
      }
}

// Long top-k rows are split into index ranges merged afterwards (whatever the thread count); tokens with
// few and with many valid indices share a call.
TEST(AttentionSparse, SplitIndexRangesMatchOracle) {
  test::reseed(7);
  const int64_t t = 2, h = 16, topk = 1200, d = 576, dv = 512;
  CacheBuffer cb = test::nan_cache(CacheFormat::fp8_ds_mla, 12, 64);
  for (int64_t s = 0; s < cb.cache.num_slots(); ++s) test::randomize_row(cb.cache, s);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(cb.cache.num_slots() - 1));
  std::vector<std::vector<int32_t>> idx(t, std::vector<int32_t>(topk, -1));
  for (int64_t x = 0; x < topk; ++x) idx[0][x] = pick(test::rng());
  for (int64_t x = 0; x < 5; ++x) idx[1][x] = pick(test::rng());
  Tensor q = test::random_tensor({t, h, d}, DType::f64);
  const std::vector<double> qv = test::to_doubles(q.view());
  test::OracleOut ref;
  for (int64_t i = 0; i < t; ++i) {
    std::vector<std::vector<double>> rows;
    for (int32_t r : idx[i])
      if (r >= 0) rows.push_back(test::decode_row(cb.cache, r));
    std::vector<const double*> keys;
    for (const auto& r : rows) keys.push_back(r.data());
    for (int64_t hh = 0; hh < h; ++hh) test::oracle_attend(qv.data() + (i * h + hh) * d, keys, d, keys, dv, 0.05, ref);
  }
  Tensor out = test::poisoned({t, h, dv}, DType::f64), lse = test::poisoned({t, h}, DType::f32);
  sparse_mqa(q, cb.cache, test::int_tensor_2d(idx), {}, out, lse, 0.05, Context{nullptr, Precision::reference});
  EXPECT_EQ(test::check_close(test::to_doubles(out.view()), ref.out, DType::f64, 1e-12), "");
  EXPECT_EQ(test::check_close(test::to_doubles(lse.view()), test::as_f32(ref.lse), DType::f32), "");
}

// The AVX2 and baseline builds of the kernels (when this CPU has wider ones).
TEST(AttentionSparse, EveryIsaLevel) {
  const cpu::attn::Isa best = cpu::attn::best_isa();
  for (int level = 0; level < static_cast<int>(best); ++level) {
    SCOPED_TRACE("isa " + std::to_string(level));
    cpu::attn::set_isa(static_cast<cpu::attn::Isa>(level));
    run_sparse(CacheFormat::fp8, 16, 16, 200 + level);
    run_sparse(CacheFormat::bf16, 64, 1, 210 + level);
  }
  cpu::attn::set_isa(best);
}

// A duplicated index counts twice: two copies of row A against one of row B weigh A by 2/3 when both
// have equal logits (q orthogonal to both rows).
TEST(AttentionSparse, DuplicatesCountTwice) {
  CacheBuffer cb = test::nan_cache(CacheFormat::bf16, 1, 4);
  Tensor rows = Tensor::zeros({2, 576}, DType::f64);
  auto* rv = static_cast<double*>(rows.data());
  rv[0] = 3.0;        // row 0: value 3 in column 0
  rv[576 + 1] = 6.0;  // row 1: value 6 in column 1
  for (int r = 0; r < 2; ++r)
    for (int x = 0; x < 576; ++x)
      num::store(const_cast<uint8_t*>(test::row_ptr(cb.cache, r)) + 2 * x, DType::bf16, rv[r * 576 + x]);
  Tensor q = Tensor::zeros({1, 1, 576}, DType::f64);
  static_cast<double*>(q.data())[575] = 1.0;  // rope column: zero in both rows -> equal logits
  const Tensor idx = test::int_tensor_2d({{0, 1, 0, -1}});
  Tensor out = test::poisoned({1, 1, 512}, DType::f64), lse = test::poisoned({1, 1}, DType::f32);
  sparse_mqa(q, cb.cache, idx, {}, out, lse, 1.0, Context{nullptr, Precision::reference});
  const std::vector<double> o = test::to_doubles(out.view());
  EXPECT_NEAR(o[0], 2.0, 1e-12);  // 3 * 2/3
  EXPECT_NEAR(o[1], 2.0, 1e-12);  // 6 * 1/3
  EXPECT_NEAR(test::to_doubles(lse.view())[0], std::log(3.0), 1e-6);
}

}  // namespace
}  // namespace mla
