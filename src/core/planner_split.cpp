// SPDX-License-Identifier: Apache-2.0
// Planner, part 1: request classification, batch reorder, decode/prefill split and decode
// thresholds (docs/SEMANTICS.md §8).
#include <algorithm>
#include <map>

#include "core/check.h"
#include "core/planner_util.h"
#include "mla/plan.h"

namespace mla {

namespace detail {

void check_query_start_loc(const std::vector<int32_t>& qsl, const char* op) {
  MLA_CHECK(!qsl.empty(), "{}: query_start_loc must hold num_reqs + 1 >= 1 entries, got an empty vector", op);
  MLA_CHECK(qsl[0] == 0, "{}: query_start_loc[0] must be 0, got {}", op, qsl[0]);
  for (std::size_t i = 1; i < qsl.size(); ++i)
    MLA_CHECK(qsl[i] >= qsl[i - 1],
              "{}: query_start_loc must be non-decreasing, got query_start_loc[{}] = {} < query_start_loc[{}] = {}", op,
              i, qsl[i], i - 1, qsl[i - 1]);
}

}  // namespace detail

RequestRegion classify_request(int64_t num_computed_tokens, int64_t num_scheduled_tokens, int64_t decode_threshold) {
  MLA_CHECK(num_computed_tokens >= 0 && num_scheduled_tokens >= 0,
            "classify_request: token counts must be >= 0, got num_computed_tokens={}, num_scheduled_tokens={}",
            num_computed_tokens, num_scheduled_tokens);
  MLA_CHECK(decode_threshold >= 1, "classify_request: decode_threshold must be >= 1, got {}", decode_threshold);
  // A fresh request is a prefill even when it schedules few tokens: it has no cache to decode against.
  if (num_computed_tokens == 0) return RequestRegion::prefill;
  return num_scheduled_tokens <= decode_threshold ? RequestRegion::decode : RequestRegion::extend;
}

ReorderResult reorder_decodes_first(const std::vector<int64_t>& num_computed_tokens,
                                    const std::vector<int64_t>& num_scheduled_tokens, int64_t decode_threshold) {
  MLA_CHECK(num_computed_tokens.size() == num_scheduled_tokens.size(),
            "reorder_decodes_first: num_computed_tokens has {} entries but num_scheduled_tokens has {}",
            num_computed_tokens.size(), num_scheduled_tokens.size());
  const std::size_t n = num_computed_tokens.size();
  std::vector<uint8_t> region(n);
  std::size_t count[3] = {0, 0, 0};
  for (std::size_t i = 0; i < n; ++i) {
    region[i] = static_cast<uint8_t>(classify_request(num_computed_tokens[i], num_scheduled_tokens[i], decode_threshold));
    ++count[region[i]];
  }
  // Position i belongs to region target(i) once grouped. Requests already inside their target
  // region stay put; the misplaced ones, stably sorted by region, fill the misplaced positions in
  // ascending order. Misplaced positions of each target region are exactly as many as misplaced
  // requests of that region, so the result is grouped decode -> extend -> prefill.
  auto target = [&](std::size_t i) -> uint8_t { return i < count[0] ? 0 : (i < count[0] + count[1] ? 1 : 2); };
  std::vector<int32_t> positions;
  std::vector<int32_t> requests[3];
  for (std::size_t i = 0; i < n; ++i) {
    if (region[i] == target(i)) continue;
    positions.push_back(static_cast<int32_t>(i));
    requests[region[i]].push_back(static_cast<int32_t>(i));
  }
  ReorderResult r;
  r.order.resize(n);
  for (std::size_t i = 0; i < n; ++i) r.order[i] = static_cast<int32_t>(i);
  std::size_t k = 0;
  for (const auto& group : requests)
    for (int32_t src : group) r.order[positions[k++]] = src;
  r.moved = !positions.empty();
  return r;
}

Split split_decodes_and_prefills(const std::vector<int32_t>& query_start_loc, int64_t decode_threshold,
                                 bool require_uniform, int64_t num_tokens) {
  constexpr const char* op = "split_decodes_and_prefills";
  detail::check_query_start_loc(query_start_loc, op);
  MLA_CHECK(decode_threshold >= 1, "{}: decode_threshold must be >= 1, got {}", op, decode_threshold);
  const int64_t actual = query_start_loc.back();
  if (num_tokens == -1) num_tokens = actual;
  MLA_CHECK(num_tokens >= actual, "{}: num_tokens ({}) must be -1 or >= query_start_loc.back() ({})", op, num_tokens,
            actual);
  const int64_t num_reqs = static_cast<int64_t>(query_start_loc.size()) - 1;
  MLA_CHECK(num_reqs > 0 || num_tokens == 0, "{}: {} padding tokens but no request to attribute them to", op,
            num_tokens);
  const Split all_decode{num_reqs, 0, num_tokens, 0};
  if (num_reqs == 0) return all_decode;

  auto q_len = [&](int64_t r) -> int64_t { return int64_t{query_start_loc[r + 1]} - query_start_loc[r]; };
  int64_t max_q = 0;
  for (int64_t r = 0; r < num_reqs; ++r) max_q = std::max(max_q, q_len(r));

  // Step 1: everything fits the threshold (with threshold 1 uniformity is automatic).
  if (max_q <= decode_threshold && (!require_uniform || decode_threshold <= 1)) return all_decode;
  // Step 2: the batch is decode-first ordered, so a long first request means no decodes at all.
  const int64_t q0 = q_len(0);
  if (q0 > decode_threshold) return {0, num_reqs, 0, num_tokens};

  // Step 3: which requests are prefills.
  std::vector<bool> is_prefill(num_reqs);
  if (require_uniform) {
    bool padded_uniform = true;
    for (int64_t r = 0; r < num_reqs; ++r) padded_uniform &= q_len(r) == q0 || q_len(r) == 0;
    if (padded_uniform) {
      // Zero-length requests are CUDA-graph padding: they count as decodes so that num_decodes
      // matches the captured batch, and the padded token count must cover them at q0 each.
      MLA_CHECK(num_reqs * q0 == num_tokens,
                "{}: padded uniform batch of {} requests x {} tokens must have num_tokens = {}, got {}", op, num_reqs,
                q0, num_reqs * q0, num_tokens);
      return all_decode;
    }
    for (int64_t r = 0; r < num_reqs; ++r) is_prefill[r] = q_len(r) != q0;
  } else {
    for (int64_t r = 0; r < num_reqs; ++r) is_prefill[r] = q_len(r) > decode_threshold;
  }
  // Step 4: decodes are the prefix before the first prefill (later short requests are prefills).
  const auto first = std::find(is_prefill.begin(), is_prefill.end(), true);
  if (first == is_prefill.end()) return all_decode;
  const int64_t num_decodes = first - is_prefill.begin();
  const int64_t decode_tokens = query_start_loc[num_decodes];
  return {num_decodes, num_reqs - num_decodes, decode_tokens, num_tokens - decode_tokens};
}

namespace {

// §8.3 `_init_reorder_batch_threshold`: spec decode raises the threshold where the backend runs
// multi-token queries as decodes; DCP without varlen support pins it to 1.
int64_t apply_spec_and_dcp(int64_t threshold, bool supports_spec_as_decode, int num_speculative_tokens,
                           bool parallel_drafting, int dcp_world_size, bool supports_dcp_varlen, const char* op) {
  MLA_CHECK(num_speculative_tokens >= 0, "{}: num_speculative_tokens must be >= 0, got {}", op,
            num_speculative_tokens);
  MLA_CHECK(dcp_world_size >= 1, "{}: dcp_world_size must be >= 1, got {}", op, dcp_world_size);
  if (supports_spec_as_decode && num_speculative_tokens > 0)
    threshold = std::max<int64_t>(threshold, 1 + int64_t{parallel_drafting ? 2 : 1} * num_speculative_tokens);
  if (dcp_world_size > 1 && !supports_dcp_varlen) threshold = 1;
  return threshold;
}

}  // namespace

int64_t dense_decode_threshold(QueryLenSupport support, int num_speculative_tokens, bool parallel_drafting,
                               int dcp_world_size, bool supports_dcp_varlen) {
  MLA_CHECK(support == QueryLenSupport::single_only || support == QueryLenSupport::uniform ||
                support == QueryLenSupport::varlen,
            "dense_decode_threshold: unknown QueryLenSupport value {} (expected 0..2)", static_cast<int>(support));
  return apply_spec_and_dcp(1, support != QueryLenSupport::single_only, num_speculative_tokens, parallel_drafting,
                            dcp_world_size, supports_dcp_varlen, "dense_decode_threshold");
}

int64_t sparse_decode_threshold(int num_heads, bool sm100, int num_speculative_tokens, bool parallel_drafting,
                                int dcp_world_size, bool supports_dcp_varlen) {
  MLA_CHECK(num_heads >= 1, "sparse_decode_threshold: num_heads must be >= 1, got {}", num_heads);
  // Exact head-count lookups (FlashMLA-sparse builder); any other count takes the default.
  static const std::map<int, int64_t> kSm100 = {{8, 128}, {16, 128}, {32, 128}, {64, 256}, {128, 1024}};
  static const std::map<int, int64_t> kSm90 = {{16, 128}, {32, 128}, {64, 256}, {128, 256}};
  const auto& table = sm100 ? kSm100 : kSm90;
  const auto it = table.find(num_heads);
  const int64_t base = it != table.end() ? it->second : (sm100 ? 1024 : 256);
  return apply_spec_and_dcp(base, true, num_speculative_tokens, parallel_drafting, dcp_world_size,
                            supports_dcp_varlen, "sparse_decode_threshold");
}

}  // namespace mla
