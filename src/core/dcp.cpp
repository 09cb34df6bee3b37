// SPDX-License-Identifier: Apache-2.0
// Decode context parallelism layout (mla/dcp.h, semantics §13).
#include "mla/dcp.h"

#include <algorithm>

#include "core/check.h"
#include "mla/error.h"

namespace mla {

// The largest group: the socket and NCCL groups' own limit. The planner keeps per-rank vectors for
// every context chunk (W of them), so an unbounded W made make_plan allocate without limit.
constexpr int kMaxDcpWorldSize = 4096;

void validate_dcp_layout(const DcpLayout& l, int64_t page_size) {
  MLA_CHECK(l.world_size >= 1 && l.world_size <= kMaxDcpWorldSize, "dcp: world_size must be in [1, {}], got {}",
            kMaxDcpWorldSize, l.world_size);
  MLA_CHECK(l.rank >= 0 && l.rank < l.world_size, "dcp: rank must be in [0, {}), got {}", l.world_size, l.rank);
  MLA_CHECK(l.interleave >= 1, "dcp: interleave must be >= 1, got {}", l.interleave);
  MLA_CHECK(page_size <= 0 || page_size % l.interleave == 0,
            "dcp: the page size {} must be a multiple of the interleave {}", page_size, l.interleave);
}

int dcp_owner(int64_t position, const DcpLayout& l) {
  validate_dcp_layout(l);
  MLA_CHECK(position >= 0, "dcp_owner: position must be >= 0, got {}", position);
  return static_cast<int>((position / l.interleave) % l.world_size);
}

int64_t dcp_local_position(int64_t position, const DcpLayout& l) {
  validate_dcp_layout(l);
  MLA_CHECK(position >= 0, "dcp_local_position: position must be >= 0, got {}", position);
  const int64_t turn = int64_t(l.world_size) * l.interleave;  // W·I <= 2^62: no overflow
  return position / turn * l.interleave + position % l.interleave;
}

int64_t dcp_local_length(int64_t length, const DcpLayout& l) {
  validate_dcp_layout(l);
  if (length <= 0) return 0;
  const int64_t turn = int64_t(l.world_size) * l.interleave;
  const int64_t full = length / turn * l.interleave;            // whole turns: I positions each
  const int64_t rest = length % turn - int64_t(l.rank) * l.interleave;  // this rank's part of the last turn
  return full + std::clamp<int64_t>(rest, 0, l.interleave);
}

void dcp_local_query_lengths(std::span<const int32_t> seq_lens, int64_t s_q, bool causal, const DcpLayout& l,
                             std::span<int32_t> out) {
  validate_dcp_layout(l);
  MLA_CHECK(s_q >= 1, "dcp_local_query_lengths: s_q must be >= 1, got {}", s_q);
  MLA_CHECK(out.size() / static_cast<std::size_t>(s_q) == seq_lens.size() &&
                out.size() % static_cast<std::size_t>(s_q) == 0,
            "dcp_local_query_lengths: out must hold {} x {} lengths, got {}", seq_lens.size(), s_q, out.size());
  for (std::size_t r = 0; r < seq_lens.size(); ++r)
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t visible = causal ? int64_t(seq_lens[r]) - s_q + 1 + i : int64_t(seq_lens[r]);
      out[r * static_cast<std::size_t>(s_q) + static_cast<std::size_t>(i)] =
          static_cast<int32_t>(dcp_local_length(visible, l));
    }
}

void dcp_filter_topk(std::span<int32_t> indices, const DcpLayout& l) {
  validate_dcp_layout(l);
  for (int32_t& x : indices)
    x = x < 0 || dcp_owner(x, l) != l.rank ? -1 : static_cast<int32_t>(dcp_local_position(x, l));
}

}  // namespace mla
