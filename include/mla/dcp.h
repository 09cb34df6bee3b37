// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decode context parallelism (DCP, semantics §13): the KV cache of every request is spread over the
// W ranks of a group. Positions go to ranks in turns of `interleave` consecutive tokens: position p
// lives on rank (p / I) % W at local position (p / (W·I))·I + p % I of that rank's shard. Each rank
// attends to its shard with the local lengths below and returns (out, lse); combine_attn_states
// (ops.h) merges the W partials exactly. These are pure host functions: the plan of a step uses them
// to give each rank its local lengths, and a caller uses them to route cache writes (slot -1 for
// positions another rank owns).
#include <cstddef>
#include <cstdint>
#include <span>

#include "mla/cache.h"
#include "mla/comm.h"
#include "mla/ops.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

struct DcpLayout {
  int world_size = 1;  // W ranks in the group, 1..4096
  int rank = 0;        // this rank, in [0, W)
  int interleave = 1;  // I consecutive positions per turn, >= 1; divides the cache's page size
};

// Throws mla::Error unless 1 <= W <= 4096, 0 <= rank < W, I >= 1 and (page_size > 0) page_size % I == 0.
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

// The DCP filter of sparse indices as an op on CPU or CUDA tensors (the layer's sparse DCP steps):
//   req_id [T] int32 (row of seq_lens), seq_lens [R] int32 global lengths, indices [T, topk] int32
//   request-local positions, out [T, topk] int32 (may not alias indices).
// out = the position's local index on this rank when this rank owns it and 0 <= position <
// seq_lens[req_id[t]]; else -1 (a req_id outside [0, R) makes the row -1).
void dcp_localize_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                       const TensorView& out, const DcpLayout& layout, const Context& ctx = {});

// The localize step of the DeepSeek-V4 DCP step (docs/SCALE.md "The DeepSeek-V4 step"), for one index list:
// the window list with the window cache's layout, the compressed list with the compressed cache's (each
// cache has its own DcpLayout: the group's W and rank, its own interleave, which divides its page size).
//   req_id       [T] int32: token t's request (row of seq_lens)
//   seq_lens     [R] int32: how many positions request r has in this list's cache (window: tokens;
//                compressed cache: entries)
//   indices      [T, topk] int32 request-local positions in that cache, < 0 invalid
//   topk_length  [T] int32 optional: entries j >= topk_length[t] are invalid (never read)
//   out          [T, topk] int32 (may not alias indices): token t's kept entries as local positions, in their
//                order, packed at the front of row t; -1 after them
//   valid_counts [T] int32: how many token t kept (its local list's valid length)
// Entry j of token t is kept when j < topk_length[t], 0 <= p < seq_lens[req_id[t]] (a req_id outside [0, R)
// keeps none) and this rank owns p (dcp_owner); duplicates are kept as duplicates. Positions and local
// positions are int32 (as every index of the library); the rows and byte addresses computed from them
// downstream are 64-bit (convert_topk_indices, the sparse_mqa kernels).
void dcp_compact_topk(const TensorView& req_id, const TensorView& seq_lens, const TensorView& indices,
                      const TensorView& topk_length, const TensorView& out, const TensorView& valid_counts,
                      const DcpLayout& layout, const Context& ctx = {});

// ---- collectives of a DCP group (one call per rank, the same shapes on every rank) -------------
// Every rank holds its h_q heads of the group's W·h_q; rank r's heads are [r·h_q, (r+1)·h_q) of the
// gathered order. Each op all-gathers q over heads, attends the rank's shard for all W·h_q heads, and
// combines the W partials of the rank's own heads (all-to-all of partial outputs and LSEs, then
// combine_attn_states: exact, §13). Partials travel in q's dtype. Tensors live on comm.device();
// q, out and lse contiguous. The workspace (u8, caller-owned, >= the size query) holds the gathered
// q, both exchange buffers and the decode's split scratch (the sparse op also a token-major copy of q
// and its partials); nothing is allocated. The dense decode runs one mqa_decode over the gathered q
// viewed [b·s_q, W, h_q, 576] (rank blocks as its query axis, non-causal) and writes its partials
// straight into the all-to-all's send blocks (strided views), so its exchange copies nothing.

// How dcp_mqa_decode exchanges and combines the partials (all exact, §13; measured in docs/SCALE.md).
enum class DcpExchange {
  // One all-to-all of partial outputs + LSEs (rank r receives the W partials of its heads), then
  // combine_attn_states over them. The default.
  all_to_all,
  // vLLM's: all-gather of the LSEs of every head, each rank rescales its partial outputs of every head
  // to the global LSE (combine_attn_states with the other parts zero), then a reduce-scatter (sum) of
  // the rescaled outputs in q's dtype (one more rounding than all_to_all: W terms summed in bf16).
  allgather_reduce_scatter,
  // all_to_all with the batch's rows in two halves: the first half's exchange and combine run on a
  // second stream (CUDA; high priority) while the second half attends. Costs one more decode launch.
  all_to_all_overlap,
};
const char* to_string(DcpExchange e);

// Dense decode of b requests with s_q queries each, as b·s_q rows of one query (the causal mask of a
// step is carried by the per-row local lengths, dcp_local_query_lengths).
//   q            [b, s_q, h_q, 576]   this rank's heads
//   cache        this rank's shard; block_table [b, max_blocks] int32 into it (local pages)
//   local_lens   [b·s_q] int32: row (r, i)'s key count in this shard
//   out          [b, s_q, h_q, 512], lse [b, s_q, h_q] fp32 optional
//   num_splits   KV splits of the local decode (mqa_decode's; 0 = its policy for b·s_q rows of W·h_q heads)
//   exchange     how the partials are combined (above); the workspace query must name the same
std::size_t dcp_mqa_decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_blocks,
                                           int64_t page_size, DType dtype, int world_size, Device device,
                                           int num_splits = 0, DcpExchange exchange = DcpExchange::all_to_all);
void dcp_mqa_decode(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& block_table,
                    const TensorView& local_lens, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const TensorView& workspace, const Context& ctx = {}, int num_splits = 0,
                    DcpExchange exchange = DcpExchange::all_to_all);

// Sparse attention of T tokens over this shard.
//   q [T, h_q, 576]; indices [T, topk] int32 slots of this shard (dcp_filter_topk, then the local block
//   table), -1 for positions other ranks own; topk_length [T] optional; out [T, h_q, 512], lse [T, h_q]
//   optional. The workspace query's d_qk / d_v are q's and out's last dims (576 / 512 here).
std::size_t dcp_sparse_mqa_workspace_bytes(int64_t t, int64_t h_q, DType dtype, int world_size, int64_t d_qk = 576,
                                           int64_t d_v = 512);
void dcp_sparse_mqa(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& indices,
                    const TensorView& topk_length, const TensorView& out, const TensorView& lse,
                    double softmax_scale, const TensorView& workspace, const Context& ctx = {});

// The DeepSeek-V4 step (sparse_mqa's SparseOptions, SEMANTICS §11.8; docs/SCALE.md "The DeepSeek-V4 step"):
// the same group op over this rank's shards of both caches, one softmax over every rank's window and
// compressed rows and the sink.
//   q            [T, h_q, d_qk] this rank's heads (V4: d_qk 512)
//   cache        this rank's shard of the main (window) cache
//   indices      [T, topk] int32 rows of that shard; topk_length [T] int32 optional: their valid lengths
//   opts.extra   {this rank's shard of the extra (compressed) cache, [T, k_e] rows of it, [T] lengths}
//   opts.attn_sink [h_q] fp32 optional: the sinks of this rank's heads
//   opts.values_include_rope, opts.batch_invariant: as sparse_mqa's (the rank's local attention)
//   out          [T, h_q, d_v] (V4: 512), lse [T, h_q] fp32 optional: over every rank's rows and the sink
//   workspace    >= dcp_sparse_mqa_workspace_bytes(T, h_q, q.dtype, W, d_qk, d_v)
// Index lists: each rank's lists are compacted rank-local rows with their counts as the valid lengths
// (per list: dcp_compact_topk, then convert_topk_indices through the rank's block table of that cache);
// lists with -1 in place of other ranks' rows give the same result and read past their -1s. A token may
// have no row on a rank (its part there is empty: lse -inf, weight 0) or on any rank.
// The sink enters each head's softmax exactly once: the ranks attend without it, and the combine of each
// rank's heads (after the exchange, on that rank) folds it in as a part of value 0 and LSE sink
// (combine_attn_states' attn_sink). Hence out and lse equal sparse_mqa with these options over the whole
// caches (up to the rounding of the partials to q's dtype); a token with no row anywhere gives out 0,
// lse = sink (-inf without one).
void dcp_sparse_mqa(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& indices,
                    const TensorView& topk_length, const TensorView& out, const TensorView& lse,
                    double softmax_scale, const SparseOptions& opts, const TensorView& workspace,
                    const Context& ctx = {});

}  // namespace mla
