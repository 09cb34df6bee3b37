// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the block traces of `mla run` share (run_block.cpp: the V2 / V3 block; run_block_v4.cpp: the
// DeepSeek-V4 block): the check rule, random published-form weights, dtype conversion, rel-L2.
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "mla/deepseek.h"
#include "mla/tensor.h"

namespace mla::app {

// rel-L2 of each step's output against the float64 twin (the bf16 rule of docs/BLOCK.md).
inline constexpr double kBlockRule = 1e-2;
// The bound of one step. bf16 cache: kBlockRule. Quantised caches: the bf16 block and its twin
// quantise different rows (bf16 vs float64), so codes flip between their caches; the bound adds twice
// the cache's own error in this step, measured as the twin against the exact float64 block (f64
// cache): kBlockRule + 2 * that (DESIGN.md §5's "twice the error of the same computation at the
// storage precision").
inline double step_bound(double cache_error) { return kBlockRule + 2.0 * cache_error; }

// The per-step check of a block trace: the block against its float64 twin, each step within
// step_bound(the twin's error against the exact f64-cache lane, where the run has one).
struct BlockCheck {
  bool exact = false;  // a third lane measures the caches' own error
  double worst = 0, worst_cache = 0, worst_ratio = 0;
  int64_t failures = 0;
  // One step: e = the block against the twin, cache_error = the twin against the exact lane (0 without).
  void add(double e, double cache_error);
  // The summary line ("check ..."); `caches` names what the bound's own error is of ("the fp8 cache's").
  void print(bool enabled, const std::string& caches) const;
  nlohmann::json json(bool enabled) const;
  // The run's end: the totals and the check into the JSON record `j` (written to `out` when enabled),
  // and the exit code (kExitCheckFailed when a checked step failed).
  int finish(bool enabled, nlohmann::json j, int64_t steps, int64_t tokens, double forward_seconds, double wall_seconds,
             OutputFile& out) const;
};

double seconds_since(std::chrono::steady_clock::time_point t0);

// A random Linear [out, in] in published form: fp8 codes of uniform(-448, 448) with scale
// sqrt(3 / in) / 448 per block_rows x block_cols block (uniform(+-sqrt(3 / in)): unit-variance outputs),
// or bf16 of the same distribution. The tensors behind the views are appended to `keep`.
DeepseekLinear random_linear(int64_t out, int64_t in, bool fp8, int block_rows, int block_cols, uint64_t seed,
                             std::vector<Tensor>& keep);
// n bf16 values uniform in [lo, hi) as a [n] tensor appended to `keep`.
TensorView random_bf16_vector(int64_t n, uint64_t seed, double lo, double hi, std::vector<Tensor>& keep);

// Rows [T, H] in `dtype` from bf16 values.
Tensor as_dtype(const Tensor& bf16, DType dtype);
// A host view's contents copied into `buf` (on a lane's device, at least as many elements), viewed with the
// same shape; on the CPU the host view itself.
TensorView on_device(const TensorView& host, const Tensor& buf);
// The reverse: a device view's contents copied into the host buffer `buf` (rows [0, view rows) of it), viewed with
// the view's shape; a host view itself.
TensorView on_host(const TensorView& view, const Tensor& buf);
// rel-L2 of got against ref (any float dtypes, contiguous, same element count); inf for NaN.
double rel_l2(const TensorView& got, const TensorView& ref);

// One step of a block trace's lanes: run(lane, hidden) serves the step on a lane and returns its output.
// The fast lane runs on the bf16 hidden rows (timed into fwd_seconds; host(output) brings its output to
// the host after the timing); the twin and the exact lane (when present) on them widened to f64; the
// step's errors go to `check`.
template <class Lane, class Run, class Host>
void run_lanes(Lane& fast, std::optional<Lane>& twin, std::optional<Lane>& exact, const Tensor& hidden, Run&& run,
               Host&& host, BlockCheck& check, double& fwd_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const TensorView out = run(fast, hidden);
  fwd_seconds += seconds_since(t0);
  if (!twin) return;
  const Tensor hidden64 = as_dtype(hidden, DType::f64);
  const TensorView ref = run(*twin, hidden64);
  check.add(rel_l2(host(out), ref), exact ? rel_l2(ref, run(*exact, hidden64)) : 0.0);
}

// The pages the scheduler freed, poisoned on every lane.
template <class Lane>
void release_lanes(const std::vector<int32_t>& blocks, Lane& fast, std::optional<Lane>& twin,
                   std::optional<Lane>& exact) {
  for (const int32_t b : blocks) {
    fast.release(b);
    if (twin) twin->release(b);
    if (exact) exact->release(b);
  }
}

}  // namespace mla::app
