#pragma once
// `mla run` internals: run.cpp resolves the options into a RunConfig, run_driver.cpp runs the trace
// into RunStats and the OracleCheck, run_report.cpp prints the summary and writes the JSON record.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_util.h"
#include "check.h"
#include "mla/plan.h"
#include "mla/safetensors.h"
#include "mla/tensor.h"
#include "mla/types.h"
#include "trace.h"

namespace mla::app {

// The options of one run after defaults and aliases are applied.
struct RunConfig {
  bool cuda = false;
  Device device{};
  std::string device_name;  // GPU name, or the CPU model and thread count
  std::string model;        // preset name
  int tp = 8;
  ModelDims dims;
  CacheFormat format = CacheFormat::bf16;
  float fp8_scale = 1.0f;
  bool sparse = false;
  int64_t topk = 0;
  bool real_indexer = false;  // sparse: top-k rows from the lightning indexer (else synthetic rows)
  int64_t steps = 0;
  int64_t check_samples = 0;
  uint64_t seed = 0;
  TraceConfig trace;
  std::vector<std::string> notes;  // defaults and aliases worth telling the user about
};

// `mla run --checkpoint DIR` / `--block`: the block's configuration and where its weights come from.
struct BlockRunConfig {
  bool enabled = false;
  std::string checkpoint;  // "" = random weights of the preset
  int layer = 0, rank = 0;
  DeepseekConfig config;
};

// Per-step measurements. Phases follow the planner's split (decode tokens go through absorbed MQA,
// prefill tokens through MHA with chunked context; in sparse mode both through sparse MQA).
struct StepRecord {
  int64_t decode_tokens = 0, prefill_tokens = 0, context_rows = 0;
  std::array<int64_t, kNumTokenKinds> kind_tokens{};
  int64_t num_reqs = 0;
  double seconds = 0;  // forward (with the device synchronised)
};

struct RunStats {
  std::vector<StepRecord> steps;
  double wall_seconds = 0;  // the whole trace including input generation and checks
  double setup_seconds = 0;
  int64_t requests_finished = 0;
  double forward_seconds() const;
  int64_t tokens() const;
};

// Runs the trace (the body of `mla run`); returns the process exit code.
int run_trace(const RunConfig& cfg, bool progress, OutputFile& json);
// The planner settings of the trace (run_driver.cpp): dims, cache, limits, decode threshold.
PlannerConfig planner_config(const RunConfig& cfg);
// The trace through the whole DeepSeek block (run_block.cpp).
int run_block_trace(const RunConfig& cfg, const BlockRunConfig& block, bool progress, OutputFile& json);

void print_header(const RunConfig& cfg);
void print_summary(const RunConfig& cfg, const RunStats& stats, const OracleCheck& check);
// The run's JSON record into `out` (opened by the caller before the run).
void write_json(OutputFile& out, const RunConfig& cfg, const RunStats& stats, const OracleCheck& check);

}  // namespace mla::app
