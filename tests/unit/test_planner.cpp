// SPDX-License-Identifier: Apache-2.0
// Planner tests: every worked example of docs/SEMANTICS.md §8, §9 and §11.4-11.5, the Plan
// assembled by make_plan, bad input, and randomized coverage properties.
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <numeric>
#include <random>

#include "mla/error.h"
#include "mla/plan.h"

namespace mla {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

std::vector<int32_t> qsl_of(const std::vector<int32_t>& q_lens) {
  std::vector<int32_t> qsl(q_lens.size() + 1, 0);
  std::partial_sum(q_lens.begin(), q_lens.end(), qsl.begin() + 1);
  return qsl;
}

Split split_of(const std::vector<int32_t>& q_lens, int64_t threshold, bool uniform, int64_t num_tokens = -1) {
  return split_decodes_and_prefills(qsl_of(q_lens), threshold, uniform, num_tokens);
}

// ---- §8.1 ---------------------------------------------------------------------------------------

TEST(Planner, ClassifyRequest) {
  EXPECT_EQ(classify_request(0, 1, 1), RequestRegion::prefill);  // fresh, even if short
  EXPECT_EQ(classify_request(0, 100, 4), RequestRegion::prefill);
  EXPECT_EQ(classify_request(7, 1, 1), RequestRegion::decode);
  EXPECT_EQ(classify_request(7, 4, 4), RequestRegion::decode);
  EXPECT_EQ(classify_request(7, 5, 4), RequestRegion::extend);
  EXPECT_THROW(classify_request(-1, 1, 1), Error);
  EXPECT_THROW(classify_request(1, -1, 1), Error);
  EXPECT_THROW(classify_request(1, 1, 0), Error);
}

TEST(Planner, ReorderMovesOnlyMisplacedRequests) {
  // Regions: P D E D P E -> targets D D E E P P. Positions 1, 2, 4 are already right and stay.
  const std::vector<int64_t> computed = {0, 5, 5, 9, 0, 3};
  const std::vector<int64_t> scheduled = {3, 1, 8, 1, 1, 2};
  const ReorderResult r = reorder_decodes_first(computed, scheduled, 1);
  EXPECT_TRUE(r.moved);
  EXPECT_EQ(r.order, (std::vector<int32_t>{3, 1, 2, 5, 4, 0}));
}

TEST(Planner, ReorderIsStableAndReportsNoMove) {
  // All misplaced: decodes keep their relative order, so do prefills.
  ReorderResult r = reorder_decodes_first({0, 0, 4, 6}, {2, 3, 1, 1}, 1);
  EXPECT_TRUE(r.moved);
  EXPECT_EQ(r.order, (std::vector<int32_t>{2, 3, 0, 1}));
  // Already ordered (the threshold decides decode vs extend): nothing moves.
  r = reorder_decodes_first({4, 4, 9, 0}, {3, 2, 5, 2}, 3);
  EXPECT_FALSE(r.moved);
  EXPECT_EQ(r.order, (std::vector<int32_t>{0, 1, 2, 3}));
  // With threshold 1 the same batch has extends before decodes.
  r = reorder_decodes_first({4, 4, 9, 0}, {3, 2, 1, 2}, 1);
  EXPECT_TRUE(r.moved);
  EXPECT_EQ(r.order, (std::vector<int32_t>{2, 1, 0, 3}));
  r = reorder_decodes_first({}, {}, 1);
  EXPECT_FALSE(r.moved);
  EXPECT_TRUE(r.order.empty());
  EXPECT_THROW(reorder_decodes_first({1, 2}, {1}, 1), Error);
  EXPECT_THROW(reorder_decodes_first({1}, {1}, 0), Error);
}

TEST(Planner, ReorderPropertyRandom) {
  std::mt19937_64 gen(1234);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = static_cast<int>(gen() % 12);
    const int64_t thr = 1 + static_cast<int64_t>(gen() % 4);
    std::vector<int64_t> computed(n), scheduled(n);
    for (int i = 0; i < n; ++i) {
      computed[i] = gen() % 3 == 0 ? 0 : 1 + static_cast<int64_t>(gen() % 50);
      scheduled[i] = 1 + static_cast<int64_t>(gen() % 6);
    }
    const ReorderResult r = reorder_decodes_first(computed, scheduled, thr);
    std::vector<int32_t> sorted = r.order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int32_t> iota(n);
    std::iota(iota.begin(), iota.end(), 0);
    ASSERT_EQ(sorted, iota) << "not a permutation";
    std::vector<RequestRegion> before(n), after(n);
    for (int i = 0; i < n; ++i) before[i] = classify_request(computed[i], scheduled[i], thr);
    for (int i = 0; i < n; ++i) after[i] = before[r.order[i]];
    EXPECT_TRUE(std::is_sorted(after.begin(), after.end())) << "not grouped decode -> extend -> prefill";
    bool any_moved = false;
    std::vector<int32_t> last_src(3, -1);
    for (int i = 0; i < n; ++i) any_moved |= r.order[i] != i;
    EXPECT_EQ(any_moved, r.moved);
    // Correctly placed requests stay: position i keeps request i whenever request i's region is
    // the region the grouped order puts at i.
    for (int i = 0; i < n; ++i)
      if (before[i] == after[i]) { EXPECT_EQ(r.order[i], i) << "correctly placed request " << i << " moved"; }
    // Moved requests keep their relative order within each region.
    for (int i = 0; i < n; ++i) {
      if (r.order[i] == i) continue;
      const auto g = static_cast<int>(after[i]);
      EXPECT_GT(r.order[i], last_src[g]);
      last_src[g] = r.order[i];
    }
  }
}

// ---- §8.2 ---------------------------------------------------------------------------------------

TEST(Planner, SplitSpecExamples) {
  // Uniform: is_prefill = q_len != q_lens[0] = 2; first prefill is request 2.
  EXPECT_EQ(split_of({2, 2, 1, 3, 2, 1, 2}, 3, true), (Split{2, 5, 4, 9}));
  // Non-uniform: is_prefill = q_len > 4; first prefill is request 4 (q_len 5).
  EXPECT_EQ(split_of({2, 1, 3, 4, 5, 6, 7, 8}, 4, false), (Split{4, 4, 10, 26}));
  // Uniform: the q_len-4 request is a prefill although it fits the threshold.
  EXPECT_EQ(split_of({2, 2, 2, 4, 5, 6, 7, 8}, 4, true), (Split{3, 5, 6, 30}));
  // Padded uniform: the zero-length request is CUDA-graph padding and counts as a decode; the
  // padded token count must be num_reqs * q_lens[0].
  EXPECT_EQ(split_of({2, 2, 2, 0}, 3, true, 8), (Split{4, 0, 8, 0}));
  EXPECT_THROW(split_of({2, 2, 2, 0}, 3, true, 6), Error);
  EXPECT_THROW(split_of({2, 2, 2, 0}, 3, true, 7), Error);
  // Sparse: query_start_loc [0,1,3,6] (q_lens 1, 2, 3) with threshold 128, uniform.
  EXPECT_EQ(split_decodes_and_prefills({0, 1, 3, 6}, 128, true), (Split{1, 2, 1, 5}));
}

TEST(Planner, SplitShortcutsAndEdges) {
  // Step 1: everything fits the threshold and uniformity is not required (or threshold 1).
  EXPECT_EQ(split_of({2, 2, 1, 3, 2, 1, 2}, 3, false), (Split{7, 0, 13, 0}));
  EXPECT_EQ(split_of({1, 0, 1}, 1, true), (Split{3, 0, 2, 0}));
  EXPECT_EQ(split_of({1, 1, 1}, 1, false, 5), (Split{3, 0, 5, 0}));  // padding joins the decodes
  // Step 2: a long first request makes everything prefill.
  EXPECT_EQ(split_of({5, 1, 1}, 4, false), (Split{0, 3, 0, 7}));
  EXPECT_EQ(split_of({5, 1, 1}, 4, true, 9), (Split{0, 3, 0, 9}));
  // Later short requests after the first prefill are prefills (decodes are a prefix).
  EXPECT_EQ(split_of({1, 3, 1}, 1, false), (Split{1, 2, 1, 4}));
  // Non-uniform split with padding: padding tokens join the prefill region.
  EXPECT_EQ(split_of({1, 3}, 1, false, 6), (Split{1, 1, 1, 5}));
  // Uniform with a zero-length request among longer ones: zero is "!= q_lens[0]" -> prefill.
  EXPECT_EQ(split_of({2, 2, 0, 5}, 3, true), (Split{2, 2, 4, 5}));
  EXPECT_EQ(split_of({}, 1, false), (Split{0, 0, 0, 0}));
  EXPECT_EQ(split_of({}, 4, true), (Split{0, 0, 0, 0}));
}

TEST(Planner, SplitRejectsBadInput) {
  EXPECT_THROW(split_decodes_and_prefills({}, 1, false), Error);
  EXPECT_THROW(split_decodes_and_prefills({1, 2}, 1, false), Error);     // does not start at 0
  EXPECT_THROW(split_decodes_and_prefills({0, 3, 2}, 1, false), Error);  // decreasing
  EXPECT_THROW(split_decodes_and_prefills({0, 3}, 0, false), Error);     // threshold 0
  EXPECT_THROW(split_decodes_and_prefills({0, 3}, 1, false, 2), Error);  // fewer tokens than queries
  EXPECT_THROW(split_decodes_and_prefills({0, 3}, 1, false, -2), Error);
  EXPECT_THROW(split_decodes_and_prefills({0}, 1, false, 4), Error);  // padding without requests
}

// ---- §8.3 ---------------------------------------------------------------------------------------

TEST(Planner, DenseThreshold) {
  using S = QueryLenSupport;
  EXPECT_EQ(dense_decode_threshold(S::single_only, 0, false, 1, false), 1);
  EXPECT_EQ(dense_decode_threshold(S::single_only, 3, false, 1, false), 1);  // no spec-as-decode
  EXPECT_EQ(dense_decode_threshold(S::uniform, 3, false, 1, false), 4);
  EXPECT_EQ(dense_decode_threshold(S::varlen, 3, false, 1, false), 4);
  EXPECT_EQ(dense_decode_threshold(S::uniform, 3, true, 1, false), 7);  // 1 + 2 * k with parallel drafting
  EXPECT_EQ(dense_decode_threshold(S::varlen, 0, true, 1, false), 1);
  EXPECT_EQ(dense_decode_threshold(S::uniform, 3, false, 2, false), 1);  // DCP without varlen support
  EXPECT_EQ(dense_decode_threshold(S::uniform, 3, false, 2, true), 4);
  EXPECT_EQ(dense_decode_threshold(S::uniform, 3, false, 1, false), 4);  // DCP 1 is no DCP
  EXPECT_THROW(dense_decode_threshold(S::uniform, -1, false, 1, false), Error);
  EXPECT_THROW(dense_decode_threshold(S::uniform, 1, false, 0, false), Error);
}

TEST(Planner, SparseThresholdHeadTables) {
  // SM90 table {16:128, 32:128, 64:256, 128:256}, default 256 (exact head-count lookups).
  EXPECT_EQ(sparse_decode_threshold(16, false, 0, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(32, false, 0, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(64, false, 0, false, 1, false), 256);
  EXPECT_EQ(sparse_decode_threshold(128, false, 0, false, 1, false), 256);
  EXPECT_EQ(sparse_decode_threshold(8, false, 0, false, 1, false), 256);
  EXPECT_EQ(sparse_decode_threshold(24, false, 0, false, 1, false), 256);
  // SM100 table {8:128, 16:128, 32:128, 64:256, 128:1024}, default 1024.
  EXPECT_EQ(sparse_decode_threshold(8, true, 0, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(16, true, 0, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(32, true, 0, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(64, true, 0, false, 1, false), 256);
  EXPECT_EQ(sparse_decode_threshold(128, true, 0, false, 1, false), 1024);
  EXPECT_EQ(sparse_decode_threshold(4, true, 0, false, 1, false), 1024);
  // Spec decode only raises the threshold; DCP without varlen support forces 1.
  EXPECT_EQ(sparse_decode_threshold(16, false, 3, false, 1, false), 128);
  EXPECT_EQ(sparse_decode_threshold(16, false, 200, false, 1, false), 201);
  EXPECT_EQ(sparse_decode_threshold(16, false, 200, true, 1, false), 401);
  EXPECT_EQ(sparse_decode_threshold(16, false, 3, false, 4, false), 1);
  EXPECT_EQ(sparse_decode_threshold(16, false, 3, false, 4, true), 128);
  EXPECT_THROW(sparse_decode_threshold(0, false, 0, false, 1, false), Error);
}

// ---- §9 -----------------------------------------------------------------------------------------

TEST(Planner, ChunkedPrefillWorkspaceFormula) {
  // max(min(max(8*L, 4*S*B), 65536[, S*topk]), S*B)
  EXPECT_EQ(chunked_prefill_workspace_rows(163840, 256, 64), 65536);     // capped
  EXPECT_EQ(chunked_prefill_workspace_rows(1024, 4, 16), 8192);          // 8 * max_model_len
  EXPECT_EQ(chunked_prefill_workspace_rows(100, 2, 1), 800);
  EXPECT_EQ(chunked_prefill_workspace_rows(100, 64, 16), 4096);          // 4 * seqs * page wins
  EXPECT_EQ(chunked_prefill_workspace_rows(4096, 2048, 64), 131072);     // floor seqs * page beats the cap
  EXPECT_EQ(chunked_prefill_workspace_rows(163840, 256, 64, 2048), 65536);
  EXPECT_EQ(chunked_prefill_workspace_rows(163840, 16, 64, 2048), 32768);  // seqs * topk term
  EXPECT_EQ(chunked_prefill_workspace_rows(1000, 4, 64, 16), 256);         // floor again
  EXPECT_THROW(chunked_prefill_workspace_rows(0, 4, 64), Error);
  EXPECT_THROW(chunked_prefill_workspace_rows(10, 0, 64), Error);
  EXPECT_THROW(chunked_prefill_workspace_rows(10, 4, 0), Error);
  EXPECT_THROW(chunked_prefill_workspace_rows(10, 4, 64, -1), Error);
}

void expect_chunk(const ContextChunk& c, int32_t start, const std::vector<int32_t>& lens) {
  EXPECT_EQ(c.seq_starts, std::vector<int32_t>(lens.size(), start));
  EXPECT_EQ(c.lens, lens);
  std::vector<int32_t> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  EXPECT_EQ(c.cu_seq_lens, cu);
  EXPECT_EQ(c.total, cu.back());
  EXPECT_EQ(c.max_len, lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end()));
}

TEST(Planner, ContextChunksRoundToPageWithZeroLengthChunks) {
  // 3 prefills with context share 256 rows: 85 each, rounded down to the page (16) -> 80.
  const ContextPlan p = plan_context_chunks({100, 30, 0, 250}, 256, 16);
  EXPECT_EQ(p.chunk_size, 80);
  ASSERT_EQ(p.chunks.size(), 4u);  // ceil(250 / 80)
  expect_chunk(p.chunks[0], 0, {80, 30, 0, 80});
  expect_chunk(p.chunks[1], 80, {20, 0, 0, 80});
  expect_chunk(p.chunks[2], 160, {0, 0, 0, 80});
  expect_chunk(p.chunks[3], 240, {0, 0, 0, 10});
  // Without page rounding the chunk is the plain share.
  const ContextPlan q = plan_context_chunks({100, 30, 0, 250}, 256, 16, false);
  EXPECT_EQ(q.chunk_size, 85);
  ASSERT_EQ(q.chunks.size(), 3u);
  expect_chunk(q.chunks[0], 0, {85, 30, 0, 85});
  expect_chunk(q.chunks[1], 85, {15, 0, 0, 85});
  expect_chunk(q.chunks[2], 170, {0, 0, 0, 80});
  // Exact multiple: ceil(160 / 80) = 2 chunks, no empty trailing chunk.
  EXPECT_EQ(plan_context_chunks({160}, 80, 16).chunks.size(), 2u);
}

TEST(Planner, ContextChunksEmptyAndErrors) {
  const ContextPlan none = plan_context_chunks({0, 0}, 256, 16);
  EXPECT_EQ(none.chunk_size, 0);
  EXPECT_TRUE(none.chunks.empty());
  EXPECT_TRUE(plan_context_chunks({}, 256, 16).chunks.empty());
  // 32 rows / 3 prefills = 10 per prefill: below one page of 16.
  EXPECT_THROW(plan_context_chunks({5, 5, 5}, 32, 16), Error);
  EXPECT_EQ(plan_context_chunks({5, 5, 5}, 32, 16, false).chunk_size, 10);
  EXPECT_THROW(plan_context_chunks({5, -1}, 32, 16), Error);
  EXPECT_THROW(plan_context_chunks({5}, 0, 16), Error);
  EXPECT_THROW(plan_context_chunks({5}, 32, 0), Error);
}

// Issue 14: a huge workspace planned zero chunks (the context was silently ignored), and the default
// workspace formula's products wrapped.
TEST(Planner, HugeWorkspacesAndConfigsDoNotWrap) {
  for (int64_t ws : {int64_t(1) << 62, std::numeric_limits<int64_t>::max()}) {
    for (bool round : {false, true}) {
      const ContextPlan p = plan_context_chunks({100, 0, 37}, ws, 16, round);
      ASSERT_EQ(p.chunks.size(), 1u) << ws;
      EXPECT_EQ(p.chunks[0].lens, (std::vector<int32_t>{100, 0, 37}));
    }
  }
  EXPECT_THROW(chunked_prefill_workspace_rows(int64_t(1) << 62, 1, 1, 0), Error);
  EXPECT_THROW(chunked_prefill_workspace_rows(1, int64_t(1) << 40, int64_t(1) << 40, 0), Error);
  EXPECT_THROW(chunked_prefill_workspace_rows(1, int64_t(1) << 61, 1, 0), Error);
  EXPECT_THROW(sparse_prefill_workspace_rows(int64_t(1) << 62), Error);
}

TEST(Planner, ContextChunksCoverEveryTokenOnceRandom) {
  std::mt19937_64 gen(42);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = static_cast<int>(gen() % 9);
    const int64_t page = int64_t{1} << (gen() % 7);
    std::vector<int32_t> ctx(n);
    int64_t with_context = 0, max_ctx = 0;
    for (auto& c : ctx) {
      c = gen() % 4 == 0 ? 0 : static_cast<int32_t>(gen() % 3000);
      with_context += c > 0;
      max_ctx = std::max<int64_t>(max_ctx, c);
    }
    const bool round = gen() % 2;
    const int64_t ws = std::max<int64_t>(with_context, 1) * page + static_cast<int64_t>(gen() % 2048);
    const ContextPlan p = plan_context_chunks(ctx, ws, page, round);
    if (max_ctx == 0) {
      EXPECT_TRUE(p.chunks.empty());
      continue;
    }
    ASSERT_GT(p.chunk_size, 0);
    if (round) { EXPECT_EQ(p.chunk_size % page, 0); }
    EXPECT_EQ(static_cast<int64_t>(p.chunks.size()), (max_ctx + p.chunk_size - 1) / p.chunk_size);
    std::vector<std::vector<int>> seen(n);
    for (int r = 0; r < n; ++r) seen[r].assign(ctx[r], 0);
    for (std::size_t i = 0; i < p.chunks.size(); ++i) {
      const ContextChunk& c = p.chunks[i];
      EXPECT_LE(c.total, ws) << "chunk overflows the workspace";
      ASSERT_EQ(c.lens.size(), static_cast<std::size_t>(n));
      ASSERT_EQ(c.cu_seq_lens.size(), static_cast<std::size_t>(n + 1));
      EXPECT_EQ(c.cu_seq_lens[0], 0);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(c.seq_starts[r], static_cast<int64_t>(i) * p.chunk_size);
        EXPECT_EQ(c.cu_seq_lens[r + 1] - c.cu_seq_lens[r], c.lens[r]);
        for (int32_t t = 0; t < c.lens[r]; ++t) {
          const int64_t pos = int64_t{c.seq_starts[r]} + t;
          ASSERT_LT(pos, ctx[r]);
          ++seen[r][pos];
        }
      }
    }
    for (int r = 0; r < n; ++r)
      for (int32_t t = 0; t < ctx[r]; ++t) ASSERT_EQ(seen[r][t], 1) << "request " << r << " token " << t;
  }
}

// ---- §11.4-11.5 ---------------------------------------------------------------------------------

TEST(Planner, ReqIdPerToken) {
  EXPECT_EQ(req_id_per_token({0, 2, 2, 5}), (std::vector<int32_t>{0, 0, 2, 2, 2}));
  EXPECT_TRUE(req_id_per_token({0}).empty());
  EXPECT_THROW(req_id_per_token({0, 3, 1}), Error);
}

TEST(Planner, SplitPrefillChunksSpecExamples) {
  EXPECT_EQ(split_prefill_chunks({2, 3, 4, 2}, 5), (Ranges{{0, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(split_prefill_chunks({5, 5, 5}, 5), (Ranges{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(split_prefill_chunks({1, 1, 1}, 10), (Ranges{{0, 3}}));
  EXPECT_EQ(split_prefill_chunks({2, 3, 4, 2}, 5, 7), (Ranges{{7, 9}, {9, 10}, {10, 11}}));
  EXPECT_EQ(split_prefill_chunks({4, 0, 1, 0, 3}, 5), (Ranges{{0, 4}, {4, 5}}));  // empties ride along
  EXPECT_TRUE(split_prefill_chunks({}, 5).empty());
  EXPECT_THROW(split_prefill_chunks({2, 6, 1}, 5), Error);  // one request beyond the workspace
  EXPECT_THROW(split_prefill_chunks({2, -1}, 5), Error);
  EXPECT_THROW(split_prefill_chunks({2}, 0), Error);
  // Issue 51: a workspace near 2^63 rows (total + seq_len overflowed int64; UBSan).
  constexpr int32_t big = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(split_prefill_chunks({big, big, 1}, std::numeric_limits<int64_t>::max()), (Ranges{{0, 3}}));
  EXPECT_EQ(split_prefill_chunks({big, big, 1}, int64_t(big) * 2), (Ranges{{0, 2}, {2, 3}}));
}

TEST(Planner, PrefillWorkspaceStartsRezeroPerChunk) {
  EXPECT_EQ(prefill_workspace_starts({10, 15, 20, 5}, {{0, 2}, {2, 4}}), (std::vector<int32_t>{0, 10, 0, 20}));
  EXPECT_EQ(prefill_workspace_starts({10, 15, 20, 5}, {{0, 4}}), (std::vector<int32_t>{0, 10, 25, 45}));
  EXPECT_EQ(prefill_workspace_starts({2, 3, 4, 2}, split_prefill_chunks({2, 3, 4, 2}, 5)),
            (std::vector<int32_t>{0, 2, 0, 0}));
  EXPECT_TRUE(prefill_workspace_starts({}, {}).empty());
  EXPECT_THROW(prefill_workspace_starts({1, 2, 3}, {{0, 2}}), Error);          // does not cover request 2
  EXPECT_THROW(prefill_workspace_starts({1, 2, 3}, {{0, 1}, {2, 3}}), Error);  // gap
  EXPECT_THROW(prefill_workspace_starts({1, 2, 3}, {{0, 2}, {1, 3}}), Error);  // overlap
  EXPECT_THROW(prefill_workspace_starts({1, 2}, {{0, 3}}), Error);             // past the end
}

TEST(Planner, MixedBatchDecisionAndHeadPadding) {
  EXPECT_TRUE(sparse_use_mixed_batch(1));
  EXPECT_TRUE(sparse_use_mixed_batch(16));
  EXPECT_TRUE(sparse_use_mixed_batch(31));
  EXPECT_FALSE(sparse_use_mixed_batch(32));
  EXPECT_FALSE(sparse_use_mixed_batch(128));
  EXPECT_FALSE(sparse_use_mixed_batch(16, /*hisparse=*/true));
  EXPECT_FALSE(sparse_use_mixed_batch(16, false, /*pcp_and_dcp=*/true));
  EXPECT_THROW(sparse_use_mixed_batch(0), Error);

  EXPECT_EQ(sparse_fp8_decode_padded_heads(1), 64);
  EXPECT_EQ(sparse_fp8_decode_padded_heads(64), 64);
  EXPECT_EQ(sparse_fp8_decode_padded_heads(65), 128);
  EXPECT_EQ(sparse_fp8_decode_padded_heads(128), 128);
  EXPECT_EQ(sparse_fp8_decode_padded_heads(200), 256);
  EXPECT_THROW(sparse_fp8_decode_padded_heads(0), Error);

  EXPECT_EQ(sparse_prefill_padded_heads(16, false), 64);
  EXPECT_EQ(sparse_prefill_padded_heads(64, false), 64);
  EXPECT_EQ(sparse_prefill_padded_heads(65, false), 128);
  EXPECT_EQ(sparse_prefill_padded_heads(16, true), 128);
  EXPECT_EQ(sparse_prefill_padded_heads(129, true), 256);
  EXPECT_THROW(sparse_prefill_padded_heads(0, true), Error);

  EXPECT_EQ(sparse_prefill_workspace_rows(163840), 819200);
  EXPECT_THROW(sparse_prefill_workspace_rows(0), Error);
}

// ---- make_plan ----------------------------------------------------------------------------------

PlannerConfig dense_config() {
  PlannerConfig c;
  c.dims = ModelDims::deepseek_v3(1);
  c.page_size = 16;
  c.max_model_len = 4096;
  c.max_num_seqs = 8;
  return c;
}

PlannerConfig sparse_config(int tp, CacheFormat format) {
  PlannerConfig c;
  c.dims = ModelDims::deepseek_v32(tp);
  c.sparse = true;
  c.cache_format = format;
  c.page_size = 64;
  c.max_model_len = 200;
  c.max_num_seqs = 8;
  c.decode_threshold = sparse_decode_threshold(c.dims.num_heads, false, 0, false, 1, false);
  c.require_uniform = true;
  return c;
}

BatchDesc batch_of(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& seq_lens, int64_t num_tokens = -1) {
  return BatchDesc{qsl_of(q_lens), seq_lens, num_tokens};
}

TEST(Planner, MakePlanDenseMixedBatch) {
  PlannerConfig cfg = dense_config();
  cfg.context_workspace_rows = 32;
  // 2 decodes (context 9, 19), 2 extends (context 20, 38), 2 fresh prefills.
  const Plan p = make_plan(batch_of({1, 1, 5, 2, 3, 4}, {10, 20, 25, 40, 3, 4}), cfg);
  EXPECT_EQ(p.num_reqs, 6);
  EXPECT_EQ(p.num_tokens, 16);
  EXPECT_EQ(p.num_actual_tokens, 16);
  EXPECT_EQ(p.split, (Split{2, 4, 2, 14}));
  EXPECT_EQ(p.decode_query_len, 1);
  EXPECT_EQ(p.max_decode_seq_len, 20);
  EXPECT_EQ(p.prefill_query_start_loc, (std::vector<int32_t>{0, 5, 7, 10, 14}));
  EXPECT_EQ(p.prefill_seq_lens, (std::vector<int32_t>{25, 40, 3, 4}));
  EXPECT_EQ(p.prefill_context_lens, (std::vector<int32_t>{20, 38, 0, 0}));
  EXPECT_EQ(p.max_prefill_query_len, 5);
  EXPECT_EQ(p.max_prefill_seq_len, 40);
  EXPECT_EQ(p.prefill_tokens_with_context, 7);
  // 32 rows / 2 prefills with context = 16 (one page); ceil(38 / 16) = 3 chunks.
  EXPECT_EQ(p.context.chunk_size, 16);
  ASSERT_EQ(p.context.chunks.size(), 3u);
  expect_chunk(p.context.chunks[0], 0, {16, 16, 0, 0});
  expect_chunk(p.context.chunks[1], 16, {4, 16, 0, 0});
  expect_chunk(p.context.chunks[2], 32, {0, 6, 0, 0});
  EXPECT_TRUE(p.req_id_per_token.empty());
  EXPECT_TRUE(p.prefill_request_id.empty());
  EXPECT_TRUE(p.sparse_chunks.empty());
  EXPECT_FALSE(p.sparse_mixed_batch);
  EXPECT_EQ(p.config.context_workspace_rows, 32);
  EXPECT_EQ(p.config.sparse_workspace_rows, 5 * 4096);
  EXPECT_TRUE(p.has_decode());
  EXPECT_TRUE(p.has_prefill());

  // Default workspace: the §9 formula (8 * 4096 rows), one chunk per context.
  const Plan d = make_plan(batch_of({1, 1, 5, 2, 3, 4}, {10, 20, 25, 40, 3, 4}), dense_config());
  EXPECT_EQ(d.config.context_workspace_rows, 32768);
  EXPECT_EQ(d.context.chunk_size, 16384);
  ASSERT_EQ(d.context.chunks.size(), 1u);
  expect_chunk(d.context.chunks[0], 0, {20, 38, 0, 0});

  // CUDA-graph padding tokens join the trailing (prefill) region of the split.
  const Plan padded = make_plan(batch_of({1, 1, 5, 2, 3, 4}, {10, 20, 25, 40, 3, 4}, 20), dense_config());
  EXPECT_EQ(padded.num_tokens, 20);
  EXPECT_EQ(padded.num_actual_tokens, 16);
  EXPECT_EQ(padded.split, (Split{2, 4, 2, 18}));
  EXPECT_EQ(padded.prefill_query_start_loc.back(), 14);
}

TEST(Planner, MakePlanPrefillOnlyAndEmpty) {
  const Plan p = make_plan(batch_of({6, 3}, {6, 3}), dense_config());
  EXPECT_EQ(p.split, (Split{0, 2, 0, 9}));
  EXPECT_EQ(p.decode_query_len, 0);
  EXPECT_EQ(p.max_decode_seq_len, 0);
  EXPECT_EQ(p.prefill_tokens_with_context, 0);
  EXPECT_EQ(p.context.chunk_size, 0);
  EXPECT_TRUE(p.context.chunks.empty());
  const Plan e = make_plan(BatchDesc{{0}, {}, -1}, dense_config());
  EXPECT_EQ(e.num_reqs, 0);
  EXPECT_EQ(e.split, (Split{0, 0, 0, 0}));
  EXPECT_FALSE(e.has_decode());
  EXPECT_FALSE(e.has_prefill());
}

TEST(Planner, MakePlanUniformSpecDecodeWithPadding) {
  PlannerConfig cfg = dense_config();
  cfg.decode_threshold = dense_decode_threshold(QueryLenSupport::uniform, 2, false, 1, false);  // 3
  cfg.require_uniform = true;
  const Plan p = make_plan(batch_of({3, 3, 3, 0}, {10, 11, 12, 0}, 12), cfg);
  EXPECT_EQ(p.split, (Split{4, 0, 12, 0}));
  EXPECT_EQ(p.decode_query_len, 3);
  EXPECT_EQ(p.max_decode_seq_len, 12);
  EXPECT_TRUE(p.prefill_query_start_loc.empty());
  EXPECT_TRUE(p.context.chunks.empty());
  // Without the padded count the uniform batch is inconsistent (§8.2 step 3).
  EXPECT_THROW(make_plan(batch_of({3, 3, 3, 0}, {10, 11, 12, 0}), cfg), Error);
  // Uniform with a prefill tail: the short 1-token request after the decodes is a prefill.
  const Plan m = make_plan(batch_of({3, 3, 1, 7}, {10, 11, 12, 7}), cfg);
  EXPECT_EQ(m.split, (Split{2, 2, 6, 8}));
  EXPECT_EQ(m.prefill_context_lens, (std::vector<int32_t>{11, 0}));
  EXPECT_EQ(m.prefill_tokens_with_context, 1);
  // A zero-length request between decodes breaks the (rows, decode_query_len) reshape.
  cfg.decode_threshold = 1;
  EXPECT_THROW(make_plan(batch_of({1, 0, 1}, {5, 0, 6}), cfg), Error);
  EXPECT_NO_THROW(make_plan(batch_of({1, 1, 0}, {5, 6, 0}), cfg));
}

TEST(Planner, MakePlanSparseBf16) {
  const PlannerConfig cfg = sparse_config(1, CacheFormat::bf16);  // 128 heads, threshold 256
  ASSERT_EQ(cfg.decode_threshold, 256);
  const Plan p = make_plan(batch_of({2, 2, 7}, {30, 40, 7}, 14), cfg);
  EXPECT_EQ(p.split, (Split{2, 1, 4, 10}));
  EXPECT_EQ(p.decode_query_len, 2);
  EXPECT_EQ(p.req_id_per_token, (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0}));
  EXPECT_FALSE(p.sparse_mixed_batch);
  EXPECT_TRUE(p.sparse_chunks.empty());  // bf16: global cache slots, no workspace
  EXPECT_TRUE(p.prefill_request_id.empty());
  EXPECT_TRUE(p.context.chunks.empty());  // sparse: no dense context chunks
  EXPECT_EQ(p.prefill_query_start_loc, (std::vector<int32_t>{0, 7}));
}

TEST(Planner, MakePlanSparseFp8MixedBatch) {
  const PlannerConfig cfg = sparse_config(8, CacheFormat::fp8_ds_mla);  // 16 heads < 32
  const Plan p = make_plan(batch_of({2, 2, 7}, {30, 40, 7}), cfg);
  EXPECT_TRUE(p.sparse_mixed_batch);
  EXPECT_TRUE(p.sparse_chunks.empty());
  EXPECT_TRUE(p.prefill_request_id.empty());
  EXPECT_EQ(p.req_id_per_token.size(), 11u);
}

TEST(Planner, MakePlanSparseFp8SeparateChunks) {
  PlannerConfig cfg = sparse_config(1, CacheFormat::fp8_ds_mla);  // 128 heads: separate mode
  cfg.sparse_workspace_rows = 200;
  // Decodes of 2 tokens, then a 1-token request with context (a prefill under uniformity) and two
  // fresh prefills. Prefill seq_lens [31, 100, 150] in 200 rows -> chunks [0,2), [2,3).
  const BatchDesc batch = batch_of({2, 2, 1, 100, 150}, {50, 60, 31, 100, 150});
  const Plan p = make_plan(batch, cfg);
  EXPECT_FALSE(p.sparse_mixed_batch);
  EXPECT_EQ(p.split, (Split{2, 3, 4, 251}));
  EXPECT_EQ(p.decode_query_len, 2);
  EXPECT_EQ(p.prefill_tokens_with_context, 1);
  ASSERT_EQ(p.sparse_chunks.size(), 2u);
  const SparsePrefillChunk& a = p.sparse_chunks[0];
  EXPECT_EQ(a.req_begin, 0);
  EXPECT_EQ(a.req_end, 2);
  EXPECT_EQ(a.token_begin, 4);
  EXPECT_EQ(a.token_end, 105);
  EXPECT_EQ(a.total_rows, 131);
  EXPECT_EQ(a.workspace_starts, (std::vector<int32_t>{0, 31}));
  const SparsePrefillChunk& b = p.sparse_chunks[1];
  EXPECT_EQ(b.req_begin, 2);
  EXPECT_EQ(b.req_end, 3);
  EXPECT_EQ(b.token_begin, 105);
  EXPECT_EQ(b.token_end, 255);
  EXPECT_EQ(b.total_rows, 150);
  EXPECT_EQ(b.workspace_starts, (std::vector<int32_t>{0}));
  ASSERT_EQ(p.prefill_request_id.size(), 255u);
  for (int t = 0; t < 255; ++t) {
    const int32_t expect = t < 4 ? -1 : t < 5 ? 0 : t < 105 ? 1 : 2;
    ASSERT_EQ(p.prefill_request_id[t], expect) << "token " << t;
  }
  // Default workspace 5 * max_model_len = 1000 rows: one chunk, plain exclusive cumsum.
  cfg.sparse_workspace_rows = 0;
  const Plan q = make_plan(batch, cfg);
  EXPECT_EQ(q.config.sparse_workspace_rows, 1000);
  ASSERT_EQ(q.sparse_chunks.size(), 1u);
  EXPECT_EQ(q.sparse_chunks[0].workspace_starts, (std::vector<int32_t>{0, 31, 131}));
  EXPECT_EQ(q.sparse_chunks[0].total_rows, 281);
  // Padding tokens of a separate-mode batch are neither decodes nor prefills of a request.
  const Plan padded = make_plan(batch_of({2, 2, 1, 100, 150}, {50, 60, 31, 100, 150}, 260), cfg);
  ASSERT_EQ(padded.prefill_request_id.size(), 260u);
  EXPECT_EQ(padded.prefill_request_id[255], -1);
  EXPECT_EQ(padded.req_id_per_token[259], 0);
  // Decode-only separate batch: no prefill mapping.
  EXPECT_TRUE(make_plan(batch_of({2, 2}, {9, 9}), cfg).prefill_request_id.empty());
}

// PlannerConfig::sparse_prefill_mode overrides §11.4's head rule for fp8_ds_mla and only there.
TEST(Planner, SparsePrefillModeOverridesTheHeadRule) {
  EXPECT_EQ(sparse_mixed_batch_for(SparsePrefillMode::automatic, 16), sparse_use_mixed_batch(16));
  EXPECT_EQ(sparse_mixed_batch_for(SparsePrefillMode::automatic, 32), sparse_use_mixed_batch(32));
  EXPECT_TRUE(sparse_mixed_batch_for(SparsePrefillMode::mixed_batch, 128));
  EXPECT_FALSE(sparse_mixed_batch_for(SparsePrefillMode::separate, 1));
  EXPECT_THROW(sparse_mixed_batch_for(static_cast<SparsePrefillMode>(3), 16), Error);
  EXPECT_THROW(sparse_mixed_batch_for(static_cast<SparsePrefillMode>(3), 16, 90), Error);
  // automatic on compute capability 9.0 (the sm90 kernels): separate at every head count, except in a
  // DCP group (mixed batch below 32 heads there, the only mode DCP plans); other devices keep §11.4's rule.
  for (int h : {1, 16, 31, 32, 128}) {
    EXPECT_FALSE(sparse_mixed_batch_for(SparsePrefillMode::automatic, h, 90)) << h;
    EXPECT_EQ(sparse_mixed_batch_for(SparsePrefillMode::automatic, h, 90, 2), sparse_use_mixed_batch(h)) << h;
    EXPECT_EQ(sparse_mixed_batch_for(SparsePrefillMode::automatic, h, 80), sparse_use_mixed_batch(h)) << h;
    EXPECT_EQ(sparse_mixed_batch_for(SparsePrefillMode::automatic, h, 100), sparse_use_mixed_batch(h)) << h;
    EXPECT_TRUE(sparse_mixed_batch_for(SparsePrefillMode::mixed_batch, h, 90)) << h;
  }
  EXPECT_THROW(sparse_mixed_batch_for(SparsePrefillMode::automatic, 0, 90), Error);
  EXPECT_THROW(sparse_mixed_batch_for(static_cast<SparsePrefillMode>(-1), 16), Error);
  EXPECT_STREQ(to_string(SparsePrefillMode::separate), "separate");

  const BatchDesc batch = batch_of({2, 2, 1, 100, 150}, {50, 60, 31, 100, 150});
  PlannerConfig h16 = sparse_config(8, CacheFormat::fp8_ds_mla);  // 16 heads: mixed batch by the rule
  h16.sparse_workspace_rows = 200;
  h16.sparse_prefill_mode = SparsePrefillMode::separate;
  const Plan sep = make_plan(batch, h16);
  EXPECT_FALSE(sep.sparse_mixed_batch);
  ASSERT_EQ(sep.sparse_chunks.size(), 2u);  // the same chunks as the 128-head separate plan above
  EXPECT_EQ(sep.sparse_chunks[0].workspace_starts, (std::vector<int32_t>{0, 31}));
  EXPECT_EQ(sep.prefill_request_id.size(), 255u);
  h16.sparse_prefill_mode = SparsePrefillMode::automatic;
  EXPECT_TRUE(make_plan(batch, h16).sparse_mixed_batch);

  PlannerConfig h128 = sparse_config(1, CacheFormat::fp8_ds_mla);  // 128 heads: separate by the rule
  h128.sparse_prefill_mode = SparsePrefillMode::mixed_batch;
  const Plan mixed = make_plan(batch, h128);
  EXPECT_TRUE(mixed.sparse_mixed_batch);
  EXPECT_TRUE(mixed.sparse_chunks.empty());
  EXPECT_TRUE(mixed.prefill_request_id.empty());
  // A plan's digest covers the mode: the same batch under another mode is another plan.
  h128.sparse_prefill_mode = SparsePrefillMode::separate;
  EXPECT_NE(make_plan(batch, h128).seal, mixed.seal);

  // Other formats ignore the mode: bf16 sparse plans use global slots for every token.
  PlannerConfig bf16 = sparse_config(8, CacheFormat::bf16);
  bf16.sparse_prefill_mode = SparsePrefillMode::separate;
  EXPECT_FALSE(make_plan(batch, bf16).sparse_mixed_batch);
  EXPECT_TRUE(make_plan(batch, bf16).sparse_chunks.empty());

  // A value outside the enum is refused by validate() and make_plan; DCP refuses the separate mode.
  PlannerConfig bad = sparse_config(8, CacheFormat::fp8_ds_mla);
  bad.sparse_prefill_mode = static_cast<SparsePrefillMode>(7);
  EXPECT_THROW(bad.validate(), Error);
  EXPECT_THROW(make_plan(batch, bad), Error);
  PlannerConfig dcp = sparse_config(8, CacheFormat::fp8_ds_mla);
  dcp.dcp = {2, 0, 1};
  dcp.sparse_prefill_mode = SparsePrefillMode::separate;
  EXPECT_THROW(make_plan(batch, dcp), Error);
  dcp.sparse_prefill_mode = SparsePrefillMode::mixed_batch;
  EXPECT_NO_THROW(make_plan(batch, dcp));
  // automatic on a compute capability 9.0 device: separate (same chunks as forced), but a DCP rank keeps
  // the mixed batch at 16 heads; the device is part of the digest; a negative capability is refused.
  h16.compute_capability = 90;
  h16.sparse_prefill_mode = SparsePrefillMode::automatic;
  EXPECT_TRUE(h16.sparse_mixed_batch() == false);
  const Plan sm90 = make_plan(batch, h16);
  EXPECT_FALSE(sm90.sparse_mixed_batch);
  EXPECT_EQ(sm90.sparse_chunks.size(), sep.sparse_chunks.size());
  h16.compute_capability = 80;
  EXPECT_TRUE(make_plan(batch, h16).sparse_mixed_batch);
  EXPECT_NE(make_plan(batch, h16).seal, sm90.seal);
  dcp.compute_capability = 90;
  dcp.sparse_prefill_mode = SparsePrefillMode::automatic;
  EXPECT_TRUE(make_plan(batch, dcp).sparse_mixed_batch);
  dcp.compute_capability = -1;
  EXPECT_THROW(dcp.validate(), Error);
}

TEST(Planner, MakePlanSparseSeparateNeedsUniformDecodes) {
  PlannerConfig cfg = sparse_config(1, CacheFormat::fp8_ds_mla);
  cfg.require_uniform = false;
  // Both fit the threshold, so both are decodes, but of different lengths: no uniform reshape.
  EXPECT_THROW(make_plan(batch_of({2, 1}, {10, 10}), cfg), Error);
  cfg.cache_format = CacheFormat::bf16;  // the global-slot path takes any decode lengths
  EXPECT_NO_THROW(make_plan(batch_of({2, 1}, {10, 10}), cfg));
}

TEST(Planner, MakePlanRejectsBadBatches) {
  const PlannerConfig cfg = dense_config();
  EXPECT_THROW(make_plan(BatchDesc{{0, 3, 2}, {3, 3}, -1}, cfg), Error);  // non-monotone
  EXPECT_THROW(make_plan(BatchDesc{{1, 3}, {3}, -1}, cfg), Error);        // does not start at 0
  EXPECT_THROW(make_plan(BatchDesc{{}, {}, -1}, cfg), Error);
  EXPECT_THROW(make_plan(batch_of({3, 1}, {3}), cfg), Error);            // seq_lens size
  EXPECT_THROW(make_plan(batch_of({3}, {2}), cfg), Error);               // seq_len < query_len
  EXPECT_THROW(make_plan(batch_of({3}, {4097}), cfg), Error);            // beyond max_model_len
  EXPECT_NO_THROW(make_plan(batch_of({3}, {4096}), cfg));
  EXPECT_THROW(make_plan(batch_of({1, 3}, {5, 3}, 3), cfg), Error);      // num_tokens < actual
  EXPECT_THROW(make_plan(batch_of({1, 3}, {5, 3}, -5), cfg), Error);
  EXPECT_THROW(make_plan(batch_of({3, 1}, {3, 10}), cfg), Error);        // fresh prefill before a decode
  EXPECT_THROW(make_plan(batch_of({4, 1}, {10, 10}), cfg), Error);       // extend before a decode
  EXPECT_THROW(make_plan(batch_of({4, 2}, {4, 10}), cfg), Error);        // fresh prefill before an extend
  EXPECT_THROW(make_plan(batch_of({4, 0}, {4, 5}), cfg), Error);         // context after a fresh prefill
  EXPECT_NO_THROW(make_plan(batch_of({4, 0}, {4, 0}), cfg));             // zero-length padding may trail
  EXPECT_THROW(make_plan(batch_of(std::vector<int32_t>(9, 1), std::vector<int32_t>(9, 2)), cfg), Error);
  PlannerConfig small = cfg;
  small.context_workspace_rows = 16;  // two prefills with context need 2 pages
  EXPECT_THROW(make_plan(batch_of({2, 2}, {5, 6}), small), Error);
  EXPECT_NO_THROW(make_plan(batch_of({2, 2}, {5, 2}), small));
}

TEST(Planner, ConfigValidation) {
  EXPECT_NO_THROW(dense_config().validate());
  EXPECT_NO_THROW(PlannerConfig{}.validate());  // defaults are usable as they stand
  auto bad = [](auto mutate) {
    PlannerConfig c = dense_config();
    mutate(c);
    return c;
  };
  EXPECT_THROW(bad([](PlannerConfig& c) { c.page_size = 0; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.max_num_seqs = 0; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.max_model_len = 0; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.max_model_len = int64_t{1} << 31; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.decode_threshold = 0; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.context_workspace_rows = 8; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.context_workspace_rows = -1; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.sparse_workspace_rows = 4095; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.dims.num_heads = 0; }).validate(), Error);
  EXPECT_THROW(bad([](PlannerConfig& c) { c.dims.index_topk = -1; }).validate(), Error);
  EXPECT_THROW(make_plan(batch_of({1}, {2}), bad([](PlannerConfig& c) { c.page_size = -4; })), Error);
}

// Random decode -> extend -> prefill batches: the plan's context chunks cover every context token
// of every prefill exactly once, and the sparse chunks tile the prefill requests and tokens.
TEST(Planner, MakePlanPropertyRandom) {
  std::mt19937_64 gen(7);
  int multi_context_chunks = 0, multi_sparse_chunks = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool sparse = trial % 2 == 1;
    PlannerConfig cfg = sparse ? sparse_config(1, CacheFormat::fp8_ds_mla) : dense_config();
    cfg.max_model_len = 3000;
    cfg.max_num_seqs = 12;
    cfg.page_size = int64_t{1} << (gen() % 6);
    cfg.decode_threshold = 1 + static_cast<int64_t>(gen() % 4);
    if (sparse) cfg.sparse_workspace_rows = 3000 + static_cast<int64_t>(gen() % 500);
    else cfg.context_workspace_rows = 8 * cfg.page_size + static_cast<int64_t>(gen() % 1000);
    const int nd = static_cast<int>(gen() % 4), ne = static_cast<int>(gen() % 4), nf = static_cast<int>(gen() % 4);
    const int32_t dq = 1 + static_cast<int32_t>(gen() % cfg.decode_threshold);  // uniform decode length
    std::vector<int32_t> q, seq;
    auto add = [&](int32_t ql, int32_t ctx) { q.push_back(ql); seq.push_back(ql + ctx); };
    for (int i = 0; i < nd; ++i) add(dq, 1 + static_cast<int32_t>(gen() % 2000));
    for (int i = 0; i < ne; ++i)
      add(static_cast<int32_t>(cfg.decode_threshold) + 1 + static_cast<int32_t>(gen() % 300),
          1 + static_cast<int32_t>(gen() % 2000));
    for (int i = 0; i < nf; ++i) add(1 + static_cast<int32_t>(gen() % 600), 0);
    const Plan p = make_plan(batch_of(q, seq), cfg);
    const int64_t nd_split = p.split.num_decodes;
    ASSERT_EQ(nd_split + p.split.num_prefills, p.num_reqs);
    ASSERT_EQ(p.split.num_decode_tokens + p.split.num_prefill_tokens, p.num_tokens);
    ASSERT_EQ(p.split.num_decode_tokens, p.query_start_loc[nd_split]);
    int64_t with_ctx_tokens = 0;
    for (int64_t r = nd_split; r < p.num_reqs; ++r)
      if (seq[r] > q[r]) with_ctx_tokens += q[r];
    EXPECT_EQ(p.prefill_tokens_with_context, with_ctx_tokens);
    if (!sparse) {
      const auto& ctx = p.prefill_context_lens;
      std::vector<std::vector<int>> seen(ctx.size());
      for (std::size_t r = 0; r < ctx.size(); ++r) seen[r].assign(ctx[r], 0);
      for (const ContextChunk& c : p.context.chunks) {
        EXPECT_LE(c.total, p.config.context_workspace_rows);
        EXPECT_EQ(c.seq_starts[0] % cfg.page_size, 0);
        for (std::size_t r = 0; r < ctx.size(); ++r)
          for (int32_t t = 0; t < c.lens[r]; ++t) ++seen[r][c.seq_starts[r] + t];
      }
      for (std::size_t r = 0; r < ctx.size(); ++r)
        for (int32_t t = 0; t < ctx[r]; ++t) ASSERT_EQ(seen[r][t], 1) << "trial " << trial;
      multi_context_chunks += p.context.chunks.size() > 1;
      continue;
    }
    // Sparse separate mode: chunks tile prefill requests and their tokens, each fits the workspace.
    if (!p.has_prefill()) {
      EXPECT_TRUE(p.sparse_chunks.empty());
      continue;
    }
    int64_t req = 0, tok = p.split.num_decode_tokens;
    for (const SparsePrefillChunk& c : p.sparse_chunks) {
      EXPECT_EQ(c.req_begin, req);
      EXPECT_EQ(c.token_begin, tok);
      EXPECT_LE(c.total_rows, p.config.sparse_workspace_rows);
      int64_t rows = 0;
      for (int64_t r = c.req_begin; r < c.req_end; ++r) {
        EXPECT_EQ(c.workspace_starts[r - c.req_begin], rows);
        rows += p.prefill_seq_lens[r];
        for (int32_t t = p.query_start_loc[nd_split + r]; t < p.query_start_loc[nd_split + r + 1]; ++t)
          ASSERT_EQ(p.prefill_request_id[t], r);
      }
      EXPECT_EQ(rows, c.total_rows);
      req = c.req_end;
      tok = c.token_end;
    }
    EXPECT_EQ(req, p.split.num_prefills);
    EXPECT_EQ(tok, p.num_actual_tokens);
    for (int64_t t = 0; t < p.split.num_decode_tokens; ++t) ASSERT_EQ(p.prefill_request_id[t], -1);
    multi_sparse_chunks += p.sparse_chunks.size() > 1;
  }
  // The random batches must actually exercise multi-chunk plans.
  EXPECT_GT(multi_context_chunks, 20);
  EXPECT_GT(multi_sparse_chunks, 10);
}

// Issue 51: head padding past the int range is refused (INT_MAX heads came back as INT_MIN), and the
// decode split count and schedule stay defined at the int64 edges (signed overflows under UBSan).
TEST(PlannerEdges, IntEdgesAreRefusedOrExact) {
  constexpr int imax = std::numeric_limits<int>::max();
  constexpr int64_t lmax = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(sparse_fp8_decode_padded_heads(imax), Error);
  EXPECT_THROW(sparse_prefill_padded_heads(imax, false), Error);
  EXPECT_THROW(sparse_prefill_padded_heads(imax - 60, true), Error);
  EXPECT_EQ(sparse_prefill_padded_heads(imax - 190, false), imax - 127);  // the last multiple of 64 below 2^31
  EXPECT_EQ(sparse_fp8_decode_padded_heads(129), 256);
  for (int64_t b : {int64_t(1), int64_t(1) << 40, lmax})
    for (int64_t s_q : {int64_t(1), int64_t(1) << 40, lmax})
      for (int64_t len : {int64_t(0), int64_t(1) << 40, lmax, -lmax}) {
        const int s = decode_num_splits(b, s_q, 128, len, imax);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, kDecodeMaxSplits);
      }
  EXPECT_EQ(decode_num_splits(1, 1, 16, lmax, 132), decode_num_splits(1, 1, 16, int64_t(1) << 40, 132));
  EXPECT_GT(decode_num_splits(1, 1, 16, lmax, 132), 1);
  EXPECT_EQ(decode_num_splits(-4, -4, 16, 4096, 132), 1);
  // A bound past the page arithmetic: refused, never wrapped.
  EXPECT_THROW(plan_decode_schedule({0, 1}, {5}, 1, 16, 16, 132, lmax - 3), Error);
  const DecodeSchedule big = plan_decode_schedule({0, 1}, {5}, 1, 16, 16, 132, int64_t(1) << 40);
  ASSERT_EQ(big.runs.size(), 1u);
  EXPECT_EQ(big.runs[0].block_cols, (int64_t(1) << 40) / 16);
}

}  // namespace
}  // namespace mla
