// SPDX-License-Identifier: Apache-2.0
// The balanced split-KV schedule of the sm90 decode kernel (src/core/decode_balance.h), on the host:
// every tile of every request is run by exactly one CTA, every empty request written by exactly one,
// no CTA gets more than `per` positions of work, the split counts and slots the combine reads are
// consistent and injective, and the schedule is balanced where the uniform split-KV one is not.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/decode_balance.h"

namespace mla {
namespace {

using balance::Cursor;
using balance::Segment;

std::vector<std::vector<Segment>> schedule(const std::vector<int64_t>& tiles, int ctas) {
  const auto w = balance::windows(tiles, ctas);
  std::vector<std::vector<Segment>> out(w.size());
  auto tiles_of = [&](int64_t i) { return tiles[static_cast<std::size_t>(i)]; };
  for (int k = 0; k < ctas; ++k) {
    Cursor c(w[static_cast<std::size_t>(k)], static_cast<int64_t>(tiles.size()), k);
    Segment s{};
    while (c.next(w[static_cast<std::size_t>(k)], tiles_of, s)) out[static_cast<std::size_t>(k)].push_back(s);
  }
  return out;
}

// The properties every schedule must have (see the file comment).
void check_schedule(const std::vector<int64_t>& tiles, int ctas) {
  const int64_t b = static_cast<int64_t>(tiles.size());
  const auto sched = schedule(tiles, ctas);
  const auto w = balance::windows(tiles, ctas);
  int64_t total = 0, max_cost = 0;
  for (int64_t n : tiles) {
    total += balance::cost_of(n);
    max_cost = std::max(max_cost, balance::cost_of(n));
  }
  const bool whole = balance::whole_requests(b, ctas, total, max_cost);
  const int64_t per = whole ? max_cost : balance::per_cta(total, ctas);
  std::vector<std::vector<int>> owner(tiles.size());
  for (std::size_t i = 0; i < tiles.size(); ++i) owner[i].assign(static_cast<std::size_t>(tiles[i]), -1);
  std::vector<int> empty_writes(tiles.size(), 0);
  std::map<int64_t, std::vector<int>> ctas_of;  // request -> CTAs that run a segment of it
  std::set<int64_t> slots;
  for (int k = 0; k < ctas; ++k) {
    EXPECT_EQ(w[static_cast<std::size_t>(k)].per, per);
    EXPECT_EQ(w[static_cast<std::size_t>(k)].whole, whole);
    if (whole) {  // CTA k: request k alone, whole (nothing split), or nothing
      ASSERT_LE(sched[static_cast<std::size_t>(k)].size(), 1u);
      EXPECT_EQ(sched[static_cast<std::size_t>(k)].size(), k < b ? 1u : 0u);
      for (const Segment& s : sched[static_cast<std::size_t>(k)]) {
        EXPECT_EQ(s.req, k);
        EXPECT_EQ(s.splits, 1);
        EXPECT_EQ(s.t1 - s.t0, tiles[static_cast<std::size_t>(k)]);
      }
    }
    int64_t work = 0, last_req = -1;
    for (const Segment& s : sched[static_cast<std::size_t>(k)]) {
      ASSERT_GE(s.req, 0);
      ASSERT_LT(s.req, b);
      EXPECT_GT(s.req, last_req) << "segments in request order";
      last_req = s.req;
      const auto i = static_cast<std::size_t>(s.req);
      if (tiles[i] == 0) {
        EXPECT_EQ(s.t0, 0);
        EXPECT_EQ(s.t1, 0);
        EXPECT_EQ(s.splits, 1);
        ++empty_writes[i];
        continue;
      }
      ASSERT_LT(s.t0, s.t1);
      ASSERT_LE(s.t1, tiles[i]);
      work += s.t1 - s.t0;
      for (int64_t t = s.t0; t < s.t1; ++t) {
        EXPECT_EQ(owner[i][static_cast<std::size_t>(t)], -1) << "tile run twice";
        owner[i][static_cast<std::size_t>(t)] = k;
      }
      ctas_of[s.req].push_back(k);
      if (s.splits > 1) {
        EXPECT_EQ(s.slot, s.req + k);
        EXPECT_TRUE(slots.insert(s.slot).second) << "slot used twice";
        EXPECT_LT(s.slot, b + ctas);
      } else {
        EXPECT_EQ(s.slot, -1);
      }
    }
    EXPECT_LE(work, per) << "CTA " << k << " over its window";
  }
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    if (tiles[i] == 0) {
      EXPECT_EQ(empty_writes[i], 1) << "empty request " << i;
      continue;
    }
    for (int o : owner[i]) EXPECT_GE(o, 0) << "request " << i << " has a tile nobody runs";
    const std::vector<int>& cs = ctas_of[static_cast<int64_t>(i)];
    ASSERT_FALSE(cs.empty());
    for (std::size_t j = 1; j < cs.size(); ++j) EXPECT_EQ(cs[j], cs[j - 1] + 1) << "contiguous CTAs";
    // Every segment of the request agrees on the split count and the first slot, and they match.
    for (int k : cs)
      for (const Segment& s : sched[static_cast<std::size_t>(k)])
        if (s.req == static_cast<int64_t>(i)) {
          EXPECT_EQ(s.splits, static_cast<int64_t>(cs.size()));
          EXPECT_EQ(s.first_slot, s.req + cs.front());
          EXPECT_EQ(s.t0 == 0, k == cs.front());
        }
  }
}

TEST(DecodeBalance, PropertiesOnFixedShapes) {
  check_schedule({16, 16, 16, 16}, 132);           // small batch: one tile per CTA
  check_schedule(std::vector<int64_t>(128, 64), 132);  // uniform, a little more CTAs than requests
  check_schedule(std::vector<int64_t>(128, 128), 132);
  check_schedule({0, 0, 0}, 132);                  // only empty requests
  check_schedule({1}, 1);
  check_schedule({0, 5, 0, 0, 7, 0}, 3);
  check_schedule({16384}, 132);                    // one long request over every CTA
  check_schedule(std::vector<int64_t>(300, 0), 7);  // many empty requests per CTA
  check_schedule({3, 0, 1, 1, 1, 1, 1, 1, 1, 200, 0}, 5);
}

// Near-uniform batches that fit one request per CTA run whole requests (no split, no combine share); small
// batches (a request costs many windows), varlen batches and batches larger than the grid stay balanced.
TEST(DecodeBalance, WholeRequestsForNearUniformBatches) {
  auto whole = [](const std::vector<int64_t>& tiles, int ctas) { return balance::windows(tiles, ctas).front().whole; };
  EXPECT_TRUE(whole(std::vector<int64_t>(128, 64), 132));   // b 128 s_k 4096: 70 positions against 68
  EXPECT_TRUE(whole(std::vector<int64_t>(128, 128), 132));  // s_k 8192
  EXPECT_TRUE(whole(std::vector<int64_t>(128, 8), 132));    // s_k 512
  EXPECT_TRUE(whole(std::vector<int64_t>(132, 64), 132));
  EXPECT_FALSE(whole(std::vector<int64_t>(133, 64), 132));  // more requests than CTAs
  EXPECT_FALSE(whole(std::vector<int64_t>(100, 64), 132));  // 32 idle CTAs: the windows are 51 positions
  EXPECT_FALSE(whole({16, 16, 16, 16}, 132));               // small batch: split over the SMs
  std::vector<int64_t> mixed(128, 64);
  mixed[5] = 128;  // one request twice as long
  EXPECT_FALSE(whole(mixed, 132));
  std::vector<int64_t> near(128, 64);
  near[7] = 70;  // within the 9/8
  EXPECT_TRUE(whole(near, 132));
  check_schedule(near, 132);
  check_schedule(std::vector<int64_t>(132, 0), 132);  // every request empty: each written once
}

TEST(DecodeBalance, PropertiesOnRandomBatches) {
  std::mt19937_64 g(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t b = std::uniform_int_distribution<int64_t>(1, 300)(g);
    const int ctas = std::uniform_int_distribution<int>(1, 264)(g);
    const int64_t max_tiles = std::uniform_int_distribution<int64_t>(0, 300)(g);
    std::vector<int64_t> tiles(static_cast<std::size_t>(b));
    const bool near_uniform = trial % 3 == 0;  // lengths within ~10%: the whole-requests mode where b <= ctas
    for (auto& t : tiles)
      t = near_uniform ? max_tiles - std::uniform_int_distribution<int64_t>(0, max_tiles / 10)(g)
                       : std::uniform_int_distribution<int64_t>(0, max_tiles)(g) * (g() % 5 == 0 ? 0 : 1);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_schedule(tiles, ctas);
  }
}

// The varlen row of issue 7 (b 128, s_k uniform in 1..8192 = 1..128 tiles, 132 SMs): the busiest CTA
// runs at most ceil(total / 132) positions, against the longest request (what the uniform split-KV
// schedule with one split per request pays); and the sizes of the workspace and the policy.
TEST(DecodeBalance, VarlenIsBalancedAndSized) {
  std::mt19937_64 g(64);
  std::vector<int64_t> tiles(128);
  for (auto& t : tiles) t = balance::tiles_of(std::uniform_int_distribution<int64_t>(1, 8192)(g));
  const auto sched = schedule(tiles, 132);
  int64_t busiest = 0, sum = 0;
  for (const auto& segs : sched) {
    int64_t work = 0;
    for (const Segment& s : segs) work += s.t1 - s.t0 + balance::kOverheadTiles;
    busiest = std::max(busiest, work);
  }
  for (int64_t n : tiles) sum += n;
  EXPECT_LE(busiest, (sum + 128 * balance::kOverheadTiles + 131) / 132 + balance::kOverheadTiles);
  EXPECT_LT(busiest * 10, *std::max_element(tiles.begin(), tiles.end()) * 8);  // well under the longest request

  EXPECT_EQ(balance::tiles_of(0), 0);
  EXPECT_EQ(balance::tiles_of(-5), 0);
  EXPECT_EQ(balance::tiles_of(64), 1);
  EXPECT_EQ(balance::tiles_of(65), 2);
  EXPECT_EQ(balance::ctas_for(128, 16, 132), 132);
  EXPECT_EQ(balance::ctas_for(264, 16, 132), 0);  // large batch: uniform schedule
  EXPECT_EQ(balance::ctas_for(4, 64, 132), 0);    // 64-row tiles: uniform schedule
  EXPECT_EQ(balance::ctas_for(4, 16, 1000), balance::kMaxCtas);
  EXPECT_EQ(balance::workspace_bytes(4, 16, 132) % 256, 0);
  EXPECT_GE(balance::workspace_bytes(4, 16, 132), (4 + 132) * 16 * (512 + 1) * 4);
}

}  // namespace
}  // namespace mla
