// SPDX-License-Identifier: Apache-2.0
// MlaAttention workspace: the facts forward() derives from a plan, the layout of the caller's
// workspace (documented in layer_internal.h) and its sizes — exact per plan, and an upper bound per
// planner config. The decode schedule and the packed metadata come from the plan (mla/plan.h).
#include <algorithm>
#include <initializer_list>

#include "core/check.h"
#include "core/checked.h"
#include "core/decode_balance.h"
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

// The metadata words [at, at + n) lie inside the plan's metadata (no overflow for any at, n).
void check_meta_range(const Plan& p, int64_t at, int64_t n, const char* what) {
  if (n == 0) return;  // nothing is read (the offset may be -1, absent)
  const auto words = static_cast<int64_t>(p.metadata.data.size());
  MLA_CHECK(at >= 0 && n >= 0 && at <= words && n <= words - at,
            "MlaAttention: plan metadata for {} at word {} ({} words) lies outside the plan's {} metadata words", what,
            at, n, words);
}

// DCP context chunks: one per context chunk (DCP plans only); each one's vectors sized for the
// prefills and its segments inside the chunk rows and the all-gathered rows.
void check_dcp_chunks(const Plan& p, int64_t np) {
  constexpr const char* op = "MlaAttention";
  const int64_t w = p.config.dcp.world_size;
  const std::size_t want = w > 1 ? p.context.chunks.size() : 0;
  MLA_CHECK(p.dcp_chunks.size() == want, "{}: plan with {} context chunks (DCP world {}) needs {} DCP chunks, got {}",
            op, p.context.chunks.size(), w, want, p.dcp_chunks.size());
  const __int128 turn = static_cast<__int128>(w) * p.config.dcp.interleave;
  for (std::size_t c = 0; c < p.dcp_chunks.size(); ++c) {
    const DcpChunk& dc = p.dcp_chunks[c];
    const int64_t total = p.context.chunks[c].total;
    MLA_CHECK(static_cast<int64_t>(dc.local_cu.size()) == np + 1 && static_cast<int64_t>(dc.local_starts.size()) == np &&
                  dc.pad_rows >= 0 && dc.pad_rows <= total && dc.local_cu.back() >= 0 &&
                  dc.local_cu.back() <= dc.pad_rows,
              "{}: DCP chunk {} needs local_cu of {} and local_starts of {} entries and at most {} rows per rank, got "
              "{}, {} and {} (this rank {})",
              op, c, np + 1, np, total, dc.local_cu.size(), dc.local_starts.size(), dc.pad_rows,
              dc.local_cu.empty() ? 0 : dc.local_cu.back());
    const __int128 received = static_cast<__int128>(w) * dc.pad_rows;
    for (std::size_t k = 0; k < dc.segments.size(); ++k) {
      const DcpSegment& g = dc.segments[k];
      const bool ok = g.dst_row >= 0 && g.src_row >= 0 && g.rows >= 1 && g.count >= 1 &&
                      g.dst_row + static_cast<__int128>(g.count - 1) * turn + g.rows <= total &&
                      g.src_row + static_cast<__int128>(g.count) * g.rows <= received;
      MLA_CHECK(ok, "{}: DCP chunk {} segment {} ({} blocks of {} rows from received row {} to chunk row {}) lies "
                "outside the chunk's {} rows or the {} received rows",
                op, c, k, g.count, g.rows, g.src_row, g.dst_row, total, static_cast<int64_t>(received));
    }
  }
}

// Dense metadata: one entry per context chunk (and per DCP chunk), every range the step reads inside
// the plan's metadata.
void check_dense_metadata(const Plan& p, int64_t nd, int64_t np) {
  constexpr const char* op = "MlaAttention";
  const StepMetadata& m = p.metadata;
  if (p.config.dcp.world_size > 1 && nd > 0)
    check_meta_range(p, m.dcp_local_lens, p.query_start_loc[static_cast<std::size_t>(nd)], "dcp_local_lens");
  if (np == 0) return;
  check_meta_range(p, m.prefill_qsl, np + 1, "prefill_query_start_loc");
  const std::size_t chunks = p.context.chunks.size();
  MLA_CHECK(m.chunk_cu.size() == chunks && m.chunk_starts.size() == chunks && m.dcp_chunk_cu.size() == p.dcp_chunks.size() &&
                m.dcp_chunk_starts.size() == p.dcp_chunks.size(),
            "{}: plan metadata holds {} / {} context chunk entries and {} / {} DCP chunk entries for {} and {} chunks",
            op, m.chunk_cu.size(), m.chunk_starts.size(), m.dcp_chunk_cu.size(), m.dcp_chunk_starts.size(), chunks,
            p.dcp_chunks.size());
  for (std::size_t c = 0; c < chunks; ++c) {
    if (p.context.chunks[c].total == 0) continue;
    check_meta_range(p, m.chunk_cu[c], np + 1, "a context chunk's cu_seq_lens");
    check_meta_range(p, m.chunk_starts[c], np, "a context chunk's seq_starts");
    if (p.dcp_chunks.empty()) continue;
    check_meta_range(p, m.dcp_chunk_cu[c], np + 1, "a DCP chunk's local_cu");
    check_meta_range(p, m.dcp_chunk_starts[c], np, "a DCP chunk's local_starts");
  }
}

// A made plan is consistent by construction; these checks keep forward() and workspace_bytes() from
// indexing past a vector or the metadata of a plan that was edited by hand (re-sealed or not),
// before anything is written.
void check_plan_vectors(const Plan& p, const LayerOptions& o) {
  constexpr const char* op = "MlaAttention";
  p.config.validate();  // a made plan's config passes; every bound below leans on it
  const int64_t nr = p.num_reqs, nd = p.split.num_decodes, np = p.split.num_prefills;
  MLA_CHECK(nr >= 0 && static_cast<int64_t>(p.query_start_loc.size()) == nr + 1 &&
                static_cast<int64_t>(p.seq_lens.size()) == nr,
            "{}: plan with num_reqs {} needs query_start_loc of {} and seq_lens of {} entries, got {} and {}", op, nr,
            nr + 1, nr, p.query_start_loc.size(), p.seq_lens.size());
  MLA_CHECK(nd >= 0 && np >= 0 && nd <= nr && np == nr - nd,
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
    const int64_t decode_tokens = p.query_start_loc[nd];
    // A made run's block columns cover at most max_model_len keys (its bound or longest seq_len).
    const int64_t page = std::max<int64_t>(p.config.page_size, 1);
    const int64_t max_cols = p.config.max_model_len / page + (p.config.max_model_len % page != 0);
    for (std::size_t i = 0; i < p.decode.runs.size(); ++i) {
      const DecodeRun& r = p.decode.runs[i];
      // In this order, so that no difference or product below can overflow.
      const bool ranges = r.req_begin >= prev_end && r.req_end > r.req_begin && r.req_end <= nd && r.s_q >= 1 &&
                          r.s_q <= decode_tokens && r.token_begin >= 0 && r.token_begin <= decode_tokens;
      MLA_CHECK(ranges && r.token_begin + (r.req_end - r.req_begin) * r.s_q <= decode_tokens && r.block_cols >= 1 &&
                    r.block_cols <= max_cols && r.num_splits >= 1 && r.num_splits <= kDecodeMaxSplits,
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
    check_dcp_chunks(p, np);
    check_dense_metadata(p, nd, np);
    return;
  }
  MLA_CHECK(p.dcp_chunks.empty(), "{}: a sparse plan has no DCP context chunks, got {}", op, p.dcp_chunks.size());
  const int64_t t_act = p.num_actual_tokens;
  check_meta_range(p, p.metadata.req_id, t_act, "req_id_per_token");
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
  check_meta_range(p, p.metadata.prefill_ids, t_act, "prefill_request_id");
  check_meta_range(p, p.metadata.workspace_starts, np, "workspace_starts");
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
  l.out_stage = take(prod({s.out_tokens, d.h, d.V, a}));
  l.amax = take(prod({s.amax_slots, 4}));
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
  l.fp8_prefill = take(s.fp8_prefill_bytes);
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
  if (o.out_quant != OutputQuant::none) s.out_tokens = f.t_act;
  if (o.kv_scales == KvScales::from_first_batch) s.amax_slots = 1;
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
  for (std::size_t c = 0; c < p.dcp_chunks.size(); ++c)  // as many as context chunks (check_plan_vectors)
    if (p.context.chunks[c].total > 0) s.dcp_rows = std::max(s.dcp_rows, p.dcp_chunks[c].pad_rows);
  s.context_accumulators = f.context_chunks == 0 ? 0 : f.context_chunks == 1 ? 1 : 3;
  if (o.fp8_prefill && o.device.is_cuda() && s.prefill_tokens > 0) {
    auto bytes = [&](int64_t tk) {
      return static_cast<int64_t>(
          mha_prefill_workspace_bytes(s.prefill_tokens, tk, o.dims.num_heads, f.num_prefills, true, o.device));
    };
    s.fp8_prefill_bytes = bytes(s.prefill_tokens);
    for (const ContextChunk& ch : p.context.chunks)
      if (ch.total > 0) s.fp8_prefill_bytes = std::max(s.fp8_prefill_bytes, bytes(ch.total));
  }
  return s;
}

// The largest decode-run scratch over every run a plan of this config can hold: b requests of
// s_q <= decode_threshold tokens each, b <= max_num_seqs, b * s_q <= n, block tables narrowed to the
// pages of at most max_model_len tokens (the split count grows with the key bound, so the longest
// bound gives the most scratch). Exact, in time independent of n and max_num_seqs: only runs that
// can take scratch beyond what their size alone implies are enumerated —
//  * split-KV: decode_num_splits gives one split once b * ceil(s_q * h / 64) >= 19 * num_sms, so
//    b * tiles < 19 * num_sms bounds the runs that may split;
//  * the sm90 balanced schedule (decode_balance.h ctas_for): b < 2 * SMs of the device and
//    s_q * h <= kMaxRows only (CUDA layers);
// every other run takes one split and no balanced scratch: mqa_decode's scratch is then zero, and a
// DCP run's buffers (gathered q, exchange blocks, block table) grow with its token count b * s_q, so
// the run with the most tokens bounds them (and is evaluated).
int64_t bound_decode_scratch(const PlannerConfig& c, int64_t n, const LayerOptions& o) {
  const int64_t max_sq = std::min(n, c.decode_threshold);
  if (max_sq <= 0) return 0;
  const int64_t h = o.dims.num_heads, seqs = c.max_num_seqs, w = c.dcp.world_size;
  const int64_t max_len = (c.max_model_len + c.page_size - 1) / c.page_size * c.page_size;
  const int64_t split_ctas = int64_t{19} * std::max(c.num_sms, 0);  // decode_num_splits: 1 split from here
  const int64_t dev_sms = o.device.is_cuda() ? multiprocessor_count(o.device) : 0;
  auto ceil_div = [](int64_t a, int64_t b) { return a / b + (a % b != 0); };
  int64_t best = 0;
  if (w > 1) {
    // DCP: the scratch of a run depends only on its tokens t = b * s_q and on whether s_q > 1 (the
    // gathered block table), and grows with t once it takes one split and no balanced scratch.
    const int64_t local = dcp_local_length(max_len, {c.dcp.world_size, 0, c.dcp.interleave});
    const int64_t cols = std::max<int64_t>(1, (local + c.page_size - 1) / c.page_size);
    const int64_t heads = h * w, tiles = ceil_div(heads, kDecodeTileRows);
    auto eval = [&](int64_t t, bool multi) {
      DecodeRun r;
      r.req_end = multi ? 1 : t;  // (1, t) stands for every (b, s_q > 1) with b * s_q = t
      r.s_q = multi ? t : 1;
      r.block_cols = cols;
      r.num_splits = decode_num_splits(t, 1, heads, cols * c.page_size, c.num_sms);
      best = std::max(best, decode_run_scratch(r, c, o));
    };
    // Whether t = b * s_q with 2 <= s_q <= max_sq and b <= max_num_seqs.
    auto multi_ok = [&](int64_t t) {
      for (int64_t d = 1; d * d <= t; ++d)
        if (t % d == 0)
          for (const int64_t s_q : {d, t / d})
            if (s_q >= 2 && s_q <= max_sq && t / s_q <= seqs) return true;
      return false;
    };
    const int64_t t_single = std::min(n, seqs);
    // Splits need t * tiles < 19 * SMs; the balanced schedule t < 2 * SMs with W * h rows per request.
    const int64_t t_cap = std::max(ceil_div(split_ctas, tiles) - 1, w * h <= balance::kMaxRows ? 2 * dev_sms - 1 : 0);
    for (int64_t t = 1; t <= t_cap && t <= n; ++t) {
      if (max_sq >= 2 && multi_ok(t))
        eval(t, true);  // the block table only adds bytes
      else if (t <= t_single)
        eval(t, false);
    }
    eval(t_single, false);
    // The most tokens a run with s_q > 1 can hold: s_q * max_num_seqs grows with s_q up to n / seqs,
    // past that s_q * floor(n / s_q) <= n.
    int64_t t_multi = 0;
    if (max_sq >= 2) {
      const int64_t s0 = std::max<int64_t>(2, n / seqs);
      for (int64_t s_q = std::min(s0, max_sq); s_q <= max_sq && t_multi < n; ++s_q)
        t_multi = std::max(t_multi, s_q * std::min(seqs, n / s_q));
    }
    if (t_multi > 0) eval(t_multi, true);
    return best;
  }
  auto eval = [&](int64_t b, int64_t s_q) {
    DecodeRun r;
    r.req_end = b;
    r.s_q = s_q;
    r.block_cols = max_len / c.page_size;
    // Batch-invariant plans: one split count per s_q whatever b, so the partials grow with b and
    // eval(b_max, s_q) bounds them.
    r.num_splits = c.batch_invariant ? batch_invariant_splits(c, s_q) : decode_num_splits(b, s_q, h, max_len, c.num_sms);
    best = std::max(best, decode_run_scratch(r, c, o));
  };
  for (int64_t s_q = 1; s_q <= max_sq; ++s_q) {
    const int64_t b_max = std::min(seqs, n / s_q);
    if (b_max == 0) break;
    const int64_t tiles = ceil_div(s_q * h, kDecodeTileRows);
    const bool balanced = s_q * h <= balance::kMaxRows;
    const int64_t b_hi =
        std::min(b_max, std::max(ceil_div(split_ctas, tiles) - 1, balanced ? 2 * dev_sms - 1 : int64_t{0}));
    for (int64_t b = 1; b <= b_hi; ++b) eval(b, s_q);
    eval(b_max, s_q);  // the run with the most tokens (one split, no balanced scratch when past b_hi)
    // From here on every larger s_q has tiles >= split_ctas and too many rows to balance: nothing more.
    if (tiles >= split_ctas && !balanced) break;
  }
  return best;
}

WorkspaceShape bound_shape(const PlannerConfig& c, int64_t n, const LayerOptions& o) {
  WorkspaceShape s;
  if (o.kv_scales == KvScales::from_first_batch) s.amax_slots = 1;
  if (n == 0) return s;
  if (o.out_quant != OutputQuant::none) s.out_tokens = n;
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
  s.decode_scratch_bytes = bound_decode_scratch(c, n, o);
  if (o.fp8_prefill && o.device.is_cuda())  // mha_prefill_workspace_bytes grows with every argument
    s.fp8_prefill_bytes = static_cast<int64_t>(mha_prefill_workspace_bytes(
        n, std::max(n, s.context_rows), o.dims.num_heads, std::min(n, c.max_num_seqs), true, o.device));
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
  MLA_CHECK(!o.batch_invariant || c.batch_invariant,
            "MlaAttention: the layer is batch-invariant (LayerOptions::batch_invariant) and {} is not: plan with "
            "PlannerConfig::batch_invariant = true",
            what);
}

}  // namespace mla::layer_detail
