// SPDX-License-Identifier: Apache-2.0
#include "check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/numeric.h"
#include "mla/error.h"

namespace mla::app {

namespace {

constexpr std::size_t kMaxMessages = 10;

double bf16_value(uint16_t bits) { return num::bf16_to_float(bits); }
bool bf16_finite(uint16_t bits) { return (bits & 0x7f80u) != 0x7f80u; }
// One e4m3 step at |x| (3 mantissa bits, normals from 2^-6 down to the subnormal quantum 2^-9).
double e4m3_step(double x) {
  const double a = std::fabs(x);
  int e = a > 0 ? std::ilogb(a) : -6;
  return std::ldexp(1.0, std::max(e, -6) - 3);
}

// Gap from an e4m3 code's magnitude to the next code up (448 -> 480: one more step of its binade).
double e4m3_gap_up(uint8_t code) {
  const uint8_t mag = code & 0x7fu;
  if (mag >= 0x7eu) return 32.0;
  return num::e4m3_to_float(static_cast<uint8_t>(mag + 1)) - num::e4m3_to_float(mag);
}

double e2m1_gap_up(uint8_t code) {
  const uint8_t mag = code & 0x7u;
  return mag == 7 ? 2.0 : num::e2m1_to_float(static_cast<uint8_t>(mag + 1)) - num::e2m1_to_float(mag);
}

}  // namespace

void dequantize_output(OutputQuant key, const uint8_t* codes, const void* scales, float scale, int64_t T, int64_t W,
                       double* values, double* steps) {
  const int64_t G = output_quant_group(key);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j) {
      const int64_t at = t * W + j;
      if (key == OutputQuant::nvfp4) {
        const uint8_t byte = codes[t * (W / 2) + j / 2];
        const uint8_t code = j % 2 == 0 ? byte & 0xfu : byte >> 4;
        const double m = static_cast<double>(num::e4m3_to_float(static_cast<const uint8_t*>(scales)[t * (W / 16) + j / 16])) /
                         scale;
        values[at] = num::e2m1_to_float(code) * m;
        steps[at] = e2m1_gap_up(code) * std::fabs(m);
        continue;
      }
      const uint8_t code = codes[at];
      const double s = key == OutputQuant::fp8 ? scale : static_cast<const float*>(scales)[(j / G) * T + t];
      values[at] = num::e4m3_to_float(code) * s;
      steps[at] = e4m3_gap_up(code) * std::fabs(s);
    }
}

OracleCheck::OracleCheck(const OracleModel& model, const Config& config)
    : model_(model), config_(config), tol_(bf16_layer_tolerance()), rng_(config.seed ^ 0xc4ecull) {
  // Samples split evenly over the three token kinds, spread over the first half of the planned steps
  // so that the quota is met even when the trace ends early.
  for (int k = 0; k < kNumTokenKinds; ++k) {
    quota_[k] = (config.samples + kNumTokenKinds - 1 - k) / kNumTokenKinds;
    gap_[k] = quota_[k] > 0 ? std::max<int64_t>(1, config.steps / (2 * quota_[k])) : 1;
    next_step_[k] = 0;
  }
}

int64_t OracleCheck::total_samples() const {
  int64_t n = 0;
  for (const auto& r : reports_) n += r.samples;
  return n;
}

void OracleCheck::fail(std::string message) {
  if (failures_.size() < kMaxMessages) failures_.push_back(std::move(message));
  else ++suppressed_;
}

std::vector<int64_t> OracleCheck::pick(const StepBatch& batch) {
  // At most one token of each kind per step, every gap_ steps until the kind's quota is met.
  std::vector<int64_t> tokens;
  for (int k = 0; k < kNumTokenKinds; ++k) {
    const int64_t have = batch.tokens_of_kind[k];
    if (have == 0 || reports_[k].samples >= quota_[k] || batch.step < next_step_[k]) continue;
    int64_t nth = rng_.below(have);
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      if (static_cast<int>(batch.kind_of_token(t)) != k) continue;
      if (nth-- == 0) {
        tokens.push_back(t);
        break;
      }
    }
    next_step_[k] = batch.step + gap_[k];
  }
  return tokens;
}

void OracleCheck::check_cache_row(const StepData& s, int64_t t, const std::vector<double>& row) {
  const ModelDims& d = model_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const int64_t slot = s.batch->slot_mapping[static_cast<std::size_t>(t)];
  double worst = 0;
  int64_t worst_col = -1;
  for (int64_t i = 0; i < L + R; ++i) {
    const double x = i < L ? bf16_value(s.kv_c[t * L + i]) : bf16_value(s.k_pe[t * R + (i - L)]);
    const double got = row[static_cast<std::size_t>(i)];
    // bf16 and every rope value of fp8_ds_mla are copies; fp8 rounds x/scale to one e4m3 step.
    double allowed = 0;
    if (config_.format == CacheFormat::fp8) {
      allowed = e4m3_step(x / config_.fp8_scale) * config_.fp8_scale;
    } else if (config_.format == CacheFormat::fp8_ds_mla && i < L) {
      float tile_scale;
      const int64_t page = config_.page_size;
      std::memcpy(&tile_scale, s.page(slot / page) + (slot % page) * ds_mla::kEntryBytes + ds_mla::kScaleOffset +
                                   4 * (i / ds_mla::kTile),
                  4);
      allowed = e4m3_step(x / tile_scale) * tile_scale;
    }
    const double excess = std::fabs(got - x) - allowed;
    if (!(excess <= 0) && (worst_col < 0 || excess > worst)) {
      worst = excess;
      worst_col = i;
    }
  }
  if (worst_col >= 0) {
    const double x = worst_col < L ? bf16_value(s.kv_c[t * L + worst_col])
                                   : bf16_value(s.k_pe[t * R + (worst_col - L)]);
    fail(fmt::format("step {} token {}: cache row at slot {} column {} holds {:.6g}, the input was {:.6g} ({} cache)",
                     s.batch->step, t, slot, worst_col, row[static_cast<std::size_t>(worst_col)], x,
                     to_string(config_.format)));
  }
}

void OracleCheck::check(const StepData& s, const std::vector<int64_t>& tokens) {
  const StepBatch& batch = *s.batch;
  const ModelDims& d = model_.dims;
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, V = d.v_head_dim,
                L = d.kv_lora_rank, D = L + R;
  const int64_t T = batch.num_tokens(), page = config_.page_size;
  const int64_t entry = cache_entry_bytes(config_.format, static_cast<int>(D));
  ++checked_steps_;

  // Every output of the step must be finite: rows were NaN-poisoned before the layer ran.
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < T * H * V; ++i)
    if (!(s.out_values ? std::isfinite(s.out_values[i]) : bf16_finite(s.out[i])) && bad++ == 0) first_bad = i;
  if (bad > 0)
    fail(fmt::format("step {}: {} of {} output values are not finite, the first at token {} head {} "
                     "(an output row the layer did not write, or a read of a NaN-poisoned cache page)",
                     batch.step, bad, T * H * V, first_bad / (H * V), first_bad % (H * V) / V));

  auto cache_row = [&](int64_t b, int64_t pos, double* out) {
    const int32_t block = batch.block_table[static_cast<std::size_t>(b * batch.max_blocks + pos / page)];
    dequantize_cache_row(config_.format, config_.fp8_scale, s.page(block) + (pos % page) * entry,
                         static_cast<int>(D), static_cast<int>(R), out);
  };

  std::map<int64_t, std::vector<int64_t>> by_request;
  for (int64_t t : tokens) by_request[batch.token_req[static_cast<std::size_t>(t)]].push_back(t);
  for (const auto& [b, toks] : by_request) {
    const ScheduledRequest& sr = batch.reqs[static_cast<std::size_t>(b)];
    const int64_t ctx = sr.num_computed, seq_len = ctx + sr.num_new;
    const int64_t q0 = batch.query_start_loc[static_cast<std::size_t>(b)];
    // Dense prefill tokens attend to their own step's new tokens as the layer received them (kv_c,
    // k_pe); everything else (decode, context, sparse) reads the cache rows the step left behind.
    const bool new_from_input = !config_.sparse && toks.front() >= s.plan->split.num_decode_tokens;

    std::vector<std::vector<int64_t>> visible_pos(toks.size());
    std::vector<int64_t> index_of(static_cast<std::size_t>(seq_len), -1), positions;
    for (std::size_t i = 0; i < toks.size(); ++i) {
      const int64_t t = toks[i], pos = batch.token_pos[static_cast<std::size_t>(t)];
      auto& vis = visible_pos[i];
      if (config_.sparse) {
        for (int64_t j = 0; j < s.topk_width && s.topk[t * s.topk_width + j] >= 0; ++j)
          vis.push_back(s.topk[t * s.topk_width + j]);
      } else {
        for (int64_t j = 0; j <= pos; ++j) vis.push_back(j);
      }
      for (int64_t p : vis) {
        if (p < 0 || p > pos)
          throw Error(fmt::format("oracle: token {} at position {} lists key {} outside its causal range", t, pos, p));
        if (index_of[static_cast<std::size_t>(p)] < 0) {
          index_of[static_cast<std::size_t>(p)] = static_cast<int64_t>(positions.size());
          positions.push_back(p);
        }
      }
    }
    std::vector<double> rows(positions.size() * static_cast<std::size_t>(D));
    for (std::size_t k = 0; k < positions.size(); ++k) {
      const int64_t p = positions[k];
      double* row = rows.data() + k * static_cast<std::size_t>(D);
      if (new_from_input && p >= ctx) {
        const int64_t u = q0 + (p - ctx);
        for (int64_t i = 0; i < L; ++i) row[i] = bf16_value(s.kv_c[u * L + i]);
        for (int64_t i = 0; i < R; ++i) row[L + i] = bf16_value(s.k_pe[u * R + i]);
      } else {
        cache_row(b, p, row);
      }
    }
    const UpProjectedKeys keys(model_, std::move(rows));

    for (std::size_t i = 0; i < toks.size(); ++i) {
      const int64_t t = toks[i], pos = batch.token_pos[static_cast<std::size_t>(t)];
      // The token's own cache row must hold its input (written by this step).
      std::vector<double> own(static_cast<std::size_t>(D));
      cache_row(b, pos, own.data());
      check_cache_row(s, t, own);

      std::vector<double> q(static_cast<std::size_t>(H * (P + R)));
      for (std::size_t j = 0; j < q.size(); ++j) q[j] = bf16_value(s.q[t * H * (P + R) + static_cast<int64_t>(j)]);
      std::vector<int64_t> visible;
      for (int64_t p : visible_pos[i]) visible.push_back(index_of[static_cast<std::size_t>(p)]);
      const std::vector<double> ref = oracle_attention(model_, q.data(), keys, visible);
      std::vector<double> got(static_cast<std::size_t>(H * V));
      std::vector<double> step;
      for (std::size_t j = 0; j < got.size(); ++j) {
        const int64_t at = t * H * V + static_cast<int64_t>(j);
        got[j] = s.out_values ? s.out_values[at] : bf16_value(s.out[at]);
        if (s.out_code_step) step.push_back(s.out_code_step[at]);
      }
      const TokenKind kind = sr.kind;
      const bool fp8 = config_.fp8_prefill && kind != TokenKind::decode;
      const Comparison c = compare_bf16(got, ref, fp8 ? fp8_prefill_tolerance() : tol_, s.out_code_step ? &step : nullptr);

      KindReport& rep = reports_[static_cast<int>(kind)];
      ++rep.samples;
      rep.max_keys = std::max<int64_t>(rep.max_keys, static_cast<int64_t>(visible.size()));
      rep.max_abs_err = std::max(rep.max_abs_err, c.max_abs_err);
      rep.kappa_needed = std::max(rep.kappa_needed, c.kappa_needed);
      if (c.worst_ratio >= rep.worst_ratio) {
        rep.worst_ratio = c.worst_ratio;
        rep.err_at_worst = std::fabs(c.got_at_worst - c.ref_at_worst);
        rep.bound_at_worst = c.bound_at_worst;
      }
      if (!c.ok)
        fail(fmt::format("step {} token {} ({} token of request {}, position {}, {} keys): head {} dim {}: {}",
                         batch.step, t, to_string(kind), sr.request, pos, visible.size(), c.worst_index / V,
                         c.worst_index % V, c.problem));
    }
  }
}

}  // namespace mla::app
