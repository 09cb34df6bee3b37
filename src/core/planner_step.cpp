// SPDX-License-Identifier: Apache-2.0
// Planner, part 4: what a step plan owns beyond the split — the decode schedule (runs and split-KV
// counts of the portable decode kernel, sized from the SM count passed in) and the packed metadata
// the kernels read on the device (one upload per step, however many layers run).
#include <algorithm>

#include "core/check.h"
#include "core/checked.h"
#include "core/decode_balance.h"
#include "core/planner_util.h"
#include "mla/plan.h"

namespace mla {

namespace {
// ceil(x / d) for x >= 0 without forming x + d - 1 (x may be near 2^63).
int64_t ceil_div(int64_t x, int64_t d) { return x / d + (x % d != 0); }
}  // namespace

int decode_num_splits(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, int num_sms) {
  if (b <= 0 || s_q <= 0 || h_q <= 0 || num_sms <= 0) return 1;
  const int64_t sms = num_sms;
  // Splitting pays only while ctas < 19 * sms: then ceil(ctas·s / sms) / s >= ctas / sms > 0.95 ·
  // ceil(ctas / sms) for every s. Larger (or unrepresentable) CTA counts take one split, so every
  // product below stays far inside int64.
  const __int128 ctas_wide = static_cast<__int128>(b) * ceil_div(std::min<int64_t>(s_q, INT64_MAX / h_q) * h_q,
                                                                   kDecodeTileRows);
  if (ctas_wide >= static_cast<__int128>(19) * sms) return 1;
  const int64_t ctas = static_cast<int64_t>(ctas_wide);
  const int64_t keys = std::max<int64_t>(max_seq_len, 0);
  const int64_t long_cap = ceil_div(keys, kDecodeMinSplitKeys);
  const int64_t short_cap = std::min<int64_t>(kDecodeShortSplits, ceil_div(keys, kDecodeShortSplitKeys));
  const int64_t cap = std::min<int64_t>(kDecodeMaxSplits, std::max<int64_t>({1, long_cap, short_cap}));
  int best = 1;
  double best_t = static_cast<double>((ctas + sms - 1) / sms);
  for (int s = 2; s <= cap; ++s) {
    const double t = static_cast<double>((ctas * s + sms - 1) / sms) / s;
    if (t < 0.95 * best_t) {
      best = s;
      best_t = t;
    }
  }
  return best;
}

int batch_invariant_splits(const PlannerConfig& config, int64_t s_q) {
  MLA_CHECK(s_q >= 1, "batch_invariant_splits: s_q must be >= 1, got {}", s_q);
  config.validate();
  const int64_t keys = detail::checked_mul(ceil_div(config.max_model_len, config.page_size), config.page_size,
                                           "batch_invariant_splits: keys");
  return decode_num_splits(config.max_num_seqs, s_q, config.dims.num_heads, keys, config.num_sms);
}

DecodeSchedule plan_decode_schedule(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq_lens,
                                    int64_t num_decodes, int64_t page_size, int64_t num_heads, int num_sms,
                                    int64_t seq_len_bound) {
  MLA_CHECK(num_decodes >= 0 && static_cast<int64_t>(qsl.size()) > num_decodes &&
                static_cast<int64_t>(seq_lens.size()) >= num_decodes && page_size >= 1 && num_heads >= 1,
            "plan_decode_schedule: needs 0 <= num_decodes < query_start_loc entries ({}) and <= seq_lens entries ({}), "
            "page_size and num_heads >= 1; got num_decodes {}, page_size {}, num_heads {}",
            qsl.size(), seq_lens.size(), num_decodes, page_size, num_heads);
  DecodeSchedule s;
  auto q_len = [&qsl](int64_t r) { return int64_t{qsl[r + 1]} - qsl[r]; };
  for (int64_t r = 0; r < num_decodes;) {
    const int64_t s_q = q_len(r);
    int64_t e = r + 1;
    if (s_q > 0) {
      while (e < num_decodes && q_len(e) == s_q) ++e;
      const int64_t longest =
          seq_len_bound > 0 ? seq_len_bound : *std::max_element(seq_lens.begin() + r, seq_lens.begin() + e);
      DecodeRun run;
      run.req_begin = r;
      run.req_end = e;
      run.s_q = s_q;
      run.token_begin = qsl[r];
      run.block_cols = ceil_div(std::max<int64_t>(longest, 0), page_size);
      run.num_splits = decode_num_splits(e - r, s_q, num_heads,
                                         detail::checked_mul(run.block_cols, page_size, "plan_decode_schedule: keys"),
                                         num_sms);
      if (seq_len_bound <= 0 && run.num_splits == 1) {
        int64_t total = 0, max_cost = 0;
        for (int64_t i = r; i < e; ++i) {
          const int64_t c = balance::cost_of(balance::tiles_of(seq_lens[static_cast<std::size_t>(i)]));
          total += c;
          max_cost = std::max(max_cost, c);
        }
        run.whole_requests =
            balance::whole_requests(e - r, balance::ctas_for(e - r, s_q * num_heads, num_sms), total, max_cost);
      }
      s.runs.push_back(run);
    }
    r = e;
  }
  return s;
}

namespace detail {

void fill_step_metadata(Plan& p) {
  StepMetadata& m = p.metadata;
  auto append = [&m](auto first, auto last) {
    const int64_t at = static_cast<int64_t>(m.data.size());
    m.data.insert(m.data.end(), first, last);
    return at;
  };
  const int64_t t_act = p.num_actual_tokens;
  if (p.config.sparse) {
    m.req_id = append(p.req_id_per_token.begin(), p.req_id_per_token.begin() + t_act);
    if (!p.sparse_chunks.empty()) {
      m.prefill_ids = append(p.prefill_request_id.begin(), p.prefill_request_id.begin() + t_act);
      m.workspace_starts = static_cast<int64_t>(m.data.size());
      for (const auto& c : p.sparse_chunks) append(c.workspace_starts.begin(), c.workspace_starts.end());
    }
    return;
  }
  if (!p.dcp_local_lens.empty()) m.dcp_local_lens = append(p.dcp_local_lens.begin(), p.dcp_local_lens.end());
  if (!p.has_prefill()) return;  // dense decode-only: the kernels read only the caller's tensors
  m.prefill_qsl = append(p.prefill_query_start_loc.begin(), p.prefill_query_start_loc.end());
  for (std::size_t i = 0; i < p.context.chunks.size(); ++i) {
    const ContextChunk& c = p.context.chunks[i];
    const bool used = c.total > 0;
    m.chunk_cu.push_back(used ? append(c.cu_seq_lens.begin(), c.cu_seq_lens.end()) : -1);
    m.chunk_starts.push_back(used ? append(c.seq_starts.begin(), c.seq_starts.end()) : -1);
    if (p.dcp_chunks.empty()) continue;
    const DcpChunk& d = p.dcp_chunks[i];
    m.dcp_chunk_cu.push_back(used ? append(d.local_cu.begin(), d.local_cu.end()) : -1);
    m.dcp_chunk_starts.push_back(used ? append(d.local_starts.begin(), d.local_starts.end()) : -1);
  }
}

}  // namespace detail

// DCP context chunks replay the same launches when their all-gather blocks and copies are equal.
static bool dcp_chunks_same(const Plan& a, const Plan& b) {
  if (a.dcp_chunks.size() != b.dcp_chunks.size()) return false;
  for (std::size_t i = 0; i < a.dcp_chunks.size(); ++i) {
    const DcpChunk &x = a.dcp_chunks[i], &y = b.dcp_chunks[i];
    if (x.pad_rows != y.pad_rows || x.segments.size() != y.segments.size()) return false;
    for (std::size_t k = 0; k < x.segments.size(); ++k) {
      const DcpSegment &g = x.segments[k], &h = y.segments[k];
      if (g.dst_row != h.dst_row || g.src_row != h.src_row || g.rows != h.rows || g.count != h.count) return false;
    }
  }
  return true;
}

bool same_launches(const Plan& a, const Plan& b) {
  const PlannerConfig &x = a.config, &y = b.config;
  if (x.page_size != y.page_size || x.cache_format != y.cache_format || x.sparse != y.sparse ||
      x.dims.num_heads != y.dims.num_heads || x.dims.index_topk != y.dims.index_topk ||
      x.dcp.world_size != y.dcp.world_size || x.dcp.rank != y.dcp.rank || x.dcp.interleave != y.dcp.interleave ||
      x.batch_invariant != y.batch_invariant)  // the attention launches take the mode
    return false;
  if (a.num_reqs != b.num_reqs || a.num_tokens != b.num_tokens || a.num_actual_tokens != b.num_actual_tokens ||
      !(a.split == b.split) || !(a.decode == b.decode) || a.sparse_mixed_batch != b.sparse_mixed_batch)
    return false;
  // Dense prefill launches are sized by the longest query and split at the last token with context.
  if (!x.sparse && (a.max_prefill_query_len != b.max_prefill_query_len ||
                    a.prefill_tokens_with_context != b.prefill_tokens_with_context))
    return false;
  // Decode tokens end where the first prefill starts; every kernel range below is derived from these.
  if (a.query_start_loc[a.split.num_decodes] != b.query_start_loc[b.split.num_decodes]) return false;
  if (a.context.chunks.size() != b.context.chunks.size() || a.sparse_chunks.size() != b.sparse_chunks.size())
    return false;
  for (std::size_t c = 0; c < a.context.chunks.size(); ++c)
    if (a.context.chunks[c].total != b.context.chunks[c].total ||
        a.context.chunks[c].max_len != b.context.chunks[c].max_len)
      return false;
  for (std::size_t c = 0; c < a.sparse_chunks.size(); ++c) {
    const SparsePrefillChunk &p = a.sparse_chunks[c], &q = b.sparse_chunks[c];
    if (p.req_begin != q.req_begin || p.req_end != q.req_end || p.token_begin != q.token_begin ||
        p.token_end != q.token_end || p.total_rows != q.total_rows)
      return false;
  }
  const StepMetadata &m = a.metadata, &n = b.metadata;
  return m.data.size() == n.data.size() && m.prefill_qsl == n.prefill_qsl && m.chunk_cu == n.chunk_cu &&
         m.chunk_starts == n.chunk_starts && m.req_id == n.req_id && m.prefill_ids == n.prefill_ids &&
         m.workspace_starts == n.workspace_starts && m.dcp_local_lens == n.dcp_local_lens &&
         m.dcp_chunk_cu == n.dcp_chunk_cu && m.dcp_chunk_starts == n.dcp_chunk_starts &&
         dcp_chunks_same(a, b);
}

std::size_t max_step_metadata_bytes(const PlannerConfig& c, int64_t n) {
  constexpr const char* op = "max_step_metadata_bytes";
  using detail::checked_add;
  using detail::checked_mul;
  c.validate();
  MLA_CHECK(n >= 0, "max_step_metadata_bytes: max_num_tokens must be >= 0, got {}", n);
  if (n == 0) return 0;
  // Requests with no new token (q = 0) are accepted and still take their entries (issue 14: the bound
  // counted at most one prefill per token), so every one of max_num_seqs requests may be a prefill.
  // Hostile configs and counts throw instead of wrapping, and nothing loops over them.
  const int64_t max_prefills = c.max_num_seqs;
  auto bytes = [&](int64_t ints) { return detail::checked_size(checked_mul(ints, sizeof(int32_t), op), op); };
  if (c.sparse) return bytes(checked_add(checked_mul(2, n, op), max_prefills, op));
  const int64_t ws_rows = c.context_workspace_rows > 0
                              ? c.context_workspace_rows
                              : chunked_prefill_workspace_rows(c.max_model_len, c.max_num_seqs, c.page_size, 0);
  // k prefills with context get ws_rows / k rows each per chunk (page-rounded; unrounded when that is
  // 0; the planner refuses k > ws_rows). The chunk never grows with k, so the chunk count is largest
  // for the largest k the planner accepts.
  int64_t max_chunks = 0;
  const int64_t max_context = c.max_model_len;  // a request with no new token has seq_len of context
  if (const int64_t k = std::min(max_prefills, ws_rows); k >= 1 && max_context > 0) {
    int64_t chunk = ws_rows / k / c.page_size * c.page_size;
    if (chunk == 0) chunk = ws_rows / k;  // planner without page rounding
    max_chunks = max_context / chunk + (max_context % chunk != 0);
  }
  // Each chunk: cu_seq_lens and seq_starts. DCP: every decode token's local length, and each chunk's
  // local cu / starts beside the global ones.
  const int64_t chunk_ints = checked_mul(max_chunks, checked_add(checked_mul(2, max_prefills, op), 1, op), op);
  const int64_t dcp = c.dcp.world_size > 1 ? checked_add(n, chunk_ints, op) : 0;
  return bytes(checked_add(checked_add(checked_add(max_prefills, 1, op), chunk_ints, op), dcp, op));
}

}  // namespace mla
