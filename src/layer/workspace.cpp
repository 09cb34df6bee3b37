// SPDX-License-Identifier: Apache-2.0
// MlaAttention workspace: the facts forward() derives from a plan, the layout of the caller's
// workspace (documented in layer_internal.h) and its sizes — exact per plan, and an upper bound per
// planner config. The decode schedule and the packed metadata come from the plan (mla/plan.h).
#include <algorithm>
#include <initializer_list>

#include "core/check.h"
#include "core/checked.h"
#include "layer/layer_internal.h"

namespace mla::layer_detail {

namespace {

int64_t align_up(int64_t x) {
  return detail::checked_add(x, kAlign - 1, "MlaAttention workspace size") / kAlign * kAlign;
}
// Product of workspace extents, checked: a huge max_num_tokens or config must fail, not wrap into a
// small workspace that forward() then overruns.
int64_t prod(std::initializer_list<int64_t> xs) {
  int64_t r = 1;
  for (int64_t x : xs) r = detail::checked_mul(r, x, "MlaAttention workspace size");
  return r;
}

// A made plan is consistent by construction; these checks keep forward() from indexing past a
// vector of a plan that was edited by hand, before anything is written.
void check_plan_vectors(const Plan& p, const LayerOptions& o) {
  constexpr const char* op = "MlaAttention";
  const int64_t nr = p.num_reqs, nd = p.split.num_decodes, np = p.split.num_prefills;
  MLA_CHECK(nr >= 0 && static_cast<int64_t>(p.query_start_loc.size()) == nr + 1 &&
                static_cast<int64_t>(p.seq_lens.size()) == nr,
            "{}: plan with num_reqs {} needs query_start_loc of {} and seq_lens of {} entries, got {} and {}", op, nr,
            nr + 1, nr, p.query_start_loc.size(), p.seq_lens.size());
  MLA_CHECK(nd >= 0 && np >= 0 && nd + np == nr,
            "{}: plan split has {} decodes + {} prefills but the batch has {} requests", op, nd, np, nr);
  MLA_CHECK(p.query_start_loc.back() == p.num_actual_tokens && p.num_actual_tokens <= p.num_tokens,
            "{}: plan has query_start_loc.back() = {}, num_actual_tokens = {}, num_tokens = {}; expected the first two "
            "equal and <= num_tokens",
            op, p.query_start_loc.back(), p.num_actual_tokens, p.num_tokens);
  if (np > 0) {
    MLA_CHECK(static_cast<int64_t>(p.prefill_query_start_loc.size()) == np + 1 &&
                  static_cast<int64_t>(p.prefill_context_lens.size()) == np,
              "{}: plan with {} prefills needs prefill_query_start_loc of {} and prefill_context_lens of {} entries, "
              "got {} and {}",
              op, np, np + 1, np, p.prefill_query_start_loc.size(), p.prefill_context_lens.size());
  }
  if (!o.sparse) {
    int64_t prev_end = 0;
    for (std::size_t i = 0; i < p.decode.runs.size(); ++i) {
      const DecodeRun& r = p.decode.runs[i];
      const int64_t b = r.req_end - r.req_begin;
      MLA_CHECK(r.req_begin >= prev_end && b >= 1 && r.req_end <= nd && r.s_q >= 1 && r.token_begin >= 0 &&
                    r.token_begin + b * r.s_q <= p.query_start_loc[nd] && r.block_cols >= 1 && r.num_splits >= 1 &&
                    r.num_splits <= kDecodeMaxSplits,
                "{}: decode run {} (requests [{}, {}), s_q {}, tokens from {}, {} block columns, {} splits) does not "
                "fit the plan's {} decodes",
                op, i, r.req_begin, r.req_end, r.s_q, r.token_begin, r.block_cols, r.num_splits, nd);
      prev_end = r.req_end;
    }
    for (std::size_t c = 0; c < p.context.chunks.size(); ++c) {
      const ContextChunk& ch = p.context.chunks[c];
      MLA_CHECK(static_cast<int64_t>(ch.cu_seq_lens.size()) == np + 1 &&
                    static_cast<int64_t>(ch.seq_starts.size()) == np,
                "{}: context chunk {} needs cu_seq_lens of {} and seq_starts of {} entries (one per prefill), got {} "
                "and {}",
                op, c, np + 1, np, ch.cu_seq_lens.size(), ch.seq_starts.size());
      MLA_CHECK(ch.total == ch.cu_seq_lens.back() && ch.total >= 0,
                "{}: context chunk {} has total {} but cu_seq_lens ends at {}", op, c, ch.total, ch.cu_seq_lens.back());
    }
    return;
  }
  MLA_CHECK(static_cast<int64_t>(p.req_id_per_token.size()) >= p.num_actual_tokens,
            "{}: sparse plan needs req_id_per_token for {} tokens, got {}", op, p.num_actual_tokens,
            p.req_id_per_token.size());
  if (p.sparse_chunks.empty()) return;
  MLA_CHECK(static_cast<int64_t>(p.prefill_request_id.size()) >= p.num_actual_tokens,
            "{}: sparse plan with prefill chunks needs prefill_request_id for {} tokens, got {}", op,
            p.num_actual_tokens, p.prefill_request_id.size());
  int64_t next = 0;
  for (std::size_t c = 0; c < p.sparse_chunks.size(); ++c) {
    const SparsePrefillChunk& ch = p.sparse_chunks[c];
    MLA_CHECK(ch.req_begin == next && ch.req_end >= ch.req_begin && ch.req_end <= np &&
                  static_cast<int64_t>(ch.workspace_starts.size()) == ch.req_end - ch.req_begin &&
                  0 <= ch.token_begin && ch.token_begin <= ch.token_end && ch.token_end <= p.num_actual_tokens,
              "{}: sparse prefill chunk {} (requests [{}, {}), tokens [{}, {}), {} starts) does not tile the {} "
              "prefills in order",
              op, c, ch.req_begin, ch.req_end, ch.token_begin, ch.token_end, ch.workspace_starts.size(), np);
    next = ch.req_end;
  }
  MLA_CHECK(next == np, "{}: sparse prefill chunks cover {} of {} prefills", op, next, np);
}

}  // namespace

Dims Dims::of(const LayerOptions& o) {
  Dims d;
  d.h = o.dims.num_heads;
  d.L = o.dims.kv_lora_rank;
  d.R = o.dims.qk_rope_head_dim;
  d.P = o.dims.qk_nope_head_dim;
  d.V = o.dims.v_head_dim;
  d.act_bytes = static_cast<int64_t>(dtype_size(o.dtype));
  d.lse_dtype = o.dtype == DType::f64 ? DType::f64 : DType::f32;
  d.lse_bytes = static_cast<int64_t>(dtype_size(d.lse_dtype));
  return d;
}

WorkspaceLayout make_layout(const WorkspaceShape& s, const Dims& d) {
  WorkspaceLayout l;
  int64_t off = 0;
  // align_up is monotone, so every offset (and the total) is monotone in every shape field.
  auto take = [&off](int64_t bytes) {
    const Region r{off, bytes};
    off = align_up(detail::checked_add(off, bytes, "MlaAttention workspace size"));
    return r;
  };
  const int64_t a = d.act_bytes, hpv = prod({d.h, d.P + d.V});
  const int64_t phase = off;

  l.q_abs = take(prod({s.mqa_tokens, d.h, d.d_qk(), a}));
  l.o_lat = take(prod({s.mqa_tokens, d.h, d.L, a}));
  l.scratch = take(s.decode_scratch_bytes);
  l.indices = take(prod({s.mqa_tokens, s.topk, 4}));
  l.upconv = take(prod({s.upconvert_rows, d.d_qk(), 2}));
  l.dcp_topk = take(prod({s.dcp_world > 1 ? s.mqa_tokens : 0, s.topk, 4}));
  const int64_t end_a = off;

  off = phase;
  l.kv_new = take(prod({s.prefill_tokens, hpv, a}));
  l.o_new = take(prod({s.staged_tokens, d.h, d.V, a}));
  l.lse_new = take(prod({d.h, s.staged_tokens, d.lse_bytes}));
  l.gathered = take(prod({s.context_rows, d.d_qk(), a}));
  l.kv_ctx = take(prod({s.context_rows, hpv, a}));
  for (int64_t i = 0; i < s.context_accumulators; ++i) {
    l.acc_o[i] = take(prod({s.staged_tokens, d.h, d.V, a}));
    l.acc_lse[i] = take(prod({d.h, s.staged_tokens, d.lse_bytes}));
  }
  l.dcp_local = take(prod({s.dcp_rows, d.d_qk(), a}));
  l.dcp_recv = take(prod({s.dcp_world, s.dcp_rows, d.d_qk(), a}));
  l.total = std::max(end_a, off);
  return l;
}

StepFacts step_facts(const Plan& p, const LayerOptions& o) {
  check_plan_vectors(p, o);
  StepFacts f;
  f.num_decodes = p.split.num_decodes;
  f.num_prefills = p.split.num_prefills;
  f.num_reqs = p.num_reqs;
  f.t_dec = p.query_start_loc[f.num_decodes];
  f.t_act = p.query_start_loc[f.num_reqs];

  if (o.sparse) {
    f.sparse_separate = o.cache_format == CacheFormat::fp8_ds_mla && !p.sparse_mixed_batch && !p.sparse_chunks.empty();
    if (f.sparse_separate)
      for (const auto& c : p.sparse_chunks) f.max_upconvert_rows = std::max(f.max_upconvert_rows, c.total_rows);
    return f;
  }
  for (const auto& c : p.context.chunks) {
    if (c.total == 0) continue;
    ++f.context_chunks;
    f.max_chunk_rows = std::max(f.max_chunk_rows, c.total);
  }
  // Tokens past the last prefill with context have none: the final merge copies them unchanged.
  if (f.context_chunks > 0)
    for (int64_t i = 0; i < f.num_prefills; ++i)
      if (p.prefill_context_lens[i] > 0) f.prefill_tokens_with_context = p.prefill_query_start_loc[i + 1];
  return f;
}

// Scratch of one decode run: mqa_decode's split partials, or under DCP everything dcp_mqa_decode
// needs (gathered q, partials, exchange buffers and its own split partials).
int64_t decode_run_scratch(const DecodeRun& r, const PlannerConfig& c, const LayerOptions& o) {
  const int64_t b = r.req_end - r.req_begin;
  if (c.dcp.world_size > 1)
    return static_cast<int64_t>(dcp_mqa_decode_workspace_bytes(b, r.s_q, o.dims.num_heads, r.block_cols, c.page_size,
                                                               o.dtype, c.dcp.world_size, o.device, r.num_splits));
  return static_cast<int64_t>(
      mqa_decode_workspace_bytes(b, r.s_q, o.dims.num_heads, r.block_cols * c.page_size, o.device, r.num_splits));
}

WorkspaceShape plan_shape(const Plan& p, const StepFacts& f, const LayerOptions& o) {
  WorkspaceShape s;
  if (o.sparse) {
    s.mqa_tokens = f.t_act;
    s.topk = o.dims.index_topk;
    s.upconvert_rows = f.max_upconvert_rows;
    s.dcp_world = p.config.dcp.world_size;
    if (s.dcp_world > 1)
      s.decode_scratch_bytes = static_cast<int64_t>(
          dcp_sparse_mqa_workspace_bytes(s.mqa_tokens, o.dims.num_heads, o.dtype, p.config.dcp.world_size));
    return s;
  }
  s.mqa_tokens = f.t_dec;
  for (const DecodeRun& r : p.decode.runs)
    s.decode_scratch_bytes = std::max<int64_t>(s.decode_scratch_bytes, decode_run_scratch(r, p.config, o));
  if (f.num_prefills > 0) s.prefill_tokens = f.t_act - f.t_dec;
  if (f.context_chunks > 0) s.staged_tokens = s.prefill_tokens;
  s.context_rows = f.max_chunk_rows;
  s.dcp_world = p.config.dcp.world_size;
  for (std::size_t c = 0; c < p.dcp_chunks.size(); ++c)
    if (p.context.chunks[c].total > 0) s.dcp_rows = std::max(s.dcp_rows, p.dcp_chunks[c].pad_rows);
  s.context_accumulators = f.context_chunks == 0 ? 0 : f.context_chunks == 1 ? 1 : 3;
  return s;
}

WorkspaceShape bound_shape(const PlannerConfig& c, int64_t n, const LayerOptions& o) {
  WorkspaceShape s;
  if (n == 0) return s;
  if (o.sparse) {
    s.mqa_tokens = n;
    s.topk = o.dims.index_topk;
    const bool separate_possible =
        o.cache_format == CacheFormat::fp8_ds_mla &&
        !sparse_mixed_batch_for(c.sparse_prefill_mode, o.dims.num_heads, c.compute_capability, c.dcp.world_size);
    if (separate_possible)
      s.upconvert_rows = c.sparse_workspace_rows > 0 ? c.sparse_workspace_rows
                                                     : sparse_prefill_workspace_rows(c.max_model_len);
    s.dcp_world = c.dcp.world_size;
    if (s.dcp_world > 1)
      s.decode_scratch_bytes =
          static_cast<int64_t>(dcp_sparse_mqa_workspace_bytes(n, o.dims.num_heads, o.dtype, c.dcp.world_size));
    return s;
  }
  s.mqa_tokens = n;
  s.prefill_tokens = n;
  s.staged_tokens = n;
  s.context_accumulators = 3;
  s.context_rows = c.context_workspace_rows > 0
                       ? c.context_workspace_rows
                       : chunked_prefill_workspace_rows(c.max_model_len, c.max_num_seqs, c.page_size, 0);
  // A rank's share of a chunk is at most the chunk (<= the workspace rows).
  s.dcp_world = c.dcp.world_size;
  if (c.dcp.world_size > 1) s.dcp_rows = s.context_rows;
  // Decode runs: b requests of s_q <= decode_threshold tokens each, b * s_q <= n, block tables
  // narrowed to the pages of at most max_model_len tokens. The split count grows with the key bound
  // (decode_num_splits considers more candidates), so the longest bound gives the most scratch.
  const int64_t max_sq = std::min(n, c.decode_threshold);
  const int64_t max_len = (c.max_model_len + c.page_size - 1) / c.page_size * c.page_size;
  // DCP: the longest shard (rank 0's), as plan_dcp_decode sizes every rank's runs.
  const int64_t local = dcp_local_length(max_len, {c.dcp.world_size, 0, c.dcp.interleave});
  const int64_t cols = std::max<int64_t>(1, (local + c.page_size - 1) / c.page_size);
  const int64_t heads = int64_t(o.dims.num_heads) * c.dcp.world_size;
  for (int64_t s_q = 1; s_q <= max_sq; ++s_q)
    for (int64_t b = 1; b <= std::min(c.max_num_seqs, n / s_q); ++b) {
      DecodeRun r;
      r.req_end = b;
      r.s_q = s_q;
      r.block_cols = c.dcp.world_size > 1 ? cols : max_len / c.page_size;
      r.num_splits = c.dcp.world_size > 1 ? decode_num_splits(b * s_q, 1, heads, cols * c.page_size, c.num_sms)
                                          : decode_num_splits(b, s_q, o.dims.num_heads, max_len, c.num_sms);
      s.decode_scratch_bytes = std::max<int64_t>(s.decode_scratch_bytes, decode_run_scratch(r, c, o));
    }
  return s;
}

void check_config_matches(const PlannerConfig& c, const LayerOptions& o, const char* what) {
  const ModelDims& a = c.dims;
  const ModelDims& b = o.dims;
  MLA_CHECK(a.kv_lora_rank == b.kv_lora_rank && a.qk_rope_head_dim == b.qk_rope_head_dim &&
                a.qk_nope_head_dim == b.qk_nope_head_dim && a.v_head_dim == b.v_head_dim &&
                a.num_heads == b.num_heads,
            "MlaAttention: {} dims (L={} R={} P={} V={} heads={}) differ from the layer's "
            "(L={} R={} P={} V={} heads={})",
            what, a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim, a.num_heads, b.kv_lora_rank,
            b.qk_rope_head_dim, b.qk_nope_head_dim, b.v_head_dim, b.num_heads);
  MLA_CHECK(c.cache_format == o.cache_format && c.sparse == o.sparse,
            "MlaAttention: {} is for a {} {} cache, the layer for a {} {} cache", what, c.sparse ? "sparse" : "dense",
            to_string(c.cache_format), o.sparse ? "sparse" : "dense", to_string(o.cache_format));
  MLA_CHECK(!o.sparse || a.index_topk == b.index_topk, "MlaAttention: {} has index_topk {}, the layer {}", what,
            a.index_topk, b.index_topk);
}

}  // namespace mla::layer_detail
