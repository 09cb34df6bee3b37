// SPDX-License-Identifier: Apache-2.0
// The sm90 mqa_decode schedule (src/core/decode_schedule.h) from the launch's facts, and the plan's whole-requests
// hint (plan_decode_schedule) that lets a near-uniform batch skip the balanced schedule's combine.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/decode_schedule.h"
#include "mla/plan.h"

namespace mla {
namespace {

using decode_schedule::choose;
using decode_schedule::Facts;
using decode_schedule::Kind;

Facts facts(CacheFormat f, int64_t b, int64_t rows, int splits, int64_t bound = 4096) {
  Facts x;
  x.regime = decode_regime::choose({.format = f, .rows = rows, .batch = b, .context_bound = bound});
  x.format = f;
  x.batch = b;
  x.rows = rows;
  x.planned_splits = splits;
  x.sms = 132;
  x.max_ws_splits = splits;
  x.workspace_bytes = std::numeric_limits<int64_t>::max();
  x.max_clusters = 66;
  return x;
}

TEST(DecodeSchedule, SmallKernelTakesTheBalancedSchedule) {
  const auto s = choose(facts(CacheFormat::bf16, 128, 16, 1));
  EXPECT_EQ(s.kind, Kind::balanced);
  EXPECT_EQ(s.ctas, 132);
  EXPECT_TRUE(s.combine);
  // ... unless the workspace cannot hold it: uniform with what the workspace holds.
  Facts f = facts(CacheFormat::bf16, 128, 16, 4);
  f.workspace_bytes = balance::workspace_bytes(128, 16, 132) - 1;  // one byte short
  f.max_ws_splits = 2;
  const auto u = choose(f);
  EXPECT_EQ(u.kind, Kind::uniform);
  EXPECT_EQ(u.splits, 2);
  EXPECT_TRUE(u.combine);
  // Batches of two CTAs per SM and more: the hardware's scheduler balances the waves (balance::ctas_for).
  EXPECT_EQ(choose(facts(CacheFormat::bf16, 264, 16, 1)).kind, Kind::uniform);
}

// The small kernel forced (or chosen) at s_q * h_q rows over requests of `keys` keys, its workspace holding a
// partial per consumer warpgroup.
Facts small_step(int64_t b, int64_t rows, int splits, int64_t keys) {
  Facts f = facts(CacheFormat::bf16, b, rows, splits, keys);
  f.regime = decode_regime::tile_for({.format = CacheFormat::bf16, .rows = rows, .batch = b, .context_bound = keys},
                                     decode_regime::Kernel::small);
  f.ws_wg_partials = true;
  f.context_bound = keys;
  return f;
}

TEST(DecodeSchedule, SmallStepsRunUniformWithWarpgroupPartials) {
  for (const Facts& f : {small_step(4, 16, 8, 1024), small_step(1, 128, 5, 640), small_step(1, 64, 32, 8192)}) {
    const auto s = choose(f);  // one wave of splits of <= 4 key tiles: no balanced window, no exchange
    EXPECT_EQ(s.kind, Kind::uniform) << f.batch << " " << f.rows;
    EXPECT_EQ(s.splits, f.planned_splits);
    EXPECT_TRUE(s.combine);
    EXPECT_TRUE(s.wg_partials);
  }
  EXPECT_EQ(choose(small_step(4, 16, 8, 1 << 20)).kind, Kind::balanced);  // long splits: the cost line
  const auto wave = choose(small_step(8, 32, 20, 1024));  // more than one wave planned: the step's own count
  EXPECT_EQ(wave.kind, Kind::uniform);
  EXPECT_EQ(wave.splits, 16);  // 128 CTAs of one key tile
  EXPECT_TRUE(wave.wg_partials);
  EXPECT_EQ(choose(small_step(16, 32, 20, 4096)).kind, Kind::balanced);  // >= 16 splits of 16 requests
  Facts no_room = small_step(4, 16, 8, 1024);
  no_room.ws_wg_partials = false;  // the workspace holds the CTAs' partials only: the balanced schedule
  EXPECT_EQ(choose(no_room).kind, Kind::balanced);
  EXPECT_FALSE(choose(no_room).wg_partials);
  Facts inv = small_step(4, 16, 8, 1024);
  inv.batch_invariant = true;  // split points and partials fixed per request: one partial per split
  EXPECT_EQ(choose(inv).kind, Kind::uniform);
  EXPECT_FALSE(choose(inv).wg_partials);
  // Uniform outside the small step (no balanced schedule above 32 rows): warpgroup partials where they fit.
  const auto wide = choose(small_step(16, 64, 16, 8192));
  EXPECT_EQ(wide.kind, Kind::uniform);
  EXPECT_EQ(wide.splits, 16);
  EXPECT_TRUE(wide.wg_partials);
  Facts short_ws = small_step(16, 64, 16, 8192);
  short_ws.max_ws_splits = 8;  // the workspace holds fewer splits than planned
  short_ws.ws_wg_partials = false;
  EXPECT_EQ(choose(short_ws).splits, 8);
  EXPECT_FALSE(choose(short_ws).wg_partials);
  EXPECT_FALSE(choose(facts(CacheFormat::fp8, 16, 64, 16)).wg_partials);  // other kernels: one partial a split
}

TEST(DecodeSchedule, WholeRequestsSkipTheCombine) {
  Facts f = facts(CacheFormat::bf16, 128, 16, 1);
  f.whole_requests = true;
  const auto s = choose(f);
  EXPECT_EQ(s.kind, Kind::uniform);
  EXPECT_EQ(s.splits, 1);
  EXPECT_FALSE(s.combine);
  // The hint needs one planned split: with more, the balanced schedule still decides.
  Facts g = facts(CacheFormat::bf16, 4, 16, 8, 1 << 20);
  g.whole_requests = true;
  EXPECT_EQ(choose(g).kind, Kind::balanced);
  // Other kernels ignore it.
  Facts h = facts(CacheFormat::fp8, 128, 16, 1);
  h.whole_requests = true;
  EXPECT_EQ(choose(h).kind, Kind::uniform);
}

TEST(DecodeSchedule, SeesawSplitsMergeInAClusterWhenAllFit) {
  const auto c = choose(facts(CacheFormat::bf16, 16, 128, 4));  // 32 row tiles in clusters of 4
  EXPECT_EQ(c.kind, Kind::cluster);
  EXPECT_EQ(c.splits, 4);
  EXPECT_FALSE(c.combine);
  Facts f = facts(CacheFormat::bf16, 64, 128, 4);
  f.max_clusters = 30;  // 128 clusters do not fit at once
  const auto u = choose(f);
  EXPECT_EQ(u.kind, Kind::uniform);
  EXPECT_EQ(u.splits, 4);
  EXPECT_TRUE(u.combine);
  EXPECT_EQ(choose(facts(CacheFormat::bf16, 4, 128, 16)).kind, Kind::uniform);  // past the cluster size
  EXPECT_EQ(choose(facts(CacheFormat::fp8_ds_mla, 4, 128, 4)).kind, Kind::uniform);  // code formats: no merge
  const auto one = choose(facts(CacheFormat::bf16, 4, 128, 1));
  EXPECT_EQ(one.kind, Kind::uniform);
  EXPECT_FALSE(one.combine);
}

TEST(DecodeSchedule, RawKernelRunsUniformWithinTheWorkspace) {
  Facts f = facts(CacheFormat::fp8_ds_mla, 4, 16, 8);
  EXPECT_EQ(choose(f).kind, Kind::uniform);
  EXPECT_EQ(choose(f).splits, 8);
  f.max_ws_splits = 1;  // no workspace: one split, no combine
  EXPECT_EQ(choose(f).splits, 1);
  EXPECT_FALSE(choose(f).combine);
}

TEST(DecodeSchedule, PlanMarksNearUniformRuns) {
  // 128 decodes of h 16 (one split each on 132 SMs): uniform lengths are whole requests, a long outlier is not.
  std::vector<int32_t> qsl(129), uniform(128, 4096), varlen(128, 4096);
  for (int i = 0; i <= 128; ++i) qsl[static_cast<std::size_t>(i)] = i;
  varlen[7] = 16384;
  const DecodeSchedule a = plan_decode_schedule(qsl, uniform, 128, 64, 16, 132);
  ASSERT_EQ(a.runs.size(), 1u);
  EXPECT_EQ(a.runs[0].num_splits, 1);
  EXPECT_TRUE(a.runs[0].whole_requests);
  EXPECT_FALSE(plan_decode_schedule(qsl, varlen, 128, 64, 16, 132).runs[0].whole_requests);
  // A length bound (CUDA graphs) says nothing about the lengths of a replay; a CPU plan knows no SMs.
  EXPECT_FALSE(plan_decode_schedule(qsl, uniform, 128, 64, 16, 132, 8192).runs[0].whole_requests);
  EXPECT_FALSE(plan_decode_schedule(qsl, uniform, 128, 64, 16, 0).runs[0].whole_requests);
}

}  // namespace
}  // namespace mla
