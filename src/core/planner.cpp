// SPDX-License-Identifier: Apache-2.0
// Planner, part 3: config validation and make_plan, which validates one scheduler batch and
// assembles the Plan from the pieces of planner_split.cpp and planner_chunks.cpp.
#include <algorithm>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/planner_util.h"
#include "mla/plan.h"

namespace mla {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

const char* region_name(RequestRegion r) {
  switch (r) {
    case RequestRegion::decode: return "decode";
    case RequestRegion::extend: return "extend";
    case RequestRegion::prefill: return "prefill";
  }
  return "?";
}

// Per-request lengths of a validated batch.
struct Lengths {
  std::vector<int64_t> q, seq;
  int64_t context(int64_t r) const { return seq[r] - q[r]; }
};

Lengths validate_batch(const BatchDesc& batch, const PlannerConfig& config) {
  constexpr const char* op = "make_plan";
  detail::check_query_start_loc(batch.query_start_loc, op);
  const int64_t num_reqs = static_cast<int64_t>(batch.query_start_loc.size()) - 1;
  MLA_CHECK(static_cast<int64_t>(batch.seq_lens.size()) == num_reqs,
            "{}: seq_lens must have num_reqs = {} entries (query_start_loc has {}), got {}", op, num_reqs,
            batch.query_start_loc.size(), batch.seq_lens.size());
  MLA_CHECK(num_reqs <= config.max_num_seqs, "{}: batch has {} requests, more than max_num_seqs = {}", op, num_reqs,
            config.max_num_seqs);
  const int64_t actual = batch.query_start_loc.back();
  MLA_CHECK(batch.num_tokens == -1 || (batch.num_tokens >= actual && batch.num_tokens <= kInt32Max),
            "{}: num_tokens must be -1 or in [query_start_loc.back() = {}, 2^31 - 1], got {}", op, actual,
            batch.num_tokens);
  Lengths len;
  len.q.resize(num_reqs);
  len.seq.resize(num_reqs);
  for (int64_t r = 0; r < num_reqs; ++r) {
    len.q[r] = int64_t{batch.query_start_loc[r + 1]} - batch.query_start_loc[r];
    len.seq[r] = batch.seq_lens[r];
    MLA_CHECK(len.seq[r] >= len.q[r], "{}: request {} has seq_len {} < query_len {} (seq_len counts the new tokens)",
              op, r, len.seq[r], len.q[r]);
    MLA_CHECK(len.seq[r] <= config.max_model_len, "{}: request {} has seq_len {} > max_model_len {}", op, r,
              len.seq[r], config.max_model_len);
  }
  // Decodes first: the order reorder_decodes_first produces (§8.1). Zero-length requests are
  // CUDA-graph padding and carry no tokens, so they may sit anywhere.
  int64_t prev = -1;
  for (int64_t r = 0; r < num_reqs; ++r) {
    if (len.q[r] == 0) continue;
    if (prev >= 0) {
      const RequestRegion a = classify_request(len.context(prev), len.q[prev], config.decode_threshold);
      const RequestRegion b = classify_request(len.context(r), len.q[r], config.decode_threshold);
      MLA_CHECK(b >= a,
                "{}: requests must be ordered decode -> extend -> prefill (reorder_decodes_first, decode_threshold "
                "{}); request {} ({}: context {}, {} new tokens) follows request {} ({}: context {}, {} new tokens)",
                op, config.decode_threshold, r, region_name(b), len.context(r), len.q[r], prev, region_name(a),
                len.context(prev), len.q[prev]);
    }
    prev = r;
  }
  return len;
}

// Decode rows are consumed as a (rows, decode_query_len) reshape: every decode must have the first
// request's length, except zero-length padding requests at the end (§8.2 step 3, §11.4).
void check_uniform_decodes(const Lengths& len, const Split& split, int64_t decode_query_len, const char* why) {
  if (split.num_decode_tokens == 0) return;
  MLA_CHECK(decode_query_len > 0, "make_plan: {} needs a first decode request with >= 1 token, got 0", why);
  MLA_CHECK(split.num_decode_tokens % decode_query_len == 0,
            "make_plan: {} needs num_decode_tokens ({}) to be a multiple of decode_query_len ({})", why,
            split.num_decode_tokens, decode_query_len);
  bool padding = false;
  for (int64_t r = 0; r < split.num_decodes; ++r) {
    if (len.q[r] == 0) {
      padding = true;
      continue;
    }
    MLA_CHECK(!padding && len.q[r] == decode_query_len,
              "make_plan: {} needs every decode to have decode_query_len = {} tokens with zero-length padding only at "
              "the end; request {} has {} tokens{}",
              why, decode_query_len, r, len.q[r], padding ? " after a zero-length request" : "");
  }
}

void fill_prefill_fields(Plan& plan, const Lengths& len) {
  const int64_t nd = plan.split.num_decodes, np = plan.split.num_prefills;
  const int32_t base = plan.query_start_loc[nd];
  plan.prefill_query_start_loc.resize(np + 1);
  plan.prefill_seq_lens.resize(np);
  plan.prefill_context_lens.resize(np);
  for (int64_t p = 0; p <= np; ++p) plan.prefill_query_start_loc[p] = plan.query_start_loc[nd + p] - base;
  int64_t with_context = 0;
  for (int64_t p = 0; p < np; ++p) {
    const int64_t r = nd + p;
    plan.prefill_seq_lens[p] = static_cast<int32_t>(len.seq[r]);
    plan.prefill_context_lens[p] = static_cast<int32_t>(len.context(r));
    plan.max_prefill_query_len = std::max(plan.max_prefill_query_len, len.q[r]);
    plan.max_prefill_seq_len = std::max(plan.max_prefill_seq_len, len.seq[r]);
    // The context merge treats prefill tokens [0, prefill_tokens_with_context) as having context:
    // valid only when prefills with context precede fresh ones (§9).
    if (len.context(r) > 0) {
      MLA_CHECK(with_context == p,
                "make_plan: prefills with context must precede fresh prefills (decode -> extend -> prefill order); "
                "request {} has context {} after request {} without context",
                r, len.context(r), nd + with_context);
      ++with_context;
    }
  }
  plan.prefill_tokens_with_context = plan.prefill_query_start_loc[with_context];
}

void fill_sparse_chunks(Plan& plan) {
  const int64_t nd = plan.split.num_decodes;
  const auto chunks = split_prefill_chunks(plan.prefill_seq_lens, plan.config.sparse_workspace_rows);
  const auto starts = prefill_workspace_starts(plan.prefill_seq_lens, chunks);
  for (const auto& [b, e] : chunks) {
    SparsePrefillChunk c;
    c.req_begin = b;
    c.req_end = e;
    c.token_begin = plan.query_start_loc[nd + b];
    c.token_end = plan.query_start_loc[nd + e];
    c.total_rows = std::accumulate(plan.prefill_seq_lens.begin() + b, plan.prefill_seq_lens.begin() + e, int64_t{0});
    c.workspace_starts.assign(starts.begin() + b, starts.begin() + e);
    plan.sparse_chunks.push_back(std::move(c));
  }
  plan.prefill_request_id.assign(plan.num_tokens, -1);
  for (int64_t p = 0; p < plan.split.num_prefills; ++p)
    std::fill(plan.prefill_request_id.begin() + plan.query_start_loc[nd + p],
              plan.prefill_request_id.begin() + plan.query_start_loc[nd + p + 1], static_cast<int32_t>(p));
}

}  // namespace

void PlannerConfig::validate() const {
  // Only the dims the planner reads; the layer validates the rest (softmax scale, head dims).
  MLA_CHECK(dims.num_heads >= 1 && dims.index_topk >= 0,
            "PlannerConfig: dims.num_heads must be >= 1 and dims.index_topk >= 0, got {} and {}", dims.num_heads,
            dims.index_topk);
  MLA_CHECK(page_size >= 1 && max_num_seqs >= 1, "PlannerConfig: page_size and max_num_seqs must be >= 1, got {} and {}",
            page_size, max_num_seqs);
  MLA_CHECK(max_model_len >= 1 && max_model_len <= kInt32Max,
            "PlannerConfig: max_model_len must be in [1, 2^31 - 1] (seq_lens are int32), got {}", max_model_len);
  MLA_CHECK(decode_threshold >= 1, "PlannerConfig: decode_threshold must be >= 1, got {}", decode_threshold);
  check_cache_format(cache_format, "PlannerConfig");
  MLA_CHECK(!cache_format_info(cache_format).record,
            "PlannerConfig: the {} cache format is a DeepSeek-V4 record (sparse_mqa with V4 options only); a layer's "
            "plan takes bf16, fp8, fp8_ds_mla or f64",
            to_string(cache_format));
  MLA_CHECK(num_sms >= 0, "PlannerConfig: num_sms must be >= 0 (0 = no split-KV), got {}", num_sms);
  MLA_CHECK(compute_capability >= 0, "PlannerConfig: compute_capability must be >= 0 (0 = not known), got {}",
            compute_capability);
  MLA_CHECK(context_workspace_rows == 0 || context_workspace_rows >= page_size,
            "PlannerConfig: context_workspace_rows must be 0 (formula) or hold at least one page ({} rows), got {}",
            page_size, context_workspace_rows);
  // A sparse prefill request is never split across workspace chunks, so the longest one must fit.
  MLA_CHECK(sparse_workspace_rows == 0 || sparse_workspace_rows >= max_model_len,
            "PlannerConfig: sparse_workspace_rows must be 0 (5 * max_model_len) or >= max_model_len = {}, got {}",
            max_model_len, sparse_workspace_rows);
  (void)sparse_mixed_batch();  // the enum value (throws outside it)
  validate_dcp_layout(dcp, page_size);
  MLA_CHECK(!batch_invariant || dcp.world_size == 1,
            "PlannerConfig: batch_invariant is not supported with decode context parallelism (dcp.world_size {}); "
            "use dcp.world_size 1 or batch_invariant false",
            dcp.world_size);
}

bool PlannerConfig::sparse_mixed_batch() const {
  return sparse_mixed_batch_for(sparse_prefill_mode, dims.num_heads, compute_capability, dcp.world_size);
}

// A DCP rank's decode (§13): every decode row's local key count, and the runs re-sized for the shard
// (block columns of the longest local length, splits for b·s_q rows of the group's heads, the way
// dcp_mqa_decode launches them).
static void plan_dcp_decode(Plan& plan, const Lengths& len, int64_t seq_len_bound) {
  const PlannerConfig& c = plan.config;
  for (int64_t r = 0; r < plan.split.num_decodes; ++r)
    for (int64_t i = 0; i < len.q[r]; ++i)
      plan.dcp_local_lens.push_back(static_cast<int32_t>(dcp_local_length(len.seq[r] - len.q[r] + 1 + i, c.dcp)));
  const int64_t heads = int64_t(c.dims.num_heads) * c.dcp.world_size;
  for (DecodeRun& run : plan.decode.runs) {
    int64_t longest = 0;
    for (int64_t r = run.req_begin; r < run.req_end; ++r) longest = std::max<int64_t>(longest, len.seq[r]);
    if (seq_len_bound > 0) longest = seq_len_bound;
    // Rank 0 owns the most positions of any prefix: every rank sizes for it, so the runs (and a
    // captured graph) are the same on every rank.
    const int64_t local = dcp_local_length(longest, {c.dcp.world_size, 0, c.dcp.interleave});
    run.block_cols = std::max<int64_t>(1, (local + c.page_size - 1) / c.page_size);
    run.num_splits =
        decode_num_splits((run.req_end - run.req_begin) * run.s_q, 1, heads, run.block_cols * c.page_size, c.num_sms);
  }
}

// A DCP rank's context chunks (§13): per chunk, this rank's share of each prefill's range, the block
// every rank all-gathers (the largest share total), and the copies that put the received rows into
// request order. A chunk's start is a multiple of the page size and so of I: rank r's positions in it
// are whole turns of I rows except a shorter last one.
static void plan_dcp_context(Plan& plan) {
  const DcpLayout& l = plan.config.dcp;
  const int64_t w = l.world_size, il = l.interleave, turn = w * il;
  const int64_t np = plan.split.num_prefills;
  for (const ContextChunk& ch : plan.context.chunks) {
    DcpChunk dc;
    dc.local_cu.push_back(0);
    std::vector<std::vector<int64_t>> cu(static_cast<std::size_t>(w), std::vector<int64_t>(1, 0));
    for (int64_t p = 0; p < np; ++p) {
      const int64_t s = ch.seq_starts[p], e = s + ch.lens[p];
      MLA_CHECK(s % il == 0, "make_plan: DCP context chunk start {} is not a multiple of the interleave {}", s, il);
      for (int64_t r = 0; r < w; ++r) {
        const DcpLayout lr{l.world_size, static_cast<int>(r), l.interleave};
        cu[r].push_back(cu[r].back() + dcp_local_length(e, lr) - dcp_local_length(s, lr));
      }
      dc.local_starts.push_back(static_cast<int32_t>(dcp_local_length(s, l)));
      dc.local_cu.push_back(static_cast<int32_t>(cu[l.rank].back()));
    }
    for (int64_t r = 0; r < w; ++r) dc.pad_rows = std::max(dc.pad_rows, cu[r].back());
    for (int64_t p = 0; p < np; ++p) {
      const int64_t s = ch.seq_starts[p], e = s + ch.lens[p];
      if (e == s) continue;
      for (int64_t r = 0; r < w; ++r) {
        const DcpLayout lr{l.world_size, static_cast<int>(r), l.interleave};
        // Blocks b of rank r cover [b·W·I + r·I, +I); those starting in [s, e) hold its positions.
        const auto ceil_div = [](int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
        const int64_t b0 = ceil_div(s - r * il, turn), b_end = ceil_div(e - r * il, turn);
        const int64_t b_full = std::max(b0, e - r * il - il >= 0 ? (e - r * il - il) / turn + 1 : 0);
        const int64_t src0 = r * dc.pad_rows + cu[r][p];
        const int64_t local_s = dcp_local_length(s, lr);
        auto src_of = [&](int64_t b) { return src0 + dcp_local_position(b * turn + r * il, lr) - local_s; };
        auto dst_of = [&](int64_t b) { return ch.cu_seq_lens[p] + b * turn + r * il - s; };
        if (b_full > b0) dc.segments.push_back({dst_of(b0), src_of(b0), il, b_full - b0});
        if (b_end > b_full) dc.segments.push_back({dst_of(b_end - 1), src_of(b_end - 1), e - ((b_end - 1) * turn + r * il), 1});
      }
    }
    plan.dcp_chunks.push_back(std::move(dc));
  }
}

Plan make_plan(const BatchDesc& batch, const PlannerConfig& config) {
  config.validate();
  const Lengths len = validate_batch(batch, config);

  Plan plan;
  plan.config = config;
  if (plan.config.context_workspace_rows == 0)
    plan.config.context_workspace_rows = chunked_prefill_workspace_rows(
        config.max_model_len, config.max_num_seqs, config.page_size, config.sparse ? config.dims.index_topk : 0);
  if (plan.config.sparse_workspace_rows == 0)
    plan.config.sparse_workspace_rows = sparse_prefill_workspace_rows(config.max_model_len);

  plan.query_start_loc = batch.query_start_loc;
  plan.seq_lens = batch.seq_lens;
  plan.num_reqs = static_cast<int64_t>(len.q.size());
  plan.num_actual_tokens = batch.query_start_loc.back();
  plan.num_tokens = batch.num_tokens == -1 ? plan.num_actual_tokens : batch.num_tokens;
  plan.split = split_decodes_and_prefills(batch.query_start_loc, config.decode_threshold, config.require_uniform,
                                          plan.num_tokens);

  if (plan.has_decode()) {
    plan.decode_query_len = len.q[0];
    plan.max_decode_seq_len = *std::max_element(len.seq.begin(), len.seq.begin() + plan.split.num_decodes);
  }
  MLA_CHECK(batch.decode_seq_len_bound == 0 ||
                (batch.decode_seq_len_bound >= plan.max_decode_seq_len && batch.decode_seq_len_bound <= config.max_model_len),
            "make_plan: decode_seq_len_bound must be 0 or in [longest decode seq_len = {}, max_model_len = {}], got {}",
            plan.max_decode_seq_len, config.max_model_len, batch.decode_seq_len_bound);
  const bool ds_mla = config.sparse && config.cache_format == CacheFormat::fp8_ds_mla;
  plan.sparse_mixed_batch = ds_mla && config.sparse_mixed_batch();
  const bool sparse_separate = ds_mla && !plan.sparse_mixed_batch;
  if (config.require_uniform) check_uniform_decodes(len, plan.split, plan.decode_query_len, "require_uniform");
  if (sparse_separate)
    check_uniform_decodes(len, plan.split, plan.decode_query_len, "the fp8_ds_mla separate decode path");
  // DCP sparse steps attend every token over the cache shards (vLLM allows FlashMLA-sparse DCP in the
  // mixed-batch mode only): the separate mode's upconverted prefill workspace would need every shard.
  MLA_CHECK(config.dcp.world_size == 1 || !sparse_separate,
            "make_plan: sparse fp8_ds_mla steps with {} heads per rank use the separate prefill mode, which DCP "
            "does not support (fewer than {} heads per rank, or a bf16 / fp8 cache, run all tokens on the cache)",
            config.dims.num_heads, kMinHeadsForBf16Prefill);

  if (plan.has_prefill()) fill_prefill_fields(plan, len);
  if (!config.sparse) {
    plan.decode = plan_decode_schedule(batch.query_start_loc, batch.seq_lens, plan.split.num_decodes,
                                       config.page_size, config.dims.num_heads, config.num_sms,
                                       batch.decode_seq_len_bound);
    if (config.batch_invariant)  // splits from the config and s_q only; no hint drawn from the batch's lengths
      for (DecodeRun& run : plan.decode.runs) {
        run.num_splits = batch_invariant_splits(config, run.s_q);
        run.whole_requests = false;
      }
    plan.context = plan_context_chunks(plan.prefill_context_lens, plan.config.context_workspace_rows,
                                       config.page_size, /*round_to_page=*/true);
  } else {
    plan.req_id_per_token = req_id_per_token(batch.query_start_loc);
    plan.req_id_per_token.resize(plan.num_tokens, 0);  // padding tokens -> request 0 (§11.2)
    if (sparse_separate && plan.has_prefill()) fill_sparse_chunks(plan);
  }
  if (config.dcp.world_size > 1) {
    plan_dcp_decode(plan, len, batch.decode_seq_len_bound);
    plan_dcp_context(plan);
  }
  detail::fill_step_metadata(plan);
  plan.seal = plan_digest(plan);
  return plan;
}

}  // namespace mla
