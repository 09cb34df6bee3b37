#pragma once
// Decode context parallelism (DCP, semantics §13): the KV cache of every request is spread over the
// W ranks of a group. Positions go to ranks in turns of `interleave` consecutive tokens: position p
// lives on rank (p / I) % W at local position (p / (W·I))·I + p % I of that rank's shard. Each rank
// attends to its shard with the local lengths below and returns (out, lse); combine_attn_states
// (ops.h) merges the W partials exactly. These are pure host functions: the plan of a step uses them
// to give each rank its local lengths, and a caller uses them to route cache writes (slot -1 for
// positions another rank owns).
#include <cstdint>
#include <span>

namespace mla {

struct DcpLayout {
  int world_size = 1;  // W ranks in the group, >= 1
  int rank = 0;        // this rank, in [0, W)
  int interleave = 1;  // I consecutive positions per turn, >= 1; divides the cache's page size
};

// Throws mla::Error unless 1 <= W, 0 <= rank < W, I >= 1 and (page_size > 0) page_size % I == 0.
void validate_dcp_layout(const DcpLayout& layout, int64_t page_size = 0);

// The rank that owns position p >= 0.
int dcp_owner(int64_t position, const DcpLayout& layout);
// Position p's index inside its owner's shard (meaningful on the owner).
int64_t dcp_local_position(int64_t position, const DcpLayout& layout);
// How many of the positions [0, length) this rank owns. Σ over ranks = length.
int64_t dcp_local_length(int64_t length, const DcpLayout& layout);

// Local key counts of a decode batch on this rank, one per (request, query) row r·s_q + i: the keys
// query i of request r sees are the global positions [0, seq_lens[r] − s_q + 1 + i) when causal, else
// [0, seq_lens[r]); on this rank they are the first dcp_local_length(...) local positions. A causal
// step with s_q > 1 is attended as s_q rows of s_q = 1 with these lengths (a shard cannot apply the
// causal mask from local lengths alone). Lengths below 0 count as 0. out.size() == seq_lens.size()·s_q.
void dcp_local_query_lengths(std::span<const int32_t> seq_lens, int64_t s_q, bool causal, const DcpLayout& layout,
                             std::span<int32_t> out);

// The DCP filter of sparse indices: request-local positions -> this rank's local positions, -1 where
// another rank owns the position (and for entries that were already < 0). In place.
void dcp_filter_topk(std::span<int32_t> indices, const DcpLayout& layout);

}  // namespace mla
