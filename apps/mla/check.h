// SPDX-License-Identifier: Apache-2.0
#pragma once
// The oracle check of `mla run`: picks a sample of tokens of several steps (decode, context-prefill
// and fresh-prefill tokens alike), recomputes each one's output with the float64 oracle over exactly
// the keys the token may see, and judges the layer's bf16 output with the DESIGN.md §5 rule. Also
// checks that the step wrote each sampled token's own cache row, and that every output row of a
// checked step is finite (outputs are NaN-poisoned before the layer runs).
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mla/block_ops.h"
#include "mla/cache.h"
#include "mla/plan.h"
#include "oracle.h"
#include "synth.h"
#include "trace.h"

namespace mla::app {

// Host copies of what one step saw and produced.
struct StepData {
  const StepBatch* batch = nullptr;
  const Plan* plan = nullptr;
  const uint16_t* q = nullptr;     // [T, h_q, P + R] bf16 bits
  const uint16_t* kv_c = nullptr;  // [T, L]
  const uint16_t* k_pe = nullptr;  // [T, R]
  const int32_t* topk = nullptr;   // [T, topk_width] request-local positions (sparse only)
  int64_t topk_width = 0;
  const uint16_t* out = nullptr;   // [T, h_q * V] the layer's output (bf16; unused when out_values is set)
  // A quantised output (--out-quant): its dequantised values [T, h_q * V] and, per value, one code step
  // (the gap to the next code up, times the value's scale): the value must meet the bf16 rule against
  // the oracle widened by that step (quantize(unfused output) within one code).
  const double* out_values = nullptr;
  const double* out_code_step = nullptr;
  // Bytes of one cache page [page_size, entry] on the host (the CUDA driver copies it down).
  std::function<const uint8_t*(int64_t block)> page;
};

struct KindReport {
  int64_t samples = 0;
  double max_abs_err = 0;
  double worst_ratio = 0;  // max err / bound
  double err_at_worst = 0, bound_at_worst = 0;
  int64_t max_keys = 0;    // most keys one sampled token attended to
  double kappa_needed = 0; // largest Comparison::kappa_needed of the samples
};

// A quantised layer output of T rows, W values each (quantize_output's layouts with M_pad = T: codes
// [T, W] e4m3 or [T, W / 2] packed e2m1; group scales f32 [W / G, T]; nvfp4 scales e4m3 [T, W / 16];
// `scale` the fp8 static or nvfp4 global scale) into its values and, per value, one code step: the gap
// from its code to the next code up, in value units.
void dequantize_output(OutputQuant key, const uint8_t* codes, const void* scales, float scale, int64_t T, int64_t W,
                       double* values, double* steps);

class OracleCheck {
 public:
  struct Config {
    int64_t samples = 12;     // tokens to check over the whole run (split over the three token kinds)
    int64_t steps = 48;       // planned steps, to spread the samples
    bool sparse = false;
    CacheFormat format = CacheFormat::bf16;
    float fp8_scale = 1.0f;
    int64_t page_size = 64;
    uint64_t seed = 0;
    bool fp8_prefill = false;  // prefill tokens get the fp8 allowance (fp8_prefill_tolerance, oracle.h)
  };
  OracleCheck(const OracleModel& model, const Config& config);

  // Tokens of this step to check (empty on most steps).
  std::vector<int64_t> pick(const StepBatch& batch);
  // Checks the picked tokens of one step and the finiteness of all its outputs.
  void check(const StepData& step, const std::vector<int64_t>& tokens);

  // The fp8 cache's scale from now on (the layer's calibrated one, --kv-scales auto).
  void set_fp8_scale(float scale) { config_.fp8_scale = scale; }
  bool enabled() const { return config_.samples > 0; }
  bool passed() const { return failures_.empty() && total_samples() > 0; }
  int64_t total_samples() const;
  int64_t checked_steps() const { return checked_steps_; }
  const std::array<KindReport, kNumTokenKinds>& reports() const { return reports_; }
  const std::vector<std::string>& failures() const { return failures_; }
  int64_t num_failures() const { return static_cast<int64_t>(failures_.size()) + suppressed_; }
  const Tolerance& tolerance() const { return tol_; }

 private:
  void fail(std::string message);
  void check_cache_row(const StepData& step, int64_t t, const std::vector<double>& row);

  OracleModel model_;
  Config config_;
  Tolerance tol_;
  FastRng rng_;
  std::array<int64_t, kNumTokenKinds> quota_{}, next_step_{}, gap_{};
  std::array<KindReport, kNumTokenKinds> reports_{};
  std::vector<std::string> failures_;
  int64_t checked_steps_ = 0, suppressed_ = 0;
};

}  // namespace mla::app
