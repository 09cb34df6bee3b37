// SPDX-License-Identifier: Apache-2.0
// `mla run`: options, backend-dependent defaults, and their resolution into a RunConfig. The trace
// itself runs in run_driver.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "cli_util.h"
#include "commands.h"
#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/error.h"
#include "mla/plan.h"
#include "run_internal.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla::app {

namespace {

// Backend-dependent defaults. The CPU ones keep `mla run` and `mla run --sparse` well under two
// minutes on two cores while the trace still has decodes, chunked prompts (prompts up to 3/4 of
// the context, a budget below the longest prompt) and fresh prefills in one batch.
struct Defaults {
  int64_t steps, requests, max_context, token_budget, max_seqs, topk, check_samples;
};
constexpr Defaults kCpuDefaults{64, 24, 1024, 256, 8, 256, 24};
constexpr Defaults kCudaDefaults{512, 512, 8192, 8192, 256, 2048, 48};
// The whole block (either backend) with its float64 CPU twin (projections of V3's hidden 7168 are most
// of its work): a short trace that still has decodes, chunked prompts and fresh prefills.
constexpr Defaults kBlockDefaults{24, 8, 512, 128, 4, 256, 1};

// fp8 per-tensor scale: vLLM's calculate_kv_scales rule, amax(kv_c) / 200, for inputs in [-1, 1).
constexpr float kFp8Scale = 1.0f / 200.0f;
// The block's kv_c is RMS-normalised (unit rms times the norm weight) and its rope key unnormalised:
// 1/200 (amax 2.24) saturates them (the fp8 cache's own error 0.25 / 0.34 rel-L2 on the V3 / V2-Lite
// fixtures); 1/50 .. 1/5 all give the e4m3 floor (5.1e-2 / 3.2e-2). 1/16: amax 28, exact.
constexpr float kBlockFp8Scale = 1.0f / 16.0f;
// --out-quant fp8's static scale and nvfp4's global scale for the trace's outputs (weighted averages of
// up-projected values of magnitude below ~2): fp8 represents |x| <= 448 / 64 = 7 unsaturated; nvfp4's
// global scale is vLLM's 448 * 6 / amax for an amax of 4.
constexpr float kOutFp8Scale = 1.0f / 64.0f;
constexpr float kOutNvfp4GlobalScale = 448.0f * 6.0f / 4.0f;
bool is_v4_model(const std::string& m) { return m == "v4-flash" || m == "v4-pro" || m == "v41-flash"; }

// Options that only matter with another one are refused when given without it (whatever their value),
// so that a command line never means less than it says.
void check_relevance(const RunOptions& o) {
  auto given = [&](const char* name) { return o.given.count(name) > 0; };
  const bool v4 = is_v4_model(o.model);
  const bool block = o.block || !o.checkpoint.empty() || v4;
  if (given("--extra-cache") && !v4 && o.checkpoint.empty())
    throw Error("--extra-cache is the format of DeepSeek-V4's compressed cache: use it with --model v4-flash, v4-pro "
                "or v41-flash");
  if (v4 && (o.sparse || o.dcp > 1 || o.batch_invariant || given("--topk") || given("--topk-source")))
    throw Error(fmt::format("--model {} runs the DeepSeek-V4 block (its window and compressed caches, the top-k picks "
                            "built in); --sparse, --topk, --topk-source, --dcp and --batch-invariant apply to the V3 "
                            "layer only",
                            o.model));
  if (given("--device") && o.backend == "cpu")
    throw Error(fmt::format("--device {} selects a CUDA device, and --backend cpu runs on the CPU", o.device));
  if ((given("--layer") || given("--rank")) && !block)
    throw Error("--layer and --rank select the block of a checkpoint: use them with --checkpoint or --block");
  if (given("--layer") && o.checkpoint.empty() && !v4)
    throw Error("--layer selects a layer of --checkpoint's weights (or of a DeepSeek-V4 model's schedule); --block "
                "makes one layer of random weights");
  if (given("--topk") && !o.sparse)
    throw Error(fmt::format("--topk {} applies to --sparse runs only (a dense run attends to every cached token)",
                            o.topk));
  if (given("--topk-source") && !o.sparse) throw Error("--topk-source applies to --sparse runs only");
  if (given("--topk-source") && block)
    throw Error("--topk-source applies to the bare layer: the block (--checkpoint / --block) draws random top-k rows");
  if (given("--sparse-prefill") && block)
    throw Error("--sparse-prefill applies to the bare layer, not to --checkpoint / --block");
  if (given("--dcp-interleave") && o.dcp < 2)
    throw Error(fmt::format("--dcp-interleave {} applies to a DCP group: give --dcp N with N >= 2 too",
                            o.dcp_interleave));
  if (o.dcp_procs && o.dcp < 2) throw Error("--dcp-procs needs --dcp N with N >= 2");
  if ((given("--out-quant") || given("--kv-scales")) && (block || o.dcp > 1))
    throw Error("--out-quant and --kv-scales apply to the bare layer on one rank, not to --checkpoint / --block "
                "(the block quantises o_proj's input itself when its weights are fp8) or --dcp");
  if (o.batch_invariant && o.dcp > 1)
    throw Error(fmt::format("--batch-invariant cannot be combined with --dcp {}: the batch-invariant decode "
                            "schedule is planned for one GPU (PlannerConfig::batch_invariant)",
                            o.dcp));
}

RunConfig resolve(const RunOptions& o, BlockRunConfig& block) {
  check_relevance(o);
  RunConfig c;
  const int devices = cuda_device_count();
  block.enabled = o.block || !o.checkpoint.empty() || is_v4_model(o.model);
  // A DeepSeek-V4 checkpoint (config.json's model_type deepseek_v4*) runs the V4 block too.
  block.v4 = is_v4_model(o.model) ||
             (!o.checkpoint.empty() && DeepseekV4Config::is_v4_file(o.checkpoint + "/config.json"));
  if (block.enabled) {
    if (!o.checkpoint.empty() && o.block) throw Error("--block builds random weights; it cannot be combined with --checkpoint");
    if (!o.checkpoint.empty() && !o.model.empty())
      throw Error("--model sets random-weight shapes; with --checkpoint the dimensions come from its config.json");
    block.checkpoint = o.checkpoint;
    block.layer = o.layer;
    block.rank = o.rank;
  } else if (o.layer != 0 || o.rank != 0) {
    throw Error("--layer and --rank select the block of a checkpoint: use them with --checkpoint or --block");
  }
  // The block runs on the backend chosen here like the bare layer (its float64 twin on the CPU).
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
  const Defaults& def = block.enabled ? kBlockDefaults : c.cuda ? kCudaDefaults : kCpuDefaults;
  auto pick = [](int64_t v, int64_t d) { return v >= 0 ? v : d; };

  c.sparse = o.sparse;
  c.model = o.model.empty() ? (o.sparse ? "v3.2" : "v3") : o.model;
  c.tp = o.tp > 0 ? o.tp : (o.checkpoint.empty() ? 8 : 1);
  c.v4 = block.v4;
  if (!block.v4 && !o.extra_cache.empty())
    throw Error("--extra-cache is the format of DeepSeek-V4's compressed cache: this checkpoint is not a DeepSeek-V4 "
                "model");
  if (block.v4) {
    if (o.checkpoint.empty()) {
      block.v4_config = DeepseekV4Config::preset(c.model);
      block.layer = o.given.count("--layer") ? o.layer : 1;
    } else {
      block.v4_config = DeepseekV4Config::from_file(o.checkpoint + "/config.json");
      c.model = block.v4_config.model_type;
      if (o.sparse || o.dcp > 1 || o.batch_invariant)
        throw Error("--checkpoint holds a DeepSeek-V4 model: --sparse, --dcp and --batch-invariant apply to the V3 "
                    "layer only");
    }
    const DeepseekV4Config& v = block.v4_config;
    (void)v.compress_ratio(block.layer);  // a layer of the preset's schedule
    if (v.num_attention_heads % c.tp != 0 || v.o_groups % c.tp != 0)
      throw Error(fmt::format("--tp {} must divide the {} heads and the {} o_proj groups of {}", c.tp,
                              v.num_attention_heads, v.o_groups, c.model));
    if (block.rank < 0 || block.rank >= c.tp)
      throw Error(fmt::format("--rank {} is not in [0, tp = {})", block.rank, c.tp));
    c.dims.name = c.model;
    c.dims.kv_lora_rank = v.head_dim - v.qk_rope_head_dim;
    c.dims.qk_rope_head_dim = v.qk_rope_head_dim;
    c.dims.qk_nope_head_dim = v.head_dim - v.qk_rope_head_dim;
    c.dims.v_head_dim = v.head_dim;
    c.dims.num_heads = v.num_attention_heads / c.tp;
    c.dims.softmax_scale = v.softmax_scale();
    if (!o.checkpoint.empty())
      c.notes.push_back(fmt::format("--checkpoint: DeepSeek-V4 layer {} (compress ratio {}); the compressors' outputs "
                                    "and the top-k picks are random",
                                    block.layer, v.compress_ratio(block.layer)));
  } else if (block.enabled) {
    block.config = o.checkpoint.empty() ? DeepseekConfig::preset(c.model)
                                        : DeepseekConfig::from_file(o.checkpoint + "/config.json");
    if (!o.checkpoint.empty()) c.model = block.config.model_type.empty() ? "checkpoint" : block.config.model_type;
    c.dims = block.config.dims(c.tp);
    if (block.rank < 0 || block.rank >= c.tp)
      throw Error(fmt::format("--rank {} is not in [0, tp = {})", block.rank, c.tp));
  } else {
    c.dims = ModelDims::preset(c.model, c.tp);
  }
  if (c.sparse && c.dims.index_topk <= 0)
    throw Error(fmt::format("--sparse needs a model with a top-k indexer (v3.2), got --model {}", c.model));
  c.dcp = o.dcp;
  c.batch_invariant = o.batch_invariant;
  c.dcp_interleave = o.dcp_interleave;
  if (c.dcp == 1 && process_group_env_present())
    c.notes.push_back("RANK / WORLD_SIZE are set but --dcp is 1: this process runs the whole layer alone");
  if (c.dcp > 1 || c.dcp_interleave != 1) {
    if (block.enabled) throw Error("--dcp runs the bare layer: it cannot be combined with --checkpoint / --block");
    if (c.dims.num_heads % c.dcp != 0)
      throw Error(fmt::format("--dcp {}: the layer's {} query heads (tp {}) must split evenly over the group", c.dcp,
                              c.dims.num_heads, c.tp));
    if (o.page_size % c.dcp_interleave != 0)
      throw Error(fmt::format("--dcp-interleave {} must divide --page-size {}", c.dcp_interleave, o.page_size));
    validate_dcp_layout({c.dcp, 0, c.dcp_interleave}, o.page_size);
    if (process_group_env_present()) {  // one process per rank (our launcher or torchrun)
      const ProcessGroupEnv env = process_group_env();
      if (env.world_size != c.dcp)
        throw Error(fmt::format("--dcp {}: WORLD_SIZE is {} (one process per rank)", c.dcp, env.world_size));
      c.dcp_rank = env.rank;
      if (c.cuda) {
        const int dev = o.device + env.local_rank;
        if (dev >= devices)
          throw Error(fmt::format("rank {}: --device {} + LOCAL_RANK {}: {} CUDA device(s) present", env.rank,
                                  o.device, env.local_rank, devices));
        c.device = Device::cuda(dev);
#if MLA_WITH_CUDA
        c.device_name = fmt::format("cuda:{} {} (one per rank)", dev, cuda_rt::device_info(dev).name);
#endif
      }
    } else if (c.cuda && c.device.index + c.dcp > devices)
      throw Error(fmt::format("--dcp {}: ranks use CUDA devices {}..{}, {} present", c.dcp, c.device.index,
                              c.device.index + c.dcp - 1, devices));
    if (c.cuda && c.dcp > 1 && !nccl_available())
      throw Error("--dcp with --backend cuda: this build of mla has no NCCL");
    if (c.dcp > 1)
      c.notes.push_back(fmt::format("--dcp {}: {} ranks as {} ({}), {} heads and 1/{} of every request's cache "
                                    "each (interleave {})",
                                    c.dcp, c.dcp, c.dcp_rank >= 0 ? "processes" : "threads",
                                    c.cuda ? "NCCL, one GPU each" : c.dcp_rank >= 0 ? "socket group" : "in-process group",
                                    c.dims.num_heads / c.dcp, c.dcp, c.dcp_interleave));
  }

  const std::string cache =
      o.cache.empty() ? (block.v4 ? (block.v4_config.q_head_norm ? "v4" : "v41") : o.sparse ? "fp8_ds_mla" : "bf16")
                      : o.cache;
  c.format = cache_format_from_string(cache);
  if (block.v4) {
    const std::string extra = o.extra_cache.empty() ? (c.format == CacheFormat::v41 ? "v41_fp4" : cache) : o.extra_cache;
    block.extra_format = cache_format_from_string(extra);
    for (const auto& [f, name] : {std::pair{c.format, "--cache"}, {block.extra_format, "--extra-cache"}})
      if (!(cache_format_info(f).record || f == CacheFormat::bf16))
        throw Error(fmt::format("{} {}: a DeepSeek-V4 cache holds rows of 512 (448 + 64 rope): bf16, v4, v41 or "
                                "v41_fp4",
                                name, to_string(f)));
    if (o.extra_cache.empty() && block.extra_format != c.format)
      c.notes.push_back(fmt::format("the compressed cache is {} beside the {} window cache (V4.1's checkpoint-native "
                                    "records; --extra-cache sets it)",
                                    to_string(block.extra_format), to_string(c.format)));
  } else if (cache_format_info(c.format).record)
    throw Error(fmt::format("--cache {}: the V3 layer and block cannot read DeepSeek-V4 records; the {} cache runs "
                            "with a DeepSeek-V4 model (--model v4-flash, v4-pro or v41-flash)",
                            cache, to_string(c.format)));
  if (c.sparse && c.format == CacheFormat::fp8) {
    // vLLM canonicalises "fp8" to fp8_ds_mla for the FlashMLA-sparse backend.
    c.format = CacheFormat::fp8_ds_mla;
    c.notes.push_back("--cache fp8 with --sparse means fp8_ds_mla (as in vLLM's sparse backend)");
  }
  c.fp8_scale = c.format == CacheFormat::fp8 ? (block.enabled ? kBlockFp8Scale : kFp8Scale) : 1.0f;
  c.out_quant = parse_output_quant(o.out_quant);
  c.out_scale = c.out_quant == OutputQuant::fp8 ? kOutFp8Scale
                : c.out_quant == OutputQuant::nvfp4 ? kOutNvfp4GlobalScale
                                                    : 1.0f;
  if (c.out_quant == OutputQuant::fp8 || c.out_quant == OutputQuant::nvfp4)
    c.notes.push_back(fmt::format("--out-quant {}: {} scale {}", o.out_quant,
                                  c.out_quant == OutputQuant::fp8 ? "static" : "global", c.out_scale));
  if (o.kv_scales != "fixed" && o.kv_scales != "auto")
    throw Error(fmt::format("--kv-scales: expected fixed or auto, got '{}'", o.kv_scales));
  c.kv_scales = o.kv_scales == "auto" ? KvScales::from_first_batch : KvScales::fixed;
  if (c.kv_scales == KvScales::from_first_batch && c.format != CacheFormat::fp8)
    throw Error(fmt::format("--kv-scales auto sets the one scale of the per-tensor fp8 cache (--cache fp8); the {} "
                            "cache has none to set",
                            to_string(c.format)));

  c.fp8_prefill = o.fp8_prefill;
  if (c.fp8_prefill) {
    if (o.dcp > 1 || c.sparse || (c.format != CacheFormat::fp8 && c.format != CacheFormat::fp8_ds_mla))
      throw Error(fmt::format("--fp8-prefill applies to a dense layer or block with --cache fp8 or fp8_ds_mla, got a "
                              "{} {} cache{}",
                              c.sparse ? "sparse" : "dense", to_string(c.format), o.dcp > 1 ? " (and --dcp)" : ""));
    c.notes.push_back(block.enabled ? "--fp8-prefill: the block's prefill attention runs on e4m3 codes (scales 1), its "
                                      "float64 twin's too; each step's bound adds their own error"
                                    : "--fp8-prefill: the prefill attention runs on e4m3 codes (scales 1); prefill tokens "
                                      "are checked with the fp8 allowance");
  }

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
    c.real_indexer = o.topk_source != "synthetic";
  } else if (!o.topk_source.empty()) {
    throw Error("--topk-source applies to --sparse runs only");
  }
  if (!o.sparse_prefill.empty() && (!c.sparse || c.format != CacheFormat::fp8_ds_mla))  // given (auto included)
    throw Error("--sparse-prefill applies to --sparse runs with the fp8_ds_mla cache only");
  if (!o.sparse_prefill.empty() && o.sparse_prefill != "auto") {
    c.sparse_prefill = o.sparse_prefill == "mixed" ? SparsePrefillMode::mixed_batch : SparsePrefillMode::separate;
    if (c.dcp > 1 && c.sparse_prefill == SparsePrefillMode::separate)
      throw Error("--sparse-prefill separate cannot be combined with --dcp: DCP runs every sparse token on the cache "
                  "shards (the mixed batch)");
  }
  return c;
}

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
  cmd->add_option("--device", o.device, "CUDA device index")->check(int_range(0, 1023))->capture_default_str();
  cmd->add_option("--model", o.model, "Model dimensions: v3 (= r1), v2-lite or v3.2 (default v3; v3.2 with --sparse); "
                                      "v4-flash, v4-pro or v41-flash run the DeepSeek-V4 attention block with random "
                                      "weights on --backend (--layer picks the layer of the schedule 0, 4, 128, 4: "
                                      "default 1)")
      ->check(CLI::IsMember({"v3", "r1", "v2-lite", "v3.2", "v4-flash", "v4-pro", "v41-flash"}));
  cmd->add_option("--tp", o.tp, "Tensor-parallel size: the layer holds heads/tp query heads (default 8: DeepSeek-V3 "
                                "shapes per rank, 16 heads; 1 with --checkpoint)")
      ->check(int_range(1, 4096));
  cmd->add_option("--checkpoint", o.checkpoint, "Run the whole DeepSeek attention block (projections, norms, YaRN "
                                                "RoPE, MLA, o_proj; docs/BLOCK.md) of this checkpoint directory "
                                                "(config.json + safetensors), on --backend (CUDA or the CPU), "
                                                "checked every step against its float64 CPU twin");
  cmd->add_option("--layer", o.layer, "With --checkpoint: the layer whose attention block runs (default 0)")
      ->check(int_range(0, 1 << 20));
  cmd->add_option("--rank", o.rank, "With --checkpoint / --block: the tensor-parallel rank whose heads run (default 0)")
      ->check(int_range(0, 4095));
  cmd->add_flag("--block", o.block, "Run the whole DeepSeek attention block with random weights of --model's "
                                    "shapes (fp8 block-scaled for v3 / r1 / v3.2, bf16 for v2-lite)");
  cmd->add_flag("--sparse", o.sparse, "DeepSeek-V3.2 sparse attention: every token attends to its top-k set");
  cmd->add_option("--cache", o.cache, "KV-cache format: bf16, fp8 (one per-tensor scale) or fp8_ds_mla (656-byte "
                                      "records) (default bf16; fp8_ds_mla with --sparse); with a DeepSeek-V4 model the "
                                      "window cache: v4 (584-byte records, default), v41 (528, default for "
                                      "v41-flash), v41_fp4 (288) or bf16")
      ->check(CLI::IsMember({"bf16", "auto", "fp8", "fp8_e4m3", "fp8_ds_mla", "v4", "v41", "v41_fp4"}));
  cmd->add_option("--extra-cache", o.extra_cache, "DeepSeek-V4 models: the compressed cache's format: v4, v41, "
                                                  "v41_fp4 or bf16 (default v41_fp4 beside a v41 window cache, else "
                                                  "--cache's)")
      ->check(CLI::IsMember({"bf16", "v4", "v41", "v41_fp4"}));
  cmd->add_option("--page-size", o.page_size, "Tokens per cache page")->check(int_range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--steps", o.steps, "Forward steps to run; fewer when every request finished" +
                                          def(&Defaults::steps))
      ->check(int_range(1, 10000000));
  cmd->add_option("--requests", o.requests, "Requests in the trace; they arrive over the first two thirds of the steps" +
                                                def(&Defaults::requests))
      ->check(int_range(1, 10000000));
  cmd->add_option("--max-context", o.max_context, "Longest request (prompt + generated tokens); prompts are up to 3/4 "
                                                  "of it" + def(&Defaults::max_context))
      ->check(int_range(8, int64_t(1) << 30));
  cmd->add_option("--token-budget", o.token_budget, "Tokens per step; longer prompts are split over steps (chunked "
                                                    "prefill)" + def(&Defaults::token_budget))
      ->check(int_range(1, int64_t(1) << 30));
  cmd->add_option("--max-seqs", o.max_seqs, "Requests running at once" + def(&Defaults::max_seqs))
      ->check(int_range(1, 1 << 20));
  cmd->add_option("--topk", o.topk, "Sparse: valid entries of each token's top-k row (the rows are index_topk = "
                                    "2048 wide, -1 padded), capped by the token's position + 1 (default 2048 on "
                                    "CUDA, 256 on the CPU)")
      ->check(int_range(1, 1 << 20));
  cmd->add_option("--topk-source", o.topk_source,
                  "Sparse: where the top-k rows come from: indexer (default; the lightning indexer on random fp8 "
                  "indexer queries and keys written to an indexer K cache beside the latent cache) or synthetic "
                  "(random positions)")
      ->check(CLI::IsMember({"indexer", "synthetic"}));
  cmd->add_option("--sparse-prefill", o.sparse_prefill,
                  "Sparse, fp8_ds_mla cache: how prefill tokens run: auto (default: separate on compute capability 9.0 "
                  "outside DCP, else the mixed batch below 32 heads, as vLLM), mixed (every token on the cache's "
                  "records) or separate (prefills through the upconverted bf16 workspace); docs/design/attention_sm90.md")
      ->check(CLI::IsMember({"auto", "mixed", "separate"}));
  cmd->add_option("--check-samples", o.check_samples, "Tokens checked against the float64 oracle, spread over the "
                                                      "steps and over decode, context-prefill and fresh-prefill "
                                                      "tokens; 0 skips the check" + def(&Defaults::check_samples))
      ->check(int_range(0, int64_t(1) << 30));
  cmd->add_option("--dcp", o.dcp, "Decode context parallelism: run the layer on a group of N ranks (threads of this "
                                  "process; CUDA: NCCL over GPUs --device .. --device + N - 1), each with 1/N of the "
                                  "heads and of every request's cache, outputs combined exactly (docs/SCALE.md)")
      ->check(int_range(1, 64))
      ->capture_default_str();
  cmd->add_option("--dcp-interleave", o.dcp_interleave, "With --dcp: consecutive positions per rank turn (divides "
                                                        "the page size)")
      ->check(int_range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--dcp-procs", o.dcp_procs, "With --dcp N: one process per rank instead of threads (this process "
                                          "spawns N copies of itself, wired through RANK, WORLD_SIZE, LOCAL_RANK and "
                                          "MLA_DCP_RENDEZVOUS; a failing rank stops the others). A process started "
                                          "with those variables set (e.g. by torchrun) runs as that rank");
  cmd->add_option("--out-quant", o.out_quant,
                  "Format the layer writes its output in: none, fp8 (static scale), fp8_group128 / fp8_group64 "
                  "(dynamic per-token group scales), nvfp4; checked against quantize(oracle) within one code")
      ->check(CLI::IsMember({"none", "fp8", "fp8_group128", "fp8_group64", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--kv-scales", o.kv_scales,
                  "fp8 cache scale: fixed (1/200), or auto: max |kv_c| / 200 of the first batch (vLLM's "
                  "calc_kv_scales), fixed from then on")
      ->check(CLI::IsMember({"fixed", "auto"}))
      ->capture_default_str();
  cmd->add_flag("--fp8-prefill", o.fp8_prefill,
                "fp8 prefill attention (LayerOptions::fp8_prefill, vLLM's use_prefill_query_quantization; "
                "docs/SEMANTICS.md §10.1): q, k, v cast to e4m3 (scales 1) for the dense prefill's attention. "
                "Needs --cache fp8 or fp8_ds_mla; on CUDA an sm_90 device. Prefill tokens are checked against the "
                "unquantised float64 oracle with the fp8 allowance (--block / --checkpoint: the block's twin runs "
                "fp8 prefill too, the bound adds its own error)");
  cmd->add_flag("--batch-invariant", o.batch_invariant,
                "Plan every step batch-invariant (PlannerConfig::batch_invariant): each request's decode output is "
                "bit-identical whatever else is in its step; kernels and split points from the request's own shape "
                "(docs/design/attention_sm90.md \"Batch-invariant mode\"). Not with --dcp");
  cmd->add_option("--seed", o.seed, "Seed of the trace, the inputs and the weights")
      ->check(uint64_value())
      ->capture_default_str();
  cmd->add_option("--json", o.json_path, "Also write the configuration, timings and check results to this file");
  cmd->add_flag("--no-progress", o.no_progress, "Do not report progress on stderr");
  return cmd;
}

int run_command(const RunOptions& options) {
  BlockRunConfig block;
  if (options.dcp_procs && !process_group_env_present()) {
    resolve(options, block);  // refuse a bad configuration before any process starts
    return launch_dcp_processes(options.dcp, std::chrono::seconds(5));
  }
  const RunConfig cfg = resolve(options, block);
  // One process per rank: rank 0 reports (header, progress, summary, --json); the others only fail loudly.
  const bool quiet = cfg.dcp_rank > 0;
  OutputFile json(quiet ? std::string() : options.json_path, "--json");  // opened before the run
  if (quiet) return run_trace(cfg, false, json);
  print_header(cfg);
  if (block.v4) return run_v4_block_trace(cfg, block, !options.no_progress, json);
  if (block.enabled) return run_block_trace(cfg, block, !options.no_progress, json);
  return run_trace(cfg, !options.no_progress, json);
}

}  // namespace mla::app
