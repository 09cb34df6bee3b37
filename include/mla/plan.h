// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Planner: pure host functions that turn a scheduler batch into a step Plan (decode/prefill
// split, the decode schedule, context chunks, sparse mapping, the packed metadata the kernels read).
// No device access, no allocation of device memory; every function is unit-tested on the CPU against
// the worked examples of docs/SEMANTICS.md §8, §9 and §11. Kernels and the layer assume a validated
// Plan. Plan once per step, run every layer of the step with it (mla/layer.h): the plan's metadata is
// written into a caller-owned pinned buffer and uploaded once (upload_step_metadata), and every
// layer's forward() only reads the device copy.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "mla/dcp.h"
#include "mla/types.h"

namespace mla {

// ---- §8.1 batch reorder --------------------------------------------------------------------
enum class RequestRegion : uint8_t { decode = 0, extend = 1, prefill = 2 };
// prefill: num_computed == 0; decode: computed > 0 and scheduled <= threshold; extend: otherwise.
// Throws on negative counts or a threshold < 1.
RequestRegion classify_request(int64_t num_computed_tokens, int64_t num_scheduled_tokens, int64_t decode_threshold);
// Stable reorder to decode -> extend -> prefill that moves only misplaced requests. Returns the new
// order as indices into the input (order[i] = old index now at position i) and whether anything moved.
// A request already inside its region's target range keeps its position; the misplaced ones fill
// the remaining positions in their original relative order (vLLM's swap set). Sizes must match.
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
// Padding tokens (num_tokens > query_start_loc.back()) are counted in the trailing region, as vLLM
// does: decode tokens when everything is decode, prefill tokens otherwise. Zero-length requests
// are padding; under require_uniform they count as decodes only when every request has length
// q_lens[0] or 0, and then num_tokens must equal num_reqs * q_lens[0]. An empty batch
// (query_start_loc = {0}) gives all zeros. Throws mla::Error on a query_start_loc that does not
// start at 0 or decreases, a threshold < 1, num_tokens < query_start_loc.back() (other than -1), or
// a padded uniform batch with the wrong num_tokens.
Split split_decodes_and_prefills(const std::vector<int32_t>& query_start_loc, int64_t decode_threshold,
                                 bool require_uniform, int64_t num_tokens = -1);

// ---- §8.3 threshold ----------------------------------------------------------------------------
enum class QueryLenSupport : uint8_t { single_only = 0, uniform = 1, varlen = 2 };
// Dense MLA backends: start threshold 1; spec decode raises it to 1 + num_spec_tokens (x2 with
// parallel drafting) unless single_only; DCP > 1 without varlen support forces 1.
// Pair with PlannerConfig::require_uniform = (support != varlen).
int64_t dense_decode_threshold(QueryLenSupport support, int num_speculative_tokens, bool parallel_drafting,
                               int dcp_world_size, bool supports_dcp_varlen);
// FlashMLA-sparse threshold by heads per rank (SM90 table unless sm100), then the same spec/DCP rules.
// Exact head-count lookups: counts not in the table take the default (256 SM90, 1024 SM100).
// HiSparse (threshold 1) is not modelled: pass decode_threshold = 1 yourself. Sparse decodes are
// uniform (require_uniform = true in vLLM).
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
  int64_t chunk_size = 0;  // max_context_chunk: workspace_rows / prefills_with_context, rounded down to
                           // page; 0 when no prefill has context
  std::vector<ContextChunk> chunks;  // empty when no prefill has context
};
// context_lens: per prefill request (seq_len - query_len). round_to_page: the CUDA builder rounds the
// chunk down to a multiple of the page size (our gathers accept any start; kept for parity). Throws
// mla::Error when the workspace cannot hold one page per prefill with context (one row without
// rounding), or on negative lengths. num_chunks = ceil(max context / chunk_size); every chunk lists
// every prefill (zero-length where its context is shorter), and one chunk's total never exceeds
// workspace_rows.
ContextPlan plan_context_chunks(const std::vector<int32_t>& context_lens, int64_t workspace_rows, int64_t page_size,
                                bool round_to_page = true);

// ---- §11 sparse --------------------------------------------------------------------------------
// req_id_per_token[t] = request of token t (from query_start_loc).
std::vector<int32_t> req_id_per_token(const std::vector<int32_t>& query_start_loc);
// §11.5 greedy request chunks with running sum <= workspace_rows; returns [start, end) request ranges
// (offset added). Throws when one seq_len exceeds the workspace.
std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(const std::vector<int32_t>& seq_lens,
                                                              int64_t workspace_rows, int64_t request_offset = 0);
// Exclusive cumsum of seq_lens, re-zeroed at the start of every chunk. `chunks` must tile [0, n) in
// order with request_offset 0 (as split_prefill_chunks(seq_lens, rows) returns them).
std::vector<int32_t> prefill_workspace_starts(const std::vector<int32_t>& seq_lens,
                                              const std::vector<std::pair<int64_t, int64_t>>& chunks);
inline constexpr int kMinHeadsForBf16Prefill = 32;
bool sparse_use_mixed_batch(int num_heads, bool hisparse = false, bool pcp_and_dcp = false);
// How a sparse fp8_ds_mla step runs its prefill tokens (PlannerConfig::sparse_prefill_mode). mixed_batch:
// every token on the cache's records; separate: prefills through the upconverted bf16 workspace at any head
// count. automatic: separate on a compute capability 9.0 device outside DCP (the sm90 kernels pad no heads,
// and their bf16-row kernel beats the fp8_ds_mla one: the default `mla run --sparse` trace at 16 heads ran
// its forward 33% faster separate; docs/design/attention_sm90.md "8. The selection rule"), else §11.4's rule
// (sparse_use_mixed_batch: mixed batch below 32 heads, vLLM's choice because its bf16 prefill kernel pads
// heads to 64 / 128; DCP plans need the mixed batch below 32 heads, and make_plan refuses separate there).
enum class SparsePrefillMode : int32_t { automatic = 0, mixed_batch = 1, separate = 2 };
const char* to_string(SparsePrefillMode m);
// The mode's decision for num_heads on a device of compute_capability (major * 10 + minor; 0 = the CPU or
// not known) in a DCP group of dcp_world_size ranks. Throws mla::Error for a mode outside the enum.
bool sparse_mixed_batch_for(SparsePrefillMode mode, int num_heads, int compute_capability = 0,
                            int dcp_world_size = 1);
// 64 if <= 64 else 128; beyond FlashMLA's 128, a multiple of 128 (no head count is refused).
int sparse_fp8_decode_padded_heads(int num_heads);
int sparse_prefill_padded_heads(int num_heads, bool sm100);  // roundup(N, 64 | 128)
int64_t sparse_prefill_workspace_rows(int64_t max_model_len);  // 5 * max_model_len

// ---- §6 decode schedule ------------------------------------------------------------------------
// How the dense decode requests of a step are launched: runs of consecutive decode requests with
// one query length (one kernel launch each; zero-length padding requests belong to no run) and, per
// run, how many KV ranges (splits) each request's keys are cut into. The split count is a function
// of the device's SM count, passed in (PlannerConfig::num_sms), never read inside a launcher, so a
// plan is a pure function of its inputs and a captured CUDA graph replays exactly what was planned.
//
// This is the schedule of the portable split-KV kernel (src/cuda/attention/portable/decode/, an
// mma.sync engine that runs one CTA of kDecodeTileRows query rows per SM). A second decode kernel (e.g. an sm90 family)
// adds its own schedule struct and plan_* function beside this one and a field of Plan for it; the
// layer picks the schedule that matches the kernel it launches. The CPU backend does not use it: it
// parallelises over its own OpenMP threads (src/cpu/mqa_split.h).
inline constexpr int kDecodeMaxSplits = 64;             // partials per request row (combine keeps weights in smem)
inline constexpr int64_t kDecodeMinSplitKeys = 256;     // a split shorter than 8 key tiles costs more than it saves
// ... except in short contexts: splits of >= 128 keys while a request has at most 16 of them (measured over
// b 1..16 x h 16 / 128: at s_k 1024 8 splits beat the 256-key rule's 4; from s_k 2048 the 256-key rule was
// within the spread of the best; docs/LAB.md, split counts).
inline constexpr int64_t kDecodeShortSplitKeys = 128;
inline constexpr int kDecodeShortSplits = 16;
inline constexpr int64_t kDecodeTileRows = 64;          // query rows (s_q * h_q) per CTA of the portable kernel
// KV splits per request for b requests of s_q queries and h_q heads whose keys number at most
// max_seq_len. The kernel runs one CTA per SM, so ctas = b * ceil(s_q * h_q / kDecodeTileRows) take
// ceil(ctas / sms) waves; S splits make each CTA S times shorter. Picks the S minimising waves / S
// (ties and gains under 5% keep the smaller S: every split adds a partial row to write and combine),
// never more than kDecodeMaxSplits nor more splits than max_seq_len has kDecodeMinSplitKeys chunks.
// num_sms <= 0 (CPU plans, or no device known): 1.
int decode_num_splits(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, int num_sms);

struct PlannerConfig;
// The split-KV count of every decode run of s_q-token requests in a batch-invariant plan
// (PlannerConfig::batch_invariant): decode_num_splits for the config's full batch, max_num_seqs requests of
// max_model_len keys (rounded up to whole pages) with dims.num_heads heads on num_sms SMs. A function of the
// config and s_q only, so a request's split points depend on its own length alone; 1 when num_sms is 0.
int batch_invariant_splits(const PlannerConfig& config, int64_t s_q);

struct DecodeRun {
  int64_t req_begin = 0, req_end = 0;  // decode requests [req_begin, req_end), each with s_q query tokens
  int64_t s_q = 0;
  int64_t token_begin = 0;  // the run's tokens are [token_begin, token_begin + (req_end - req_begin) * s_q)
  // Block-table columns the kernel is given: pages of the longest sequence of the run (or of
  // BatchDesc::decode_seq_len_bound). The kernel's split-KV ranges and scratch are sized from it.
  int64_t block_cols = 0;
  // decode_num_splits(b, s_q, num_heads, block_cols * page_size, num_sms); batch-invariant plans:
  // batch_invariant_splits(config, s_q), whatever the batch.
  int num_splits = 1;
  // The run's host lengths are near-uniform: one request per CTA is what the sm90 kernel's balanced schedule would
  // run (core/decode_balance.h whole_requests, one planned split, the lengths known: no seq_len_bound), so it runs
  // that without the combine launch (mqa_decode's whole_requests hint).
  bool whole_requests = false;
  friend bool operator==(const DecodeRun&, const DecodeRun&) = default;
};
struct DecodeSchedule {
  std::vector<DecodeRun> runs;
  friend bool operator==(const DecodeSchedule&, const DecodeSchedule&) = default;
};
// Runs over decode requests [0, num_decodes). seq_len_bound > 0 sizes every run for sequences up to
// that length instead of the run's longest (CUDA graphs: one schedule for every batch of the shape).
DecodeSchedule plan_decode_schedule(const std::vector<int32_t>& query_start_loc, const std::vector<int32_t>& seq_lens,
                                    int64_t num_decodes, int64_t page_size, int64_t num_heads, int num_sms,
                                    int64_t seq_len_bound = 0);

// ---- step metadata ------------------------------------------------------------------------------
// The int32 arrays the kernels of a step read from device memory that the scheduler does not hand
// over as device tensors itself, packed into one array (offsets in int32 elements; -1 = absent).
// make_plan fills it; upload_step_metadata (mla/layer.h) writes it into a caller-owned pinned host
// buffer and copies it to the device with one async copy per step. Dense decode-only steps have none.
struct StepMetadata {
  std::vector<int32_t> data;
  // dense prefill
  int64_t prefill_qsl = -1;                     // [num_prefills + 1] prefill_query_start_loc
  std::vector<int64_t> chunk_cu, chunk_starts;  // per context chunk: [P + 1] cu_seq_lens, [P] seq_starts
                                                // (-1 for a chunk with no rows)
  // sparse
  int64_t req_id = -1;            // [num_actual_tokens] req_id_per_token
  int64_t prefill_ids = -1;       // [num_actual_tokens] prefill_request_id   (fp8_ds_mla separate mode)
  int64_t workspace_starts = -1;  // [num_prefills] chunk-local starts          (fp8_ds_mla separate mode)
  // decode context parallelism
  int64_t dcp_local_lens = -1;    // [num_decode_tokens] Plan::dcp_local_lens
  std::vector<int64_t> dcp_chunk_cu, dcp_chunk_starts;  // per context chunk: DcpChunk::local_cu / local_starts (-1: no rows)
  std::size_t bytes() const { return data.size() * sizeof(int32_t); }
};

// ---- the Plan ----------------------------------------------------------------------------------
// The planner reads only dims.num_heads (mixed-batch decision) and dims.index_topk (sparse term of
// the chunked workspace formula); the layer validates the other dims. In sparse plans only the
// fp8_ds_mla format takes the mixed-batch / separate (upconvert workspace) decision of §11.4; bf16
// and per-tensor fp8 sparse plans use global cache slots for every token (the spec's fp8 ->
// fp8_ds_mla alias is the caller's choice of cache).
struct PlannerConfig {
  ModelDims dims;
  CacheFormat cache_format = CacheFormat::bf16;
  int64_t page_size = 64;
  int64_t max_model_len = 163840;
  int64_t max_num_seqs = 256;
  bool sparse = false;
  int64_t decode_threshold = 1;  // use dense_/sparse_decode_threshold to derive
  bool require_uniform = false;
  // Rows of the dense chunked-context workspace; 0 = chunked_prefill_workspace_rows(...) (with
  // dims.index_topk as the sparse term when sparse). Otherwise >= page_size.
  int64_t context_workspace_rows = 0;
  // Rows of the sparse fp8 prefill upconvert workspace; 0 = sparse_prefill_workspace_rows(max_model_len).
  // Otherwise >= max_model_len: a request is never split across workspace chunks.
  int64_t sparse_workspace_rows = 0;
  // Sparse fp8_ds_mla steps: mixed batch or separate prefill (SparsePrefillMode above). Other formats
  // and dense steps ignore it. DCP plans need the mixed batch (make_plan refuses separate with DCP).
  SparsePrefillMode sparse_prefill_mode = SparsePrefillMode::automatic;
  // Multiprocessors of the device the step runs on (multiprocessor_count(device), mla/ops.h): sizes
  // the decode split-KV schedule. 0 = no split-KV (CPU layers; on CUDA correct but slower).
  int num_sms = 0;
  // Compute capability of that device, major * 10 + minor (compute_capability(device), mla/ops.h; 0 = the
  // CPU or not known): picks the automatic sparse prefill mode (SparsePrefillMode above). Any value plans
  // a correct step on any device; it only chooses between two correct modes.
  int compute_capability = 0;
  // Decode context parallelism (§13): this rank's place in the group. world_size > 1 plans the step
  // for one rank of the group: seq_lens stay global, the block table the layer gets is the rank's
  // shard, each decode row's local key count goes into the metadata (dcp_local_lens). Dense
  // steps, and sparse steps that run every token on the cache (not the fp8_ds_mla separate mode).
  DcpLayout dcp;
  // Batch-invariant decode: a request's decode output (dense and sparse) is bit-identical whatever else is
  // in the step (its position, the batch size, the other requests' lengths). Every decision that shapes a
  // request's arithmetic is then a function of the config and the request's own shape: its kernel (by its
  // row count, never the batch), its split-KV count (batch_invariant_splits, per query length: the kernels
  // cut a request's own key tiles into that many equal ranges) and the combine, which merges those splits
  // in split order. No balanced or cluster schedule, no small-T sparse split, no split count lowered for a
  // short workspace (the op refuses instead). The cost: no balancing across requests (a varlen batch waits
  // for its longest request's share) and one split count sized for a full batch (docs/design/
  // attention_sm90.md "Batch-invariant mode"). Not with DCP (validate refuses it).
  bool batch_invariant = false;
  // The sparse fp8_ds_mla prefill mode this config gives a step (sparse_mixed_batch_for of its fields).
  bool sparse_mixed_batch() const;
  // Throws mla::Error unless num_sms >= 0, compute_capability >= 0, num_heads, page_size, max_num_seqs, decode_threshold >= 1,
  // 1 <= max_model_len < 2^31, index_topk >= 0, the workspace rows are as above and batch_invariant is not
  // combined with DCP.
  void validate() const;
};

// One step's batch as the scheduler describes it (host copies). Requests are already ordered
// decodes first (reorder_decodes_first): classified with context = seq_len - query_len and
// config.decode_threshold, the regions of the requests with query_len > 0 never decrease
// (decode -> extend -> prefill), and among the split's prefills those with context precede those
// without. Zero-length requests (query_len 0) are CUDA-graph padding: allowed anywhere the order
// permits (trailing, with seq_len 0, is the safe place). At most max_num_seqs requests, each with
// query_len <= seq_len <= max_model_len.
//
// CUDA graphs: a graph captured for one plan replays the plan's host decisions (decode runs and
// splits, token counts, chunk counts and sizes, max lengths) with whatever the device buffers and the
// pinned metadata hold at replay. Pad batches to the captured shape (num_tokens > actual tokens,
// zero-length requests) and set decode_seq_len_bound so that the decode schedule depends on the
// shape only; a batch whose Plan has the same host decisions may then replay the same graph.
struct BatchDesc {
  std::vector<int32_t> query_start_loc;  // [num_reqs + 1]
  std::vector<int32_t> seq_lens;         // [num_reqs] context + new tokens
  int64_t num_tokens = -1;               // padded token count; -1 = query_start_loc.back()
  // 0: the decode schedule follows the batch's seq_lens. > 0: it is sized for decodes of up to this
  // many tokens (every decode's seq_len must be <= it; <= max_model_len).
  int64_t decode_seq_len_bound = 0;
};

// DCP plans with context (§13): how one context chunk's rows reach this rank. Each rank gathers the
// positions of the chunk it owns (a contiguous local range per prefill), all ranks all-gather those
// blocks (pad_rows rows each), and the segments put the received rows into the chunk's request order.
struct DcpSegment {
  // `count` blocks of `rows` rows: block i goes from received row src_row + i·rows to chunk row
  // dst_row + i·W·I (one rank's turns of I positions, W·I apart in the global order).
  int64_t dst_row = 0, src_row = 0, rows = 0, count = 0;
};
struct DcpChunk {
  std::vector<int32_t> local_cu;      // [P + 1] this rank's rows per prefill, exclusive cumsum
  std::vector<int32_t> local_starts;  // [P] this rank's first local position of each prefill's share
  int64_t pad_rows = 0;               // the largest rank's total: every rank's all-gather block
  std::vector<DcpSegment> segments;   // received [W, pad_rows] -> chunk rows (covers every chunk row once)
};

struct SparsePrefillChunk {
  int64_t req_begin = 0, req_end = 0;  // prefill request range (prefill-local indices)
  int64_t token_begin = 0, token_end = 0;  // token range in the whole batch
  int64_t total_rows = 0;              // workspace rows used (sum of seq_lens)
  std::vector<int32_t> workspace_starts;  // [req_end - req_begin] chunk-local starts
};

struct Plan {
  PlannerConfig config;  // as given, with context_/sparse_workspace_rows resolved to their effective values
  int64_t num_reqs = 0, num_tokens = 0, num_actual_tokens = 0;  // num_tokens: padded; actual = qsl.back()
  std::vector<int32_t> query_start_loc, seq_lens;
  Split split;  // split_decodes_and_prefills(query_start_loc, threshold, require_uniform, num_tokens)
  // q_len of request 0 when the batch has decodes (vLLM's decode_query_len), else 0. Under
  // require_uniform and in sparse fp8_ds_mla separate mode make_plan checks that it is > 0, that every
  // decode has exactly this length except zero-length padding at the end of the decodes, and that
  // num_decode_tokens is a multiple of it: the decode rows reshape to
  // (num_decode_tokens / decode_query_len, decode_query_len). For varlen dense decodes it is only
  // the first request's length.
  int64_t decode_query_len = 0;
  int64_t max_decode_seq_len = 0;  // max seq_len over the decode requests (0 when none)

  // Prefill requests [num_decodes, num_reqs), filled for dense and sparse plans (empty without
  // prefills): query_start_loc rebased to 0; context = seq_len - query_len.
  std::vector<int32_t> prefill_query_start_loc, prefill_seq_lens, prefill_context_lens;
  int64_t max_prefill_query_len = 0, max_prefill_seq_len = 0;
  int64_t prefill_tokens_with_context = 0;  // prefill tokens whose request has context > 0
  // Dense plans only: plan_context_chunks(prefill_context_lens, config.context_workspace_rows,
  // page_size, round_to_page = true). Empty for sparse plans (sparse prefills read the cache or the
  // upconvert workspace through top-k indices, not context chunks).
  ContextPlan context;

  // Sparse plans only.
  std::vector<int32_t> req_id_per_token;      // [num_tokens] (padding tokens -> 0)
  // fp8_ds_mla with sparse_mixed_batch_for(config.sparse_prefill_mode, num_heads): all tokens through the
  // cache path.
  bool sparse_mixed_batch = false;
  // [num_tokens]: -1 decode (and padding) tokens, prefill-local index otherwise. Filled exactly when
  // sparse_chunks is (fp8_ds_mla separate mode with prefills), empty otherwise.
  std::vector<int32_t> prefill_request_id;
  // fp8_ds_mla separate mode (num_heads >= 32) with prefills: split_prefill_chunks over
  // prefill_seq_lens with config.sparse_workspace_rows; req ranges are prefill-local, token ranges
  // index the whole batch, workspace_starts are chunk-local (prefill_workspace_starts).
  std::vector<SparsePrefillChunk> sparse_chunks;

  // Dense plans: the decode schedule (runs and splits) of the portable decode kernel. Empty for
  // sparse plans (sparse decodes run through sparse MQA over their top-k rows).
  DecodeSchedule decode;
  // DCP plans (config.dcp.world_size > 1): per decode token (request r, query i of q_len), the keys
  // of this rank's shard it sees: dcp_local_length(seq_len − q_len + 1 + i). The decode runs' block_cols
  // and num_splits are sized for the shard (the longest local length) and the group's heads.
  std::vector<int32_t> dcp_local_lens;
  // DCP plans with context chunks: one entry per context.chunks entry.
  std::vector<DcpChunk> dcp_chunks;
  // The packed device-read metadata of this step (see StepMetadata).
  StepMetadata metadata;

  // plan_digest(*this) as make_plan computed it; 0 = not made by make_plan. MlaAttention::forward
  // refuses a plan whose seal is 0 or differs from its digest before it writes anything: a plan is
  // either exactly what make_plan produced (internally consistent, validated) or refused. Copies
  // keep the seal; editing any field after make_plan voids it. (The seal detects edits, it is no
  // secret: a caller who re-seals an edited plan with plan_digest is outside the contract; the ops
  // still never read or write outside their tensors, but forward may then throw after a write.)
  uint64_t seal = 0;

  bool has_decode() const { return split.num_decodes > 0; }
  bool has_prefill() const { return split.num_prefills > 0; }
};

// Builds and validates a Plan. Throws mla::Error on inconsistent input (non-monotone
// query_start_loc, seq_len < query_len, lengths beyond max_model_len, num_tokens below the actual
// count, more than max_num_seqs requests, a batch not in decode-first order (see BatchDesc), decodes
// that are not uniform where a uniform reshape consumes them (see decode_query_len), an invalid
// config, a context workspace below one page per prefill with context). The result is sealed
// (Plan::seal = plan_digest(result)).
Plan make_plan(const BatchDesc& batch, const PlannerConfig& config);

// CUDA graphs: true when a graph captured with plan `a` (upload_step_metadata + forward of every
// layer) computes plan `b`'s step once the device buffers and the pinned staging buffer hold b's
// inputs and metadata: every host decision the layer bakes into launches is equal (token and request
// counts, split, decode schedule, prefill maximum query length, context chunk count and sizes,
// sparse mode and chunks, metadata layout). Lengths, block tables and indices may differ.
bool same_launches(const Plan& a, const Plan& b);

// 64-bit digest of every field of the plan except `seal` (FNV-1a over 64-bit words, lengths of
// vectors and strings included), never 0. Any single changed value changes the digest. Cost: linear
// in the plan's arrays, about 1 ns per 8 bytes (tens of microseconds for a step of thousands of
// tokens), paid once per forward().
uint64_t plan_digest(const Plan& plan);

// Upper bound of plan.metadata.bytes() over every plan `config` admits with at most max_num_tokens
// tokens: size the pinned staging buffer and its device copy once.
std::size_t max_step_metadata_bytes(const PlannerConfig& config, int64_t max_num_tokens);

}  // namespace mla
