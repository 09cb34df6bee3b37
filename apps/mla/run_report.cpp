// SPDX-License-Identifier: Apache-2.0
// The summary `mla run` prints, and its JSON record.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mla/error.h"
#include "run_internal.h"

namespace mla::app {

double RunStats::forward_seconds() const {
  double s = 0;
  for (const auto& r : steps) s += r.seconds;
  return s;
}

int64_t RunStats::tokens() const {
  int64_t n = 0;
  for (const auto& r : steps) n += r.decode_tokens + r.prefill_tokens;
  return n;
}

namespace {

const char* model_title(const std::string& m) {
  if (m == "v2-lite") return "DeepSeek-V2-Lite";
  if (m == "v3.2") return "DeepSeek-V3.2";
  if (m == "r1") return "DeepSeek-R1";
  if (m == "v3") return "DeepSeek-V3";
  if (m == "v4-flash") return "DeepSeek-V4-Flash";
  if (m == "v4-pro") return "DeepSeek-V4-Pro";
  if (m == "v41-flash") return "DeepSeek-V4.1-Flash";
  return m.c_str();  // a checkpoint's model_type
}

// Steps grouped by what they contained, in the planner's terms.
enum StepKind { kDecodeOnly = 0, kMixed = 1, kPrefillOnly = 2, kNumStepKinds = 3 };
const char* step_kind_name(int k) {
  static const char* names[] = {"decode-only", "mixed", "prefill-only"};
  return names[k];
}
int step_kind(const StepRecord& r) {
  if (r.prefill_tokens == 0) return kDecodeOnly;
  return r.decode_tokens == 0 ? kPrefillOnly : kMixed;
}

struct KindTotals {
  int64_t steps = 0, decode = 0, prefill = 0;
  double seconds = 0;
};

std::array<KindTotals, kNumStepKinds> by_step_kind(const RunStats& s) {
  std::array<KindTotals, kNumStepKinds> k{};
  for (const auto& r : s.steps) {
    KindTotals& t = k[static_cast<std::size_t>(step_kind(r))];
    ++t.steps;
    t.decode += r.decode_tokens;
    t.prefill += r.prefill_tokens;
    t.seconds += r.seconds;
  }
  return k;
}

double rate(double n, double secs) { return secs > 0 ? n / secs : 0.0; }

// The sparse fp8_ds_mla prefill mode the run's plans take: "mixed", "separate", or "" (no such choice).
const char* sparse_prefill_name(const RunConfig& c) {
  if (!c.sparse || c.format != CacheFormat::fp8_ds_mla) return "";
  // The planners' decision (with --dcp, each rank plans its share of the heads: rank 0's stands for all).
  const PlannerConfig pc = c.dcp > 1 ? rank_planner_config(c, 0, c.device) : planner_config(c);
  return pc.sparse_mixed_batch() ? "mixed" : "separate";
}

std::string attention_kind(const RunConfig& c) {
  if (c.v4) return "DeepSeek-V4 (sliding window + compressed cache, sink)";
  if (!c.sparse) return "dense";
  const std::string mode = sparse_prefill_name(c);
  return fmt::format("sparse top-{} ({}{})", c.topk, c.real_indexer ? "lightning indexer" : "synthetic rows",
                     mode.empty() ? "" : mode == "mixed" ? ", mixed batch" : ", separate prefill");
}

}  // namespace

void print_header(const RunConfig& c) {
  fmt::print("mla run: {} dims, tp {} -> {} query heads per rank, {} attention, {} cache, page {}\n",
             model_title(c.model), c.tp, c.dims.num_heads, attention_kind(c), to_string(c.format), c.trace.page_size);
  fmt::print("  backend {}: {}{}\n", c.cuda ? "cuda" : "cpu", c.device_name,
             c.batch_invariant ? "; batch-invariant decode (PlannerConfig::batch_invariant)" : "");
  fmt::print("  trace: {} requests over up to {} steps, {} tokens per step, {} running, context <= {}, seed {}\n",
             c.trace.num_requests, c.steps, c.trace.token_budget, c.trace.max_num_seqs, c.trace.max_context, c.seed);
  if (c.out_quant != OutputQuant::none || c.kv_scales != KvScales::fixed)
    fmt::print("  output {}, fp8 cache scale {}\n", to_string(c.out_quant),
               c.kv_scales == KvScales::fixed ? "fixed" : "from the first batch (--kv-scales auto)");
  for (const auto& n : c.notes) fmt::print("  note: {}\n", n);
  std::fflush(stdout);
}

void print_summary(const RunConfig& c, const RunStats& s, const OracleCheck& check) {
  const double fwd = s.forward_seconds();
  std::vector<double> times;
  for (const auto& r : s.steps) times.push_back(r.seconds);
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  const double maxt = times.empty() ? 0 : times.back();
  const auto kinds = by_step_kind(s);
  int64_t decode = 0, prefill = 0, ctx_rows = 0;
  std::array<int64_t, kNumTokenKinds> kind_tokens{};
  for (const auto& r : s.steps) {
    decode += r.decode_tokens;
    prefill += r.prefill_tokens;
    ctx_rows += r.context_rows;
    for (std::size_t k = 0; k < kind_tokens.size(); ++k) kind_tokens[k] += r.kind_tokens[k];
  }
  const auto n_steps = static_cast<double>(std::max<std::size_t>(s.steps.size(), 1));

  fmt::print("\n== summary: {} attention, {} cache, backend {} ({}) ==\n", attention_kind(c), to_string(c.format),
             c.cuda ? "cuda" : "cpu", c.device_name);
  fmt::print("steps         {} ({} decode-only, {} mixed, {} prefill-only); {} of {} requests finished\n",
             s.steps.size(), kinds[kDecodeOnly].steps, kinds[kMixed].steps, kinds[kPrefillOnly].steps,
             s.requests_finished, c.trace.num_requests);
  fmt::print("forward time  {:.3f} s; per step mean {:.2f} ms, median {:.2f} ms, max {:.2f} ms\n", fwd,
             1e3 * fwd / n_steps, 1e3 * median, 1e3 * maxt);
  fmt::print("wall time     {:.2f} s (setup {:.2f}, inputs {:.2f}, indexer {:.2f}, oracle checks {:.2f}, other {:.2f} s)\n",
             s.wall_seconds, s.setup_seconds, s.inputs_seconds, s.indexer_seconds, s.check_seconds,
             s.wall_seconds - s.setup_seconds - s.inputs_seconds - s.indexer_seconds - s.check_seconds - fwd);

  fmt::print("\n{:<26}{:>10}{:>14}\n", "phase (planner split)", "tokens", "tokens/s");
  fmt::print("{:<26}{:>10}{:>14.1f}\n", "decode", decode, rate(double(decode), fwd));
  fmt::print("{:<26}{:>10}{:>14.1f}\n", "prefill", prefill, rate(double(prefill), fwd));
  fmt::print("{:<26}{:>10}\n", "  chunk of a longer prompt", kind_tokens[static_cast<int>(TokenKind::context_prefill)]);
  fmt::print("{:<26}{:>10}\n", "  first chunk", kind_tokens[static_cast<int>(TokenKind::fresh_prefill)]);
  if (!c.sparse) fmt::print("{:<26}{:>10}\n", "  context rows re-read", ctx_rows);
  fmt::print("{:<26}{:>10}{:>14.1f}\n", "all", decode + prefill, rate(double(decode + prefill), fwd));
  fmt::print("(a phase's tokens over the whole forward time; steps that hold only one phase are below)\n");

  fmt::print("\n{:<14}{:>7}{:>12}{:>13}{:>11}{:>12}\n", "step kind", "steps", "decode tok", "prefill tok", "ms/step",
             "tokens/s");
  for (int k = 0; k < kNumStepKinds; ++k) {
    const KindTotals& t = kinds[static_cast<std::size_t>(k)];
    if (t.steps == 0) continue;
    fmt::print("{:<14}{:>7}{:>12}{:>13}{:>11.2f}{:>12.1f}\n", step_kind_name(k), t.steps, t.decode, t.prefill,
               1e3 * t.seconds / double(t.steps), rate(double(t.decode + t.prefill), t.seconds));
  }

  fmt::print("\noracle check: float64 naive MHA with explicit kv_b_proj up-projection over the keys each token may "
             "see;\n  bound per element = 2|bf16(ref)-ref| + ulp_bf16(ref) + {:g} * 2^-8 * max|ref of the token|{}\n",
             check.tolerance().kappa,
             c.out_quant == OutputQuant::none
                 ? ""
                 : fmt::format(" + one {} code step (the dequantised output)", to_string(c.out_quant)));
  if (c.fp8_prefill)
    fmt::print("  prefill tokens (--fp8-prefill, e4m3 q, k, v and P): {:g} * 2^-8 * max|ref of the token| instead\n",
               fp8_prefill_tolerance().kappa);
  if (!check.enabled()) {
    fmt::print("  skipped (--check-samples 0)\n");
    return;
  }
  for (int k = 0; k < kNumTokenKinds; ++k) {
    const KindReport& r = check.reports()[static_cast<std::size_t>(k)];
    if (r.samples == 0) {
      fmt::print("  {:<16} no token sampled{}\n", to_string(static_cast<TokenKind>(k)),
                 kind_tokens[static_cast<std::size_t>(k)] == 0 ? " (none in this trace)" : "");
      continue;
    }
    fmt::print("  {:<16} {:>3} tokens (up to {} keys): max |err| {:.3g}; worst err/bound {:.3f} (err {:.3g}, bound "
               "{:.3g})\n",
               to_string(static_cast<TokenKind>(k)), r.samples, r.max_keys, r.max_abs_err, r.worst_ratio,
               r.err_at_worst, r.bound_at_worst);
  }
  if (check.passed()) {
    fmt::print("  PASSED: {} tokens over {} steps match the oracle\n", check.total_samples(), check.checked_steps());
    return;
  }
  const std::string head =
      check.total_samples() == 0 ? "ORACLE CHECK FAILED: no token was checked (the trace ended before a sample step)"
                                 : fmt::format("ORACLE CHECK FAILED ({} problem(s){}):", check.num_failures(),
                                               check.num_failures() > static_cast<int64_t>(check.failures().size())
                                                   ? fmt::format(", the first {} listed", check.failures().size())
                                                   : "");
  fmt::print("  {}\n", head);
  for (const auto& f : check.failures()) fmt::print("    {}\n", f);
  std::fflush(stdout);
  // The verdict also goes to stderr, for logs that keep only that stream.
  fmt::print(stderr, "mla run: {}\n", head);
  if (!check.failures().empty()) fmt::print(stderr, "  {}\n  (all of them in the summary on stdout)\n", check.failures().front());
}

void write_json(OutputFile& out, const RunConfig& c, const RunStats& s, const OracleCheck& check) {
  nlohmann::json j;
  j["version"] = version_string();
  j["backend"] = c.cuda ? "cuda" : "cpu";
  j["device"] = c.device_name;
  j["config"] = {{"model", c.model},
                 {"tp", c.tp},
                 {"heads_per_rank", c.dims.num_heads},
                 {"sparse", c.sparse},
                 {"topk", c.topk},
                 {"topk_source", c.sparse ? (c.real_indexer ? "indexer" : "synthetic") : ""},
                 {"sparse_prefill", sparse_prefill_name(c)},
                 {"batch_invariant", c.batch_invariant},
                 {"cache", to_string(c.format)},
                 {"out_quant", to_string(c.out_quant)},
                 {"kv_scales", c.kv_scales == KvScales::fixed ? "fixed" : "auto"},
                 {"fp8_prefill", c.fp8_prefill},
                 {"page_size", c.trace.page_size},
                 {"steps", c.steps},
                 {"requests", c.trace.num_requests},
                 {"max_context", c.trace.max_context},
                 {"token_budget", c.trace.token_budget},
                 {"max_seqs", c.trace.max_num_seqs},
                 {"dcp", c.dcp},
                 {"dcp_interleave", c.dcp_interleave},
                 {"seed", c.seed},
                 {"check_samples", c.check_samples}};
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& r : s.steps)
    steps.push_back({{"decode_tokens", r.decode_tokens},
                     {"prefill_tokens", r.prefill_tokens},
                     {"context_rows", r.context_rows},
                     {"requests", r.num_reqs},
                     {"seconds", r.seconds}});
  j["steps"] = steps;
  int64_t decode = 0, prefill = 0;
  for (const auto& r : s.steps) {
    decode += r.decode_tokens;
    prefill += r.prefill_tokens;
  }
  const double fwd = s.forward_seconds();
  j["totals"] = {{"forward_seconds", fwd},
                 {"wall_seconds", s.wall_seconds},
                 {"setup_seconds", s.setup_seconds},
                 {"inputs_seconds", s.inputs_seconds},
                 {"indexer_seconds", s.indexer_seconds},
                 {"check_seconds", s.check_seconds},
                 {"decode_tokens", decode},
                 {"prefill_tokens", prefill},
                 {"decode_tokens_per_s", rate(double(decode), fwd)},
                 {"prefill_tokens_per_s", rate(double(prefill), fwd)},
                 {"tokens_per_s", rate(double(decode + prefill), fwd)},
                 {"requests_finished", s.requests_finished}};
  nlohmann::json kinds = nlohmann::json::object();
  for (int k = 0; k < kNumTokenKinds; ++k) {
    const KindReport& r = check.reports()[static_cast<std::size_t>(k)];
    kinds[to_string(static_cast<TokenKind>(k))] = {{"samples", r.samples},
                                                   {"max_keys", r.max_keys},
                                                   {"max_abs_err", r.max_abs_err},
                                                   {"worst_err_over_bound", r.worst_ratio},
                                                   {"kappa_needed", r.kappa_needed}};
  }
  j["oracle"] = {{"enabled", check.enabled()},
                 {"passed", check.enabled() && check.passed()},
                 {"kappa", check.tolerance().kappa},
                 {"samples", check.total_samples()},
                 {"by_token_kind", kinds},
                 {"num_failures", check.num_failures()},
                 {"failures", check.failures()}};
  out.write(j.dump(2) + "\n");
}

}  // namespace mla::app
