// SPDX-License-Identifier: Apache-2.0
// The small-T split of the sm90 sparse decode (src/core/sparse_split.h): the largest split that keeps one wave,
// at least two tiles per rank and every cluster resident; none once the tokens fill the GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/sparse_split.h"

namespace mla {
namespace {

using sparse_split::cluster_splits;

// A device of `sms` SMs whose GPCs hold `per_gpc` SMs each: clusters of s fit per_gpc / s to a GPC.
struct Gpcs {
  int gpcs, per_gpc;
  int operator()(int s) const { return gpcs * (per_gpc / s); }
};

// The raw kernel's resident clusters on nvidia-h200 (132 SMs; as cudaOccupancyMaxActiveClusters reported them):
// 15 of 8, 30 of 4, 66 of 2.
int h200_clusters(int s) { return s == 8 ? 15 : s == 4 ? 30 : s == 2 ? 66 : 0; }

TEST(SparseSplit, LargestSplitInOneWave) {
  EXPECT_EQ(cluster_splits(1, 32, 132, h200_clusters), 8);   // T 1, topk 2048
  EXPECT_EQ(cluster_splits(15, 32, 132, h200_clusters), 8);  // 120 CTAs
  EXPECT_EQ(cluster_splits(16, 32, 132, h200_clusters), 4);  // 16 clusters of 8 are not resident together
  EXPECT_EQ(cluster_splits(30, 32, 132, h200_clusters), 4);
  EXPECT_EQ(cluster_splits(31, 32, 132, h200_clusters), 2);
  EXPECT_EQ(cluster_splits(64, 32, 132, h200_clusters), 2);
  EXPECT_EQ(cluster_splits(66, 32, 132, h200_clusters), 2);
  EXPECT_EQ(cluster_splits(67, 32, 132, h200_clusters), 1);  // the tokens fill the GPU
  EXPECT_EQ(cluster_splits(128, 32, 132, h200_clusters), 1);
  const Gpcs whole{8, 16};  // a part of whole GPCs: the one-wave rule binds first
  EXPECT_EQ(cluster_splits(16, 32, 132, whole), 8);   // 128 CTAs
  EXPECT_EQ(cluster_splits(17, 32, 132, whole), 4);   // 136 > 132
  EXPECT_EQ(cluster_splits(33, 32, 132, whole), 2);   // 132 < 33 * 4
}

TEST(SparseSplit, AtLeastTwoTilesPerRank) {
  const Gpcs g{8, 16};
  EXPECT_EQ(cluster_splits(1, 16, 132, g), 8);  // topk 1024: 2 tiles per rank
  EXPECT_EQ(cluster_splits(1, 15, 132, g), 4);
  EXPECT_EQ(cluster_splits(1, 8, 132, g), 4);   // topk 512
  EXPECT_EQ(cluster_splits(1, 4, 132, g), 2);
  EXPECT_EQ(cluster_splits(1, 3, 132, g), 1);   // topk 133 / 192
  EXPECT_EQ(cluster_splits(1, 1, 132, g), 1);
}

TEST(SparseSplit, EveryClusterResident) {
  const Gpcs small{7, 14};  // 7 GPCs of 14: one cluster of 8 per GPC, three of 4
  EXPECT_EQ(cluster_splits(7, 32, 132, small), 8);
  EXPECT_EQ(cluster_splits(8, 32, 132, small), 4);   // 8 clusters of 8 do not fit together
  EXPECT_EQ(cluster_splits(21, 32, 132, small), 4);
  EXPECT_EQ(cluster_splits(22, 32, 132, small), 2);
  auto none = [](int) { return 0; };  // clusters not launchable (shared memory, a part without clusters)
  EXPECT_EQ(cluster_splits(1, 32, 132, none), 1);
}

TEST(SparseSplit, DegenerateShapes) {
  const Gpcs g{8, 16};
  EXPECT_EQ(cluster_splits(0, 32, 132, g), 1);  // no tokens
  EXPECT_EQ(cluster_splits(1, 0, 132, g), 1);   // topk 0
  EXPECT_EQ(cluster_splits(1, 32, 0, g), 1);
  EXPECT_EQ(cluster_splits(int64_t{1} << 40, 32, 132, g), 1);  // no overflow of units * s
}

// The DeepSeek-V4 record kernel's split: any cluster size 2..8, the largest with two tiles per rank.
using sparse_split::record_splits;
TEST(SparseSplit, RecordSplitsTakeEverySize) {
  const Gpcs g{8, 16};
  EXPECT_EQ(record_splits(8, 10, 132, g), 5);   // T 8, window 128 + extra 512: 5 ranks of 2 tiles
  EXPECT_EQ(record_splits(8, 18, 132, g), 8);   // 128 + 1024: 8 ranks of at most 3
  EXPECT_EQ(record_splits(1, 7, 132, g), 3);
  EXPECT_EQ(record_splits(1, 3, 132, g), 1);    // below two tiles per rank
  EXPECT_EQ(record_splits(16, 18, 132, g), 8);  // 128 CTAs
  EXPECT_EQ(record_splits(17, 18, 132, g), 5);  // 17 clusters of 7 or 6 are not resident together (16)
  EXPECT_EQ(record_splits(40, 18, 132, g), 3);  // 120 CTAs
  EXPECT_EQ(record_splits(41, 18, 132, g), 2);
  EXPECT_EQ(record_splits(64, 18, 132, g), 2);
  EXPECT_EQ(record_splits(65, 18, 132, g), 1);  // 65 clusters of 2 are not resident together
  EXPECT_EQ(record_splits(67, 18, 132, g), 1);  // the tokens fill the GPU
  EXPECT_EQ(record_splits(8, 18, 132, g, /*batch_invariant=*/true), 1);
  // Residency: 7 GPCs of 14 hold one cluster of 8 each, two of 7.
  const Gpcs small{7, 14};
  EXPECT_EQ(record_splits(7, 18, 132, small), 8);
  EXPECT_EQ(record_splits(8, 18, 132, small), 7);
  auto none = [](int) { return 0; };
  EXPECT_EQ(record_splits(1, 18, 132, none), 1);
  EXPECT_EQ(record_splits(0, 18, 132, g), 1);
  EXPECT_EQ(record_splits(int64_t{1} << 40, 18, 132, g), 1);
}

}  // namespace
}  // namespace mla
