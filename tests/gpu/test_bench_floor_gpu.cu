// SPDX-License-Identifier: Apache-2.0
// Device test of the benchmark's read floor (bench/floor.h): the load-only gather must read exactly the
// listed rows — each 16-byte chunk of every non-negative slot's row, repeats read again, nothing else — so its
// XOR of the 32-bit words read equals the host's over the same rows, for one row set and for several (paged, short
// rows) in one launch; cache_row_sets must name the bytes the kernels read; and decode_row_slots must list
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

// The XOR of the words a row set reads: each non-negative slot's row at its (block, row in block) address, a short
// row as the aligned 16-byte chunk it lies in (floor.h, RowLayout). `words` starts at the sets' bases' origin.
uint32_t host_xor_set(const std::vector<uint32_t>& words, int64_t base_bytes, const bench::RowLayout& l,
                      const std::vector<int32_t>& slots) {
  uint32_t x = 0;
  const int64_t span = l.row_bytes < 16 ? 16 : l.row_bytes;
  for (int32_t s : slots) {
    if (s < 0) continue;
    const int64_t at = (base_bytes + (s / l.page) * l.block_stride_bytes + (s % l.page) * l.row_stride_bytes) & ~15;
    for (int64_t w = 0; w < span / 4; ++w) x ^= words[static_cast<std::size_t>(at / 4 + w)];
  }
  return x;
}

TEST(BenchFloorGpu, GatherReadsSeveralRowSetsInOneLaunch) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 g(7);
  // v4's page geometry (4 rows a page here): 576-byte bodies packed, then the 8-byte scale slots; a 48-byte
  // strided set after the pages; a 16-byte row set of page 1.
  const int64_t page = 4, pages = 50, block = page * 584, strided_at = pages * block, strided_rows = 700;
  const int64_t total_bytes = strided_at + strided_rows * 80;
  std::vector<uint32_t> words(static_cast<std::size_t>(total_bytes / 4));
  for (auto& w : words) w = g();
  test::DevBuf<uint32_t> d_words(words), result(1);
  const auto* base = reinterpret_cast<const char*>(d_words.p);
  const bench::RowLayout body{base, 576, block, 576, page}, scale{base + page * 576, 8, block, 8, page};
  const bench::RowLayout strided = bench::strided_rows(base + strided_at, 80, 48);
  const bench::RowLayout chunk = bench::strided_rows(base, 32, 16);
  std::vector<std::vector<int32_t>> slots(4);
  for (int i = 0; i < 900; ++i) slots[0].push_back(std::uniform_int_distribution<int32_t>(-1, page * pages - 1)(g));
  for (int i = 0; i < 333; ++i) slots[1].push_back(std::uniform_int_distribution<int32_t>(-1, page * pages - 1)(g));
  for (int i = 0; i < 1000; ++i) slots[2].push_back(std::uniform_int_distribution<int32_t>(-1, strided_rows - 1)(g));
  for (int i = 0; i < 77; ++i) slots[3].push_back(std::uniform_int_distribution<int32_t>(0, 999)(g));
  test::DevBuf<int32_t> s0(slots[0]), s1(slots[1]), s2(slots[2]), s3(slots[3]);
  const std::vector<bench::DeviceRowSet> sets = {{body, s0.p, 900}, {scale, s1.p, 333}, {strided, s2.p, 1000},
                                                 {chunk, s3.p, 77}};
  const uint32_t want = host_xor_set(words, 0, body, slots[0]) ^ host_xor_set(words, page * 576, scale, slots[1]) ^
                        host_xor_set(words, strided_at, strided, slots[2]) ^ host_xor_set(words, 0, chunk, slots[3]);
  cudaStream_t s;
  MLA_CUDA_OK(cudaStreamCreate(&s));
  for (bench::FloorKernel k : {bench::FloorKernel::loads, bench::FloorKernel::bulk}) {
    const char* name = k == bench::FloorKernel::loads ? "loads" : "bulk";
    EXPECT_EQ(bench::gather_rows_xor(k, sets, result.p, s), want) << name;
    // A set's rows alone: the same fold as the host's over that set.
    EXPECT_EQ(bench::gather_rows_xor(k, {sets[1]}, result.p, s), host_xor_set(words, page * 576, scale, slots[1]))
        << name;
    // A short row that crosses a 16-byte chunk at some row of the page is refused (8 bytes at stride 12).
    bench::DeviceRowSet bad = sets[1];
    bad.rows.row_stride_bytes = 12;
    EXPECT_THROW(bench::gather_rows_xor(k, {bad}, result.p, s), Error) << name;
  }
  MLA_CUDA_OK(cudaStreamDestroy(s));
}

TEST(BenchFloorGpu, CacheRowSetsAreWhereTheRecordsAre) {
  // v4: the bodies packed in the page, the scale slots after them (mla/cache_format.h); every other format one
  // set of whole entries at the tensor's strides. The bytes per slot are the entry's.
  for (CacheFormat f : {CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4, CacheFormat::bf16}) {
    const int d_qk = 512;
    CacheBuffer cb = allocate_cache(f, 3, 64, Device::cpu(), 1.0f, d_qk);
    const std::vector<bench::RowSet> sets = bench::cache_row_sets(cb.cache, {0, 65, -1});
    const auto* base = static_cast<const char*>(cb.cache.data.data);
    const int64_t entry = cache_entry_bytes(f, d_qk);
    int64_t bytes = 0;
    for (const bench::RowSet& r : sets) {
      EXPECT_EQ(r.slots, (std::vector<int32_t>{0, 65, -1})) << to_string(f);
      EXPECT_EQ(r.rows.page, 64) << to_string(f);
      EXPECT_EQ(r.rows.block_stride_bytes, 64 * entry) << to_string(f);
      bytes += r.rows.row_bytes;
    }
    EXPECT_EQ(bytes, entry) << to_string(f);
    EXPECT_EQ(sets[0].rows.base, base) << to_string(f);
    if (f == CacheFormat::v4) {
      ASSERT_EQ(sets.size(), 2u);
      EXPECT_EQ(sets[0].rows.row_bytes, 576);
      EXPECT_EQ(sets[0].rows.row_stride_bytes, 576);
      EXPECT_EQ(sets[1].rows.base, base + 64 * 576);
      EXPECT_EQ(sets[1].rows.row_bytes, 8);
      EXPECT_EQ(sets[1].rows.row_stride_bytes, 8);
    } else {
      ASSERT_EQ(sets.size(), 1u) << to_string(f);
      EXPECT_EQ(sets[0].rows.row_bytes, entry) << to_string(f);
      EXPECT_EQ(sets[0].rows.row_stride_bytes, entry) << to_string(f);
    }
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
