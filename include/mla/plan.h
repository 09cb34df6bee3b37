#pragma once
// The Planner: pure host functions that turn a scheduler batch into a Plan (decode/prefill split,
// context chunks, sparse mapping, workspace sizes). No device access, no allocation of device
// memory; every function is unit-tested on the CPU against the worked examples of
// mla_semantics.md §8, §9 and §11. Kernels and the layer assume a validated Plan.
#include <cstdint>
#include <utility>
#include <vector>

#include "mla/types.h"

namespace mla {

// ---- §8.1 batch reorder --------------------------------------------------------------------
enum class RequestRegion : uint8_t { decode = 0, extend = 1, prefill = 2 };
// prefill: num_computed == 0; decode: computed > 0 and scheduled <= threshold; extend: otherwise.
RequestRegion classify_request(int64_t num_computed_tokens, int64_t num_scheduled_tokens, int64_t decode_threshold);
// Stable reorder to decode -> extend -> prefill that moves only misplaced requests. Returns the new
// order as indices into the input (order[i] = old index now at position i) and whether anything moved.
struct ReorderResult {
  std::vector<int32_t> order;
  bool moved = false;
};
ReorderResult reorder_decodes_first(const std::vector<int64_t>& num_computed_tokens,
                                    const std::vector<int64_t>& num_scheduled_tokens, int64_t decode_threshold);

// ---- §8.2 split --------------------------------------------------------------------------------
struct Split {
  int64_t num_decodes = 0, num_prefills = 0, num_decode_tokens = 0, num_prefill_tokens = 0;
  friend bool operator==(const Split&, const Split&) = default;
};
// query_start_loc [num_reqs + 1] (host); num_tokens = query_start_loc.back() unless padded (CUDA
// graphs: pass the padded count).
Split split_decodes_and_prefills(const std::vector<int32_t>& query_start_loc, int64_t decode_threshold,
                                 bool require_uniform, int64_t num_tokens = -1);

// ---- §8.3 threshold ----------------------------------------------------------------------------
enum class QueryLenSupport : uint8_t { single_only = 0, uniform = 1, varlen = 2 };
// Dense MLA backends: start threshold 1; spec decode raises it to 1 + num_spec_tokens (x2 with
// parallel drafting) unless single_only; DCP > 1 without varlen support forces 1.
int64_t dense_decode_threshold(QueryLenSupport support, int num_speculative_tokens, bool parallel_drafting,
                               int dcp_world_size, bool supports_dcp_varlen);
// FlashMLA-sparse threshold by heads per rank (SM90 table unless sm100), then the same spec/DCP rules.
int64_t sparse_decode_threshold(int num_heads, bool sm100, int num_speculative_tokens, bool parallel_drafting,
                                int dcp_world_size, bool supports_dcp_varlen);

// ---- §9 chunked context ------------------------------------------------------------------------
// max(min(max(8*max_model_len, 4*max_num_seqs*page_size), 65536[, max_num_seqs*topk]), max_num_seqs*page_size)
int64_t chunked_prefill_workspace_rows(int64_t max_model_len, int64_t max_num_seqs, int64_t page_size,
                                       int64_t sparse_topk = 0);

struct ContextChunk {
  std::vector<int32_t> seq_starts;   // [P] logical start position of this chunk per prefill (same for all)
  std::vector<int32_t> lens;         // [P] tokens of each prefill in this chunk (0 allowed)
  std::vector<int32_t> cu_seq_lens;  // [P + 1] exclusive cumsum of lens
  int64_t total = 0;                 // sum of lens (rows gathered)
  int64_t max_len = 0;
};
struct ContextPlan {
  int64_t chunk_size = 0;  // max_context_chunk: workspace_rows / prefills_with_context, rounded down to page
  std::vector<ContextChunk> chunks;  // empty when no prefill has context
};
// context_lens: per prefill request (seq_len - query_len). round_to_page: the CUDA builder rounds the
// chunk down to a multiple of the page size (our gathers accept any start; kept for parity). Throws
// mla::Error when the workspace cannot hold one page per prefill with context.
ContextPlan plan_context_chunks(const std::vector<int32_t>& context_lens, int64_t workspace_rows, int64_t page_size,
                                bool round_to_page = true);

// ---- §11 sparse --------------------------------------------------------------------------------
// req_id_per_token[t] = request of token t (from query_start_loc).
std::vector<int32_t> req_id_per_token(const std::vector<int32_t>& query_start_loc);
// §11.5 greedy request chunks with running sum <= workspace_rows; returns [start, end) request ranges
// (offset added). Throws when one seq_len exceeds the workspace.
std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(const std::vector<int32_t>& seq_lens,
                                                              int64_t workspace_rows, int64_t request_offset = 0);
// Exclusive cumsum of seq_lens, re-zeroed at the start of every chunk.
std::vector<int32_t> prefill_workspace_starts(const std::vector<int32_t>& seq_lens,
                                              const std::vector<std::pair<int64_t, int64_t>>& chunks);
inline constexpr int kMinHeadsForBf16Prefill = 32;
bool sparse_use_mixed_batch(int num_heads, bool hisparse = false, bool pcp_and_dcp = false);
int sparse_fp8_decode_padded_heads(int num_heads);          // 64 if <= 64 else 128
int sparse_prefill_padded_heads(int num_heads, bool sm100);  // roundup(N, 64 | 128)
int64_t sparse_prefill_workspace_rows(int64_t max_model_len);  // 5 * max_model_len

// ---- the Plan ----------------------------------------------------------------------------------
struct PlannerConfig {
  ModelDims dims;
  CacheFormat cache_format = CacheFormat::bf16;
  int64_t page_size = 64;
  int64_t max_model_len = 163840;
  int64_t max_num_seqs = 256;
  bool sparse = false;
  int64_t decode_threshold = 1;  // use dense_/sparse_decode_threshold to derive
  bool require_uniform = false;
  // Rows of the dense chunked-context workspace; 0 = chunked_prefill_workspace_rows(...).
  int64_t context_workspace_rows = 0;
  // Rows of the sparse fp8 prefill upconvert workspace; 0 = sparse_prefill_workspace_rows(max_model_len).
  int64_t sparse_workspace_rows = 0;
  void validate() const;
};

// One step's batch as the scheduler describes it (host copies). Requests are already ordered
// decodes first (reorder_decodes_first).
struct BatchDesc {
  std::vector<int32_t> query_start_loc;  // [num_reqs + 1]
  std::vector<int32_t> seq_lens;         // [num_reqs] context + new tokens
  int64_t num_tokens = -1;               // padded token count; -1 = query_start_loc.back()
};

struct SparsePrefillChunk {
  int64_t req_begin = 0, req_end = 0;  // prefill request range (prefill-local indices)
  int64_t token_begin = 0, token_end = 0;  // token range in the whole batch
  int64_t total_rows = 0;              // workspace rows used (sum of seq_lens)
  std::vector<int32_t> workspace_starts;  // [req_end - req_begin] chunk-local starts
};

struct Plan {
  PlannerConfig config;
  int64_t num_reqs = 0, num_tokens = 0, num_actual_tokens = 0;
  std::vector<int32_t> query_start_loc, seq_lens;
  Split split;
  int64_t decode_query_len = 0;  // uniform s_q of the decode requests (0 when none)
  int64_t max_decode_seq_len = 0;

  // Dense prefill (requests [num_decodes, num_reqs)): query_start_loc rebased to 0.
  std::vector<int32_t> prefill_query_start_loc, prefill_seq_lens, prefill_context_lens;
  int64_t max_prefill_query_len = 0, max_prefill_seq_len = 0;
  int64_t prefill_tokens_with_context = 0;  // prefill tokens whose request has context > 0
  ContextPlan context;

  // Sparse.
  std::vector<int32_t> req_id_per_token;      // [num_tokens] (padding tokens -> 0)
  bool sparse_mixed_batch = false;            // fp8_ds_mla: all tokens through the cache path
  std::vector<int32_t> prefill_request_id;    // [num_tokens]: -1 decode, prefill-local index otherwise
  std::vector<SparsePrefillChunk> sparse_chunks;  // fp8_ds_mla separate mode only

  bool has_decode() const { return split.num_decodes > 0; }
  bool has_prefill() const { return split.num_prefills > 0; }
};

// Builds and validates a Plan. Throws mla::Error on inconsistent input (non-monotone
// query_start_loc, seq_len < query_len, lengths beyond max_model_len, ...).
Plan make_plan(const BatchDesc& batch, const PlannerConfig& config);

}  // namespace mla
