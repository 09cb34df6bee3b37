// SPDX-License-Identifier: Apache-2.0
// `mla run --model v4-flash | v4-pro | v41-flash`: the continuous-batching trace (trace.h) through the
// DeepSeek-V4 attention block (mla/deepseek_v4.h) on the run's backend (CPU or CUDA), with random weights of the model's shapes
// (fp8 e4m3 with 128 x 128 block scales, as published) for one layer of the preset schedule (default
// layer 1: ratio 4, the indexer's top-k over the compressed cache). Each step: random bf16 hidden rows;
// the compressors' outputs are random rows (one per `ratio` tokens of a request, emitted at the
// window's last token) written into the extra cache, which shares the main cache's pages (entry e of a
// request at its logical block e / page); each token attends its sliding window and, for ratio 4, up to
// index_topk distinct causal entries in random order (-1 padded), for ratio 128 every causal entry.
// A float64 twin (Precision::reference, caches of the same formats) serves every step too and each step's
// output is compared with it: rel-L2 <= 1e-2, plus twice the caches' own error where they are V4
// records (measured by a third lane with the exact f64 caches; run_block_util.h step_bound).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "core/numeric.h"
#include "mla/deepseek_v4.h"
#include "mla/error.h"
#include "progress.h"
#include "run_block_util.h"
#include "run_internal.h"
#include "synth.h"

namespace mla::app {

namespace {

struct V4RandomWeights {
  std::vector<Tensor> keep;
  DeepseekV4Weights w;

  V4RandomWeights(const DeepseekV4Config& c, uint64_t seed) {
    uint64_t stream = 0;
    auto linear = [&](int64_t out, int64_t in) {
      return random_linear(out, in, c.fp8_weights, c.weight_block_rows, c.weight_block_cols,
                           substream(seed, 1000 + stream++), keep);
    };
    const int64_t H = c.hidden_size, D = c.head_dim, h = c.num_attention_heads, G = c.o_groups;
    w.q_a_proj = linear(c.q_lora_rank, H);
    w.q_b_proj = linear(h * D, c.q_lora_rank);
    w.kv_proj = linear(D, H);
    w.o_a_proj = linear(G * c.o_lora_rank, h / G * D);
    w.o_b_proj = linear(H, G * c.o_lora_rank);
    w.q_a_norm = random_bf16_vector(c.q_lora_rank, substream(seed, 3000), 0.9, 1.1, keep);
    w.kv_norm = random_bf16_vector(D, substream(seed, 3001), 0.9, 1.1, keep);
    w.sinks = random_bf16_vector(h, substream(seed, 3002), -1.0, 1.0, keep);
  }
};

// One block with its two caches and workspace on the block's device, fed the trace's steps. On CUDA the step's
// inputs are uploaded into device buffers once per step (as an engine would) and the output copied back after the
// timing.
struct V4Lane {
  DeepseekV4Attention block;
  Device dev;
  int64_t page_bytes, epage_bytes;
  CacheBuffer cache, extra;
  Tensor workspace, out, out_host;
  Tensor hidden_dev, positions_dev, req_dev, table_dev, slots_dev, topk_dev, ekv_dev, eslots_dev;
  Context ctx;

  V4Lane(DeepseekV4Attention blk, const RunConfig& cfg, int64_t max_topk, Precision precision)
      : block(std::move(blk)),
        dev(block.options().device),
        page_bytes(cfg.trace.page_size * cache_entry_bytes(block.options().cache_format, 512, 64)),
        epage_bytes(cfg.trace.page_size * cache_entry_bytes(block.options().extra_cache_format, 512, 64)),
        cache(allocate_cache(block.options().cache_format, cfg.trace.pool_blocks(), cfg.trace.page_size, dev, 1.0f,
                             512, 64)),
        extra(allocate_cache(block.options().extra_cache_format, cfg.trace.pool_blocks(), cfg.trace.page_size, dev,
                             1.0f, 512, 64)),
        workspace(Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(
                                    block.workspace_bytes(cfg.trace.token_budget, max_topk), 16))},
                                DType::u8, dev)),
        out(Tensor::empty({cfg.trace.token_budget, block.config().hidden_size}, block.options().dtype, dev)),
        ctx{nullptr, precision} {
    poison(cache.storage.data(), dev, cache.storage.nbytes());
    poison(extra.storage.data(), dev, extra.storage.nbytes());
    if (dev.is_cuda()) {
      const int64_t budget = cfg.trace.token_budget, H = block.config().hidden_size, D = block.config().head_dim;
      out_host = Tensor::empty({budget, H}, block.options().dtype);
      hidden_dev = Tensor::empty({budget, H}, block.options().dtype, dev);
      positions_dev = Tensor::empty({budget}, DType::i64, dev);
      req_dev = Tensor::empty({budget}, DType::i32, dev);
      table_dev = Tensor::empty({cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request()}, DType::i32, dev);
      slots_dev = Tensor::empty({budget}, DType::i64, dev);
      topk_dev = Tensor::empty({std::max<int64_t>(1, budget * max_topk)}, DType::i32, dev);
      ekv_dev = Tensor::empty({std::max<int64_t>(1, budget), D}, DType::bf16, dev);
      eslots_dev = Tensor::empty({std::max<int64_t>(1, budget)}, DType::i64, dev);
    }
  }
  // One step (host inputs in `a` and `hidden`); returns the output on the block's device after the device finished.
  TensorView step(DeepseekV4ForwardArgs a, const Tensor& hidden, int64_t T) {
    a.hidden = on_device(hidden.view().slice(0, 0, T), hidden_dev);
    a.positions = on_device(a.positions, positions_dev);
    a.req_id = on_device(a.req_id, req_dev);
    a.slot_mapping = on_device(a.slot_mapping, slots_dev);
    const bool shared_table = a.extra_block_table.defined() && a.extra_block_table.data == a.block_table.data;
    a.block_table = on_device(a.block_table, table_dev);
    if (shared_table) a.extra_block_table = a.block_table;  // the extra cache shares the main cache's pages
    a.extra_topk = on_device(a.extra_topk, topk_dev);
    a.extra_kv = on_device(a.extra_kv, ekv_dev);
    a.extra_slot_mapping = on_device(a.extra_slot_mapping, eslots_dev);
    a.out = out.view().slice(0, 0, T);
    poison(a.out.data, dev, static_cast<std::size_t>(T * a.out.shape[1]) * a.out.element_size());
    block.forward(a, cache.cache, extra.cache, workspace.view(), ctx);
    synchronize(dev);
    return a.out;
  }
  // The output of the last step on the host.
  TensorView host(const TensorView& o) { return on_host(o, out_host); }
  void release(int32_t b) {
    poison(cache.cache.data.select(0, b).data, dev, static_cast<std::size_t>(page_bytes));
    poison(extra.cache.data.select(0, b).data, dev, static_cast<std::size_t>(epage_bytes));
  }
};

}  // namespace

int run_v4_block_trace(const RunConfig& cfg, const BlockRunConfig& b, bool show_progress, OutputFile& json) {
  const auto t_start = std::chrono::steady_clock::now();
  const DeepseekV4Config& c = b.v4_config;
  const int ratio = c.compress_ratio(b.layer);
  // Width of the top-k rows: the indexer's picks (ratio 4), every entry a request can have (else).
  const int64_t max_entries = ratio == 0 ? 0 : cfg.trace.max_context / ratio;
  const int64_t K = ratio == 0 ? 0 : ratio == 4 ? c.index_topk : std::max<int64_t>(1, max_entries);
  std::optional<V4RandomWeights> random;
  if (b.checkpoint.empty()) random.emplace(c, substream(cfg.seed, 0));
  std::optional<Checkpoint> ck;
  if (!b.checkpoint.empty()) ck.emplace(b.checkpoint);
  auto make = [&](DType dt, Device dev, CacheFormat main, CacheFormat extra, Precision p) {
    DeepseekV4Options o;
    o.tp = cfg.tp;
    o.rank = b.rank;
    o.cache_format = main;
    o.extra_cache_format = extra;
    o.dtype = dt;
    o.device = dev;
    return V4Lane(random ? DeepseekV4Attention(c, b.layer, random->w, o) : DeepseekV4Attention::load(*ck, c, b.layer, o),
                  cfg, K, p);
  };
  V4Lane fast = make(DType::bf16, cfg.device, cfg.format, b.extra_format, Precision::fast);
  std::optional<V4Lane> twin, exact;
  const bool quantised = cache_format_info(cfg.format).record || cache_format_info(b.extra_format).record;
  if (cfg.check_samples > 0) {
    twin.emplace(make(DType::f64, Device::cpu(), cfg.format, b.extra_format, Precision::reference));
    if (quantised)
      exact.emplace(make(DType::f64, Device::cpu(), CacheFormat::f64, CacheFormat::f64, Precision::reference));
  }
  random.reset();
  const double setup = seconds_since(t_start);

  const int64_t H = c.hidden_size, D = c.head_dim, budget = cfg.trace.token_budget;
  Tensor hidden = Tensor::empty({budget, H}, DType::bf16), positions = Tensor::empty({budget}, DType::i64),
         slots = Tensor::empty({budget}, DType::i64), req = Tensor::empty({budget}, DType::i32),
         table = Tensor::empty({cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request()}, DType::i32),
         topk = Tensor::empty({std::max<int64_t>(1, budget * K)}, DType::i32),
         ekv = Tensor::empty({std::max<int64_t>(1, budget), D}, DType::bf16),
         eslots = Tensor::empty({std::max<int64_t>(1, budget)}, DType::i64);
  Scheduler sched(cfg.trace);
  Progress progress(cfg.steps, show_progress);
  int64_t steps = 0, tokens = 0, entries_written = 0;
  double fwd_seconds = 0;
  BlockCheck check;
  check.exact = exact.has_value();
  for (int64_t i = 0; i < cfg.steps && !sched.done(); ++i) {
    const StepBatch batch = sched.schedule();
    const int64_t T = batch.num_tokens(), R = batch.num_reqs(), P = cfg.trace.page_size;
    fill_uniform_bf16(static_cast<uint16_t*>(hidden.data()), T * H, substream(cfg.seed, 1 + i), -1.0, 1.0);
    std::copy(batch.slot_mapping.begin(), batch.slot_mapping.end(), static_cast<int64_t*>(slots.data()));
    std::copy(batch.block_table.begin(), batch.block_table.end(), static_cast<int32_t*>(table.data()));
    int64_t n_e = 0;
    FastRng g(substream(cfg.seed, 2000000 + i));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = batch.token_pos[t];
      const int32_t r = batch.token_req[t];
      static_cast<int64_t*>(positions.data())[t] = p;
      static_cast<int32_t*>(req.data())[t] = r;
      if (ratio == 0) continue;
      // The compressor closes entry e = (p + 1) / ratio - 1 at position p: a random row of unit rms.
      if ((p + 1) % ratio == 0) {
        const int64_t e = (p + 1) / ratio - 1;
        fill_uniform_bf16(static_cast<uint16_t*>(ekv.data()) + n_e * D, D,
                          substream(cfg.seed, 3000000 + static_cast<uint64_t>(batch.reqs[r].request) * 65536 + e),
                          -1.7, 1.7);
        static_cast<int64_t*>(eslots.data())[n_e++] =
            int64_t{batch.block_table[static_cast<std::size_t>(r * batch.max_blocks + e / P)]} * P + e % P;
      }
      // The picks: the visible entries (e < (p + 1) / ratio), shuffled and cut to K for ratio 4.
      int32_t* row = static_cast<int32_t*>(topk.data()) + t * K;
      const int64_t visible = (p + 1) / ratio;
      std::vector<int32_t> ids(static_cast<std::size_t>(visible));
      for (int64_t e = 0; e < visible; ++e) ids[static_cast<std::size_t>(e)] = static_cast<int32_t>(e);
      if (ratio == 4)
        for (int64_t e = visible - 1; e > 0; --e)
          std::swap(ids[static_cast<std::size_t>(e)], ids[static_cast<std::size_t>(g.below(e + 1))]);
      for (int64_t j = 0; j < K; ++j) row[j] = j < visible ? ids[static_cast<std::size_t>(j)] : -1;
    }
    entries_written += n_e;
    DeepseekV4ForwardArgs a;
    a.positions = positions.view().slice(0, 0, T);
    a.req_id = req.view().slice(0, 0, T);
    a.block_table = TensorView(table.data(), DType::i32, {R, batch.max_blocks});
    a.slot_mapping = slots.view().slice(0, 0, T);
    if (ratio > 0) {
      a.extra_block_table = a.block_table;
      a.extra_topk = TensorView(topk.data(), DType::i32, {T, K});
      a.extra_kv = ekv.view().slice(0, 0, n_e);
      a.extra_slot_mapping = eslots.view().slice(0, 0, n_e);
    }
    run_lanes(
        fast, twin, exact, hidden, [&](V4Lane& l, const Tensor& h) { return l.step(a, h, T); },
        [&](const TensorView& o) { return fast.host(o); }, check, fwd_seconds);
    release_lanes(sched.commit(batch), fast, twin, exact);
    ++steps;
    tokens += T;
    progress.update(i + 1, tokens, fwd_seconds,
                    check.failures == 0 ? "" : fmt::format("{} check failure(s)", check.failures));
  }
  progress.finish();
  const double wall = seconds_since(t_start);

  fmt::print("\n== summary: DeepSeek-V4 attention block ({}, {}), layer {} (compress ratio {}), {} + {} "
             "caches, {} ({}) ==\n",
             cfg.model, b.checkpoint.empty() ? "random weights" : b.checkpoint, b.layer, ratio, to_string(cfg.format),
             to_string(b.extra_format), cfg.device.is_cuda() ? "cuda" : "cpu", cfg.device_name);
  fmt::print("block         hidden {}, {} heads per rank (tp {}, rank {}), head_dim {}, q_lora_rank {}, {} o "
             "group(s) of rank {} per rank, window {}, {}query head norm, {} weights\n",
             H, fast.block.heads(), cfg.tp, b.rank, D, c.q_lora_rank, c.o_groups / cfg.tp, c.o_lora_rank,
             c.sliding_window, c.q_head_norm ? "" : "no ", c.fp8_weights ? "fp8 block-scaled" : "bf16");
  fmt::print("steps         {}; {} tokens; {} compressed entries written; top-k rows {} wide; {} of {} requests "
             "finished\n",
             steps, tokens, entries_written, K, sched.num_finished(), sched.requests().size());
  fmt::print("forward       {:.3f} s in bf16 ({:.0f} tokens/s); setup {:.2f} s; wall {:.2f} s\n", fwd_seconds,
             fwd_seconds > 0 ? static_cast<double>(tokens) / fwd_seconds : 0.0, setup, wall);
  check.print(twin.has_value(), "the caches'");
  nlohmann::json j;
  j["mode"] = "block_v4";
  j["model"] = cfg.model;
  j["layer"] = b.layer;
  j["compress_ratio"] = ratio;
  j["tp"] = cfg.tp;
  j["rank"] = b.rank;
  j["hidden_size"] = H;
  j["heads_per_rank"] = fast.block.heads();
  j["cache"] = to_string(cfg.format);
  j["extra_cache"] = to_string(b.extra_format);
  j["device"] = cfg.device.is_cuda() ? "cuda" : "cpu";
  j["device_name"] = cfg.device_name;
  return check.finish(twin.has_value(), j, steps, tokens, fwd_seconds, wall, json);
}

}  // namespace mla::app
