// SPDX-License-Identifier: Apache-2.0
#pragma once
// The subcommands of the `mla` program. Each add_* registers its options on the CLI11 app; main()
// calls the matching *_command after parsing. Commands return the process exit code.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <set>
#include <string>

#include "bench.h"

namespace mla::app {

// Exit codes shared by the commands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;  // the oracle check of `mla run` failed
inline constexpr int kExitError = 3;        // mla::Error or another runtime failure

// `mla run`. Numeric options left at -1 take a backend-dependent default (run.cpp, kDefaults).
struct RunOptions {
  std::string backend = "auto";
  int device = 0;
  std::string model;  // "" = v3, or v3.2 with --sparse
  int tp = -1;        // -1: 8, or 1 with --checkpoint
  // The whole DeepSeek block (docs/BLOCK.md) instead of the bare layer: a checkpoint directory, or
  // --block for random weights of --model's shapes.
  std::string checkpoint;
  int layer = 0, rank = 0;
  bool block = false;
  std::string cache;  // "" = bf16, or fp8_ds_mla with --sparse; v4 / v41 for the DeepSeek-V4 models
  std::string extra_cache;  // DeepSeek-V4: the compressed cache's format ("" = v41_fp4 beside v41, else --cache)
  bool sparse = false;
  int64_t page_size = 64;
  int64_t steps = -1, requests = -1, max_context = -1, token_budget = -1, max_seqs = -1, topk = -1;
  int64_t check_samples = -1;
  std::string topk_source;  // "" = indexer with --sparse; "synthetic" = random rows
  std::string sparse_prefill;  // "" = auto; "mixed" / "separate" (PlannerConfig::sparse_prefill_mode)
  uint64_t seed = 0;
  std::string json_path;
  bool no_progress = false;
  int dcp = 1;             // ranks of a decode-context-parallel group (threads of this process)
  int dcp_interleave = 1;  // consecutive positions per rank turn
  bool dcp_procs = false;  // one process per rank (this process launches them), not threads
  std::string out_quant = "none";  // the layer's output format (mla::OutputQuant key)
  std::string kv_scales = "fixed";  // fixed, or auto: the fp8 cache's scale from the first batch
  bool batch_invariant = false;  // PlannerConfig::batch_invariant (--batch-invariant)
  bool fp8_prefill = false;      // LayerOptions::fp8_prefill (--fp8-prefill)
  std::set<std::string> given;  // long names of the options on the command line (irrelevant ones are refused)
};
CLI::App* add_run_command(CLI::App& app, RunOptions& options);
int run_command(const RunOptions& options);

struct InfoOptions {
  bool json = false;
};
CLI::App* add_info_command(CLI::App& app, InfoOptions& options);
int info_command(const InfoOptions& options);

CLI::App* add_bench_command(CLI::App& app, bench::BenchOptions& options);
// given: the long names of the options on the command line (shape options of ops that do not run are refused).
int bench_command(const bench::BenchOptions& options, const std::set<std::string>& given);

// Build facts shared by `mla info` and the run summary.
std::string version_string();
std::string build_type();
std::string cpu_name();  // /proc/cpuinfo "model name", or "unknown CPU"
int openmp_threads();

}  // namespace mla::app
