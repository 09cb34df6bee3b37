// SPDX-License-Identifier: Apache-2.0
// Fuzz target: make_plan over hostile configs and batches (any cache-format byte, page sizes,
// workspace rows and counts up to the int64 edges, unordered or inconsistent batches, padding).
// Contract: either mla::Error, or a sealed plan that covers every token and every context position:
//   * decode runs cover exactly the decode requests with tokens, at their query offsets, with block
//     columns covering their sequences; the prefill query offsets are the batch's, rebased;
//   * dense: every prefill's context [0, context) is covered by the chunks in order, with no gap and
//     no overlap; a non-empty context never gets zero chunks; no chunk exceeds the workspace rows;
//   * sparse separate mode: the chunks tile the prefills and their tokens, each within the workspace;
//   * metadata and workspace stay within the size queries (max_step_metadata_bytes,
//     MlaAttention::max_workspace_bytes) for the plan's token count.
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

#include "fuzz/fuzz_util.h"
#include "mla/layer.h"
#include "mla/plan.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

// One small CPU layer per (format, sparse, heads, topk): workspace_bytes / max_workspace_bytes only.
const MlaAttention& layer_for(const LayerOptions& o) {
  static std::map<std::tuple<int, bool, int, int>, std::unique_ptr<MlaAttention>> layers;
  // Hostile head counts and top-k values make many shapes: keep at most 128 (~400 MB; keeping every
  // one ran past libFuzzer's 2 GB limit after 582k executions, keeping 16 rebuilt layers so often
  // that the target ran 3x slower).
  if (layers.size() >= 128) layers.clear();
  auto& slot = layers[{static_cast<int>(o.cache_format), o.sparse, o.dims.num_heads, o.dims.index_topk}];
  if (!slot) {
    const ModelDims& d = o.dims;
    Tensor w = Tensor::zeros({int64_t{d.num_heads} * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank}, DType::bf16);
    slot = std::make_unique<MlaAttention>(o, w.view());
  }
  return *slot;
}

void check_plan(const Plan& p, const BatchDesc& b, const PlannerConfig& c) {
  FUZZ_REQUIRE(p.seal != 0 && p.seal == plan_digest(p), "plan not sealed");
  const int64_t nr = static_cast<int64_t>(b.seq_lens.size());
  FUZZ_REQUIRE(p.num_reqs == nr && p.num_actual_tokens == b.query_start_loc.back() &&
                   p.num_tokens >= p.num_actual_tokens,
               "counts: %lld requests, %lld / %lld tokens", static_cast<long long>(p.num_reqs),
               static_cast<long long>(p.num_actual_tokens), static_cast<long long>(p.num_tokens));
  const Split& s = p.split;
  FUZZ_REQUIRE(s.num_decodes >= 0 && s.num_prefills >= 0 && s.num_decodes + s.num_prefills == nr &&
                   s.num_decode_tokens + s.num_prefill_tokens == p.num_tokens,
               "split does not cover the batch");
  auto q = [&](int64_t r) { return int64_t{b.query_start_loc[r + 1]} - b.query_start_loc[r]; };
  // Decode runs: every decode request with tokens in exactly one run, at its own offset.
  if (!c.sparse) {
    std::vector<int> covered(static_cast<std::size_t>(nr), 0);
    for (const DecodeRun& r : p.decode.runs) {
      FUZZ_REQUIRE(0 <= r.req_begin && r.req_begin < r.req_end && r.req_end <= s.num_decodes && r.s_q >= 1 &&
                       r.num_splits >= 1 && r.num_splits <= kDecodeMaxSplits &&
                       (!c.batch_invariant || (r.num_splits == batch_invariant_splits(c, r.s_q) && !r.whole_requests)),
                   "decode run [%lld, %lld) s_q %lld", static_cast<long long>(r.req_begin),
                   static_cast<long long>(r.req_end), static_cast<long long>(r.s_q));
      for (int64_t i = r.req_begin; i < r.req_end; ++i) {
        ++covered[static_cast<std::size_t>(i)];
        FUZZ_REQUIRE(q(i) == r.s_q && b.query_start_loc[i] == r.token_begin + (i - r.req_begin) * r.s_q &&
                         b.seq_lens[i] <= r.block_cols * c.page_size,
                     "decode request %lld misplaced in its run", static_cast<long long>(i));
      }
    }
    for (int64_t i = 0; i < s.num_decodes; ++i)
      FUZZ_REQUIRE(covered[i] == (q(i) > 0 ? 1 : 0), "decode request %lld in %d runs", static_cast<long long>(i),
                   covered[i]);
  }
  // Prefills.
  const int64_t nd = s.num_decodes, np = s.num_prefills;
  if (np > 0) {
    FUZZ_REQUIRE(static_cast<int64_t>(p.prefill_query_start_loc.size()) == np + 1, "prefill offsets");
    for (int64_t i = 0; i <= np; ++i)
      FUZZ_REQUIRE(p.prefill_query_start_loc[i] == b.query_start_loc[nd + i] - b.query_start_loc[nd],
                   "prefill offset %lld", static_cast<long long>(i));
    int64_t longest = 0;
    for (int64_t i = 0; i < np; ++i) longest = std::max(longest, q(nd + i));
    FUZZ_REQUIRE(p.max_prefill_query_len == longest, "max_prefill_query_len");
  }
  if (!c.sparse && np > 0) {
    const ContextPlan& cp = p.context;
    std::vector<int64_t> next(static_cast<std::size_t>(np), 0);  // next uncovered context position
    bool any_context = false;
    for (int64_t i = 0; i < np; ++i) any_context |= p.prefill_context_lens[i] > 0;
    FUZZ_REQUIRE(!any_context || !cp.chunks.empty(), "context present but zero chunks planned");
    for (const ContextChunk& ch : cp.chunks) {
      FUZZ_REQUIRE(static_cast<int64_t>(ch.lens.size()) == np && static_cast<int64_t>(ch.seq_starts.size()) == np &&
                       static_cast<int64_t>(ch.cu_seq_lens.size()) == np + 1 && ch.cu_seq_lens[0] == 0,
                   "chunk arrays");
      FUZZ_REQUIRE(ch.total <= p.config.context_workspace_rows, "chunk of %lld rows > workspace %lld",
                   static_cast<long long>(ch.total), static_cast<long long>(p.config.context_workspace_rows));
      int64_t sum = 0;
      for (int64_t i = 0; i < np; ++i) {
        if (ch.lens[i] > 0) {
          FUZZ_REQUIRE(ch.seq_starts[i] == next[i], "prefill %lld: chunk starts at %d, %lld expected",
                       static_cast<long long>(i), ch.seq_starts[i], static_cast<long long>(next[i]));
          next[i] += ch.lens[i];
        }
        FUZZ_REQUIRE(ch.lens[i] >= 0, "negative chunk length");
        sum += ch.lens[i];
        FUZZ_REQUIRE(ch.cu_seq_lens[i + 1] == sum, "cu_seq_lens");
      }
      FUZZ_REQUIRE(sum == ch.total, "chunk total");
    }
    for (int64_t i = 0; i < np; ++i)
      FUZZ_REQUIRE(next[i] == p.prefill_context_lens[i], "prefill %lld: context %d covered up to %lld",
                   static_cast<long long>(i), p.prefill_context_lens[i], static_cast<long long>(next[i]));
  }
  if (c.sparse && !p.sparse_chunks.empty()) {
    int64_t req = 0, tok = b.query_start_loc[nd];
    for (const SparsePrefillChunk& ch : p.sparse_chunks) {
      FUZZ_REQUIRE(ch.req_begin == req && ch.req_end > ch.req_begin && ch.token_begin == tok &&
                       ch.total_rows <= p.config.sparse_workspace_rows,
                   "sparse chunk does not continue the previous one or overflows the workspace");
      req = ch.req_end;
      tok = ch.token_end;
    }
    FUZZ_REQUIRE(req == np && tok == p.num_actual_tokens, "sparse chunks stop short");
  }
  // Size queries bound the plan.
  // (A bound past size_t, e.g. for max_num_seqs near 2^62, is refused with mla::Error.)
  std::size_t meta_bound = 0;
  if (!rejects([&] { meta_bound = max_step_metadata_bytes(c, p.num_tokens); }))
    FUZZ_REQUIRE(p.metadata.bytes() <= meta_bound, "metadata %zu past its bound %zu", p.metadata.bytes(), meta_bound);
  if (c.dims.num_heads <= 128 && (!c.sparse || c.dims.index_topk > 0)) {  // (a layer refuses sparse topk 0)
    LayerOptions o;
    o.dims = c.dims;
    o.cache_format = c.cache_format;
    o.sparse = c.sparse;
    const MlaAttention& layer = layer_for(o);
    std::size_t bound = 0;
    if (!rejects([&] { bound = layer.max_workspace_bytes(c, p.num_tokens); }))
      FUZZ_REQUIRE(layer.workspace_bytes(p) <= bound, "workspace %zu past max_workspace_bytes %zu",
                   layer.workspace_bytes(p), bound);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  PlannerConfig c;
  c.dims = ModelDims::deepseek_v3(1);
  c.dims.qk_nope_head_dim = c.dims.v_head_dim = 16;  // small layers for the workspace query
  c.dims.num_heads = static_cast<int>(in.pick({1, 4, 32, 128, static_cast<int>(in.hostile(1, 300))}));
  c.sparse = in.flag();
  c.dims.index_topk = c.sparse ? static_cast<int>(in.pick({16, 64, 2048, static_cast<int>(in.hostile(0, 100))})) : 0;
  const uint8_t fmt = in.byte();
  c.cache_format = static_cast<CacheFormat>(fmt % 8 < 7 ? fmt % 3 : fmt);  // mostly valid, sometimes any byte
  c.page_size = in.pick({int64_t{1}, int64_t{16}, int64_t{64}, in.hostile(1, 300)});
  c.max_model_len = in.flag() ? in.range(1, 600) : in.hostile(1, 1 << 20);
  c.max_num_seqs = in.hostile(1, 16);
  c.decode_threshold = in.hostile(1, 8);
  c.require_uniform = in.flag();
  c.context_workspace_rows = in.flag() ? 0 : in.hostile(0, 2048);
  c.sparse_workspace_rows = in.flag() ? 0 : in.hostile(0, 4096);
  c.num_sms = static_cast<int>(in.hostile(0, 200));
  c.batch_invariant = in.byte() % 4 == 0;

  // The batch: mostly well-formed (decodes, extends, prefills in that order, lengths within the
  // config), with hostile values mixed in by the reader.
  const bool ordered = in.byte() % 4 != 0;
  const int64_t nr = in.range(0, 12);
  std::vector<int64_t> qlen, ctx;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t region = ordered ? std::min<int64_t>(2, r * 3 / std::max<int64_t>(nr, 1)) : in.range(0, 2);
    qlen.push_back(region == 0 ? in.hostile(0, c.decode_threshold) : in.hostile(0, 60));
    ctx.push_back(region == 2 ? 0 : in.hostile(0, 400));
  }
  BatchDesc b;
  int64_t at = 0;
  b.query_start_loc.push_back(0);
  for (int64_t r = 0; r < nr; ++r) {
    at = wrap_add(at, qlen[r]);
    b.query_start_loc.push_back(static_cast<int32_t>(at));  // wraps on hostile lengths: must be refused
    b.seq_lens.push_back(static_cast<int32_t>(wrap_add(qlen[r], ctx[r])));
  }
  if (in.byte() % 16 == 0) b.seq_lens.push_back(1);  // one too many
  b.num_tokens = in.flag() ? -1 : wrap_add(b.query_start_loc.back(), in.hostile(0, 8));
  b.decode_seq_len_bound = in.byte() % 4 == 0 ? in.hostile(0, 700) : 0;
  // A plan's size grows with the token count and with the context chunks (context / workspace rows), and
  // batches of up to 2^31 - 1 tokens or context positions are valid: planning one of 9e8 tokens, or a 2^31
  // context through a 229-row workspace (9.4e6 chunks), needs gigabytes, past libFuzzer's 2 GB limit (the fuzzer
  // reached both), and large valid sizes make every run slow. Valid sizes past 2^16 are left out;
  // out-of-range ones (refused before any allocation) stay.
  constexpr int64_t kBig = int64_t{1} << 16;
  const auto huge = [](int64_t v) { return v > kBig && v <= std::numeric_limits<int32_t>::max(); };
  if (huge(b.num_tokens) || std::any_of(b.query_start_loc.begin(), b.query_start_loc.end(), huge)) return 0;
  if (std::any_of(b.seq_lens.begin(), b.seq_lens.end(), [&](int32_t s) { return s > kBig && s <= c.max_model_len; }))
    return 0;

  if (std::getenv("FUZZ_VERBOSE")) {  // describe the call (for reproducers)
    std::fprintf(stderr, "config: heads %d sparse %d topk %d format %d page %lld max_model_len %lld max_num_seqs %lld "
                 "decode_threshold %lld uniform %d context_rows %lld sparse_rows %lld sms %d batch_invariant %d\n"
                 "batch: num_tokens %lld "
                 "bound %lld, query_start_loc:", c.dims.num_heads, c.sparse, c.dims.index_topk,
                 static_cast<int>(c.cache_format), static_cast<long long>(c.page_size),
                 static_cast<long long>(c.max_model_len), static_cast<long long>(c.max_num_seqs),
                 static_cast<long long>(c.decode_threshold), c.require_uniform,
                 static_cast<long long>(c.context_workspace_rows), static_cast<long long>(c.sparse_workspace_rows),
                 c.num_sms, c.batch_invariant, static_cast<long long>(b.num_tokens),
                 static_cast<long long>(b.decode_seq_len_bound));
    for (int32_t x : b.query_start_loc) std::fprintf(stderr, " %d", x);
    std::fprintf(stderr, "\nseq_lens:");
    for (int32_t x : b.seq_lens) std::fprintf(stderr, " %d", x);
    std::fprintf(stderr, "\n");
  }
  Plan p;
  if (rejects([&] { p = make_plan(b, c); })) return 0;
  check_plan(p, b, c);
  return 0;
}
