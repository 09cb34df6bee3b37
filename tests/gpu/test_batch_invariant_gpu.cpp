// SPDX-License-Identifier: Apache-2.0
// The batch-invariant mode on CUDA (PlannerConfig::batch_invariant, mla/ops.h): a fixed request of mqa_decode
// and a fixed token of sparse_mqa keep their output and LSE bytes over 100 random batch compositions (position,
// batch size, the other requests' lengths) in every device cache format, at row counts that take each sm90 kernel
// (and, without the mode, the balanced schedule, the 16-row seesaw promotion, the cluster merge and the small-T
// sparse split), with one split and with several (the combine). tests/unit/batch_invariant_check.h does the work.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "unit/batch_invariant_check.h"

namespace mla {
namespace {

// (format, s_q, h, splits), one test case each (the GPU check runs the suite as gtest shards side by side).
// (s_q, h): 16 rows (small kernel; the default promotes small batches to the seesaw tile), 8 and 32 rows, one and
// two 64-row seesaw tiles, speculative s_q 6 and 8, one row.
using DecodeShape = std::tuple<CacheFormat, std::tuple<int64_t, int64_t>, int>;
class BatchInvariantDecodeGpu : public ::testing::TestWithParam<DecodeShape> {};

TEST_P(BatchInvariantDecodeGpu, BitIdenticalAcrossBatches) {
  MLA_SKIP_WITHOUT_GPU();
  const auto& [f, rows, splits] = GetParam();
  test::InvarianceCase k;
  k.format = f;
  k.s_q = std::get<0>(rows);
  k.h = std::get<1>(rows);
  k.splits = splits;
  k.fixed_len = 3000;
  k.max_len = 4000;
  k.max_batch = 24;  // both sides of the 16-request promotion
  EXPECT_EQ(test::decode_variations(Device::cuda(0), k), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BatchInvariantDecodeGpu,
    ::testing::Combine(::testing::ValuesIn(test::kDeviceFormats),
                       ::testing::Values(std::tuple<int64_t, int64_t>{1, 16}, std::tuple<int64_t, int64_t>{2, 8},
                                         std::tuple<int64_t, int64_t>{1, 8}, std::tuple<int64_t, int64_t>{1, 32},
                                         std::tuple<int64_t, int64_t>{1, 64}, std::tuple<int64_t, int64_t>{1, 128},
                                         std::tuple<int64_t, int64_t>{6, 16}, std::tuple<int64_t, int64_t>{8, 4},
                                         std::tuple<int64_t, int64_t>{8, 16}, std::tuple<int64_t, int64_t>{1, 1}),
                       ::testing::Values(1, 4)),
    [](const ::testing::TestParamInfo<DecodeShape>& i) {
      const auto& rows = std::get<1>(i.param);
      return std::string(to_string(std::get<0>(i.param))) + "_sq" + std::to_string(std::get<0>(rows)) + "_h" +
             std::to_string(std::get<1>(rows)) + "_splits" + std::to_string(std::get<2>(i.param));
    });

TEST(BatchInvariantGpu, SparseBitIdenticalAcrossBatches) {
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : test::kDeviceFormats)
    for (int64_t h : {16, 32, 64, 128}) {
      SCOPED_TRACE(std::string(to_string(f)) + " h " + std::to_string(h));
      test::InvarianceCase k;
      k.format = f;
      k.h = h;
      k.fixed_len = 1800;
      k.max_len = 2048;
      k.max_batch = 16;  // few tokens: the default splits each token's top-k over a cluster
      EXPECT_EQ(test::sparse_variations(Device::cuda(0), k, /*topk=*/2048), 0);
    }
}

}  // namespace
}  // namespace mla
