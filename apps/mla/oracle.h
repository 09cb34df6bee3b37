// SPDX-License-Identifier: Apache-2.0
#pragma once
// The float64 oracle of `mla run`: one MLA attention output recomputed the naive way, independently
// of the library's ops — explicit up-projection of every visible latent row with the original
// kv_b_proj weight (K_nope, V per head), per-head softmax(scale * (q_nope·k_nope + q_pe·k_pe)) · V,
// all in float64 — and the tolerance rule that judges the layer's bf16 output against it.
#include <cstdint>
#include <string>
#include <vector>

#include "mla/cache.h"
#include "mla/types.h"

namespace mla::app {

struct OracleModel {
  ModelDims dims;
  std::vector<double> kv_b_proj;  // [h_q * (P + V), L], the values the layer was built from
};

// Latent rows [kv_c (L) | k_pe (R)] in float64, up-projected once for every query that sees them
// (one dgemm: [n, L] x kv_b_proj^T -> [n, h_q * (P + V)]).
class UpProjectedKeys {
 public:
  UpProjectedKeys(const OracleModel& model, std::vector<double> rows);
  int64_t size() const { return n_; }
  const double* latent_row(int64_t i) const { return rows_.data() + i * row_width_; }  // [L + R]
  const double* kv(int64_t i) const { return kv_.data() + i * kv_width_; }             // [h_q, P + V]

 private:
  int64_t n_ = 0, row_width_ = 0, kv_width_ = 0;
  std::vector<double> rows_, kv_;
};

// out [h_q * V] of one query q [h_q, P + R] attending to the key rows `visible` (indices into keys;
// duplicates count twice, as in the sparse kernels). `visible` must not be empty.
std::vector<double> oracle_attention(const OracleModel& model, const double* q, const UpProjectedKeys& keys,
                                     const std::vector<int64_t>& visible);

// Exact dequantised value of a cache row (576 columns), decoded here from the format's byte layout
// (mla_semantics §3) rather than through the CPU backend's reader, so that the oracle shares no code
// with the path it checks. `row` points at the row's first byte.
void dequantize_cache_row(CacheFormat format, float fp8_scale, const uint8_t* row, int d_qk, int d_rope, double* out);

// DESIGN.md §5 for a bf16 output, per element i of one token's output row:
//   |got - ref| <= 2 |bf16(ref) - ref| + ulp_bf16(ref) + kappa * u * max_j |ref_j|
// The first two terms are the rule as written (twice the storage rounding plus one quantum). The
// third is the adaptation to a layer whose intermediates are bf16 tensors too (absorbed query or
// up-projected K/V, latent output, merged partials): each such rounding perturbs the result by at
// most about one unit roundoff u = 2^-8 of the row's scale; kappa counts them (oracle.cpp).
// Non-finite outputs always fail.
struct Tolerance {
  double kappa = 0;
};
Tolerance bf16_layer_tolerance();
// Prefill tokens of a layer with LayerOptions::fp8_prefill against the unquantised oracle: q, k, v and P rounded to
// e4m3 (SEMANTICS §10.1) move an output by a few percent of the row's largest |value| (2^-3 of it here).
Tolerance fp8_prefill_tolerance();

struct Comparison {
  bool ok = true;
  double max_abs_err = 0;   // over the row
  double bound_at_worst = 0;
  double worst_ratio = 0;   // max of err / bound (<= 1 passes)
  int64_t worst_index = -1;
  double got_at_worst = 0, ref_at_worst = 0;
  double max_ref = 0;
  double kappa_needed = 0;  // smallest kappa under which this row passes (how much of the allowance is used)
  std::string problem;  // non-empty when !ok: what went wrong, for the message
};
// extra (optional, one per element): an allowance added to each element's bound (a quantised output's
// one code step, docs/CLI.md "--out-quant").
Comparison compare_bf16(const std::vector<double>& got, const std::vector<double>& ref, const Tolerance& tol,
                        const std::vector<double>* extra = nullptr);

}  // namespace mla::app
