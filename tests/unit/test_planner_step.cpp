// SPDX-License-Identifier: Apache-2.0
// Step-plan tests: the decode schedule (split-KV policy sized from the SM count passed in, runs of
// equal query length, the CUDA-graph length bound) and the packed step metadata (offsets and values
// in every mode, its size bound).
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <random>

#include "mla/error.h"
#include "mla/ops.h"
#include "mla/plan.h"

namespace mla {
namespace {

std::vector<int32_t> qsl_of(const std::vector<int32_t>& q_lens) {
  std::vector<int32_t> qsl(q_lens.size() + 1, 0);
  std::partial_sum(q_lens.begin(), q_lens.end(), qsl.begin() + 1);
  return qsl;
}

BatchDesc batch_of(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& seq_lens, int64_t num_tokens = -1,
                   int64_t bound = 0) {
  return BatchDesc{qsl_of(q_lens), seq_lens, num_tokens, bound};
}

PlannerConfig dense_config(int num_sms = 132) {
  PlannerConfig c;
  c.dims = ModelDims::deepseek_v3(8);  // 16 heads
  c.page_size = 64;
  c.max_model_len = 8192;
  c.max_num_seqs = 64;
  c.decode_threshold = 3;
  c.num_sms = num_sms;
  return c;
}

TEST(DecodeSchedule, SplitPolicy) {
  // No device (CPU plans) or no work: one split.
  EXPECT_EQ(decode_num_splits(4, 1, 16, 4096, 0), 1);
  EXPECT_EQ(decode_num_splits(0, 1, 16, 4096, 132), 1);
  // 4 CTAs on 132 SMs: each split halves the wave time until the key cap, 4096 / 256 = 16 ranges.
  EXPECT_EQ(decode_num_splits(4, 1, 16, 4096, 132), 16);
  EXPECT_EQ(decode_num_splits(4, 1, 16, 300, 132), 3);  // 300 keys: 3 ranges of >= 128 (at most 16 such)
  EXPECT_EQ(decode_num_splits(4, 1, 16, 1024, 132), 8);  // short context: 8 ranges of 128, not 4 of 256
  EXPECT_EQ(decode_num_splits(4, 1, 16, 2048, 132), 16);
  EXPECT_EQ(decode_num_splits(4, 1, 16, 64, 132), 1);   // one tile: nothing to split
  EXPECT_EQ(decode_num_splits(1, 1, 16, 8192, 132), 31);  // long: the 256-key cap (32 > 16 short ranges), 5% rule
  // One CTA: many splits, until a further one gains under 5% over the best so far; never past the cap.
  EXPECT_EQ(decode_num_splits(1, 1, 16, 1 << 20, 132), 61);
  EXPECT_EQ(decode_num_splits(1, 1, 16, 1 << 20, 16), 16);
  // 64 CTAs: 2 splits fill 128 of 132 SMs; more only cost waves (never 5% better than 1/2).
  EXPECT_EQ(decode_num_splits(64, 1, 16, 4096, 132), 2);
  // Two full waves already: splitting cannot shorten the launch.
  EXPECT_EQ(decode_num_splits(264, 1, 16, 1 << 20, 132), 1);
  // s_q * h_q rows share a CTA: 2 x 64 rows = 2 tiles per request.
  EXPECT_EQ(decode_num_splits(33, 2, 64, 1 << 20, 132), 2);
  // Monotone in the key bound (the workspace bound of a config relies on it) and never above the cap.
  std::mt19937_64 g(11);
  for (int i = 0; i < 2000; ++i) {
    const int64_t b = std::uniform_int_distribution<int64_t>(1, 300)(g);
    const int64_t s_q = std::uniform_int_distribution<int64_t>(1, 4)(g);
    const int64_t h = std::uniform_int_distribution<int64_t>(1, 128)(g);
    const int64_t l1 = std::uniform_int_distribution<int64_t>(0, 100000)(g), l2 = l1 + (g() % 5000);
    const int sms = static_cast<int>(g() % 200) + 1;
    const int s1 = decode_num_splits(b, s_q, h, l1, sms), s2 = decode_num_splits(b, s_q, h, l2, sms);
    ASSERT_LE(s1, s2) << b << " " << s_q << " " << h << " " << l1 << " " << l2 << " " << sms;
    ASSERT_GE(s1, 1);
    ASSERT_LE(s2, kDecodeMaxSplits);
  }
}

TEST(DecodeSchedule, RunsOfEqualQueryLength) {
  // Decodes with q_lens 2 2 0 2 3 3 1 (the zero-length one is padding): runs [0,2) [3,4) [4,6) [6,7).
  const std::vector<int32_t> q = {2, 2, 0, 2, 3, 3, 1}, seq = {10, 700, 0, 50, 5, 3000, 20};
  const DecodeSchedule s = plan_decode_schedule(qsl_of(q), seq, 7, 64, 16, 132);
  ASSERT_EQ(s.runs.size(), 4u);
  auto expect_run = [&](const DecodeRun& r, int64_t b, int64_t e, int64_t s_q, int64_t tok, int64_t cols) {
    EXPECT_EQ(r.req_begin, b);
    EXPECT_EQ(r.req_end, e);
    EXPECT_EQ(r.s_q, s_q);
    EXPECT_EQ(r.token_begin, tok);
    EXPECT_EQ(r.block_cols, cols);
    EXPECT_EQ(r.num_splits, decode_num_splits(e - b, s_q, 16, cols * 64, 132));
  };
  expect_run(s.runs[0], 0, 2, 2, 0, 11);  // longest 700 -> 11 pages
  expect_run(s.runs[1], 3, 4, 2, 4, 1);
  expect_run(s.runs[2], 4, 6, 3, 6, 47);  // 3000 -> 47 pages
  expect_run(s.runs[3], 6, 7, 1, 12, 1);
  EXPECT_GT(s.runs[2].num_splits, 1);
  // Without an SM count every run has one split; with a bound every run is sized for it.
  for (const DecodeRun& r : plan_decode_schedule(qsl_of(q), seq, 7, 64, 16, 0).runs) EXPECT_EQ(r.num_splits, 1);
  for (const DecodeRun& r : plan_decode_schedule(qsl_of(q), seq, 7, 64, 16, 132, 4096).runs)
    EXPECT_EQ(r.block_cols, 64);
  EXPECT_THROW(plan_decode_schedule(qsl_of(q), seq, 8, 64, 16, 132), Error);
}

TEST(DecodeSchedule, MakePlanAndGraphBound) {
  const PlannerConfig cfg = dense_config();
  // Two decode batches of one padded shape (3 requests, the last one padding, 4 padded tokens) with
  // different lengths: the bound makes their schedules, hence their captured launches, identical.
  const Plan a = make_plan(batch_of({1, 1, 0}, {100, 3000, 0}, 4, 4096), cfg);
  const Plan b = make_plan(batch_of({1, 1, 0}, {2000, 7, 0}, 4, 4096), cfg);
  ASSERT_EQ(a.decode.runs.size(), 1u);
  EXPECT_EQ(a.decode, b.decode);
  EXPECT_EQ(a.decode.runs[0].block_cols, 64);
  EXPECT_NE(make_plan(batch_of({1, 1, 0}, {100, 3000, 0}, 4), cfg).decode,
            make_plan(batch_of({1, 1, 0}, {2000, 7, 0}, 4), cfg).decode);
  EXPECT_TRUE(same_launches(a, b));
  EXPECT_FALSE(same_launches(a, make_plan(batch_of({1, 1, 0}, {100, 3000, 0}, 5, 4096), cfg)));  // more padding
  EXPECT_TRUE(a.metadata.data.empty());  // dense decode-only: nothing to upload
  // The bound must cover the decodes and stay within max_model_len.
  EXPECT_THROW(make_plan(batch_of({1, 1}, {100, 3000}, -1, 2999), cfg), Error);
  EXPECT_THROW(make_plan(batch_of({1, 1}, {100, 3000}, -1, 8193), cfg), Error);
  PlannerConfig bad = cfg;
  bad.num_sms = -1;
  EXPECT_THROW(make_plan(batch_of({1}, {10}), bad), Error);
  // Sparse plans have no dense decode schedule (their decodes run through sparse MQA).
  PlannerConfig sp = cfg;
  sp.sparse = true;
  sp.dims = ModelDims::deepseek_v32(8);
  EXPECT_TRUE(make_plan(batch_of({1, 1}, {100, 300}), sp).decode.runs.empty());
}

// The standalone op's split argument: the CPU needs no scratch and has no SM count; bad counts throw.
TEST(DecodeSchedule, MqaDecodeSplitArgumentOnTheCpu) {
  EXPECT_EQ(multiprocessor_count(Device::cpu()), 0);
  EXPECT_EQ(compute_capability(Device::cpu()), 0);  // PlannerConfig::compute_capability's "not a GPU"
  // Device indices outside the cache (and, in a build without CUDA, any CUDA device) are refused.
  EXPECT_THROW(compute_capability(Device::cuda(-1)), Error);
  EXPECT_THROW(compute_capability(Device::cuda(1000)), Error);
  EXPECT_THROW(multiprocessor_count(Device::cuda(1000)), Error);
  EXPECT_EQ(mqa_decode_workspace_bytes(8, 2, 16, 4096, Device::cpu(), 5), 0u);
  EXPECT_THROW(mqa_decode_workspace_bytes(8, 2, 16, 4096, Device::cpu(), -1), Error);
}

std::vector<int32_t> slice(const StepMetadata& m, int64_t at, std::size_t n) {
  EXPECT_GE(at, 0);
  EXPECT_LE(at + static_cast<int64_t>(n), static_cast<int64_t>(m.data.size()));
  return std::vector<int32_t>(m.data.begin() + at, m.data.begin() + at + static_cast<int64_t>(n));
}

TEST(StepMetadata, DensePrefillAndChunks) {
  PlannerConfig cfg = dense_config();
  cfg.context_workspace_rows = 128;  // 2 prefills with context: 64-row chunks
  // 2 decodes, prefills with context 90 and 30, a fresh prefill of 5 tokens, 3 padding tokens.
  const Plan p = make_plan(batch_of({1, 1, 10, 4, 5}, {10, 20, 100, 34, 5}, 24), cfg);
  const StepMetadata& m = p.metadata;
  ASSERT_EQ(p.split.num_prefills, 3);
  EXPECT_EQ(slice(m, m.prefill_qsl, 4), p.prefill_query_start_loc);
  ASSERT_EQ(p.context.chunks.size(), 2u);
  ASSERT_EQ(m.chunk_cu.size(), 2u);
  for (std::size_t c = 0; c < 2; ++c) {
    EXPECT_EQ(slice(m, m.chunk_cu[c], 4), p.context.chunks[c].cu_seq_lens) << c;
    EXPECT_EQ(slice(m, m.chunk_starts[c], 3), p.context.chunks[c].seq_starts) << c;
  }
  EXPECT_EQ(m.req_id, -1);
  EXPECT_EQ(m.bytes(), m.data.size() * 4);
  EXPECT_LE(m.bytes(), max_step_metadata_bytes(cfg, 24));
  // Same shape, other context lengths: graph-compatible while the chunk sizes stay, not once they move.
  EXPECT_TRUE(same_launches(p, make_plan(batch_of({1, 1, 10, 4, 5}, {30, 9, 100, 34, 5}, 24), cfg)));
  EXPECT_FALSE(same_launches(p, make_plan(batch_of({1, 1, 10, 4, 5}, {10, 20, 100, 14, 5}, 24), cfg)));
}

TEST(StepMetadata, SparseModes) {
  PlannerConfig cfg;
  cfg.dims = ModelDims::deepseek_v32(1);  // 128 heads: fp8_ds_mla separate mode
  cfg.sparse = true;
  cfg.cache_format = CacheFormat::fp8_ds_mla;
  cfg.page_size = 64;
  cfg.max_model_len = 200;
  cfg.max_num_seqs = 8;
  cfg.decode_threshold = 2;
  cfg.require_uniform = true;
  cfg.sparse_workspace_rows = 200;
  const BatchDesc batch = batch_of({2, 2, 1, 100, 150}, {50, 60, 31, 100, 150}, 260);
  const Plan p = make_plan(batch, cfg);
  const StepMetadata& m = p.metadata;
  ASSERT_EQ(p.sparse_chunks.size(), 2u);
  const std::vector<int32_t> req(p.req_id_per_token.begin(), p.req_id_per_token.begin() + 255),
      pid(p.prefill_request_id.begin(), p.prefill_request_id.begin() + 255);
  EXPECT_EQ(slice(m, m.req_id, 255), req);
  EXPECT_EQ(slice(m, m.prefill_ids, 255), pid);
  EXPECT_EQ(slice(m, m.workspace_starts, 3), (std::vector<int32_t>{0, 31, 0}));  // chunk-local starts
  EXPECT_EQ(m.prefill_qsl, -1);
  EXPECT_LE(m.bytes(), max_step_metadata_bytes(cfg, 260));
  // Tokens moved between the fresh prefills change the sparse chunks' token ranges.
  EXPECT_FALSE(same_launches(p, make_plan(batch_of({2, 2, 1, 110, 140}, {50, 60, 31, 110, 140}, 260), cfg)));
  // bf16 cache (no separate mode): only req_id, actual tokens only.
  cfg.cache_format = CacheFormat::bf16;
  const Plan b = make_plan(batch, cfg);
  EXPECT_EQ(b.metadata.data, req);
  EXPECT_EQ(b.metadata.prefill_ids, -1);
  // Without separate mode the same move only changes metadata values: one graph serves both.
  EXPECT_TRUE(same_launches(b, make_plan(batch_of({2, 2, 1, 110, 140}, {50, 60, 31, 110, 140}, 260), cfg)));
  EXPECT_EQ(max_step_metadata_bytes(cfg, 0), 0u);
  EXPECT_THROW(max_step_metadata_bytes(cfg, -1), Error);
}

// Issue 14 (found by fuzz_planner): requests with no new token take metadata entries too; the bound
// assumed at most one prefill per token and was 4 bytes short here (sparse; dense 12).
TEST(StepMetadata, BoundCountsRequestsWithoutTokens) {
  PlannerConfig cfg;
  cfg.dims = ModelDims::deepseek_v3(1);
  cfg.dims.qk_nope_head_dim = cfg.dims.v_head_dim = 16;
  cfg.dims.num_heads = 114;
  cfg.dims.index_topk = 9;
  cfg.sparse = true;
  cfg.cache_format = CacheFormat::fp8_ds_mla;
  cfg.page_size = 16;
  cfg.max_model_len = 490;
  cfg.max_num_seqs = 10;
  cfg.decode_threshold = 3;
  cfg.require_uniform = true;
  cfg.num_sms = 52;
  const Plan p = make_plan(batch_of({0, 1, 0}, {0, 198, 0}, 1), cfg);
  EXPECT_LE(p.metadata.bytes(), max_step_metadata_bytes(cfg, p.num_tokens));
  cfg.sparse = false;
  cfg.dims.index_topk = 0;
  const Plan d = make_plan(batch_of({0, 1, 0}, {0, 198, 0}, 1), cfg);  // dense: 32 bytes against a bound of 20
  EXPECT_LE(d.metadata.bytes(), max_step_metadata_bytes(cfg, d.num_tokens));
  // Counts near int64 throw at once (no loop over requests, no wrapped product).
  cfg.max_num_seqs = int64_t{1} << 61;
  cfg.context_workspace_rows = int64_t{1} << 60;
  EXPECT_THROW(max_step_metadata_bytes(cfg, 1), Error);
  cfg.sparse = true;
  cfg.dims.index_topk = 9;
  EXPECT_THROW(max_step_metadata_bytes(cfg, int64_t{1} << 62), Error);
}

// Issue 14: make_plan seals its plan; every edit of a field (scalars, nested structs, array values,
// array lengths) changes plan_digest, so MlaAttention::forward refuses the edited plan.
TEST(PlanSeal, MakePlanSealsAndEveryEditBreaksIt) {
  PlannerConfig dense = dense_config();
  dense.context_workspace_rows = 128;
  PlannerConfig sparse = dense;
  sparse.sparse = true;
  sparse.dims = ModelDims::deepseek_v32(1);
  sparse.cache_format = CacheFormat::fp8_ds_mla;
  sparse.max_model_len = 200;
  sparse.sparse_workspace_rows = 200;
  sparse.decode_threshold = 1;
  sparse.require_uniform = true;
  const Plan d = make_plan(batch_of({1, 1, 10, 4, 5}, {10, 20, 100, 34, 5}, 24), dense);
  const Plan sp = make_plan(batch_of({1, 1, 100, 150}, {50, 31, 100, 150}, 260), sparse);
  for (const Plan* p : {&d, &sp}) {
    EXPECT_NE(p->seal, 0u);
    EXPECT_EQ(p->seal, plan_digest(*p));
    const Plan copy = *p;
    EXPECT_EQ(copy.seal, plan_digest(copy));
  }
  ASSERT_FALSE(d.context.chunks.empty());
  ASSERT_FALSE(d.decode.runs.empty());
  ASSERT_FALSE(sp.sparse_chunks.empty());
  const std::vector<std::pair<const char*, std::function<void(Plan&)>>> dense_edits = {
      {"config.page_size", [](Plan& p) { p.config.page_size = 32; }},
      {"config.dims.name", [](Plan& p) { p.config.dims.name += "x"; }},
      {"config.dims.softmax_scale", [](Plan& p) { p.config.dims.softmax_scale = 0.5; }},
      {"config.require_uniform", [](Plan& p) { p.config.require_uniform = !p.config.require_uniform; }},
      {"num_actual_tokens", [](Plan& p) { ++p.num_actual_tokens; }},
      {"seq_lens value", [](Plan& p) { ++p.seq_lens[1]; }},
      {"seq_lens length", [](Plan& p) { p.seq_lens.push_back(0); }},
      {"split", [](Plan& p) { ++p.split.num_decode_tokens; }},
      {"max_prefill_query_len", [](Plan& p) { p.max_prefill_query_len = -1; }},
      {"prefill_tokens_with_context", [](Plan& p) { ++p.prefill_tokens_with_context; }},
      {"context chunk start", [](Plan& p) { p.context.chunks[0].seq_starts[1] += 64; }},
      {"context chunk size", [](Plan& p) { p.context.chunk_size = 0; }},
      {"context chunk dropped", [](Plan& p) { p.context.chunks.pop_back(); }},
      {"decode run block_cols", [](Plan& p) { ++p.decode.runs[0].block_cols; }},
      {"decode run splits", [](Plan& p) { ++p.decode.runs[0].num_splits; }},
      {"metadata word", [](Plan& p) { p.metadata.data[2] ^= 1 << 30; }},
      {"metadata offset", [](Plan& p) { ++p.metadata.chunk_cu[0]; }},
      {"sparse_mixed_batch", [](Plan& p) { p.sparse_mixed_batch = true; }},
  };
  const std::vector<std::pair<const char*, std::function<void(Plan&)>>> sparse_edits = {
      {"req_id_per_token", [](Plan& p) { p.req_id_per_token.back() = 1; }},
      {"prefill_request_id", [](Plan& p) { p.prefill_request_id[0] = 0; }},
      {"sparse chunk token_end", [](Plan& p) { --p.sparse_chunks[0].token_end; }},
      {"sparse chunk workspace start", [](Plan& p) { ++p.sparse_chunks.back().workspace_starts.back(); }},
      {"metadata prefill_ids offset", [](Plan& p) { ++p.metadata.prefill_ids; }},
  };
  for (const auto& [edits, base] : {std::pair{&dense_edits, &d}, std::pair{&sparse_edits, &sp}}) {
    for (const auto& [what, edit] : *edits) {
      Plan p = *base;
      edit(p);
      EXPECT_NE(plan_digest(p), p.seal) << what;
    }
  }
}

}  // namespace
}  // namespace mla
