// SPDX-License-Identifier: Apache-2.0
// convert_topk_indices (semantics §11.3) on the CPU: the worked cases, workspace rows (re-zeroed per
// chunk, no block-table bound check), block_stride_rows, valid counts, and rejected inputs.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "cache_test_util.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr int32_t kUnwritten = -77;

Tensor filled_i32(std::initializer_list<int64_t> shape, int32_t v) {
  Tensor t = Tensor::empty(shape, DType::i32);
  fill(t, v);
  return t;
}

// page 4, three requests of three blocks each.
const std::vector<std::vector<int32_t>> kTable = {{5, 2, 7}, {1, 0, 3}, {4, 6, 8}};

TEST(TopkConvert, CacheRowsAndWorkspaceRows) {
  // Tokens 0-1 are decodes (cache rows); tokens 2-5 are prefills of local prefill requests 0-3 with
  // seq_lens [10, 15, 20, 5] split into chunks [0, 2) and [2, 4): exclusive cumsum re-zeroed per
  // chunk gives workspace starts [0, 10, 0, 20] (§11.5). req_id of workspace tokens is not read.
  const std::vector<std::vector<int32_t>> idx = {
      {0, 5, 11, 12, -1, 3, 100, -7},     // req 0: blocks 5, 2, 7; 12 is block 3 (outside the table)
      {1, 4, 9, -1, -1, -1, -1, -1},      // req 2: blocks 4, 6, 8
      {0, 9, -1, 1000, -1, -1, -1, -1},   // pid 0: 1000 is far past the table: no bound check [PIN]
      {14, 0, -1, -1, -1, -1, -1, -1},    // pid 1, start 10
      {19, 7, -1, -1, -1, -1, -1, -1},    // pid 2, start 0
      {4, 0, -1, -1, -1, -1, -1, -2}};    // pid 3, start 20
  const std::vector<std::vector<int32_t>> want4 = {
      {20, 9, 31, -1, -1, 23, -1, -1}, {17, 24, 33, -1, -1, -1, -1, -1}, {0, 9, -1, 1000, -1, -1, -1, -1},
      {24, 10, -1, -1, -1, -1, -1, -1}, {19, 7, -1, -1, -1, -1, -1, -1}, {24, 20, -1, -1, -1, -1, -1, -1}};
  Tensor out = filled_i32({6, 8}, kUnwritten), valid = filled_i32({6}, kUnwritten);
  convert_topk_indices(test::int_tensor({0, 2, 99, 99, 99, 99}), test::int_tensor_2d(kTable),
                       test::int_tensor_2d(idx), out, 4, 0, test::int_tensor({-1, -1, 0, 1, 2, 3}),
                       test::int_tensor({0, 10, 0, 20}), valid);
  const auto o = test::to_ints(out);
  for (int t = 0; t < 6; ++t)
    EXPECT_EQ(std::vector<int32_t>(o.begin() + 8 * t, o.begin() + 8 * t + 8), want4[t]) << "token " << t;
  EXPECT_EQ(test::to_ints(valid), (std::vector<int32_t>{4, 3, 3, 2, 2, 2}));

  // block_stride_rows 10 (page 4 inside a flat row view whose pages are 10 rows apart), no workspace:
  // every token maps through its request's block table.
  Tensor out2 = filled_i32({6, 8}, kUnwritten);
  convert_topk_indices(test::int_tensor({0, 2, 0, 1, 2, 1}), test::int_tensor_2d(kTable), test::int_tensor_2d(idx),
                       out2, 4, 10);
  const auto o2 = test::to_ints(out2);
  EXPECT_EQ(std::vector<int32_t>(o2.begin(), o2.begin() + 8), (std::vector<int32_t>{50, 21, 73, -1, -1, 53, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(o2.begin() + 16, o2.begin() + 24),
            (std::vector<int32_t>{50, 71, -1, -1, -1, -1, -1, -1}));  // 1000: block 250, outside the table
}

TEST(TopkConvert, RandomAgainstFormula) {
  for (int64_t page : {1, 16, 64}) {
    test::reseed(800 + page);
    const int64_t T = 9, K = 128, R = 3, max_blocks = 5, stride = page == 16 ? 48 : 0;
    std::uniform_int_distribution<int32_t> blk(0, 1000), pos(-3, static_cast<int32_t>(max_blocks * page + 4)),
        req(0, R - 1);
    std::vector<std::vector<int32_t>> table(R, std::vector<int32_t>(max_blocks)), idx(T, std::vector<int32_t>(K));
    std::vector<int32_t> req_id(T);
    for (auto& r : table)
      for (auto& b : r) b = blk(test::rng());
    for (int64_t t = 0; t < T; ++t) {
      req_id[t] = req(test::rng());
      for (auto& i : idx[t]) i = pos(test::rng());
    }
    Tensor out = filled_i32({T, K}, kUnwritten), valid = filled_i32({T}, kUnwritten);
    convert_topk_indices(test::int_tensor(req_id), test::int_tensor_2d(table), test::int_tensor_2d(idx), out, page,
                         stride, {}, {}, valid);
    const auto o = test::to_ints(out), v = test::to_ints(valid);
    const int64_t rows = stride ? stride : page;
    for (int64_t t = 0; t < T; ++t) {
      int32_t n = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t i = idx[t][k];
        const int64_t want = i < 0 || i / page >= max_blocks ? -1 : table[req_id[t]][i / page] * rows + i % page;
        ASSERT_EQ(o[t * K + k], want) << "page " << page << " token " << t << " k " << k;
        n += want >= 0;
      }
      EXPECT_EQ(v[t], n);
    }
  }
}

TEST(TopkConvert, StridedViewsAndEmptyBatch) {
  // indices and out as column ranges of wider buffers; out's spare columns untouched.
  Tensor idx_buf = test::int_tensor_2d({{9, 0, 1, 2, 9}, {9, 5, -1, 8, 9}});
  Tensor out_buf = filled_i32({2, 6}, kUnwritten);
  convert_topk_indices(test::int_tensor({1, 0}), test::int_tensor_2d(kTable), idx_buf.view().slice(1, 1, 4),
                       out_buf.view().slice(1, 2, 5), 4);
  EXPECT_EQ(test::to_ints(out_buf), (std::vector<int32_t>{kUnwritten, kUnwritten, 4, 5, 6, kUnwritten,  //
                                                          kUnwritten, kUnwritten, 9, -1, 28, kUnwritten}));
  Tensor none = Tensor::empty({0, 8}, DType::i32);
  EXPECT_NO_THROW(convert_topk_indices(test::int_tensor({}), test::int_tensor_2d(kTable), none, none, 4));
}

// Issue 14: rows past int32 were wrapped into small (valid-looking) rows of other blocks. The CPU front
// end sees the values and refuses (nothing written); CUDA launches cannot read device values before the
// kernel, so the kernel writes -1 (invalid) for them (both backends clamp; the GPU test checks CUDA).
TEST(TopkConvert, RowsPastInt32AreRefused) {
  const int64_t stride = int64_t(1) << 30;  // block 2 starts at row 2^31: not representable
  Tensor out = filled_i32({1, 4}, kUnwritten);
  EXPECT_THROW(convert_topk_indices(test::int_tensor({0}), test::int_tensor_2d({{0, 1, 2}}),
                                    test::int_tensor_2d({{1, 5, 9, -1}}), out, 4, stride),
               Error);
  EXPECT_EQ(test::to_ints(out), std::vector<int32_t>(4, kUnwritten));
  convert_topk_indices(test::int_tensor({0}), test::int_tensor_2d({{0, 1, 2}}), test::int_tensor_2d({{1, 5, -1, -1}}),
                       out, 4, stride);  // blocks 0 and 1 still fit
  EXPECT_EQ(test::to_ints(out), (std::vector<int32_t>{1, int32_t(stride) + 1, -1, -1}));
  // A stride past int32 is refused whatever the values.
  Tensor out3 = filled_i32({1, 4}, kUnwritten);
  EXPECT_THROW(convert_topk_indices(test::int_tensor({0}), test::int_tensor_2d({{0}}),
                                    test::int_tensor_2d({{1, -1, -1, -1}}), out3, 4, int64_t(1) << 40),
               Error);
  EXPECT_EQ(test::to_ints(out3), std::vector<int32_t>(4, kUnwritten));
}

// Issue 14: with seq_lens, positions at or past the token's request length are invalid (-1), cache and
// workspace tokens alike, and their block-table columns are never looked at (garbage there is fine).
TEST(TopkConvert, PositionsPastSeqLenAreInvalid) {
  const std::vector<std::vector<int32_t>> table = {{5, 2, -999999}, {1, 0, 2147483}};  // column 2: garbage
  const std::vector<std::vector<int32_t>> idx = {{0, 5, 7, 8, 11, -1}, {0, 3, 4, 9, 100, 2}};
  Tensor out = filled_i32({2, 6}, kUnwritten), valid = filled_i32({2}, kUnwritten);
  convert_topk_indices(test::int_tensor({0, 1}), test::int_tensor_2d(table), test::int_tensor_2d(idx), out, 4, 0, {},
                       {}, valid, test::int_tensor({8, 4}));
  EXPECT_EQ(test::to_ints(out), (std::vector<int32_t>{20, 9, 11, -1, -1, -1, 4, 7, -1, -1, -1, 6}));
  EXPECT_EQ(test::to_ints(valid), (std::vector<int32_t>{3, 3}));
  // Without seq_lens the garbage column is reached and refused (nothing written).
  Tensor out2 = filled_i32({2, 6}, kUnwritten);
  EXPECT_THROW(convert_topk_indices(test::int_tensor({0, 1}), test::int_tensor_2d(table), test::int_tensor_2d(idx), out2,
                                    4, 1 << 20),
               Error);
  EXPECT_EQ(test::to_ints(out2), std::vector<int32_t>(12, kUnwritten));
  // Workspace tokens: bounded by their request's length too (req_id is read for them).
  Tensor out3 = filled_i32({2, 6}, kUnwritten);
  convert_topk_indices(test::int_tensor({0, 1}), test::int_tensor_2d(table), test::int_tensor_2d(idx), out3, 4, 0,
                       test::int_tensor({0, 1}), test::int_tensor({100, 200}), {}, test::int_tensor({8, 4}));
  EXPECT_EQ(test::to_ints(out3), (std::vector<int32_t>{100, 105, 107, -1, -1, -1, 200, 203, -1, -1, -1, 202}));
  // seq_lens must cover the table's rows, and req_id must then name a row for workspace tokens as well.
  Tensor out4 = filled_i32({2, 6}, kUnwritten);
  EXPECT_THROW(convert_topk_indices(test::int_tensor({0, 1}), test::int_tensor_2d(table), test::int_tensor_2d(idx),
                                    out4, 4, 0, {}, {}, {}, test::int_tensor({8})),
               Error);
  EXPECT_THROW(convert_topk_indices(test::int_tensor({0, 7}), test::int_tensor_2d(table), test::int_tensor_2d(idx),
                                    out4, 4, 0, test::int_tensor({0, 1}), test::int_tensor({100, 200}), {},
                                    test::int_tensor({8, 4})),
               Error);
  EXPECT_EQ(test::to_ints(out4), std::vector<int32_t>(12, kUnwritten));
}

TEST(TopkConvert, BadInputsThrowAndWriteNothing) {
  Tensor out = filled_i32({2, 4}, kUnwritten), valid = filled_i32({2}, kUnwritten);
  const Tensor idx = test::int_tensor_2d({{0, 1, 2, 3}, {4, 5, -1, -1}}), req = test::int_tensor({0, 1});
  const Tensor table = test::int_tensor_2d(kTable), pid = test::int_tensor({-1, 0}), starts = test::int_tensor({3});
  Tensor idx64 = Tensor::zeros({2, 4}, DType::i64);
  auto untouched = [&] {
    for (int32_t v : test::to_ints(out))
      if (v != kUnwritten) return false;
    for (int32_t v : test::to_ints(valid))
      if (v != kUnwritten) return false;
    return true;
  };
  auto expect_rejected = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_TRUE(untouched()) << what;
  };
  expect_rejected([&] { convert_topk_indices(test::int_tensor({0, 1, 2}), table, idx, out, 4); },
                  "req_id covers other tokens than indices");
  expect_rejected([&] { convert_topk_indices(req, table, idx64, out, 4); }, "indices i64");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out.view().slice(1, 0, 3), 4); }, "out shape");
  expect_rejected([&] { convert_topk_indices(test::int_tensor({0, 3}), table, idx, out, 4); }, "req_id >= rows");
  expect_rejected([&] { convert_topk_indices(test::int_tensor({-1, 0}), table, idx, out, 4); }, "req_id < 0");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 4, 0, test::int_tensor({-1, 1}), starts); },
                  "prefill id >= P");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 4, 0, pid, {}); }, "prefill ids without starts");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 4, 0, pid, test::int_tensor({-3})); },
                  "negative workspace start");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 4, 3); }, "block_stride_rows < page");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 0); }, "page size 0");
  expect_rejected([&] { convert_topk_indices(req, test::int_tensor_2d({{1 << 28}, {1 << 28}}), idx, out, 4, 16); },
                  "cache row overflows int32");
  expect_rejected(
      [&] {
        convert_topk_indices(req, table, idx, out, 4, 0, pid,
                             test::int_tensor({std::numeric_limits<int32_t>::max() - 4}));
      },
      "workspace row overflows int32");
  expect_rejected([&] { convert_topk_indices(req, table, idx, out, 4, 0, {}, {}, filled_i32({3}, 0)); },
                  "valid_counts length");
  expect_rejected([&] { convert_topk_indices(req, table, idx, test::on_fake_cuda(out), 4); }, "out device");
  expect_rejected([&] { convert_topk_indices(req, test::on_fake_cuda(table), idx, out, 4); }, "table device");
  TensorView overlapping = out.view();
  overlapping.stride[0] = 0;
  expect_rejected([&] { convert_topk_indices(req, table, idx, overlapping, 4); }, "out rows overlap");
  // Out-of-table positions are not an error: they convert to -1.
  EXPECT_NO_THROW(convert_topk_indices(req, test::int_tensor_2d({{1}, {2}}), idx, out, 4));
  EXPECT_EQ(test::to_ints(out), (std::vector<int32_t>{4, 5, 6, 7, -1, -1, -1, -1}));
}

}  // namespace
}  // namespace mla
