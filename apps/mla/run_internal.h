// SPDX-License-Identifier: Apache-2.0
#pragma once
// `mla run` internals: run.cpp resolves the options into a RunConfig, run_driver.cpp runs the trace
// into RunStats and the OracleCheck, run_report.cpp prints the summary and writes the JSON record.
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "check.h"
#include "mla/layer.h"
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
  bool v4 = false;          // the DeepSeek-V4 block (BlockRunConfig::v4)
  int tp = 8;
  ModelDims dims;
  CacheFormat format = CacheFormat::bf16;
  float fp8_scale = 1.0f;
  bool sparse = false;
  int64_t topk = 0;
  bool real_indexer = false;  // sparse: top-k rows from the lightning indexer (else synthetic rows)
  // Sparse fp8_ds_mla: how prefill tokens run (--sparse-prefill; PlannerConfig::sparse_prefill_mode).
  SparsePrefillMode sparse_prefill = SparsePrefillMode::automatic;
  int64_t steps = 0;
  int64_t check_samples = 0;
  uint64_t seed = 0;
  TraceConfig trace;
  // Decode context parallelism (--dcp N, docs/SCALE.md): N ranks, one thread each (CPU: the in-process
  // group; CUDA: NCCL, rank r on GPU device + r), each with dims.num_heads / N heads and the positions
  // of every request's cache it owns (turns of dcp_interleave positions). 1 = one layer.
  int dcp = 1;
  int dcp_interleave = 1;
  // One process per rank (--dcp-procs, or RANK / WORLD_SIZE in the environment): this process is rank
  // dcp_rank of the group; device is its GPU (--device + LOCAL_RANK). -1: ranks are threads.
  int dcp_rank = -1;
  // --out-quant: the layer writes its output in this format (out_scale: fp8's static / nvfp4's global
  // scale); the check compares the dequantised output with the oracle within one code step.
  OutputQuant out_quant = OutputQuant::none;
  float out_scale = 1.0f;
  // --kv-scales auto: the fp8 cache's scale from the first batch (LayerOptions::kv_scales).
  KvScales kv_scales = KvScales::fixed;
  // Batch-invariant decode (--batch-invariant; PlannerConfig::batch_invariant): each request's decode output
  // is bit-identical whatever else is in its step. Not with --dcp.
  bool batch_invariant = false;
  bool fp8_prefill = false;  // --fp8-prefill: LayerOptions::fp8_prefill with scales 1, 1, 1 (vLLM's plain cast)
  std::vector<std::string> notes;  // defaults and aliases worth telling the user about
};

// `mla run --checkpoint DIR` / `--block`: the block's configuration and where its weights come from.
struct BlockRunConfig {
  bool enabled = false;
  std::string checkpoint;  // "" = random weights of the preset
  int layer = 0, rank = 0;
  DeepseekConfig config;
  // --model v4-flash / v4-pro / v41-flash: the DeepSeek-V4 block (random weights, CPU) instead.
  bool v4 = false;
  DeepseekV4Config v4_config;
  CacheFormat extra_format = CacheFormat::bf16;  // the V4 block's compressed cache
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
  // Host-side phases of the wall time (CUDA: each includes its uploads / downloads): random inputs and
  // metadata, the lightning indexer's top-k rows (sparse runs with the real indexer; its own GPU work
  // included), and the float64 oracle checks.
  double inputs_seconds = 0, indexer_seconds = 0, check_seconds = 0;
  int64_t requests_finished = 0;
  double forward_seconds() const;
  int64_t tokens() const;
};

// Runs the trace (the body of `mla run`); returns the process exit code.
int run_trace(const RunConfig& cfg, bool progress, OutputFile& json);
// The planner settings of the trace (run_driver.cpp): dims, cache, limits, decode threshold.
PlannerConfig planner_config(const RunConfig& cfg);
// One rank's planner of a --dcp group (cfg.dcp > 1): planner_config with the rank's share of the heads,
// its place in the group and its device's facts.
PlannerConfig rank_planner_config(const RunConfig& cfg, int rank, Device dev);
// The layer's options of the trace (run_driver.cpp): dims, cache format, sparse, device, bf16.
LayerOptions layer_options(const RunConfig& cfg);
// Every byte of [p, p + bytes) on `dev` set to 0xff (NaN in bf16, e4m3 and fp32): unwritten rows show.
void poison(void* p, Device dev, std::size_t bytes);
// Waits for the device's work (no-op on the CPU).
void synchronize(Device dev);

// The DCP group of a `mla run --dcp N` trace (run_dcp.cpp). The scheduler's pages stay global: each
// rank's shard is a pool of the same size in which request q's local page k is q's k-th block id, so
// the step's block table serves every rank; a token's cache row goes to its owner only (slot -1 on the
// others). Outputs are assembled as one layer's [T, H * V]; the oracle check reads whole pages
// assembled from the owners' shards. With one process per rank (cfg.dcp_rank >= 0) the group holds
// only this process's rank: the output's heads and the check's pages come from the other processes
// through the group's communicator (all-gathers; every rank runs the same trace and check, so they
// call them in the same order).
class DcpGroup {
 public:
  DcpGroup(const RunConfig& cfg, const Tensor& kv_b_proj);  // the whole layer's weight, on the CPU
  ~DcpGroup();
  DcpGroup(const DcpGroup&) = delete;
  DcpGroup& operator=(const DcpGroup&) = delete;
  // Host inputs of one step (bf16 bits; topk may be null) of the whole layer.
  struct Inputs {
    const uint16_t *q, *kv_c, *k_pe;
    const int32_t* topk;
    int64_t topk_width;
  };
  // Runs the step on every rank at once (a plan per rank; warm_up: one untimed forward first) and
  // writes the group's output into out [T, H * V] (host, bf16 bits). Returns the slowest rank's
  // seconds for upload + forward + synchronize.
  double forward(const StepBatch& batch, const Inputs& in, uint16_t* out, bool warm_up);
  // Global page `block` of the step's batch (a request's block) assembled from its owners' shards on
  // the host; valid until the next forward(). Rows past the request's length are 0xff.
  const uint8_t* page(const StepBatch& batch, int64_t block);
  // A page the scheduler freed: poisoned on every rank.
  void release(int32_t block);

 private:
  struct Rank;
  const RunConfig& cfg_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t entry_bytes_, page_bytes_;
  std::map<int64_t, std::vector<uint8_t>> pages_, rank_pages_;  // host copies for the check
  Tensor gather_;  // processes: device buffer of the output's and pages' all-gathers
};
// The trace through the whole DeepSeek block (run_block.cpp).
int run_block_trace(const RunConfig& cfg, const BlockRunConfig& block, bool progress, OutputFile& json);
// The trace through the DeepSeek-V4 block (run_block_v4.cpp; block.v4).
int run_v4_block_trace(const RunConfig& cfg, const BlockRunConfig& block, bool progress, OutputFile& json);

// `mla run --dcp N --dcp-procs`: spawns N copies of this process (argv from /proc/self/cmdline) with
// RANK, WORLD_SIZE, LOCAL_RANK and MLA_DCP_RENDEZVOUS set, waits for them; when one fails the others
// are stopped at once (SIGTERM, then SIGKILL). Returns the exit code (the first failing rank's).
int launch_dcp_processes(int world, std::chrono::milliseconds grace);

void print_header(const RunConfig& cfg);
void print_summary(const RunConfig& cfg, const RunStats& stats, const OracleCheck& check);
// The run's JSON record into `out` (opened by the caller before the run).
void write_json(OutputFile& out, const RunConfig& cfg, const RunStats& stats, const OracleCheck& check);

}  // namespace mla::app
