// SPDX-License-Identifier: Apache-2.0
// The schedule of the fused quantising V up-projection (src/core/up_proj_schedule.h): decode-sized products
// fill the machine with split clusters, large ones keep whole-latent 128-row tiles, and devices without
// clusters never split.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/up_proj_schedule.h"

namespace mla {
namespace {

using up_proj::Problem;
using up_proj::Schedule;

constexpr int kH200 = 132;

Problem decode(int64_t rows, int64_t heads, int sms = kH200, int max_splits = up_proj::kMaxSplits) {
  return Problem{rows, heads, 1, 16, sms, max_splits};  // L 512, V 128
}

int64_t ctas(const Problem& p, const Schedule& s) {
  return (p.rows + s.tile_rows - 1) / s.tile_rows * p.heads * p.col_tiles * s.splits;
}

TEST(UpProjSchedule, DecodeSizesOnHopper) {
  // h 16: the latent split eight ways, one 16-row tile up to 16 tokens, one 64-row tile up to 64.
  EXPECT_EQ(up_proj::schedule(decode(1, 16)), (Schedule{16, 8}));
  EXPECT_EQ(up_proj::schedule(decode(4, 16)), (Schedule{16, 8}));
  EXPECT_EQ(up_proj::schedule(decode(16, 16)), (Schedule{16, 8}));
  EXPECT_EQ(up_proj::schedule(decode(64, 16)), (Schedule{64, 8}));
  EXPECT_EQ(up_proj::schedule(decode(128, 16)), (Schedule{64, 4}));
  // h 64: two splits; h 128: the heads alone fill 128 SMs.
  EXPECT_EQ(up_proj::schedule(decode(1, 64)), (Schedule{16, 2}));
  EXPECT_EQ(up_proj::schedule(decode(64, 64)), (Schedule{64, 2}));
  EXPECT_EQ(up_proj::schedule(decode(128, 64)), (Schedule{64, 1}));
  EXPECT_EQ(up_proj::schedule(decode(1, 128)), (Schedule{16, 1}));
  EXPECT_EQ(up_proj::schedule(decode(64, 128)), (Schedule{64, 1}));
  EXPECT_EQ(up_proj::schedule(decode(128, 128)), (Schedule{128, 1}));
}

TEST(UpProjSchedule, EveryDecodeSizeFillsTheMachine) {
  for (const int64_t h : {16, 64, 128})
    for (int64_t b = 1; b <= 128; ++b) {
      const Problem p = decode(b, h);
      const Schedule s = up_proj::schedule(p);
      EXPECT_GE(ctas(p, s), 128) << "b " << b << " h " << h;  // 16 heads x 8 splits is the most at b 1 h 16
      EXPECT_LE(ctas(p, s), 2 * kH200) << "b " << b << " h " << h;
    }
}

TEST(UpProjSchedule, LargeProductsKeepWholeLatentTiles) {
  for (const int64_t h : {16, 64, 128})
    for (const int64_t rows : {1024, 4096, 8192}) {
      const Schedule s = up_proj::schedule(decode(rows, h));
      EXPECT_EQ(s, (Schedule{128, 1})) << "rows " << rows << " h " << h;
    }
}

TEST(UpProjSchedule, NoClustersNoSplit) {
  for (const int64_t h : {16, 64, 128})
    for (const int64_t rows : {1, 4, 16, 17, 64, 128, 300, 4096}) {
      const Schedule s = up_proj::schedule(decode(rows, h, 108, 1));
      EXPECT_EQ(s.splits, 1) << "rows " << rows << " h " << h;
    }
  // Without splits a decode-sized product takes the smallest tile (the most CTAs).
  EXPECT_EQ(up_proj::schedule(decode(64, 16, 108, 1)), (Schedule{16, 1}));
  EXPECT_EQ(up_proj::schedule(decode(1, 128, 108, 1)), (Schedule{16, 1}));
}

TEST(UpProjSchedule, SplitsBoundedByTheLatentSteps) {
  // L 40 (two steps), L 72 (three): at most that many splits, each a power of two.
  for (const int64_t k_tiles : {1, 2, 3}) {
    const Schedule s = up_proj::schedule(Problem{1, 3, 1, k_tiles, kH200, up_proj::kMaxSplits});
    EXPECT_LE(s.splits, k_tiles) << "k_tiles " << k_tiles;
    EXPECT_EQ(s.splits & (s.splits - 1), 0);
  }
  EXPECT_EQ(up_proj::split_k_tiles(16, 8), 2);
  EXPECT_EQ(up_proj::split_k_tiles(3, 2), 2);
}

TEST(UpProjSchedule, CostCountsTheBusiestSm) {
  // b 64 h 16: 64-row tiles split eight ways are 128 CTAs of 64 x 64 latent (24 KiB) plus the 32 KiB partial
  // rows; 16-row tiles unsplit are 64 CTAs of the whole latent (144 KiB).
  EXPECT_EQ(up_proj::cost(decode(64, 16), Schedule{64, 8}), 64 * (64 + 128) * 2 + 64 * 128 * 4);
  EXPECT_EQ(up_proj::cost(decode(64, 16), Schedule{16, 1}), 512 * (16 + 128) * 2);
  // Two waves count twice.
  EXPECT_EQ(up_proj::cost(decode(256, 128), Schedule{128, 1}), 2 * 512 * (128 + 128) * 2);
}

TEST(UpProjSchedule, DegenerateProblems) {
  EXPECT_EQ(up_proj::schedule(decode(0, 16)), (Schedule{16, 1}));  // padding rows only
  EXPECT_EQ(up_proj::schedule(Problem{5, 0, 1, 16, kH200, 8}), (Schedule{16, 1}));
  EXPECT_EQ(up_proj::schedule(decode(1, 16, 0)), (Schedule{16, 1}));  // an unknown SM count counts as one SM
}

TEST(UpProjSchedule, HopperMainloopStepsOf64) {
  EXPECT_EQ(up_proj::step_of(Schedule{64, 1}), 32);
  EXPECT_EQ(up_proj::step_of(Schedule{64, 1, true}), 64);
  EXPECT_EQ(up_proj::k_tiles_of(Schedule{128, 1}, 512), 16);
  EXPECT_EQ(up_proj::k_tiles_of(Schedule{128, 1, true}, 512), 8);
  EXPECT_EQ(up_proj::k_tiles_of(Schedule{64, 1, true}, 136), 3);  // ragged: the last step zero-filled past L
  EXPECT_NE((Schedule{64, 2}), (Schedule{64, 2, true}));
  // Without the Hopper mainloop on the device the planner never picks it.
  for (const int64_t b : {1, 64, 128, 1024}) EXPECT_FALSE(up_proj::schedule(decode(b, 128)).hopper) << b;
}

// With it, the products where it was measured to win (h >= 128, 64..128 rows) take its 128-row tile unsplit;
// the others keep the mma.sync model's schedule.
TEST(UpProjSchedule, HopperMainloopWhereItWins) {
  auto hopper = [](int64_t rows, int64_t heads) {
    Problem p = decode(rows, heads);
    p.hopper = true;
    return up_proj::schedule(p);
  };
  for (const int64_t b : {64, 65, 100, 128}) EXPECT_EQ(hopper(b, 128), (Schedule{128, 1, true})) << b;
  EXPECT_EQ(hopper(64, 256), (Schedule{128, 1, true}));
  for (const int64_t b : {1, 16, 32, 63, 129, 1024}) EXPECT_FALSE(hopper(b, 128).hopper) << b;
  for (const int64_t h : {16, 64}) EXPECT_FALSE(hopper(128, h).hopper) << h;
  EXPECT_EQ(hopper(16, 128), up_proj::schedule(decode(16, 128)));
  EXPECT_TRUE(up_proj::hopper_fuses(64, 128));
  EXPECT_FALSE(up_proj::hopper_fuses(32, 128));
  EXPECT_FALSE(up_proj::hopper_fuses(128, 64));
}

}  // namespace
}  // namespace mla
