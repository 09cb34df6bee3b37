// SPDX-License-Identifier: Apache-2.0
// The batch-invariant mode (PlannerConfig::batch_invariant): the host decisions that shape a request's
// arithmetic (its run's split count, the kernel, the schedule, its split ranges) are a function of the
// request alone over many random batches around it, where the default mode's are not; and the CPU backend's
// mqa_decode and sparse_mqa give a fixed request bit-identical bytes over 100 random batch compositions in
// every cache format (tests/unit/batch_invariant_check.h; tests/gpu/test_batch_invariant_gpu.cpp on CUDA).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "batch_invariant_check.h"
#include "layer_test_util.h"
#include "core/decode_regime.h"
#include "core/decode_schedule.h"
#include "core/sparse_split.h"
#include "mla/error.h"
#include "mla/layer.h"
#include "mla/plan.h"

namespace mla {
namespace {

PlannerConfig config(bool batch_invariant, int64_t max_num_seqs = 8, int num_sms = 132) {
  PlannerConfig c;
  c.dims = ModelDims::deepseek_v3(8);  // 16 heads
  c.max_model_len = 16384;
  c.max_num_seqs = max_num_seqs;
  c.decode_threshold = 4;  // decodes of 1..4 tokens: runs of one query length each
  c.num_sms = num_sms;
  c.batch_invariant = batch_invariant;
  return c;
}

// What decides the fixed request's arithmetic on CUDA, from the plan of one batch: its run's planned splits,
// the kernel and tiling the launch's regime rule picks (sm90), the schedule the launcher executes with the
// facts of that batch (workspace as the front end requires it, resident clusters, SM count), and the tile
// ranges of its own splits under that schedule.
struct Decisions {
  int splits = 0;
  decode_regime::Kernel kernel{};
  int tile_rows = 0, m_tiles = 0;
  decode_schedule::Kind kind{};
  int sched_splits = 0;
  bool combine = false;
  std::vector<decode_schedule::TileRange> ranges;
  bool operator==(const Decisions&) const = default;
};

Decisions decisions(const Plan& plan, int64_t req, CacheFormat format, int max_clusters) {
  const PlannerConfig& c = plan.config;
  for (const DecodeRun& r : plan.decode.runs) {
    if (req < r.req_begin || req >= r.req_end) continue;
    Decisions d;
    d.splits = r.num_splits;
    const int64_t b = r.req_end - r.req_begin, rows = r.s_q * c.dims.num_heads;
    const decode_regime::Regime regime = decode_regime::choose({.format = format,
                                                                .rows = rows,
                                                                .batch = b,
                                                                .context_bound = r.block_cols * c.page_size,
                                                                .batch_invariant = c.batch_invariant});
    d.kernel = regime.kernel;
    d.tile_rows = regime.tile_rows;
    d.m_tiles = regime.m_tiles;
    decode_schedule::Facts f;
    f.regime = regime;
    f.format = format;
    f.batch = b;
    f.rows = rows;
    f.planned_splits = r.num_splits;
    f.sms = c.num_sms;
    f.max_ws_splits = r.num_splits;  // mqa_decode's front end requires the planned partials
    f.workspace_bytes = std::numeric_limits<int64_t>::max();
    f.max_clusters = max_clusters;
    f.whole_requests = r.whole_requests;
    f.batch_invariant = c.batch_invariant;
    const decode_schedule::Schedule s = decode_schedule::choose(f);
    d.kind = s.kind;
    d.sched_splits = s.splits;
    d.combine = s.combine;
    if (s.kind != decode_schedule::Kind::balanced) {
      const int64_t tiles = balance::tiles_of(plan.seq_lens[static_cast<std::size_t>(req)]);
      for (int k = 0; k < s.splits; ++k) d.ranges.push_back(decode_schedule::split_range(tiles, s.splits, k));
    }
    return d;
  }
  ADD_FAILURE() << "request " << req << " is in no decode run";
  return {};
}

// Random decode batches (b in [1, max_num_seqs], query lengths in [1, 4], lengths in [q, 16384]) with the fixed
// request (s_q 2, 3000 keys) at a random position; the number of batches whose decisions differ from the first's.
int decision_variations(bool batch_invariant, CacheFormat format) {
  const PlannerConfig cfg = config(batch_invariant);
  std::mt19937_64 g(48);
  auto draw = [&g](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(g() % static_cast<uint64_t>(hi - lo + 1)); };
  Decisions first;
  int differ = 0;
  for (int n = 0; n < 300; ++n) {
    const int64_t b = draw(1, cfg.max_num_seqs), at = draw(0, b - 1);
    BatchDesc batch;
    batch.query_start_loc = {0};
    for (int64_t r = 0; r < b; ++r) {
      const int64_t q = r == at ? 2 : draw(1, 4);
      batch.query_start_loc.push_back(static_cast<int32_t>(batch.query_start_loc.back() + q));
      batch.seq_lens.push_back(static_cast<int32_t>(r == at ? 3000 : draw(q + 1, cfg.max_model_len)));  // context > 0
    }
    const Plan plan = make_plan(batch, cfg);
    const Decisions d = decisions(plan, at, format, static_cast<int>(draw(0, 132)));
    if (n == 0) first = d;
    differ += d == first ? 0 : 1;
  }
  return differ;
}

TEST(BatchInvariant, RequestDecisionsDependOnTheRequestAlone) {
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    SCOPED_TRACE(to_string(f));
    EXPECT_EQ(decision_variations(true, f), 0);
    // The default mode plans from the batch: the same batches move the request's splits or schedule.
    EXPECT_GT(decision_variations(false, f), 0);
  }
}

TEST(BatchInvariant, SplitsAreTheFullBatchPolicy) {
  for (int64_t seqs : {1, 8, 64, 256})
    for (int64_t s_q : {1, 2, 6}) {
      const PlannerConfig c = config(true, seqs);
      EXPECT_EQ(batch_invariant_splits(c, s_q), decode_num_splits(seqs, s_q, 16, 16384, 132)) << seqs << " " << s_q;
    }
  EXPECT_EQ(batch_invariant_splits(config(true, 8, 0), 1), 1);  // no SMs (CPU plans): one split
  EXPECT_GT(batch_invariant_splits(config(true, 8), 1), 1);     // a small full batch splits its requests
  EXPECT_THROW(batch_invariant_splits(config(true), 0), Error);
  // Every run of a batch-invariant plan takes the split of its query length, never the whole-requests hint.
  const PlannerConfig c = config(true, 256);
  const Plan p = make_plan({.query_start_loc = {0, 1, 2, 4}, .seq_lens = {700, 700, 900}}, c);
  ASSERT_EQ(p.decode.runs.size(), 2u);
  for (const DecodeRun& r : p.decode.runs) {
    EXPECT_EQ(r.num_splits, batch_invariant_splits(c, r.s_q));
    EXPECT_FALSE(r.whole_requests);
  }
  // The flag is part of the plan's digest, and a graph captured in one mode does not replay the other.
  PlannerConfig d = c;
  d.batch_invariant = false;
  const Plan q = make_plan({.query_start_loc = {0, 1, 2, 4}, .seq_lens = {700, 700, 900}}, d);
  EXPECT_NE(p.seal, q.seal);
  EXPECT_FALSE(same_launches(p, q));
  EXPECT_TRUE(same_launches(p, make_plan({.query_start_loc = {0, 1, 2, 4}, .seq_lens = {70, 700, 900}}, c)));
}

TEST(BatchInvariant, RefusedWithDcp) {
  PlannerConfig c = config(true);
  c.dcp = {2, 0, 1};
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(make_plan({.query_start_loc = {0, 1}, .seq_lens = {10}}, c), Error);
}

TEST(BatchInvariant, RegimeIgnoresTheBatch) {
  // 9..16 bf16 rows: the default promotes small batches with short contexts to the seesaw tile.
  const decode_regime::Problem small_batch{.format = CacheFormat::bf16, .rows = 16, .batch = 4, .context_bound = 1024};
  EXPECT_EQ(decode_regime::preferred(small_batch), decode_regime::Kernel::seesaw);
  decode_regime::Problem p = small_batch;
  p.batch_invariant = true;
  for (int64_t b : {1, 4, 16, 17, 128})
    for (int64_t bound : {64, 1024, 16384, 1 << 20}) {
      p.batch = b;
      p.context_bound = bound;
      EXPECT_EQ(decode_regime::preferred(p), decode_regime::Kernel::small) << b << " " << bound;
    }
}

TEST(BatchInvariant, ScheduleIsUniformWithThePlannedSplits) {
  decode_schedule::Facts f;
  f.format = CacheFormat::bf16;
  f.batch = 4;
  f.rows = 128;
  f.regime = decode_regime::choose({.format = f.format, .rows = f.rows, .batch = 4, .context_bound = 4096});
  f.planned_splits = 4;
  f.sms = 132;
  f.max_ws_splits = 4;
  f.workspace_bytes = std::numeric_limits<int64_t>::max();
  f.max_clusters = 66;
  EXPECT_EQ(decode_schedule::choose(f).kind, decode_schedule::Kind::cluster);  // the default: a cluster merge
  f.batch_invariant = true;
  auto s = decode_schedule::choose(f);
  EXPECT_EQ(s.kind, decode_schedule::Kind::uniform);
  EXPECT_EQ(s.splits, 4);
  EXPECT_TRUE(s.combine);
  f.max_ws_splits = 2;  // never fewer splits for a short workspace (the launcher refuses it instead)
  EXPECT_EQ(decode_schedule::choose(f).splits, 4);
  // The small kernel: no balanced windows, no whole-requests shortcut.
  f.regime = decode_regime::choose({.format = f.format, .rows = 16, .batch = 4, .context_bound = 4096,
                                    .batch_invariant = true});
  f.rows = 16;
  f.planned_splits = 1;
  f.max_ws_splits = 1;
  s = decode_schedule::choose(f);
  EXPECT_EQ(s.kind, decode_schedule::Kind::uniform);
  EXPECT_FALSE(s.combine);
  // Split ranges: equal shares of the request's own tiles, the last one shorter, empty ones past the end.
  EXPECT_EQ(decode_schedule::split_range(10, 4, 0), (decode_schedule::TileRange{0, 3}));
  EXPECT_EQ(decode_schedule::split_range(10, 4, 3), (decode_schedule::TileRange{9, 10}));
  EXPECT_EQ(decode_schedule::split_range(2, 4, 3), (decode_schedule::TileRange{2, 2}));
}

TEST(BatchInvariant, NoSmallTokenCountSplit) {
  auto all_fit = [](int) { return 1000; };
  EXPECT_EQ(sparse_split::cluster_splits(4, 32, 132, all_fit), 8);  // the default splits a few tokens' top-k
  for (int64_t units : {1, 4, 16, 66, 200}) EXPECT_EQ(sparse_split::cluster_splits(units, 32, 132, all_fit, true), 1);
}

TEST(BatchInvariant, DecodeNeedsAnExplicitSplitCount) {
  const Tensor q = test::random_tensor({1, 1, 1, 576}, DType::bf16);
  const test::InvarianceCache c = test::invariance_cache(CacheFormat::bf16, 1, 16, Device::cpu());
  Tensor out = test::poisoned({1, 1, 1, 512}, DType::f32);
  EXPECT_THROW(mqa_decode(q, c.cache, test::int_tensor_2d({{0}}), test::int_tensor({5}), out, {}, 0.07, true, {}, {},
                          /*num_splits=*/0, false, /*batch_invariant=*/true),
               Error);
  EXPECT_TRUE(std::isnan(test::to_doubles(out)[0]));  // nothing written
}

// The CPU backend: a fixed request's bytes over 100 random batch compositions, every format (its own query
// rows per format: the kernels see s_q * h rows).
TEST(BatchInvariant, CpuDecodeIsBitIdenticalAcrossBatches) {
  const std::tuple<int64_t, int64_t> shapes[] = {{1, 16}, {2, 8}, {8, 1}, {4, 4}};
  std::size_t i = 0;
  for (CacheFormat f : test::kAllFormats) {
    const auto [s_q, h] = shapes[i++ % std::size(shapes)];
    SCOPED_TRACE(std::string(to_string(f)) + " s_q " + std::to_string(s_q) + " h " + std::to_string(h));
    test::InvarianceCase k;
    k.format = f;
    k.s_q = s_q;
    k.h = h;
    k.out_dtype = DType::f32;  // every bit of the float result
    k.fixed_len = 1100;        // two ranges of kBatchInvariantKeys
    k.max_len = 1200;
    k.max_batch = 5;
    EXPECT_EQ(test::decode_variations(Device::cpu(), k), 0);
  }
}

TEST(BatchInvariant, CpuSparseIsBitIdenticalAcrossBatches) {
  const int64_t heads[] = {16, 1, 8, 32};
  std::size_t i = 0;
  for (CacheFormat f : test::kAllFormats) {
    test::InvarianceCase k;
    k.format = f;
    k.h = heads[i++ % std::size(heads)];
    k.fixed_len = 1100;
    k.max_len = 1152;
    k.max_batch = 5;
    k.out_dtype = DType::f32;
    SCOPED_TRACE(std::string(to_string(f)) + " h " + std::to_string(k.h));
    EXPECT_EQ(test::sparse_variations(Device::cpu(), k, /*topk=*/1152), 0);
  }
}

// Without the mode the CPU backend sizes its key ranges from the whole call and its thread count, so the same
// compositions move the fixed request's bytes: what the tests above would catch. Two threads (CI's machine): with
// many threads every range sits at the minimum length and the default mode happens to be invariant at these sizes.
TEST(BatchInvariant, CpuDefaultModeDependsOnTheBatch) {
  struct Threads {
    int before = omp_get_max_threads();
    Threads() { omp_set_num_threads(2); }
    ~Threads() { omp_set_num_threads(before); }
  } two;
  test::InvarianceCase k;
  k.out_dtype = DType::f32;
  k.batch_invariant = false;
  k.compositions = 20;
  k.fixed_len = 1100;
  k.max_len = 1200;
  k.max_batch = 5;
  EXPECT_GT(test::decode_variations(Device::cpu(), k), 0);
  k.max_len = 1152;
  EXPECT_GT(test::sparse_variations(Device::cpu(), k, 1152), 0);
}

// The layer runs batch-invariant plans end to end (dense with decodes of two query lengths, chunked context and
// fresh prefills; sparse): the float64 oracle layer against the naive formulation. A batch-invariant layer refuses
// plans and configs that are not.
TEST(BatchInvariant, LayerRunsBatchInvariantPlans) {
  using namespace test::layer;
  for (bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    Scenario sc;
    sc.sparse = sparse;
    sc.format = sparse ? CacheFormat::fp8_ds_mla : CacheFormat::fp8;
    sc.decode_threshold = 2;
    sc.require_uniform = sparse;
    sc.reqs = sparse ? std::vector<Req>{{40, 1}, {90, 1}, {7, 1}, {20, 6}, {0, 5}}
                     : std::vector<Req>{{40, 1}, {90, 2}, {7, 2}, {20, 6}, {0, 5}};
    sc.batch_invariant = true;
    const StepData d = make_step(sc);
    ASSERT_TRUE(d.plan.config.batch_invariant);
    const LayerRun run = run_layer(d, Device::cpu(), DType::f64, Precision::reference);
    EXPECT_LE(error_ratio(run.out, naive_layer(d, run.cache_view), d), 1.0);

    Scenario plain = sc;
    plain.batch_invariant = false;
    const MlaAttention layer(sc.options(Device::cpu(), DType::f64), d.weight);
    EXPECT_THROW((void)layer.workspace_bytes(make_step(plain).plan), Error);
    EXPECT_THROW((void)layer.max_workspace_bytes(plain.config(), 64), Error);
    EXPECT_NO_THROW((void)layer.max_workspace_bytes(sc.config(), 64));
  }
}

}  // namespace
}  // namespace mla
