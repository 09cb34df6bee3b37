// SPDX-License-Identifier: Apache-2.0
// `mla run --checkpoint DIR [--layer N]` and `mla run --block`: the same continuous-batching trace
// (trace.h) through the whole DeepSeek attention block (mla/deepseek.h) instead of the bare layer:
// random bf16 hidden states in, the o_proj output out. With --check-samples > 0 a float64 twin of the
// block (Precision::reference, its own cache of the run's format) serves every step too, and each
// step's output is compared with it (rel-L2 <= 1e-2, the bf16 rule of docs/BLOCK.md; with an fp8 /
// fp8_ds_mla cache plus twice that cache's own error — and with --fp8-prefill the fp8 prefill's too —, measured
// by a third lane: the float64 block with the exact f64 cache and no fp8 prefill, step_bound below). Without a
// checkpoint the block gets random weights of the chosen model's shapes (fp8 e4m3 with 128 x 128 block scales for v3 /
// r1 / v3.2, as published; bf16 for v2-lite). The block runs on the backend of --backend (CUDA when a
// device is present, or the CPU); its float64 twin always runs on the CPU.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "commands.h"
#include "core/numeric.h"
#include "mla/deepseek.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "mla/step.h"
#include "progress.h"
#include "run_block_util.h"
#include "run_internal.h"
#include "synth.h"

namespace mla::app {

namespace {

// Random published-form weights of `c` (all heads): fp8 codes of uniform(-448, 448) with scale
// sqrt(3 / in) / 448 per block (uniform(+-sqrt(3 / in)): unit-variance outputs), or bf16 of the same
// distribution; norm weights uniform(0.9, 1.1).
struct RandomWeights {
  std::vector<Tensor> keep;
  DeepseekWeights w;

  RandomWeights(const DeepseekConfig& c, uint64_t seed) {
    uint64_t stream = 0;
    auto linear = [&](int64_t out, int64_t in) {
      const uint64_t s = c.fp8_weights ? substream(seed, 1000 + stream++) : substream(seed, 2000 + stream);
      return random_linear(out, in, c.fp8_weights, c.weight_block_rows, c.weight_block_cols, s, keep);
    };
    auto norm = [&](int64_t n) { return random_bf16_vector(n, substream(seed, 3000 + stream++), 0.9, 1.1, keep); };
    const int64_t H = c.hidden_size, h = c.num_attention_heads, L = c.kv_lora_rank, P = c.qk_nope_head_dim,
                  R = c.qk_rope_head_dim, V = c.v_head_dim;
    if (c.q_lora_rank > 0) {
      w.q_a_proj = linear(c.q_lora_rank, H);
      w.q_a_layernorm = norm(c.q_lora_rank);
      w.q_b_proj = linear(h * (P + R), c.q_lora_rank);
    } else {
      w.q_proj = linear(h * (P + R), H);
    }
    w.kv_a_proj_with_mqa = linear(L + R, H);
    w.kv_a_layernorm = norm(L);
    w.kv_b_proj = linear(h * (P + V), L);
    w.o_proj = linear(H, h * V);
  }
};

// fp8_prefill: the run's --fp8-prefill on the lanes of its cache format (the fast block and its twin); the exact
// lane's f64 cache takes none, so its distance to the twin is the cache's and the fp8 prefill's error together.
DeepseekAttention make_block(const RunConfig& cfg, const BlockRunConfig& b, DType dtype, Device device,
                             CacheFormat format, const std::optional<RandomWeights>& random, bool fp8_prefill) {
  DeepseekOptions o;
  o.tp = cfg.tp;
  o.rank = b.rank;
  o.cache_format = format;
  o.sparse = cfg.sparse;
  o.device = device;
  o.dtype = dtype;
  o.fp8_prefill = fp8_prefill;
  if (random) return DeepseekAttention(b.config, random->w, o);
  return DeepseekAttention::load(Checkpoint(b.checkpoint), b.config, b.layer, o);
}

// One block, its cache and workspace on the block's device, fed the trace's steps. On CUDA the step's
// inputs are uploaded into device buffers and the plan's metadata once per step (as an engine would).
struct BlockLane {
  DeepseekAttention block;
  Device dev;
  PlannerConfig pc;  // the run's, with this block's cache format
  int64_t page_bytes;
  CacheBuffer cache;
  Tensor workspace, out, out_host;
  Tensor hidden_dev, positions_dev, slots_dev, table_dev, seq_dev, topk_dev;
  PinnedBuffer meta_staging;
  Tensor meta;
  Context ctx;

  BlockLane(DeepseekAttention blk, const RunConfig& cfg, PlannerConfig planner, Precision precision)
      : block(std::move(blk)),
        dev(block.options().device),
        pc((planner.cache_format = block.options().cache_format, planner.num_sms = dev.is_cpu() ? 0 : planner.num_sms,
            planner.compute_capability = dev.is_cpu() ? 0 : planner.compute_capability, planner)),
        page_bytes(cfg.trace.page_size * cache_entry_bytes(pc.cache_format)),
        cache(allocate_cache(pc.cache_format, cfg.trace.pool_blocks(), cfg.trace.page_size, dev, cfg.fp8_scale)),
        workspace(Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(
                                    block.max_workspace_bytes(pc, cfg.trace.token_budget), 16))},
                                DType::u8, dev)),
        out(Tensor::empty({cfg.trace.token_budget, block.config().hidden_size}, block.options().dtype, dev)),
        ctx{nullptr, precision} {
    poison(cache.storage.data(), dev, cache.storage.nbytes());  // NaN: unwritten rows show
    if (dev.is_cuda()) {
      const int64_t budget = cfg.trace.token_budget, H = block.config().hidden_size;
      out_host = Tensor::empty({budget, H}, block.options().dtype);
      hidden_dev = Tensor::empty({budget, H}, block.options().dtype, dev);
      positions_dev = Tensor::empty({budget}, DType::i64, dev);
      slots_dev = Tensor::empty({budget}, DType::i64, dev);
      table_dev = Tensor::empty({cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request()}, DType::i32, dev);
      seq_dev = Tensor::empty({cfg.trace.max_num_seqs}, DType::i32, dev);
      topk_dev = Tensor::empty({std::max<int64_t>(1, budget * (cfg.sparse ? cfg.dims.index_topk : 0))}, DType::i32, dev);
      meta_staging = PinnedBuffer(max_step_metadata_bytes(pc, budget));
      meta = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(meta_staging.size(), 16))}, DType::u8, dev);
    }
  }
  // One step of `batch` (host inputs in `a` and `hidden`, in the block's dtype), planned for this
  // lane's cache format; returns the output on the block's device after the device finished.
  TensorView step(const BatchDesc& batch, DeepseekForwardArgs a, const Tensor& hidden) {
    const Plan plan = make_plan(batch, pc);
    const int64_t T = plan.num_tokens;
    a.hidden = on_device(hidden.view().slice(0, 0, T), hidden_dev);
    a.positions = on_device(a.positions, positions_dev);
    a.slot_mapping = on_device(a.slot_mapping, slots_dev);
    a.block_table = on_device(a.block_table, table_dev);
    a.seq_lens = on_device(a.seq_lens, seq_dev);
    a.topk_indices = on_device(a.topk_indices, topk_dev);
    if (dev.is_cuda()) {
      upload_step_metadata(plan, meta_staging.view(), meta.view());
      a.metadata = meta.view();
    }
    a.out = out.view().slice(0, 0, T);
    poison(a.out.data, dev, static_cast<std::size_t>(T * a.out.shape[1]) * a.out.element_size());
    block.forward(plan, a, cache.cache, workspace.view(), ctx);
    synchronize(dev);
    return a.out;
  }
  // The output of the last step on the host.
  TensorView host(const TensorView& o) { return on_host(o, out_host); }
  void release(int32_t b) {
    poison(cache.cache.data.select(0, b).data, dev, static_cast<std::size_t>(page_bytes));
  }
};

}  // namespace

int run_block_trace(const RunConfig& cfg, const BlockRunConfig& b, bool show_progress, OutputFile& json) {
  const auto t_start = std::chrono::steady_clock::now();
  std::optional<RandomWeights> random;
  if (b.checkpoint.empty()) random.emplace(b.config, substream(cfg.seed, 0));
  const PlannerConfig pc = planner_config(cfg);
  BlockLane fast(make_block(cfg, b, DType::bf16, cfg.device, cfg.format, random, cfg.fp8_prefill), cfg, pc,
                 Precision::fast);
  std::optional<BlockLane> twin, exact;
  const bool quantised = cfg.format == CacheFormat::fp8 || cfg.format == CacheFormat::fp8_ds_mla;
  if (cfg.check_samples > 0) {
    twin.emplace(make_block(cfg, b, DType::f64, Device::cpu(), cfg.format, random, cfg.fp8_prefill), cfg, pc,
                 Precision::reference);
    if (quantised)
      exact.emplace(make_block(cfg, b, DType::f64, Device::cpu(), CacheFormat::f64, random, false), cfg, pc,
                    Precision::reference);
  }
  random.reset();  // the blocks hold their own rank slices
  const double setup = seconds_since(t_start);

  const int64_t H = b.config.hidden_size, budget = cfg.trace.token_budget;
  const int64_t topk_width = cfg.sparse ? cfg.dims.index_topk : 0;
  Tensor hidden = Tensor::empty({budget, H}, DType::bf16), positions = Tensor::empty({budget}, DType::i64),
         slots = Tensor::empty({budget}, DType::i64),
         table = Tensor::empty({cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request()}, DType::i32),
         seq = Tensor::empty({cfg.trace.max_num_seqs}, DType::i32),
         topk = Tensor::empty({std::max<int64_t>(1, budget * topk_width)}, DType::i32);
  Scheduler sched(cfg.trace);
  Progress progress(cfg.steps, show_progress);
  int64_t steps = 0, tokens = 0;
  double fwd_seconds = 0;
  BlockCheck check;
  check.exact = exact.has_value();
  for (int64_t i = 0; i < cfg.steps && !sched.done(); ++i) {
    const StepBatch batch = sched.schedule();
    const int64_t T = batch.num_tokens(), R = batch.num_reqs();
    const BatchDesc desc{batch.query_start_loc, batch.seq_lens};
    fill_uniform_bf16(static_cast<uint16_t*>(hidden.data()), T * H, substream(cfg.seed, 1 + i), -1.0, 1.0);
    for (int64_t t = 0; t < T; ++t) static_cast<int64_t*>(positions.data())[t] = batch.token_pos[t];
    std::copy(batch.slot_mapping.begin(), batch.slot_mapping.end(), static_cast<int64_t*>(slots.data()));
    std::copy(batch.block_table.begin(), batch.block_table.end(), static_cast<int32_t*>(table.data()));
    std::copy(batch.seq_lens.begin(), batch.seq_lens.end(), static_cast<int32_t*>(seq.data()));
    DeepseekForwardArgs a;
    a.positions = positions.view().slice(0, 0, T);
    a.slot_mapping = slots.view().slice(0, 0, T);
    a.block_table = TensorView(table.data(), DType::i32, {R, batch.max_blocks});
    a.seq_lens = seq.view().slice(0, 0, R);
    if (cfg.sparse) {
      fill_sparse_topk(static_cast<int32_t*>(topk.data()), T, batch.token_pos.data(), topk_width, cfg.topk,
                       substream(cfg.seed, 1000000 + i));
      a.topk_indices = TensorView(topk.data(), DType::i32, {T, topk_width});
    }
    run_lanes(
        fast, twin, exact, hidden, [&](BlockLane& l, const Tensor& h) { return l.step(desc, a, h); },
        [&](const TensorView& o) { return fast.host(o); }, check, fwd_seconds);
    release_lanes(sched.commit(batch), fast, twin, exact);
    ++steps;
    tokens += T;
    progress.update(i + 1, tokens, fwd_seconds,
                    check.failures == 0 ? "" : fmt::format("{} check failure(s)", check.failures));
  }
  progress.finish();
  const double wall = seconds_since(t_start);

  fmt::print("\n== summary: DeepSeek attention block ({}), layer {}, {} cache, {} ==\n",
             b.checkpoint.empty() ? "random weights" : b.checkpoint, b.layer, to_string(cfg.format),
             cfg.cuda ? cfg.device_name : fmt::format("cpu ({})", cfg.device_name));
  fmt::print("block         hidden {}, {} heads per rank (tp {}, rank {}), q_lora_rank {}, {} weights\n", H,
             cfg.dims.num_heads, cfg.tp, b.rank, b.config.q_lora_rank, b.config.fp8_weights ? "fp8 block-scaled" : "bf16");
  fmt::print("steps         {}; {} tokens; {} of {} requests finished\n", steps, tokens, sched.num_finished(),
             sched.requests().size());
  fmt::print("forward       {:.3f} s in bf16 ({:.0f} tokens/s); setup {:.2f} s; wall {:.2f} s\n", fwd_seconds,
             fwd_seconds > 0 ? static_cast<double>(tokens) / fwd_seconds : 0.0, setup, wall);
  check.print(twin.has_value(), fmt::format("the {} cache's{}", to_string(cfg.format),
                                            cfg.fp8_prefill ? " and the fp8 prefill's" : ""));
  nlohmann::json j;
  j["mode"] = "block";
  j["checkpoint"] = b.checkpoint;
  j["layer"] = b.layer;
  j["tp"] = cfg.tp;
  j["rank"] = b.rank;
  j["hidden_size"] = H;
  j["heads_per_rank"] = cfg.dims.num_heads;
  j["fp8_weights"] = b.config.fp8_weights;
  j["cache"] = to_string(cfg.format);
  j["fp8_prefill"] = cfg.fp8_prefill;
  j["device"] = cfg.cuda ? "cuda" : "cpu";
  j["device_name"] = cfg.device_name;
  return check.finish(twin.has_value(), j, steps, tokens, fwd_seconds, wall, json);
}

}  // namespace mla::app
