// SPDX-License-Identifier: Apache-2.0
#pragma once
// The synthetic continuous-batching trace behind `mla run`: requests arrive with prompts, a
// vLLM-v1-style scheduler fills each step up to a token budget (running requests first: one token
// per decode, the next chunk of a partly computed prompt; then newly arrived requests, whose prompt
// is cut at the budget = chunked prefill), pages come from a block pool, and the batch is put in the
// decodes-first order the layer expects with the planner's reorder_decodes_first. Pure host code.
#include <cstdint>
#include <random>
#include <vector>

namespace mla::app {

struct TraceConfig {
  int64_t num_requests = 8;
  int64_t min_prompt = 16;      // prompt lengths are uniform in [min_prompt, max_prompt]
  int64_t max_prompt = 768;
  int64_t max_context = 1024;   // prompt + generated tokens of one request never exceed this
  int64_t min_output = 4;       // generated tokens, uniform in [min_output, min(max_output, max_context - prompt)]
  int64_t max_output = 64;
  int64_t token_budget = 256;   // tokens per step; longer prompts are split over several steps
  int64_t max_num_seqs = 8;     // requests running at once
  int64_t page_size = 64;
  int64_t arrival_span = 16;    // request i arrives at step floor(i * arrival_span / num_requests)
  int64_t decode_threshold = 1; // classify_request's threshold (dense 1; sparse by head count)
  uint64_t seed = 0;

  void validate() const;  // throws mla::Error on inconsistent values
  // Pages one request can hold, and the pool size that lets max_num_seqs requests run at once
  // (plus block 0, the never-allocated null block that pads block tables).
  int64_t max_blocks_per_request() const { return (max_context + page_size - 1) / page_size; }
  int64_t pool_blocks() const { return 1 + max_num_seqs * max_blocks_per_request(); }
};

// Pages of the paged cache. Block 0 is never handed out: block tables are padded with it, and the
// driver keeps it NaN-poisoned, so that a read past a request's pages shows in the output.
// Allocation order is shuffled so that a request's pages are scattered across the cache.
class BlockPool {
 public:
  BlockPool(int64_t num_blocks, uint64_t seed);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int32_t allocate();  // throws mla::Error when empty
  void release(int32_t block);

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;
  std::mt19937_64 rng_;
};

// How a token entered the step, from the scheduler's point of view (the planner's decode/prefill
// split may count short uniform extends as decodes in sparse mode; the oracle samples each kind).
enum class TokenKind : uint8_t { decode = 0, context_prefill = 1, fresh_prefill = 2 };
inline constexpr int kNumTokenKinds = 3;
const char* to_string(TokenKind k);

struct Request {
  int64_t id = 0;
  int64_t arrival_step = 0;
  int64_t prompt_len = 0, output_len = 0;
  int64_t num_computed = 0;     // tokens whose latent row is in the cache
  std::vector<int32_t> blocks;  // pages in logical order
  bool admitted = false, finished = false;
  int64_t total_len() const { return prompt_len + output_len; }
  bool in_prompt() const { return num_computed < prompt_len; }
};

struct ScheduledRequest {
  int64_t request = 0;       // index into Scheduler::requests()
  int64_t num_computed = 0;  // context: tokens already in the cache
  int64_t num_new = 0;       // tokens of this step
  TokenKind kind = TokenKind::decode;
};

// One step in the layer's terms. Requests are in decodes-first order.
struct StepBatch {
  int64_t step = 0;   // forward-step index
  int64_t clock = 0;  // trace time (arrivals); jumps over idle time
  std::vector<ScheduledRequest> reqs;
  std::vector<int32_t> query_start_loc;  // [R + 1]
  std::vector<int32_t> seq_lens;         // [R] context + new
  std::vector<int64_t> slot_mapping;     // [T]
  int64_t max_blocks = 0;                // block-table width
  std::vector<int32_t> block_table;      // [R * max_blocks], padded with block 0
  std::vector<int32_t> token_req;        // [T] batch-request index of each token
  std::vector<int32_t> token_pos;        // [T] request-local position of each token
  int64_t tokens_of_kind[kNumTokenKinds] = {0, 0, 0};

  int64_t num_reqs() const { return static_cast<int64_t>(reqs.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(token_req.size()); }
  bool empty() const { return reqs.empty(); }
  TokenKind kind_of_token(int64_t t) const { return reqs[token_req[t]].kind; }
};

class Scheduler {
 public:
  explicit Scheduler(const TraceConfig& config);

  const TraceConfig& config() const { return config_; }
  const std::vector<Request>& requests() const { return requests_; }
  int64_t num_finished() const { return num_finished_; }
  bool done() const { return num_finished_ == static_cast<int64_t>(requests_.size()); }

  // Builds the next step (an empty batch only when every request has finished).
  StepBatch schedule();
  // Marks the batch's tokens computed. Requests that reach their total length finish and their
  // pages go back to the pool; the released block ids are returned (the driver re-poisons them).
  std::vector<int32_t> commit(const StepBatch& batch);

 private:
  bool ensure_blocks(Request& r, int64_t tokens);  // false when the pool cannot cover it

  TraceConfig config_;
  std::vector<Request> requests_;
  std::vector<int64_t> running_;  // admission order
  int64_t next_arrival_ = 0;      // first request not yet admitted (requests sorted by arrival)
  int64_t num_finished_ = 0;
  int64_t step_ = 0, clock_ = 0;
  BlockPool pool_;
};

}  // namespace mla::app
