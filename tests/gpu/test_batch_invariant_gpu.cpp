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

TEST(BatchInvariantGpu, DecodeBitIdenticalAcrossBatches) {
  MLA_SKIP_WITHOUT_GPU();
  // (s_q, h): 16 rows (small kernel; the default promotes small batches to the seesaw tile), 8 and 32 rows,
  // one and two 64-row seesaw tiles, speculative s_q 6 and 8, one row.
  const std::tuple<int64_t, int64_t> shapes[] = {{1, 16}, {2, 8},  {1, 8},  {1, 32}, {1, 64},
                                                 {1, 128}, {6, 16}, {8, 4}, {8, 16}, {1, 1}};
  for (CacheFormat f : test::kDeviceFormats)
    for (const auto& [s_q, h] : shapes)
      for (int splits : {1, 4}) {
        SCOPED_TRACE(std::string(to_string(f)) + " s_q " + std::to_string(s_q) + " h " + std::to_string(h) +
                     " splits " + std::to_string(splits));
        test::InvarianceCase k;
        k.format = f;
        k.s_q = s_q;
        k.h = h;
        k.splits = splits;
        k.fixed_len = 3000;
        k.max_len = 4000;
        k.max_batch = 24;  // both sides of the 16-request promotion
        EXPECT_EQ(test::decode_variations(Device::cuda(0), k), 0);
      }
}

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
