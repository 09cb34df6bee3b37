// `mla run`: a synthetic continuous-batching trace through MlaAttention on the best backend present,
// timed per step and checked against the float64 oracle (check.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "check.h"
#include "commands.h"
#include "core/numeric.h"
#include "mla/error.h"
#include "mla/layer.h"
#include "mla/plan.h"
#include "progress.h"
#include "run_report.h"
#include "synth.h"
#include "trace.h"
#if MLA_WITH_CUDA
#include "cuda/runtime/device_api.h"
#endif

namespace mla::app {

namespace {

// Backend-dependent defaults. The CPU ones keep `mla run` and `mla run --sparse` well under two
// minutes on two cores while the trace still has decodes, chunked prompts (prompts up to 3/4 of
// the context, a budget below the longest prompt) and fresh prefills in one batch.
struct Defaults {
  int64_t steps, requests, max_context, token_budget, max_seqs, topk, check_samples;
};
constexpr Defaults kCpuDefaults{64, 24, 1024, 256, 8, 256, 12};
constexpr Defaults kCudaDefaults{512, 512, 8192, 8192, 256, 2048, 48};

// fp8 per-tensor scale: vLLM's calculate_kv_scales rule, amax(kv_c) / 200, for inputs in [-1, 1).
constexpr float kFp8Scale = 1.0f / 200.0f;
// Activation range of the synthetic inputs; kv_b_proj entries are uniform in +-1/sqrt(L) (the usual
// fan-in initialisation), so that K and V have magnitudes like the activations'.
constexpr double kInputRange = 1.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RunConfig resolve(const RunOptions& o) {
  RunConfig c;
  const int devices = cuda_device_count();
  if (o.backend == "auto") {
    c.cuda = devices > 0;
  } else if (o.backend == "cuda") {
    if (!built_with_cuda())
      throw Error("--backend cuda: this build of mla has no CUDA backend (configure with nvcc available)");
    if (devices == 0) throw Error("--backend cuda: no CUDA device found (see `mla info`)");
    c.cuda = true;
  } else if (o.backend == "cpu") {
    c.cuda = false;
  } else {
    throw Error(fmt::format("--backend: expected auto, cpu or cuda, got '{}'", o.backend));
  }
  if (c.cuda) {
    if (o.device < 0 || o.device >= devices)
      throw Error(fmt::format("--device {}: {} CUDA device(s) present", o.device, devices));
    c.device = Device::cuda(o.device);
#if MLA_WITH_CUDA
    const cuda_rt::DeviceInfo info = cuda_rt::device_info(o.device);
    c.device_name = fmt::format("cuda:{} {} ({} SMs, {:.0f} GiB)", o.device, info.name, info.sm_count,
                                static_cast<double>(info.total_mem) / (1ull << 30));
#endif
  } else {
    c.device = Device::cpu();
    c.device_name = fmt::format("{} ({} OpenMP threads)", cpu_name(), openmp_threads());
  }
  const Defaults& def = c.cuda ? kCudaDefaults : kCpuDefaults;
  auto pick = [](int64_t v, int64_t d) { return v >= 0 ? v : d; };

  c.sparse = o.sparse;
  c.model = o.model.empty() ? (o.sparse ? "v3.2" : "v3") : o.model;
  c.tp = o.tp;
  c.dims = ModelDims::preset(c.model, o.tp);
  if (c.sparse && c.dims.index_topk <= 0)
    throw Error(fmt::format("--sparse needs a model with a top-k indexer (v3.2), got --model {}", c.model));

  const std::string cache = o.cache.empty() ? (o.sparse ? "fp8_ds_mla" : "bf16") : o.cache;
  c.format = cache_format_from_string(cache);
  if (c.sparse && c.format == CacheFormat::fp8) {
    // vLLM canonicalises "fp8" to fp8_ds_mla for the FlashMLA-sparse backend.
    c.format = CacheFormat::fp8_ds_mla;
    c.notes.push_back("--cache fp8 with --sparse means fp8_ds_mla (as in vLLM's sparse backend)");
  }
  c.fp8_scale = c.format == CacheFormat::fp8 ? kFp8Scale : 1.0f;

  c.steps = pick(o.steps, def.steps);
  c.check_samples = pick(o.check_samples, def.check_samples);
  c.seed = o.seed;
  if (c.steps < 1) throw Error(fmt::format("--steps must be >= 1, got {}", c.steps));

  TraceConfig& t = c.trace;
  t.num_requests = pick(o.requests, def.requests);
  t.max_context = pick(o.max_context, def.max_context);
  t.token_budget = pick(o.token_budget, def.token_budget);
  t.max_num_seqs = pick(o.max_seqs, def.max_seqs);
  t.page_size = o.page_size;
  if (t.max_context < 8) throw Error(fmt::format("--max-context must be >= 8, got {}", t.max_context));
  t.max_prompt = t.max_context * 3 / 4;
  t.min_prompt = std::min<int64_t>(16, t.max_prompt);
  t.min_output = std::min<int64_t>(4, t.max_context - t.max_prompt);
  // Outputs short enough that requests finish within the run: their pages return to the pool
  // (re-poisoned) and later requests reuse them.
  t.max_output = std::max(t.min_output, c.steps / 2);
  t.arrival_span = std::max<int64_t>(1, c.steps * 2 / 3);
  t.seed = o.seed;
  t.decode_threshold = c.sparse ? sparse_decode_threshold(c.dims.num_heads, /*sm100=*/false, 0, false, 1, true)
                                : dense_decode_threshold(QueryLenSupport::varlen, 0, false, 1, true);
  t.validate();

  if (c.sparse) {
    c.topk = pick(o.topk, c.cuda ? c.dims.index_topk : def.topk);
    if (c.topk < 1 || c.topk > c.dims.index_topk)
      throw Error(fmt::format("--topk must be in [1, {}] (the model's index_topk, the width of the top-k rows), got {}",
                              c.dims.index_topk, c.topk));
  }
  return c;
}

// Every byte 0xff: NaN in bf16 (0xffff), e4m3 (0xff) and fp32, so a read of an unwritten cache row
// or an output row the layer did not write shows as a NaN.
void poison(void* p, Device dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(p, 0xff, bytes);
    return;
  }
#if MLA_WITH_CUDA
  cuda_rt::memset(p, dev.index, 0xff, bytes);
#endif
}

void synchronize(Device dev) {
#if MLA_WITH_CUDA
  if (dev.is_cuda()) cuda_rt::synchronize(dev.index);
#else
  (void)dev;
#endif
}

// A host tensor and, on CUDA, its device twin; views of the first rows serve one step.
struct Staged {
  Tensor host, dev;
  Staged(std::initializer_list<int64_t> shape, DType t, Device device) {
    host = Tensor::empty(shape, t, Device::cpu());
    dev = device.is_cpu() ? host : Tensor::empty(shape, t, device);
  }
  // Contiguous [rows, inner...] view of the first rows, on the host or the device.
  static TensorView rows(const Tensor& buf, std::initializer_list<int64_t> shape) {
    return TensorView(buf.data(), buf.dtype(), shape, buf.device());
  }
  TensorView host_view(std::initializer_list<int64_t> shape) const { return rows(host, shape); }
  TensorView dev_view(std::initializer_list<int64_t> shape) const { return rows(dev, shape); }
  void upload(std::initializer_list<int64_t> shape) const {
    if (dev.data() != host.data()) copy(dev_view(shape), host_view(shape));
  }
  void download(std::initializer_list<int64_t> shape) const {
    if (dev.data() != host.data()) copy(host_view(shape), dev_view(shape));
  }
};

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run a synthetic continuous-batching trace (decodes, chunked prefills with context, fresh prefills) through "
      "one MLA attention layer on the best backend present, print tokens/s per phase, and check a sample of "
      "outputs against a float64 oracle (exit status 1 when the check fails)");
  auto def = [](int64_t Defaults::*f) {
    return fmt::format(" (default {} on the CPU, {} on CUDA)", kCpuDefaults.*f, kCudaDefaults.*f);
  };
  cmd->add_option("--backend", o.backend, "auto (CUDA when a device is present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--device", o.device, "CUDA device index")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--model", o.model, "Model dimensions: v3 (= r1), v2-lite or v3.2 (default v3; v3.2 with --sparse)")
      ->check(CLI::IsMember({"v3", "r1", "v2-lite", "v3.2"}));
  cmd->add_option("--tp", o.tp, "Tensor-parallel size: the layer holds heads/tp query heads (default 8: DeepSeek-V3 "
                                "shapes per rank, 16 heads)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--sparse", o.sparse, "DeepSeek-V3.2 sparse attention: every token attends to its top-k set");
  cmd->add_option("--cache", o.cache, "KV-cache format: bf16, fp8 (one per-tensor scale) or fp8_ds_mla (656-byte "
                                      "records) (default bf16; fp8_ds_mla with --sparse)")
      ->check(CLI::IsMember({"bf16", "auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}));
  cmd->add_option("--page-size", o.page_size, "Tokens per cache page")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--steps", o.steps, "Forward steps to run; fewer when every request finished" +
                                          def(&Defaults::steps));
  cmd->add_option("--requests", o.requests, "Requests in the trace; they arrive over the first two thirds of the steps" +
                                                def(&Defaults::requests));
  cmd->add_option("--max-context", o.max_context, "Longest request (prompt + generated tokens); prompts are up to 3/4 "
                                                  "of it" + def(&Defaults::max_context));
  cmd->add_option("--token-budget", o.token_budget, "Tokens per step; longer prompts are split over steps (chunked "
                                                    "prefill)" + def(&Defaults::token_budget));
  cmd->add_option("--max-seqs", o.max_seqs, "Requests running at once" + def(&Defaults::max_seqs));
  cmd->add_option("--topk", o.topk, "Sparse: valid entries of each token's top-k row (the rows are index_topk = "
                                    "2048 wide, -1 padded), capped by the token's position + 1 (default 2048 on "
                                    "CUDA, 256 on the CPU)");
  cmd->add_option("--check-samples", o.check_samples, "Tokens checked against the float64 oracle, spread over the "
                                                      "steps and over decode, context-prefill and fresh-prefill "
                                                      "tokens; 0 skips the check" + def(&Defaults::check_samples));
  cmd->add_option("--seed", o.seed, "Seed of the trace, the inputs and the weights")->capture_default_str();
  cmd->add_option("--json", o.json_path, "Also write the configuration, timings and check results to this file");
  cmd->add_flag("--no-progress", o.no_progress, "Do not report progress on stderr");
  return cmd;
}

int run_command(const RunOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  const RunConfig cfg = resolve(options);
  print_header(cfg);

  const ModelDims& d = cfg.dims;
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, V = d.v_head_dim,
                L = d.kv_lora_rank;
  const TraceConfig& tc = cfg.trace;
  const int64_t max_t = tc.token_budget, max_r = tc.max_num_seqs, max_b = tc.max_blocks_per_request();

  // The layer, from a random kv_b_proj weight in bf16 (the oracle gets the same values in float64).
  // Data streams: 0 the weight, then four per step (q, kv_c, k_pe, top-k rows).
  auto stream = [&](int64_t step, int k) { return substream(cfg.seed, static_cast<uint64_t>(1 + 4 * step + k)); };
  Tensor weight = Tensor::empty({H * (P + V), L}, DType::bf16);
  fill_uniform_bf16(weight.view().data_as<uint16_t>(), weight.numel(), substream(cfg.seed, 0), -1.0 / std::sqrt(double(L)),
                    1.0 / std::sqrt(double(L)));
  OracleModel oracle_model{d, {}};
  oracle_model.kv_b_proj.resize(static_cast<std::size_t>(weight.numel()));
  for (int64_t i = 0; i < weight.numel(); ++i)
    oracle_model.kv_b_proj[static_cast<std::size_t>(i)] = num::bf16_to_float(weight.view().data_as<uint16_t>()[i]);
  LayerOptions lo;
  lo.dims = d;
  lo.cache_format = cfg.format;
  lo.sparse = cfg.sparse;
  lo.device = cfg.device;
  lo.dtype = DType::bf16;
  const MlaAttention layer(lo, weight.view());

  PlannerConfig pc;
  pc.dims = d;
  pc.cache_format = cfg.format;
  pc.page_size = tc.page_size;
  pc.max_model_len = tc.max_context;
  pc.max_num_seqs = tc.max_num_seqs;
  pc.sparse = cfg.sparse;
  pc.decode_threshold = tc.decode_threshold;
  pc.require_uniform = cfg.sparse;  // FlashMLA-sparse: uniform decodes; dense: varlen
  pc.validate();

  CacheBuffer cache = allocate_cache(cfg.format, tc.pool_blocks(), tc.page_size, cfg.device, cfg.fp8_scale);
  const int64_t page_bytes = tc.page_size * cache_entry_bytes(cfg.format);
  poison(cache.cache.data.data, cfg.device, static_cast<std::size_t>(tc.pool_blocks() * page_bytes));
  const std::size_t ws_bytes = layer.max_workspace_bytes(pc, max_t);
  Tensor workspace = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(ws_bytes, 1))}, DType::u8, cfg.device);

  Staged q({max_t, H, P + R}, DType::bf16, cfg.device), kv_c({max_t, L}, DType::bf16, cfg.device),
      k_pe({max_t, R}, DType::bf16, cfg.device), out({max_t, H * V}, DType::bf16, cfg.device),
      slots({max_t}, DType::i64, cfg.device), block_table({max_r * max_b}, DType::i32, cfg.device),
      seq_lens({max_r}, DType::i32, cfg.device), topk({cfg.sparse ? max_t * d.index_topk : 1}, DType::i32, cfg.device);

  Scheduler sched(tc);
  OracleCheck::Config cc;
  cc.samples = cfg.check_samples;
  cc.steps = cfg.steps;
  cc.sparse = cfg.sparse;
  cc.format = cfg.format;
  cc.fp8_scale = cfg.fp8_scale;
  cc.page_size = tc.page_size;
  cc.seed = cfg.seed;
  OracleCheck checker(oracle_model, cc);
  RunStats stats;
  stats.setup_seconds = seconds_since(t_start);
  Progress progress(cfg.steps, !options.no_progress);
  int64_t tokens_done = 0;
  double forward_total = 0;

  for (int64_t step = 0; step < cfg.steps && !sched.done(); ++step) {
    const StepBatch batch = sched.schedule();
    const int64_t T = batch.num_tokens(), Rq = batch.num_reqs(), W = batch.max_blocks;
    BatchDesc desc;
    desc.query_start_loc = batch.query_start_loc;
    desc.seq_lens = batch.seq_lens;
    const Plan plan = make_plan(desc, pc);
    const std::size_t need = layer.workspace_bytes(plan);
    if (need > ws_bytes)
      throw Error(fmt::format("step {}: the plan needs {} workspace bytes but max_workspace_bytes promised {} for "
                              "{} tokens (layer/planner inconsistency)",
                              step, need, ws_bytes, max_t));

    // Inputs: fresh random activations every step; metadata from the scheduler.
    fill_uniform_bf16(q.host.view().data_as<uint16_t>(), T * H * (P + R), stream(step, 0), -kInputRange, kInputRange);
    fill_uniform_bf16(kv_c.host.view().data_as<uint16_t>(), T * L, stream(step, 1), -kInputRange, kInputRange);
    fill_uniform_bf16(k_pe.host.view().data_as<uint16_t>(), T * R, stream(step, 2), -kInputRange, kInputRange);
    std::copy(batch.slot_mapping.begin(), batch.slot_mapping.end(), slots.host.view().data_as<int64_t>());
    std::copy(batch.block_table.begin(), batch.block_table.end(), block_table.host.view().data_as<int32_t>());
    std::copy(batch.seq_lens.begin(), batch.seq_lens.end(), seq_lens.host.view().data_as<int32_t>());
    if (cfg.sparse)
      fill_sparse_topk(topk.host.view().data_as<int32_t>(), T, batch.token_pos.data(), d.index_topk, cfg.topk,
                       stream(step, 3));
    q.upload({T, H, P + R});
    kv_c.upload({T, L});
    k_pe.upload({T, R});
    slots.upload({T});
    block_table.upload({Rq * W});
    seq_lens.upload({Rq});
    if (cfg.sparse) topk.upload({T, d.index_topk});

    ForwardArgs args;
    args.q = q.dev_view({T, H, P + R});
    args.kv_c = kv_c.dev_view({T, L});
    args.k_pe = k_pe.dev_view({T, R});
    args.slot_mapping = slots.dev_view({T});
    args.block_table = block_table.dev_view({Rq, W});
    args.seq_lens = seq_lens.dev_view({Rq});
    if (cfg.sparse) args.topk_indices = topk.dev_view({T, d.index_topk});
    args.out = out.dev_view({T, H * V});
    const TensorView ws = workspace.view();
    if (step == 0 && cfg.cuda) {
      // Untimed warm-up (library handles, first launches). Rewriting the same rows is idempotent.
      layer.forward(plan, args, cache.cache, ws);
      synchronize(cfg.device);
    }
    poison(args.out.data, cfg.device, static_cast<std::size_t>(T * H * V * 2));
    synchronize(cfg.device);

    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(plan, args, cache.cache, ws);
    synchronize(cfg.device);
    const double secs = seconds_since(t0);

    StepRecord rec;
    rec.decode_tokens = plan.split.num_decode_tokens;
    rec.prefill_tokens = plan.split.num_prefill_tokens;
    for (int k = 0; k < kNumTokenKinds; ++k) rec.kind_tokens[static_cast<std::size_t>(k)] = batch.tokens_of_kind[k];
    for (const auto& ch : plan.context.chunks) rec.context_rows += ch.total;
    rec.num_reqs = Rq;
    rec.seconds = secs;
    stats.steps.push_back(rec);
    tokens_done += T;
    forward_total += secs;

    const std::vector<int64_t> picked = checker.enabled() ? checker.pick(batch) : std::vector<int64_t>{};
    if (!picked.empty()) {
      out.download({T, H * V});
      std::map<int64_t, std::vector<uint8_t>> pages;  // device pages copied down for this check
      StepData sd;
      sd.batch = &batch;
      sd.plan = &plan;
      sd.q = q.host.view().data_as<uint16_t>();
      sd.kv_c = kv_c.host.view().data_as<uint16_t>();
      sd.k_pe = k_pe.host.view().data_as<uint16_t>();
      sd.topk = cfg.sparse ? topk.host.view().data_as<int32_t>() : nullptr;
      sd.topk_width = cfg.sparse ? d.index_topk : 0;
      sd.out = out.host.view().data_as<uint16_t>();
      sd.page = [&](int64_t block) -> const uint8_t* {
        const TensorView blk = cache.cache.data.select(0, block);
        if (!cfg.cuda) return static_cast<const uint8_t*>(blk.data);
        auto& bytes = pages[block];
        if (bytes.empty()) {
          bytes.resize(static_cast<std::size_t>(page_bytes));
          const int64_t elems = page_bytes / static_cast<int64_t>(blk.element_size());
          copy(TensorView(bytes.data(), blk.dtype, {elems}, Device::cpu()), blk.reshape({elems}));
        }
        return bytes.data();
      };
      checker.check(sd, picked);
    }

    for (int32_t b : sched.commit(batch))
      poison(cache.cache.data.select(0, b).data, cfg.device, static_cast<std::size_t>(page_bytes));
    progress.update(step + 1, tokens_done, forward_total,
                    checker.num_failures() == 0 ? "" : fmt::format("{} check failure(s)", checker.num_failures()));
  }
  progress.finish();
  stats.requests_finished = sched.num_finished();
  stats.wall_seconds = seconds_since(t_start);

  print_summary(cfg, stats, checker);
  if (!options.json_path.empty()) write_json(options.json_path, cfg, stats, checker);
  if (!checker.enabled()) return kExitOk;
  return checker.passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace mla::app
