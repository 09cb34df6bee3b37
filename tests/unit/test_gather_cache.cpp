// SPDX-License-Identifier: Apache-2.0
// gather_cache, cp_gather_cache and upconvert_ds_mla (semantics §5) on the CPU: every format and
// page size, unaligned starts, zero-length requests, out-of-table blocks (never read, dst rows left
// untouched), strided views, and rejected inputs that must write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "cache_test_util.h"
#include "core/numeric.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

// A cache whose every slot holds a written random token, and a batch of requests over it.
struct Batch {
  test::PatternCache pc;
  std::vector<int32_t> lens, starts;
  Tensor block_table;  // [B, max_blocks] with one spare column per row naming a valid, unread block
  std::vector<int32_t> table_ids;  // block_table's entries, row-major
  int64_t total() const { return std::accumulate(lens.begin(), lens.end(), int64_t{0}); }
  std::vector<int32_t> cu() const {
    std::vector<int32_t> c{0};
    for (int32_t l : lens) c.push_back(c.back() + l);
    return c;
  }
  // Cache slot of token i of request b (position starts[b] + i).
  int64_t slot(int b, int64_t i) const {
    const int64_t p = starts[b] + i, page = pc.cache.page_size();
    return static_cast<int64_t>(table_ids[b * block_table.size(1) + p / page]) * page + p % page;
  }
};

Batch make_batch(CacheFormat f, int64_t page, std::vector<int32_t> lens, std::vector<int32_t> starts,
                 int64_t layers = 1) {
  Batch bt;
  bt.lens = std::move(lens);
  bt.starts = std::move(starts);
  const int B = static_cast<int>(bt.lens.size());
  std::vector<int64_t> need(B);
  int64_t max_need = 0, sum_need = 0;
  for (int b = 0; b < B; ++b) {
    need[b] = (bt.starts[b] + bt.lens[b] + page - 1) / page;
    max_need = std::max(max_need, need[b]);
    sum_need += need[b];
  }
  const int64_t num_blocks = sum_need + 2;
  bt.pc = test::pattern_cache(f, num_blocks, page, 0.03f, layers, layers - 1);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), test::rng());
  std::vector<std::vector<int32_t>> rows(B, std::vector<int32_t>(max_need + 1, static_cast<int32_t>(num_blocks - 1)));
  int64_t next = 0;
  for (int b = 0; b < B; ++b)
    for (int64_t j = 0; j < need[b]; ++j) rows[b][j] = ids[next++];
  bt.block_table = test::int_tensor_2d(rows);
  bt.table_ids = test::to_ints(bt.block_table);
  const int64_t n = bt.pc.cache.num_slots();
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  write_cache(test::random_tensor({n, 512}, DType::bf16, Device::cpu(), -3, 3),
              test::random_tensor({n, 64}, DType::bf16, Device::cpu(), -3, 3), test::int64_tensor(all), bt.pc.cache);
  return bt;
}

// Expected value of a dst element: the decoded cache value stored to dst's dtype.
double stored(double v, DType t) {
  return t == DType::bf16 ? num::round_bf16(static_cast<float>(v)) : static_cast<double>(static_cast<float>(v));
}

using GatherParam = std::tuple<CacheFormat, int64_t>;
class Gather : public ::testing::TestWithParam<GatherParam> {};

TEST_P(Gather, DequantisesRowsWithUnalignedStartsAndEmptyRequests) {
  const auto [format, page] = GetParam();
  test::reseed(100 + page + static_cast<int>(format));
  Batch bt = make_batch(format, page, {5, 0, 37, 20}, {3, 9, 17, 1});
  const int64_t tot = bt.total();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t D : {576, 512}) {
      Tensor dst = test::poisoned({tot + 3, D}, dt);  // 3 rows past cu[B] must stay untouched
      gather_cache(bt.pc.cache, dst, bt.block_table, test::int_tensor(bt.cu()), test::int_tensor(bt.starts));
      const auto got = test::to_doubles(dst);
      int64_t r = 0;
      for (int b = 0; b < 4; ++b)
        for (int64_t i = 0; i < bt.lens[b]; ++i, ++r) {
          const auto want = test::decode_row(bt.pc.cache, bt.slot(b, i));
          for (int64_t c = 0; c < D; ++c)
            ASSERT_EQ(got[r * D + c], stored(want[c], dt)) << "request " << b << " token " << i << " col " << c;
        }
      for (int64_t k = r * D; k < (tot + 3) * D; ++k) ASSERT_TRUE(std::isnan(got[k])) << "row " << k / D;
    }
  }
}

TEST_P(Gather, CpGatherCopiesRawBytes) {
  const auto [format, page] = GetParam();
  test::reseed(200 + page + static_cast<int>(format));
  Batch bt = make_batch(format, page, {0, 11, 4}, {5, 2, 30});
  const int64_t tot = bt.total(), E = bt.pc.cache.data.size(2);
  Tensor dst = Tensor::empty({tot + 1, E}, bt.pc.cache.data.dtype);
  std::memset(dst.data(), 0x5a, dst.nbytes());
  cp_gather_cache(bt.pc.cache, dst, bt.block_table, test::int_tensor(bt.cu()), test::int_tensor(bt.starts));
  const int64_t row_bytes = cache_entry_bytes(format);
  const auto* d = static_cast<const uint8_t*>(dst.data());
  int64_t r = 0;
  for (int b = 0; b < 3; ++b)
    for (int64_t i = 0; i < bt.lens[b]; ++i, ++r)
      EXPECT_EQ(std::memcmp(d + r * row_bytes, test::row_ptr(bt.pc.cache, bt.slot(b, i)), row_bytes), 0)
          << "request " << b << " token " << i;
  for (int64_t k = r * row_bytes; k < (tot + 1) * row_bytes; ++k) ASSERT_EQ(d[k], 0x5a);
}

INSTANTIATE_TEST_SUITE_P(FormatsAndPages, Gather,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8,
                                                              CacheFormat::fp8_ds_mla),
                                            ::testing::Values(1, 16, 64)));

TEST(GatherEdges, OutOfTableBlocksAreNeverReadAndRowsStayUntouched) {
  // page 4, table of 2 columns viewed inside a 4-column buffer whose extra columns hold ids far
  // outside the cache: positions 8.. of the request lie beyond the table and must not be read.
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    test::reseed(300);
    Batch bt = make_batch(f, 4, {3, 12}, {0, 2});
    std::vector<std::vector<int32_t>> wide = {{test::to_ints(bt.block_table)[0], 0, 1 << 30, 1 << 30},
                                              {test::to_ints(bt.block_table)[3], test::to_ints(bt.block_table)[4],
                                               1 << 30, -5}};
    Tensor table = test::int_tensor_2d(wide);
    const TensorView bt2 = table.view().slice(1, 0, 2);
    auto expect_rows = [&](const std::vector<double>& got, int64_t D, bool raw) {
      // request 1 = rows 3..14, positions 2..13: positions 2..7 (rows 3..8) read, rows 9..14 untouched.
      for (int64_t r = 9; r < 15; ++r)
        for (int64_t c = 0; c < D; ++c)
          ASSERT_TRUE(raw ? got[r * D + c] == 0x5a : std::isnan(got[r * D + c])) << "row " << r;
      for (int64_t r = 3; r < 9; ++r)
        ASSERT_FALSE(raw ? got[r * D] == 0x5a && got[r * D + 1] == 0x5a : std::isnan(got[r * D])) << "row " << r;
    };
    Tensor dst = test::poisoned({15, 576}, DType::bf16);
    gather_cache(bt.pc.cache, dst, bt2, test::int_tensor({0, 3, 15}), test::int_tensor(bt.starts));
    expect_rows(test::to_doubles(dst), 576, false);
    const int64_t E = bt.pc.cache.data.size(2);
    Tensor raw = Tensor::empty({15, E}, bt.pc.cache.data.dtype);
    std::memset(raw.data(), 0x5a, raw.nbytes());
    cp_gather_cache(bt.pc.cache, raw, bt2, test::int_tensor({0, 3, 15}), test::int_tensor(bt.starts));
    if (f == CacheFormat::fp8_ds_mla) {
      expect_rows(test::to_doubles(raw), E, true);
      Tensor up = test::poisoned({15, 576}, DType::bf16);
      upconvert_ds_mla(bt.pc.cache, up, bt2, test::int_tensor({0, 3}), test::int_tensor(bt.starts));
      expect_rows(test::to_doubles(up), 576, false);
    }
  }
}

TEST(GatherEdges, UpconvertMatchesGatherOfTheSameRows) {
  for (int64_t page : {1, 16, 64}) {
    test::reseed(400 + page);
    Batch bt = make_batch(CacheFormat::fp8_ds_mla, page, {7, 0, 13, 11}, {5, 3, 60, 2});
    // Workspace starts re-based at 2: rows 0 and 1 belong to no request.
    const std::vector<int32_t> ws = {2, 9, 9, 22};
    const int64_t tot = 33;
    Tensor up = test::poisoned({tot, 576}, DType::bf16), ref = test::poisoned({tot, 576}, DType::bf16);
    upconvert_ds_mla(bt.pc.cache, up, bt.block_table, test::int_tensor(ws), test::int_tensor(bt.starts));
    gather_cache(bt.pc.cache, ref.view().slice(0, 2, tot), bt.block_table, test::int_tensor({0, 7, 7, 20, 31}),
                 test::int_tensor(bt.starts));
    EXPECT_EQ(std::memcmp(up.data(), ref.data(), up.nbytes()), 0) << "page " << page;
    const auto got = test::to_doubles(up);
    for (int64_t k = 0; k < 2 * 576; ++k) ASSERT_TRUE(std::isnan(got[k]));
    // Rope columns are bit copies of the cache's bf16 rope.
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(up.data()) + (2 * 576 + 512) * 2, 2);
    EXPECT_EQ(0, std::memcmp(&h, test::row_ptr(bt.pc.cache, bt.slot(0, 0)) + 528, 2));
  }
}

TEST(GatherEdges, StridedViewsAndEmptyCalls) {
  test::reseed(500);
  Batch bt = make_batch(CacheFormat::fp8, 16, {9, 4}, {30, 0}, /*layers=*/2);  // cache = layer 1 of 2
  Tensor buf = test::poisoned({13, 700}, DType::f32);
  const TensorView dst = buf.view().slice(1, 100, 676);  // row stride 700
  Tensor starts_buf = test::int_tensor({30, 99, 0, 99});
  TensorView strided_starts = starts_buf.view();  // every other element: {30, 0}
  strided_starts.shape[0] = 2;
  strided_starts.stride[0] = 2;
  gather_cache(bt.pc.cache, dst, bt.block_table, test::int_tensor(bt.cu()), strided_starts);
  const auto got = test::to_doubles(dst);
  for (int64_t r = 0; r < 13; ++r) {
    const auto want = test::decode_row(bt.pc.cache, r < 9 ? bt.slot(0, r) : bt.slot(1, r - 9));
    for (int c = 0; c < 576; ++c) ASSERT_EQ(got[r * 576 + c], static_cast<float>(want[c])) << r << " " << c;
  }
  const auto around = test::to_doubles(buf.view().slice(1, 0, 100));
  for (double v : around) ASSERT_TRUE(std::isnan(v));
  // TOT = 0 and all-empty requests are no-ops.
  Tensor none = Tensor::empty({0, 576}, DType::f32);
  gather_cache(bt.pc.cache, none, bt.block_table, test::int_tensor({0, 0, 0}));
  Tensor two = test::poisoned({2, 576}, DType::f32);
  gather_cache(bt.pc.cache, two, bt.block_table, test::int_tensor({0, 0, 0}), test::int_tensor({3, 4}));
  for (double v : test::to_doubles(two)) ASSERT_TRUE(std::isnan(v));
}

TEST(GatherEdges, NarrowCacheRows) {
  // d_qk 320 (L 256 + R 64) bf16 and fp8 caches: written, then gathered whole or latent-only.
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    test::reseed(550);
    CacheBuffer cb = allocate_cache(f, 3, 2, Device::cpu(), 0.25f, 320, 64);
    Tensor kv_c = test::random_tensor({6, 256}, DType::f32), k_pe = test::random_tensor({6, 64}, DType::f32);
    write_cache(kv_c, k_pe, test::int64_tensor({4, 5, 0, 1, 2, 3}), cb.cache);
    const Tensor table = test::int_tensor_2d({{2, 0, 1}}), cu = test::int_tensor({0, 5});
    for (int64_t D : {320, 256}) {
      Tensor dst = test::poisoned({5, D}, DType::f64);
      gather_cache(cb.cache, dst, table, cu, test::int_tensor({1}));
      const auto got = test::to_doubles(dst);
      const auto x = test::to_doubles(kv_c), r = test::to_doubles(k_pe);
      const int64_t tbl[3] = {2, 0, 1};
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t c = 0; c < D; ++c) {
          const int64_t p = 1 + i, slot = tbl[p / 2] * 2 + p % 2, tok = (slot + 2) % 6;  // slot (t + 4) % 6 holds t
          const double v = c < 256 ? x[tok * 256 + c] : r[tok * 64 + c - 256];
          const double want = f == CacheFormat::bf16 ? num::round_bf16(static_cast<float>(v))
                                                     : num::round_e4m3(static_cast<float>(v) / 0.25f) * 0.25;
          ASSERT_EQ(got[i * D + c], want) << to_string(f) << " row " << i << " col " << c;
        }
    }
  }
}

TEST(GatherErrors, BadInputsThrowAndWriteNothing) {
  test::reseed(600);
  Batch bt = make_batch(CacheFormat::fp8_ds_mla, 4, {3, 5}, {1, 2});
  Tensor dst = test::poisoned({8, 576}, DType::bf16);
  Tensor raw = Tensor::empty({8, 656}, DType::u8);
  std::memset(raw.data(), 0x5a, raw.nbytes());
  const Tensor cu = test::int_tensor({0, 3, 8}), starts = test::int_tensor(bt.starts);
  auto untouched = [&] {
    for (double v : test::to_doubles(dst))
      if (!std::isnan(v)) return false;
    for (double v : test::to_doubles(raw))
      if (v != 0x5a) return false;
    return true;
  };
  auto expect_rejected = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_TRUE(untouched()) << what;
  };
  const KVCache& c = bt.pc.cache;
  const TensorView table = bt.block_table;
  // Block table whose read entry of request 1 lies outside the cache (or is negative).
  auto table_with = [&](int32_t id) {
    auto ids = test::to_ints(table);
    ids[table.size(1) + 1] = id;
    std::vector<std::vector<int32_t>> rows(2);
    rows[0].assign(ids.begin(), ids.begin() + table.size(1));
    rows[1].assign(ids.begin() + table.size(1), ids.end());
    return test::int_tensor_2d(rows);
  };
  const Tensor bad_id = table_with(static_cast<int32_t>(c.num_blocks())), neg_id = table_with(-1);
  Tensor table64 = Tensor::zeros({2, table.size(1)}, DType::i64);
  expect_rejected([&] { gather_cache(c, dst, table, test::int_tensor({0, 4, 3})); }, "cu decreasing");
  expect_rejected([&] { gather_cache(c, dst, table, test::int_tensor({0, 3, 9})); }, "cu past TOT");
  expect_rejected([&] { gather_cache(c, dst, table, test::int64_tensor({0, 3, 8})); }, "cu i64");
  expect_rejected([&] { gather_cache(c, dst, bad_id, cu, starts); }, "block id == num_blocks");
  expect_rejected([&] { gather_cache(c, dst, neg_id, cu, starts); }, "negative block id");
  expect_rejected([&] { gather_cache(c, dst, table64, cu); }, "block_table i64");
  expect_rejected([&] { gather_cache(c, dst, table, cu, test::int_tensor({1, -2})); }, "negative seq_start");
  expect_rejected([&] { gather_cache(c, dst, table, cu, test::int_tensor({1})); }, "seq_starts length");
  expect_rejected([&] { gather_cache(c, dst, table, test::int_tensor({0, 3, 5, 8})); }, "table rows < B");
  expect_rejected([&] { gather_cache(c, dst.view().slice(1, 0, 100), table, cu); }, "dst width");
  expect_rejected([&] { gather_cache(c, raw, table, cu); }, "dst dtype u8");
  expect_rejected([&] { gather_cache(c, test::on_fake_cuda(dst), table, cu); }, "dst device");
  expect_rejected([&] { gather_cache(c, dst, table, test::on_fake_cuda(cu)); }, "cu device");
  expect_rejected([&] { cp_gather_cache(c, dst, table, cu); }, "cp dst dtype");
  expect_rejected([&] { cp_gather_cache(c, raw.view().slice(1, 0, 576), table, cu); }, "cp dst width");
  expect_rejected([&] { cp_gather_cache(c, raw, bad_id, cu, starts); }, "cp block id");
  expect_rejected([&] { upconvert_ds_mla(c, dst.view().slice(1, 0, 512), table, test::int_tensor({0, 3})); },
                  "upconvert dst width");
  expect_rejected([&] { upconvert_ds_mla(c, dst, table, test::int_tensor({4, 3})); }, "workspace starts decreasing");
  expect_rejected([&] { upconvert_ds_mla(c, dst, table, test::int_tensor({0, 9})); }, "workspace start past TOT");
  expect_rejected([&] { upconvert_ds_mla(c, dst, bad_id, test::int_tensor({0, 3}), starts); }, "upconvert block id");
  auto bf = test::pattern_cache(CacheFormat::bf16, 4, 4);
  expect_rejected([&] { upconvert_ds_mla(bf.cache, dst, table, test::int_tensor({0, 3})); }, "upconvert bf16 cache");
  // A junk id in a table column that no position reads is not an error (request 0 reads column 0 only).
  auto ids = bt.table_ids;
  ids[1] = 1 << 30;
  Tensor junk = test::int_tensor_2d({std::vector<int32_t>(ids.begin(), ids.begin() + table.size(1)),
                                     std::vector<int32_t>(ids.begin() + table.size(1), ids.end())});
  EXPECT_NO_THROW(gather_cache(c, dst, junk, cu, starts));
  Tensor ref = test::poisoned({8, 576}, DType::bf16);
  gather_cache(c, ref, table, cu, starts);
  EXPECT_EQ(std::memcmp(dst.data(), ref.data(), dst.nbytes()), 0);
}

}  // namespace
}  // namespace mla
