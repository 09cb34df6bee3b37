// SPDX-License-Identifier: Apache-2.0
// `mla bench`: option parsing for mla::bench::run (bench/, CUDA builds).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "mla/cache_format.h"
#include "mla/plan.h"
#include "mla/error.h"
#include "mla/tensor.h"
#include "mla/variants.h"

namespace mla::app {

namespace {
// A cache format's name (mla/cache_format.h), the parser's own message otherwise.
CLI::Validator cache_format_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          cache_format_from_string(s);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "FORMAT");
}
}  // namespace

CLI::App* add_bench_command(CLI::App& app, bench::BenchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "bench", "Benchmark the kernels and a whole layer step on a CUDA device: median time after warm-up with L2 "
               "flushed, TFLOP/s, GB/s and the share of the copy-bandwidth and cuBLAS-bf16 ceilings measured in the "
               "same run");
  cmd->add_option("--ops", o.ops, "Comma-separated benchmarks to run (default: all). Names: " +
                                      [] {
                                        std::string s;
                                        for (const auto& n : bench::available()) s += (s.empty() ? "" : ", ") + n;
                                        return s.empty() ? std::string("none in this build (no CUDA backend)") : s;
                                      }())
      ->delimiter(',');
  cmd->add_option("--json", o.json_path, "Also write the results as a JSON record to this file");
  cmd->add_flag("--quick", o.quick, "Small sizes and few iterations (a smoke test, not a measurement)");
  cmd->add_option("--device", o.device, "CUDA device index")->check(int_range(0, 1023));
  cmd->add_option("--iters", o.iters, "Timed iterations per measurement (the median is reported)")
      ->check(int_range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--variant", o.variant,
                  "Force this kernel variant in every kernel family that has one of that name (default: the best "
                  "variant the device and problem allow). Variants: " +
                      [] {
                        std::string s;
                        for (const std::string& f : variant_families())
                          for (const VariantInfo& v : list_variants(f)) s += (s.empty() ? "" : ", ") + f + ":" + v.name;
                        return s.empty() ? std::string("none in this build (no CUDA backend)") : s;
                      }());
  cmd->add_option("--b", o.decode.b, "mqa_decode / mha_prefill / sparse_mqa: benchmark this one shape with b requests (with --s-q, --h-q, --s-k, --page, --format, --varlen, --non-causal; sparse_mqa: b tokens, --h-q, --topk, --pool, --format)")
      ->check(int_range(0, 1 << 20));
  cmd->add_option("--s-q", o.decode.s_q, "mqa_decode / mha_prefill shape: query tokens per request")->check(int_range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--h-q", o.decode.h, "mqa_decode / mha_prefill / sparse_mqa shape: query heads")->check(int_range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--s-k", o.decode.s_k, "mqa_decode / mha_prefill shape: keys per request (the longest, with --varlen)")
      ->check(int_range(1, INT32_MAX))  // seq_lens are int32
      ->capture_default_str();
  cmd->add_option("--page", o.decode.page, "mqa_decode shape: cache page size")->check(int_range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--format", o.decode.format, "mqa_decode / sparse_mqa shape: cache format (bf16, fp8, fp8_ds_mla)")
      ->check(cache_format_validator())
      ->capture_default_str();
  cmd->add_flag("--varlen", o.decode.varlen, "mqa_decode shape: seq_lens uniform in [1, s_k] instead of all s_k");
  cmd->add_flag("--graph", o.decode.graph,
                "mqa_decode / sparse_mqa shape (--b): time the call graph-replayed (no host launch cost in the time)");
  cmd->add_flag("--sequential-pages", o.decode.sequential_pages,
                "mqa_decode shape: each request's pages contiguous in the cache (FlashMLA's benchmark tables) instead of a random permutation");
  cmd->add_flag("--non-causal", o.decode.non_causal, "mha_prefill shape: non-causal (a context chunk) instead of causal");
  cmd->add_flag("--fp8-prefill", o.fp8_prefill,
                "mha_prefill: fp8 compute (PrefillOptions::fp8, the sm90_fp8 kernel; scales 1/256 on inputs in "
                "[-1, 1]; the time includes the quantise pass); layer: LayerOptions::fp8_prefill in the dense rows "
                "over fp8 / fp8_ds_mla caches; block: the prefill step again with DeepseekOptions::fp8_prefill over "
                "an fp8_ds_mla cache");
  cmd->add_option("--topk", o.decode.topk, "sparse_mqa shape: indices per token")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--pool", o.decode.pool, "sparse_mqa shape: cache rows the indices are drawn from (0: b * topk rows, each read once)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_option("--extra-topk", o.decode.extra_topk,
                  "sparse_mqa shape: a DeepSeek-V4 row (d_qk 512, K = V, a per-head sink): --topk window rows of the "
                  "main cache and this many rows of the extra (compressed) cache per token")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--extra-pool", o.decode.extra_pool,
                  "sparse_mqa V4 shape: extra-cache rows the extra indices are drawn from (0: b * extra-topk rows, each "
                  "read once)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_option("--extra-format", o.decode.extra_format,
                  "sparse_mqa V4 shape: the extra cache's format (default: --format; V4.1: --format v41 --extra-format "
                  "v41_fp4)")
      ->check(cache_format_validator());
  cmd->add_flag("--trace", o.decode.trace,
                "mqa_decode: after each row, the sm90 kernels' per-CTA timeline of a warm and a cold call (needs a build "
                "configured with -DMLA_DECODE_TRACE=ON; docs/design/attention_sm90.md \"10. Where the time goes\")");
  cmd->add_flag("--batch-invariant", o.decode.batch_invariant,
                "mqa_decode / sparse_mqa: each row runs twice, as is and in the batch-invariant mode right after it "
                "(PlannerConfig::batch_invariant; decode: the split count of a config whose full batch is the row's b)");
  cmd->add_flag("--fp8-compute", o.decode.fp8_compute,
                "mqa_decode: each fp8 per-tensor row runs twice, as is and with fp8 compute (mqa_decode's fp8_compute: "
                "e4m3 products, the sm90_fp8c kernel above 32 rows) right after it");
  cmd->add_option("--splits", o.decode.splits, "mqa_decode shape: KV splits per request (0: the planner's policy)")
      ->check(int_range(0, kDecodeMaxSplits));
  cmd->add_option("--grid", o.decode_grid,
                  "A named list of shapes that replaces the default rows of the ops it has rows for (issue7: mqa_decode, issue 7's table "
                  "with FlashMLA's times, small batch, varlen, h 8/32/64, page sizes, fp8 formats; issue9: mha_prefill, "
                  "b 1/4 x s 1024/4096/16384 x h 16/128 causal and s_q 1024 x s_k 8192 non-causal; issue8: sparse_mqa, issue 8's "
                  "table with FlashMLA's times, h 16/32 x topk 512/1024/2048, T 1/4/16/64 at h 16/32, bf16 rows, sparse "
                  "prefill 4096 tokens "
                  "over 8192 / 131072 rows; v4: sparse_mqa, DeepSeek-V4 decode: d_qk 512 K = V, window 128 + extra top "
                  "512 / 1024, sink, h 16/64/128, bf16 and fp8; issue48: issue 48's small decode steps, each "
                  "graph-replayed beside the issue's target time: mqa_decode bf16 b 4 s_k 1024 h 16, b 1 / 8 s_k 640 "
                  "h 128, b 1 / 8 s_k 8192 h 64, b 4 s_q 6 s_k 4096 h 16; sparse_mqa fp8_ds_mla topk 2048 T 1 / 8 h 16, "
                  "T 8 h 64; layer: the layer's decode step b 1 / 4 / 8 h 16 s_k 4096 bf16 and its kernels alone)")
      ->check(CLI::IsMember(bench::grids()));
  cmd->add_option("--dcp", o.dcp, "dcp: GPUs of the decode-context-parallel group (0: every GPU)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--out-quant", o.out_quant,
                  "layer: also time every row with the output written in this format (none, fp8, fp8_group128, "
                  "fp8_group64, nvfp4), beside the unquantised row; gemm: the key of the quantised V up-projection "
                  "rows (fused against bmm + quantize_output; default fp8_group128)")
      ->check(CLI::IsMember({"none", "fp8", "fp8_group128", "fp8_group64", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--kv-scales", o.kv_scales,
                  "layer: fp8 cache scale, fixed or auto (calibrated from the first step's max |kv_c| / 200)")
      ->check(CLI::IsMember({"fixed", "auto"}))
      ->capture_default_str();
  cmd->add_flag("--no-pdl{false}", o.pdl,
                "Launch every kernel after the previous one completed (Context::pdl = false) instead of with "
                "programmatic dependent launch (docs/DESIGN.md), to measure what the overlap gains");
  cmd->add_option("--warmup", o.warmup, "Untimed warm-up iterations")->check(int_range(0, 1000000))->capture_default_str();
  return cmd;
}

namespace {

// Refuses options that would change nothing: a shape option of ops that do not run, a shape option
// without --b (the single row it shapes), --b with --grid (both choose the rows).
void check_relevance(const bench::BenchOptions& o, const std::set<std::string>& given) {
  struct Rule {
    const char* option;
    std::vector<std::string> ops;  // the benchmarks that read it
    bool needs_b;                  // it shapes the single --b row only
  };
  const std::string decode = "mqa_decode", prefill = "mha_prefill", sparse = "sparse_mqa";
  const std::vector<Rule> rules = {
      {"--b", {decode, prefill, sparse}, false},  {"--s-q", {decode, prefill}, true},
      {"--h-q", {decode, prefill, sparse}, true}, {"--s-k", {decode, prefill}, true},
      {"--page", {decode}, true},                 {"--format", {decode, sparse}, true},
      {"--varlen", {decode, prefill}, true},      {"--sequential-pages", {decode}, true},
      {"--non-causal", {prefill}, true},          {"--topk", {sparse}, true},
      {"--pool", {sparse}, true},                 {"--splits", {decode}, true},
      {"--extra-topk", {sparse}, true},           {"--extra-pool", {sparse}, true},
      {"--extra-format", {sparse}, true},
      {"--trace", {decode, sparse}, false},       {"--dcp", {"dcp"}, false},
      {"--out-quant", {"layer", "gemm"}, false},          {"--kv-scales", {"layer"}, false},
      {"--batch-invariant", {decode, sparse}, false}, {"--fp8-compute", {decode}, false},
      {"--fp8-prefill", {prefill, "layer", "block"}, false},
  };
  auto runs = [&](const std::string& op) {
    // dcp is opt-in: the default selection (every benchmark) leaves it out.
    if (o.ops.empty()) return op != "dcp";
    return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end();
  };
  for (const Rule& r : rules) {
    if (!given.count(r.option)) continue;
    if (!std::any_of(r.ops.begin(), r.ops.end(), runs)) {
      std::string ops;
      for (const std::string& op : r.ops) ops += (ops.empty() ? "" : ", ") + op;
      std::string selected;
      for (const std::string& op : o.ops) selected += (selected.empty() ? "--ops " : ",") + op;
      throw Error(fmt::format("{} applies to {} only, and {} does not run {}", r.option, ops,
                              o.ops.empty() ? "the default selection (every benchmark but the opt-in dcp)" : selected,
                              r.ops.size() == 1 ? "it" : "any of them"));
    }
    if (r.needs_b && !given.count("--b"))
      throw Error(fmt::format("{} shapes the single row that --b selects: give --b too (without --b the ops run "
                              "their default rows{})",
                              r.option, o.decode_grid.empty() ? "" : " or --grid's"));
  }
  for (const char* v4 : {"--extra-pool", "--extra-format"})
    if (given.count(v4) && !given.count("--extra-topk"))
      throw Error(fmt::format("{} shapes a DeepSeek-V4 row's extra cache: give --extra-topk too", v4));
  if (given.count("--b") && given.count("--grid"))
    throw Error("--b and --grid both choose the rows to run: give one of them");
  if (!o.decode_grid.empty()) {
    // The ops that have rows in the grid: it applies when --ops runs at least one of them.
    const std::vector<std::string> grid_ops = o.decode_grid == "issue7"    ? std::vector<std::string>{decode}
                                              : o.decode_grid == "issue9"  ? std::vector<std::string>{prefill}
                                              : o.decode_grid == "issue48" ? std::vector<std::string>{decode, sparse, "layer"}
                                                                           : std::vector<std::string>{sparse};
    if (!std::any_of(grid_ops.begin(), grid_ops.end(), runs)) {
      std::string ops;
      for (const std::string& op : grid_ops) ops += (ops.empty() ? "" : ", ") + op;
      throw Error(fmt::format("--grid {} is a list of {} rows, and --ops does not run {}", o.decode_grid, ops,
                              grid_ops.size() == 1 ? ops : "any of them"));
    }
  }
}

}  // namespace

int bench_command(const bench::BenchOptions& options, const std::set<std::string>& given) {
  check_relevance(options, given);
  // The record file is opened first: an unwritable --json fails before any work, and a failed write
  // of the record is an error (cli_util.h).
  auto json = std::make_shared<OutputFile>(options.json_path, "--json");
  bench::BenchOptions o = options;
  if (json->enabled()) o.write_json = [json](const std::string& text) { json->write(text); };
  if (!built_with_cuda())
    throw Error("mla bench measures CUDA kernels, and this build of mla has no CUDA backend (configure with nvcc "
                "available, without -DMLA_WITH_CUDA=OFF)");
  if (cuda_device_count() == 0) throw Error("mla bench needs a CUDA device and none was found (see `mla info`)");
  return bench::run(o);
}

}  // namespace mla::app
