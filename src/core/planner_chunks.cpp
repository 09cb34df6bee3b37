// SPDX-License-Identifier: Apache-2.0
// Planner, part 2: workspace sizes, dense context chunks (docs/SEMANTICS.md §9) and the sparse
// prefill workspace chunks and head padding (§11.4-11.5).
#include <algorithm>
#include <limits>

#include "core/checked.h"
#include "core/check.h"
#include "core/planner_util.h"
#include "mla/plan.h"

namespace mla {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

int64_t chunked_prefill_workspace_rows(int64_t max_model_len, int64_t max_num_seqs, int64_t page_size,
                                       int64_t sparse_topk) {
  MLA_CHECK(max_model_len >= 1 && max_num_seqs >= 1 && page_size >= 1,
            "chunked_prefill_workspace_rows: max_model_len, max_num_seqs and page_size must be >= 1, got {}, {}, {}",
            max_model_len, max_num_seqs, page_size);
  MLA_CHECK(sparse_topk >= 0, "chunked_prefill_workspace_rows: sparse_topk must be >= 0, got {}", sparse_topk);
  constexpr const char* op = "chunked_prefill_workspace_rows";
  const int64_t seq_pages = detail::checked_mul(max_num_seqs, page_size, op);  // max_num_seqs x page_size
  int64_t rows = std::min<int64_t>(std::max(detail::checked_mul(8, max_model_len, op), detail::checked_mul(4, seq_pages, op)), 65536);
  if (sparse_topk > 0) rows = std::min(rows, detail::checked_mul(max_num_seqs, sparse_topk, op));
  // The floor guarantees one page per request, so a context chunk is never empty (§9).
  return std::max(rows, seq_pages);
}

ContextPlan plan_context_chunks(const std::vector<int32_t>& context_lens, int64_t workspace_rows, int64_t page_size,
                                bool round_to_page) {
  constexpr const char* op = "plan_context_chunks";
  MLA_CHECK(workspace_rows >= 1 && page_size >= 1, "{}: workspace_rows and page_size must be >= 1, got {} and {}", op,
            workspace_rows, page_size);
  int64_t with_context = 0, max_context = 0;
  for (std::size_t r = 0; r < context_lens.size(); ++r) {
    MLA_CHECK(context_lens[r] >= 0, "{}: context_lens[{}] must be >= 0, got {}", op, r, context_lens[r]);
    with_context += context_lens[r] > 0;
    max_context = std::max<int64_t>(max_context, context_lens[r]);
  }
  ContextPlan plan;
  if (max_context == 0) return plan;  // chunk_size 0, no chunks

  // Every prefill with context gets the same share of the workspace per chunk, so one chunk's rows
  // never exceed the workspace whatever the mix of lengths.
  int64_t chunk = workspace_rows / with_context;
  if (round_to_page) chunk = chunk / page_size * page_size;
  MLA_CHECK(chunk > 0,
            "{}: a workspace of {} rows cannot hold {} prefills with context ({} per prefill{}); expected >= {} rows",
            op, workspace_rows, with_context, workspace_rows / with_context,
            round_to_page ? ", rounded down to the page size" : "", with_context * (round_to_page ? page_size : 1));
  plan.chunk_size = chunk;
  // (max_context + chunk - 1) / chunk wraps for a chunk near 2^63 (a huge workspace): zero chunks, and
  // the context silently ignored.
  const int64_t num_chunks = max_context / chunk + (max_context % chunk != 0);
  const std::size_t num_prefills = context_lens.size();
  plan.chunks.resize(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    ContextChunk& c = plan.chunks[i];
    const int64_t start = i * chunk;  // < max_context, so fits int32
    c.seq_starts.assign(num_prefills, static_cast<int32_t>(start));
    c.lens.resize(num_prefills);
    c.cu_seq_lens.assign(num_prefills + 1, 0);
    for (std::size_t r = 0; r < num_prefills; ++r) {
      // Short contexts get zero-length chunks: their context output of this chunk is (0, -inf).
      const int64_t len = std::max<int64_t>(std::min<int64_t>(context_lens[r], start + chunk) - start, 0);
      c.lens[r] = static_cast<int32_t>(len);
      c.total += len;
      c.max_len = std::max(c.max_len, len);
      // total <= with_context * chunk <= workspace_rows; int32 is the gather kernels' index type.
      MLA_CHECK(c.total <= kInt32Max, "{}: chunk {} gathers {} rows, beyond the int32 range of cu_seq_lens", op, i,
                c.total);
      c.cu_seq_lens[r + 1] = static_cast<int32_t>(c.total);
    }
  }
  return plan;
}

std::vector<int32_t> req_id_per_token(const std::vector<int32_t>& query_start_loc) {
  detail::check_query_start_loc(query_start_loc, "req_id_per_token");
  std::vector<int32_t> ids(query_start_loc.back());
  for (std::size_t r = 0; r + 1 < query_start_loc.size(); ++r)
    std::fill(ids.begin() + query_start_loc[r], ids.begin() + query_start_loc[r + 1], static_cast<int32_t>(r));
  return ids;
}

std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(const std::vector<int32_t>& seq_lens,
                                                              int64_t workspace_rows, int64_t request_offset) {
  constexpr const char* op = "split_prefill_chunks";
  MLA_CHECK(workspace_rows >= 1, "{}: workspace_rows must be >= 1, got {}", op, workspace_rows);
  MLA_CHECK(request_offset >= 0, "{}: request_offset must be >= 0, got {}", op, request_offset);
  for (std::size_t r = 0; r < seq_lens.size(); ++r) {
    MLA_CHECK(seq_lens[r] >= 0, "{}: seq_lens[{}] must be >= 0, got {}", op, r, seq_lens[r]);
    MLA_CHECK(seq_lens[r] <= workspace_rows,
              "{}: seq_lens[{}] = {} does not fit the prefill workspace of {} rows (one request is never split)", op,
              r, seq_lens[r], workspace_rows);
  }
  std::vector<std::pair<int64_t, int64_t>> chunks;
  const int64_t n = static_cast<int64_t>(seq_lens.size());
  int64_t i = 0;
  while (i < n) {
    const int64_t start = i;
    int64_t total = 0;
    // Greedy: take requests while the running sum still fits (every single one fits, so each
    // chunk holds at least one request and the loop advances).
    while (i < n && seq_lens[i] <= workspace_rows - total) total += seq_lens[i++];  // no overflow: total <= rows
    chunks.emplace_back(start + request_offset, i + request_offset);
  }
  return chunks;
}

std::vector<int32_t> prefill_workspace_starts(const std::vector<int32_t>& seq_lens,
                                              const std::vector<std::pair<int64_t, int64_t>>& chunks) {
  constexpr const char* op = "prefill_workspace_starts";
  const int64_t n = static_cast<int64_t>(seq_lens.size());
  // The chunks must tile [0, n) in order, as split_prefill_chunks(seq_lens, rows, 0) returns them:
  // then every request gets exactly one chunk-local start.
  int64_t expect = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const auto [b, e] = chunks[c];
    MLA_CHECK(b == expect && e >= b && e <= n,
              "{}: chunks must tile requests [0, {}) in order; chunk {} is [{}, {}) but expected it to start at {}", op,
              n, c, b, e, expect);
    expect = e;
  }
  MLA_CHECK(expect == n, "{}: chunks cover requests [0, {}) but there are {} requests", op, expect, n);
  std::vector<int32_t> starts(n);
  for (const auto& [b, e] : chunks) {
    int64_t offset = 0;  // re-zeroed per chunk: each chunk gathers into the workspace from row 0
    for (int64_t r = b; r < e; ++r) {
      MLA_CHECK(seq_lens[r] >= 0, "{}: seq_lens[{}] must be >= 0, got {}", op, r, seq_lens[r]);
      starts[r] = static_cast<int32_t>(offset);
      offset += seq_lens[r];
      MLA_CHECK(offset <= kInt32Max, "{}: chunk rows exceed the int32 range at request {}", op, r);
    }
  }
  return starts;
}

bool sparse_use_mixed_batch(int num_heads, bool hisparse, bool pcp_and_dcp) {
  MLA_CHECK(num_heads >= 1, "sparse_use_mixed_batch: num_heads must be >= 1, got {}", num_heads);
  return num_heads < kMinHeadsForBf16Prefill && !hisparse && !pcp_and_dcp;
}

const char* to_string(SparsePrefillMode m) {
  switch (m) {
    case SparsePrefillMode::automatic: return "automatic";
    case SparsePrefillMode::mixed_batch: return "mixed_batch";
    case SparsePrefillMode::separate: return "separate";
  }
  return "invalid";
}

bool sparse_mixed_batch_for(SparsePrefillMode mode, int num_heads, int compute_capability, int dcp_world_size) {
  switch (mode) {
    case SparsePrefillMode::automatic: {
      const bool head_rule = sparse_use_mixed_batch(num_heads);  // also checks num_heads
      return compute_capability == 90 && dcp_world_size <= 1 ? false : head_rule;  // sm90: measured (plan.h)
    }
    case SparsePrefillMode::mixed_batch: return true;
    case SparsePrefillMode::separate: return false;
  }
  MLA_CHECK(false, "sparse_prefill_mode must be automatic (0), mixed_batch (1) or separate (2), got {}",
            static_cast<int32_t>(mode));
  return false;
}

namespace {
// num_heads rounded up to a multiple of `multiple`, refused when that is past the int range (it was
// cast back to int: INT_MAX heads came back as INT_MIN).
int padded_heads(int num_heads, int64_t multiple, const char* op) {
  MLA_CHECK(num_heads >= 1, "{}: num_heads must be >= 1, got {}", op, num_heads);
  const int64_t padded = round_up(num_heads, multiple);
  MLA_CHECK(padded <= std::numeric_limits<int>::max(), "{}: num_heads {} padded to a multiple of {} exceeds the int "
            "range", op, num_heads, multiple);
  return static_cast<int>(padded);
}
}  // namespace

int sparse_fp8_decode_padded_heads(int num_heads) {
  constexpr const char* op = "sparse_fp8_decode_padded_heads";
  MLA_CHECK(num_heads >= 1, "{}: num_heads must be >= 1, got {}", op, num_heads);
  if (num_heads <= 64) return 64;
  // FlashMLA stops at 128; larger counts (no input is refused, DESIGN §4) pad to a multiple of 128.
  return padded_heads(num_heads, 128, op);
}

int sparse_prefill_padded_heads(int num_heads, bool sm100) {
  return padded_heads(num_heads, sm100 ? 128 : 64, "sparse_prefill_padded_heads");
}

int64_t sparse_prefill_workspace_rows(int64_t max_model_len) {
  MLA_CHECK(max_model_len >= 1, "sparse_prefill_workspace_rows: max_model_len must be >= 1, got {}", max_model_len);
  return detail::checked_mul(5, max_model_len, "sparse_prefill_workspace_rows");
}

}  // namespace mla
