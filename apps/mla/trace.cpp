// SPDX-License-Identifier: Apache-2.0
#include "trace.h"

#include <fmt/format.h>

#include <algorithm>

#include "mla/error.h"
#include "mla/plan.h"

namespace mla::app {

const char* to_string(TokenKind k) {
  switch (k) {
    case TokenKind::decode: return "decode";
    case TokenKind::context_prefill: return "context prefill";
    case TokenKind::fresh_prefill: return "fresh prefill";
  }
  return "?";
}

void TraceConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("trace: " + what);
  };
  need(num_requests >= 1, fmt::format("--requests must be >= 1, got {}", num_requests));
  need(page_size >= 1, fmt::format("--page-size must be >= 1, got {}", page_size));
  need(token_budget >= 1, fmt::format("--token-budget must be >= 1, got {}", token_budget));
  need(max_num_seqs >= 1, fmt::format("--max-seqs must be >= 1, got {}", max_num_seqs));
  need(min_prompt >= 1 && min_prompt <= max_prompt,
       fmt::format("prompt lengths need 1 <= min <= max, got [{}, {}]", min_prompt, max_prompt));
  need(min_output >= 1 && min_output <= max_output,
       fmt::format("generated tokens per request need 1 <= min <= max, got [{}, {}]", min_output, max_output));
  need(max_prompt + min_output <= max_context,
       fmt::format("--max-context {} cannot hold a {}-token prompt plus {} generated tokens", max_context, max_prompt,
                   min_output));
  need(arrival_span >= 1, fmt::format("arrival span must be >= 1 step, got {}", arrival_span));
  need(decode_threshold >= 1, fmt::format("decode threshold must be >= 1, got {}", decode_threshold));
}

// ---- BlockPool --------------------------------------------------------------------------------

BlockPool::BlockPool(int64_t num_blocks, uint64_t seed) : num_blocks_(num_blocks), rng_(seed) {
  if (num_blocks < 2) throw Error(fmt::format("block pool: need >= 2 blocks (block 0 is reserved), got {}", num_blocks));
  if (num_blocks > INT32_MAX) throw Error(fmt::format("block pool: {} blocks do not fit int32 block ids", num_blocks));
  free_.reserve(static_cast<std::size_t>(num_blocks - 1));
  for (int64_t b = 1; b < num_blocks; ++b) free_.push_back(static_cast<int32_t>(b));
  std::shuffle(free_.begin(), free_.end(), rng_);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) throw Error("block pool: no free block");
  const int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void BlockPool::release(int32_t block) {
  if (block <= 0 || block >= num_blocks_)
    throw Error(fmt::format("block pool: released block {} outside [1, {})", block, num_blocks_));
  free_.push_back(block);
  // Keep reuse order random: a freed page goes to a random place in the free list.
  std::uniform_int_distribution<std::size_t> pick(0, free_.size() - 1);
  std::swap(free_.back(), free_[pick(rng_)]);
}

// ---- Scheduler --------------------------------------------------------------------------------

Scheduler::Scheduler(const TraceConfig& config) : config_(config), pool_(config.pool_blocks(), config.seed ^ 0xb10c) {
  config_.validate();
  std::mt19937_64 rng(config.seed);
  requests_.resize(static_cast<std::size_t>(config.num_requests));
  for (int64_t i = 0; i < config.num_requests; ++i) {
    Request& r = requests_[static_cast<std::size_t>(i)];
    r.id = i;
    r.arrival_step = i * config.arrival_span / config.num_requests;
    r.prompt_len = std::uniform_int_distribution<int64_t>(config.min_prompt, config.max_prompt)(rng);
    r.output_len = std::uniform_int_distribution<int64_t>(
        config.min_output, std::min(config.max_output, config.max_context - r.prompt_len))(rng);
  }
}

bool Scheduler::ensure_blocks(Request& r, int64_t tokens) {
  const int64_t need = (tokens + config_.page_size - 1) / config_.page_size;
  const int64_t missing = need - static_cast<int64_t>(r.blocks.size());
  if (missing <= 0) return true;
  if (missing > pool_.num_free()) return false;
  for (int64_t i = 0; i < missing; ++i) r.blocks.push_back(pool_.allocate());
  return true;
}

StepBatch Scheduler::schedule() {
  StepBatch batch;
  if (done()) return batch;
  // Idle trace time (nothing running, next request not arrived yet) is skipped.
  if (running_.empty() && next_arrival_ < static_cast<int64_t>(requests_.size()))
    clock_ = std::max(clock_, requests_[static_cast<std::size_t>(next_arrival_)].arrival_step);
  batch.step = step_;
  batch.clock = clock_;

  int64_t budget = config_.token_budget;
  std::vector<ScheduledRequest> order;  // scheduling order (running first, then admissions)
  auto take = [&](int64_t idx, int64_t wanted) {
    Request& r = requests_[static_cast<std::size_t>(idx)];
    int64_t n = std::min(wanted, budget);
    // Shrink to what the pool can back; a request that gets nothing waits for the next step.
    while (n > 0 && !ensure_blocks(r, r.num_computed + n)) --n;
    if (n <= 0) return false;
    const TokenKind kind = !r.in_prompt()         ? TokenKind::decode
                           : r.num_computed > 0 ? TokenKind::context_prefill
                                                : TokenKind::fresh_prefill;
    order.push_back({idx, r.num_computed, n, kind});
    budget -= n;
    return true;
  };
  for (int64_t idx : running_) {
    if (budget == 0) break;
    const Request& r = requests_[static_cast<std::size_t>(idx)];
    take(idx, r.in_prompt() ? r.prompt_len - r.num_computed : 1);
  }
  while (budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs &&
         next_arrival_ < static_cast<int64_t>(requests_.size())) {
    Request& r = requests_[static_cast<std::size_t>(next_arrival_)];
    if (r.arrival_step > clock_) break;
    if (!take(next_arrival_, r.prompt_len)) break;
    r.admitted = true;
    running_.push_back(next_arrival_);
    ++next_arrival_;
  }
  if (order.empty()) throw Error(fmt::format("trace: step {} scheduled no token (block pool exhausted?)", step_));

  // Decodes first, the way the model runner hands the batch to the layer.
  std::vector<int64_t> computed, scheduled;
  for (const auto& s : order) {
    computed.push_back(s.num_computed);
    scheduled.push_back(s.num_new);
  }
  const ReorderResult reorder = reorder_decodes_first(computed, scheduled, config_.decode_threshold);
  if (reorder.order.size() != order.size())
    throw Error(fmt::format("trace: reorder_decodes_first returned {} indices for {} requests", reorder.order.size(),
                            order.size()));
  int prev_region = 0;
  for (int32_t i : reorder.order) {
    const ScheduledRequest& s = order.at(static_cast<std::size_t>(i));
    const int region = static_cast<int>(classify_request(s.num_computed, s.num_new, config_.decode_threshold));
    if (region < prev_region)
      throw Error(fmt::format("trace: reorder_decodes_first left request {} (region {}) after region {}", s.request,
                              region, prev_region));
    prev_region = region;
    batch.reqs.push_back(s);
  }

  // Layer metadata.
  const int64_t R = batch.num_reqs();
  for (const auto& s : batch.reqs)
    batch.max_blocks =
        std::max<int64_t>(batch.max_blocks, static_cast<int64_t>(requests_[static_cast<std::size_t>(s.request)].blocks.size()));
  batch.block_table.assign(static_cast<std::size_t>(R * batch.max_blocks), 0);
  batch.query_start_loc.push_back(0);
  for (int64_t b = 0; b < R; ++b) {
    const ScheduledRequest& s = batch.reqs[static_cast<std::size_t>(b)];
    const Request& r = requests_[static_cast<std::size_t>(s.request)];
    std::copy(r.blocks.begin(), r.blocks.end(), batch.block_table.begin() + b * batch.max_blocks);
    for (int64_t p = s.num_computed; p < s.num_computed + s.num_new; ++p) {
      const int64_t page = r.blocks[static_cast<std::size_t>(p / config_.page_size)];
      batch.slot_mapping.push_back(page * config_.page_size + p % config_.page_size);
      batch.token_req.push_back(static_cast<int32_t>(b));
      batch.token_pos.push_back(static_cast<int32_t>(p));
    }
    batch.query_start_loc.push_back(static_cast<int32_t>(batch.slot_mapping.size()));
    batch.seq_lens.push_back(static_cast<int32_t>(s.num_computed + s.num_new));
    batch.tokens_of_kind[static_cast<int>(s.kind)] += s.num_new;
  }
  return batch;
}

std::vector<int32_t> Scheduler::commit(const StepBatch& batch) {
  std::vector<int32_t> released;
  for (const auto& s : batch.reqs) {
    Request& r = requests_[static_cast<std::size_t>(s.request)];
    if (r.num_computed != s.num_computed)
      throw Error(fmt::format("trace: request {} committed twice (computed {} vs batch {})", r.id, r.num_computed,
                              s.num_computed));
    r.num_computed += s.num_new;
    if (r.num_computed >= r.total_len()) {
      r.finished = true;
      ++num_finished_;
      for (int32_t b : r.blocks) {
        pool_.release(b);
        released.push_back(b);
      }
      r.blocks.clear();
      running_.erase(std::find(running_.begin(), running_.end(), s.request));
    }
  }
  ++step_;
  ++clock_;
  return released;
}

}  // namespace mla::app
