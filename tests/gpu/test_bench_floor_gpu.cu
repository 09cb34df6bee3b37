// SPDX-License-Identifier: Apache-2.0
// Device test of the benchmark's read floor (bench/floor.h): the load-only gather must read exactly the
// listed rows — each 16-byte chunk of every non-negative slot's row, repeats read again, nothing else — so its
// XOR of the 32-bit words read equals the host's over the same rows; and decode_row_slots must list
// mqa_decode's rows through the block table.
#include <random>
#include <vector>

#include "floor.h"
#include "mla/error.h"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

uint32_t host_xor(const std::vector<uint32_t>& words, int64_t stride_words, int64_t row_words,
                  const std::vector<int32_t>& slots) {
  uint32_t x = 0;
  for (int32_t s : slots)
    if (s >= 0)
      for (int64_t w = 0; w < row_words; ++w) x ^= words[static_cast<std::size_t>(s * stride_words + w)];
  return x;
}

TEST(BenchFloorGpu, GatherReadsExactlyTheListedRows) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 g(5);
  // Row sizes of the compiled cases (576, 656, 1152 B) and the run-time one (48 B), strides above the row.
  for (const auto& [row_bytes, stride_bytes] :
       std::vector<std::pair<int64_t, int64_t>>{{576, 576}, {656, 672}, {1152, 1152}, {48, 80}}) {
    const int64_t slots_total = 3000, stride_words = stride_bytes / 4, row_words = row_bytes / 4;
    std::vector<uint32_t> words(static_cast<std::size_t>(slots_total * stride_words));
    for (auto& w : words) w = g();
    std::vector<int32_t> slots;
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(slots_total - 1));
    for (int i = 0; i < 5000; ++i) slots.push_back(pick(g));  // repeats and -1 entries included
    test::DevBuf<uint32_t> d_words(words), result(1);
    test::DevBuf<int32_t> d_slots(slots);
    cudaStream_t s;
    MLA_CUDA_OK(cudaStreamCreate(&s));
    const uint32_t want = host_xor(words, stride_words, row_words, slots);
    std::vector<int32_t> fewer = slots;  // one row fewer changes the result (the last row is not all zeros)
    fewer.pop_back();
    while (!fewer.empty() && fewer.back() < 0) fewer.pop_back();
    const uint32_t want_fewer = host_xor(words, stride_words, row_words, fewer);
    ASSERT_NE(want, want_fewer);
    for (bench::FloorKernel k : {bench::FloorKernel::loads, bench::FloorKernel::bulk}) {
      const char* name = k == bench::FloorKernel::loads ? "loads" : "bulk";
      EXPECT_EQ(bench::gather_rows_xor(k, d_words.p, stride_bytes, row_bytes, d_slots.p,
                                       static_cast<int64_t>(slots.size()), result.p, s), want)
          << name << ", row " << row_bytes << " B";
      EXPECT_EQ(bench::gather_rows_xor(k, d_words.p, stride_bytes, row_bytes, d_slots.p,
                                       static_cast<int64_t>(fewer.size()), result.p, s), want_fewer)
          << name << ", row " << row_bytes << " B";
      EXPECT_THROW(bench::gather_rows_xor(k, d_words.p, stride_bytes, row_bytes + 4, d_slots.p, 1, result.p, s),
                   Error);
    }
    MLA_CUDA_OK(cudaStreamDestroy(s));
  }
}

TEST(BenchFloorGpu, DecodeRowSlotsFollowTheBlockTable) {
  // Two requests of 3 pages of 4 keys: lengths 5 and 12; request 1's second page is unmapped (-1).
  const std::vector<int32_t> table = {7, 2, 9, 4, -1, 0}, lens = {5, 12};
  const std::vector<int32_t> want = {28, 29, 30, 31, 8,               // request 0: page 7 whole, page 2 key 0
                                     16, 17, 18, 19, -1, -1, -1, -1,  // request 1: page 4, the unmapped page
                                     0,  1,  2,  3};                  // page 0
  EXPECT_EQ(bench::decode_row_slots(table, lens, 3, 4), want);
}

}  // namespace
}  // namespace mla
