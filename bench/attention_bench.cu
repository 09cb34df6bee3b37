// SPDX-License-Identifier: Apache-2.0
// Attention benchmarks (DESIGN.md §6 formulas):
//   mqa_decode:  default: b in {64, 128} requests x s_k 4096 keys, s_q 1, h in {16, 128}, page 64, bf16
//                and fp8_ds_mla caches; or one shape from the command line (--b --s-q --h-q --s-k --page
//                --format --varlen --sequential-pages); or a named grid (--grid issue7; --grid issue48: issue 48's
//                small steps, graph-replayed, each beside the issue's target time). Split-KV workspace
//                as sized by mqa_decode_workspace_bytes. FLOPs = 2*h*s_q*sum(seq_lens)*(576+512);
//                bytes = sum(seq_lens)*row_bytes (cache rows once) + q + out
//   mha_prefill: default: causal self-attention (b x s tokens, s_q = s_k = s) and a non-causal context
//                chunk; h 128 / 16, d_qk 192 (k_pe shared by all heads), d_v 128; or one shape from the
//                command line (--b --s-q --s-k --h-q --varlen --non-causal); or a named grid (--grid issue9).
//                FLOPs causal = b*h*(s^2/2)*2*(192+128), non-causal = b*h*s_q*s_k*2*(192+128);
//                bytes = q + k_nope + k_pe + v + out (+ lse), each once; rows of >= 5e11 FLOPs are followed
//                by cuBLAS at equal work (report_equal_work_gemm: the ceiling at the same power state)
//   sparse_mqa:  default: T tokens x topk 2048 distinct cache rows (page 64), h 128 / 16, bf16 and
//                fp8_ds_mla; or one shape from the command line (--b = T tokens, --h-q, --topk, --format,
//                --pool = cache rows the indices are drawn from, 0: T*topk rows, each read once); or a named
//                grid (--grid issue8: issue 8's table with FlashMLA's times, h 16 / 32 x topk 512 / 1024 /
//                2048, T 1 / 4 / 16 / 64 at h 16 / 32, bf16 rows, the sparse prefill shapes; --grid v4:
//                DeepSeek-V4's decode shape, d_qk 512 K = V, a 128-row window cache + an extra (compressed)
//                cache of top 512 / 1024 rows at page 64,
//                a per-head sink, h 16 / 64 / 128, bf16, fp8, v4 (both caches) and v41 + v41_fp4 (V4.1's
//                window and compressed records), then T 8 h 16 + 512 extra in v4 and v41 + v41_fp4,
//                graph-replayed, beside issue 47's 12 us target; --grid issue48: fp8_ds_mla T 1 / 8 at h 16 and
//                T 8 at h 64, graph-replayed, beside issue 48's targets). FLOPs = 2*T*h*keys*(d_qk+d_v) with
//                keys = topk (+ extra_topk); bytes = distinct rows * row_bytes + q + out
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mla/block_ops.h"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "mla/variants.h"
#include "cuda/common/trace.cuh"
#include "floor.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr double kScale = 0.0722;  // 1/sqrt(192)

// A block-scaled record cache (v4, v41, v41_fp4) filled through write_cache from uniform bf16 rows in [-1, 1]:
// the writers' own scales and codes.
void fill_record_cache(const KVCache& c, uint64_t seed, void* stream, const Context& op) {
  const Device dev = c.data.device;
  const int64_t n = c.num_slots();
  Tensor kv = Tensor::empty({n, int64_t{c.d_latent()}}, DType::bf16, dev);
  Tensor pe = Tensor::empty({n, int64_t{c.d_rope}}, DType::bf16, dev);
  fill_uniform(kv, -1, 1, seed, stream);
  fill_uniform(pe, -1, 1, seed + 1, stream);
  Tensor slots = Tensor::empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(slots.data())[i] = i;
  const Tensor dslots = slots.to(dev);
  write_cache(kv, pe, dslots, c, DsMlaScale::amax, op);
}

// Bytes from one cache row (slot) to the next: the read floor's stride.
int64_t slot_stride_bytes(const KVCache& c) { return c.data.stride_of(1) * static_cast<int64_t>(c.data.element_size()); }

Tensor device_i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape, Device dev) {
  Tensor h = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), static_cast<int32_t*>(h.data()));
  return h.to(dev);
}

// --trace: the per-CTA stamps of the sm90 decode kernels (cuda/common/trace.cuh) of one call, printed as the
// distribution over CTAs of each event's time after the first CTA's entry, and the CTAs' exit by unit count.
void print_decode_trace(const char* what, const std::vector<uint64_t>& st) {
  using cuda::decode_sm90::kTraceCtas;
  using cuda::decode_sm90::kTraceEvents;
  using cuda::decode_sm90::kTraceStride;
  constexpr int kUnits = 11;  // a value stamp, not a time
  uint64_t t0 = ~uint64_t{0};
  for (int c = 0; c < kTraceCtas; ++c)
    if (st[c * kTraceStride] != 0) t0 = std::min(t0, st[c * kTraceStride]);
  if (t0 == ~uint64_t{0}) return;
  using cuda::decode_sm90::kTracePairBase;
  using cuda::decode_sm90::kTracePairSteps;
  static const char* names[kTracePairBase] = {"entry",      "prod start", "prod done",  "Q loaded",
                                              "first full", "last prod",  "epilogue",   "exit",
                                              "merge bar1", "merge loop", "merge bar2", "units"};
  std::printf("    trace (%s), us after the first CTA's entry over the CTAs that stamped it:\n", what);
  // Event e's stamps (ns) over the CTAs that stamped it, as µs after t0: one line of their distribution.
  auto print_event = [&](const char* name, int e, int width) {
    std::vector<double> v;
    for (int c = 0; c < kTraceCtas; ++c) {
      const uint64_t x = st[c * kTraceStride + e];
      if (x != 0) v.push_back((static_cast<double>(x) - static_cast<double>(t0)) / 1e3);
    }
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    std::printf("      %-*s n %4zu  min %8.2f  p10 %8.2f  med %8.2f  p90 %8.2f  max %8.2f\n", width, name, v.size(),
                v.front(), v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back());
  };
  for (int e = 0; e < kTracePairBase; ++e)
    if (e != kUnits) print_event(names[e], e, 11);
  // The split-KV combine after the kernel, the producer's first two tiles, the small / raw epilogue's steps and the
  // producer's steps inside its first two tiles (trace.cuh events 50..71), on the same clock.
  using cuda::decode_sm90::kTraceCombineBase;
  using cuda::decode_sm90::kTraceProducerBase;
  static const char* cnames[] = {"comb entry", "comb waited", "comb weights", "comb stored", "P tile0 read",
                                 "P tile0 sent", "P tile1 read", "P tile1 sent", "C0 ep start", "C0 ep (m,l)",
                                 "C0 ep weights", "C0 ep end", "C1 ep start", "C1 ep (m,l)", "C1 ep weights",
                                 "C1 ep end", "P t0 empty ok", "P t0 announced", "P t0 panel0", "P t1 empty ok",
                                 "P t1 announced", "P t1 panel0", "pro waited", "pro unit", "pro synced",
                                 "P unit read"};
  static_assert(sizeof(cnames) / sizeof(cnames[0]) == kTraceEvents - kTraceCombineBase);
  for (int k = 0; k < kTraceEvents - kTraceCombineBase; ++k) print_event(cnames[k], kTraceCombineBase + k, 12);
  for (int k = 1; k < 8; ++k) {
    double sum = 0, mx = 0;
    int n = 0;
    for (int c = 0; c < kTraceCtas; ++c) {
      const uint64_t units = st[c * kTraceStride + kUnits], x = st[c * kTraceStride + 7];
      if (x == 0 || static_cast<int>(std::min<uint64_t>(units, 7)) != k) continue;
      const double t = static_cast<double>(x - t0) / 1e3;
      sum += t;
      mx = std::max(mx, t);
      ++n;
    }
    if (n) std::printf("      units %d: %4d CTAs, exit mean %8.2f max %8.2f\n", k, n, sum / n, mx);
  }
  // The same events of the attention kernel on each CTA's own SM clock, after that CTA's entry (cycles: what the
  // global timer's ~0.26 us steps hide), and as us at the clock the CTAs ran at (cycles over ns from entry to exit).
  {
    auto clk = [&](int c, int e) { return st[c * kTraceStride + kTraceEvents + e]; };
    std::vector<double> ghz;
    for (int c = 0; c < kTraceCtas; ++c) {
      const uint64_t g0 = st[c * kTraceStride], g7 = st[c * kTraceStride + 7];
      if (g0 != 0 && g7 > g0 + 2000 && clk(c, 0) != 0 && clk(c, 7) > clk(c, 0))
        ghz.push_back(static_cast<double>(clk(c, 7) - clk(c, 0)) / static_cast<double>(g7 - g0));
    }
    std::sort(ghz.begin(), ghz.end());
    const double f = ghz.empty() ? 0.0 : ghz[ghz.size() / 2];
    std::printf("      the same on each CTA's SM clock, cycles after its entry (us at %.2f GHz):\n", f);
    auto print_cycles = [&](const char* name, int e) {
      std::vector<double> v;
      for (int c = 0; c < kTraceCtas; ++c)
        if (clk(c, 0) != 0 && clk(c, e) != 0) v.push_back(static_cast<double>(static_cast<int64_t>(clk(c, e) - clk(c, 0))));
      if (v.empty()) return;
      std::sort(v.begin(), v.end());
      const double med = v[v.size() / 2];
      std::printf("      %-14s n %4zu  p10 %7.0f  med %7.0f  p90 %7.0f  (%6.2f us)\n", name, v.size(), v[v.size() / 10], med,
                  v[v.size() * 9 / 10], f > 0 ? med / f / 1e3 : 0.0);
    };
    for (int e = 1; e < kTracePairBase; ++e)
      if (e != kUnits) print_cycles(names[e], e);
    for (int k = kTraceProducerBase - kTraceCombineBase; k < kTraceEvents - kTraceCombineBase; ++k)
      print_cycles(cnames[k], kTraceCombineBase + k);
  }
  // The seesaw kernel's pair steps (trace.cuh: SM cycles of pair kTracePair, relative to consumer 0's
  // step 0 of the same CTA).
  static const char* steps[2][kTracePairSteps] = {
      {"start", "rope landed", "P1+remote", "rope+remote", "S done", "m0 pub", "P0, O*a0", "local PV", "m1 read", "end"},
      {"start", "S, max", "m1 pub", "P1 stored", "P0 synced|V4 w1 arrived 0", "local PV|V4 w2 arrived 0",
       "remote PV|V4 w1 arrived 1", "V4 w2 arrived 1", "", ""}};
  bool any = false;
  for (int c = 0; c < kTraceCtas && !any; ++c) any = st[c * kTraceStride + kTracePairBase] != 0;
  if (!any) return;
  std::printf("      pair %d (seesaw), SM cycles after consumer 0's start, over the CTAs that stamped it:\n",
              cuda::decode_sm90::kTracePair);
  // Event e's stamps relative to consumer 0's step 0 of the same CTA, over the CTAs that stamped both, sorted.
  auto cycles = [&](int e) {
    std::vector<double> v;
    for (int c = 0; c < kTraceCtas; ++c) {
      const uint64_t t0c = st[c * kTraceStride + kTracePairBase], t = st[c * kTraceStride + e];
      if (t0c != 0 && t != 0) v.push_back(static_cast<double>(static_cast<int64_t>(t - t0c)));
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  for (int cons = 0; cons < 2; ++cons)
    for (int k = 0; k < kTracePairSteps; ++k) {
      const std::vector<double> v = cycles(kTracePairBase + kTracePairSteps * cons + k);
      if (v.empty()) continue;
      std::printf("      C%d %-12s n %4zu  p10 %8.0f  med %8.0f  p90 %8.0f\n", cons, steps[cons][k], v.size(), v[v.size() / 10],
                  v[v.size() / 2], v[v.size() * 9 / 10]);
    }
  // The producers' slots of the same pair (trace.cuh kTraceProdBase: stage s, slot 3 g + k): the seesaw's release
  // group g step k, the DeepSeek-V4 converter's step 3 g + k (convert/kernel.cuh V4ConvTrace: top, landed,
  // reference, empty, stored, arrived, issued, warp 3 stored, warp 3 arrived).
  static const char* gname[3] = {"rope", "own V", "other V"};
  static const char* kname[3] = {"empty", "landed", "done"};
  static const char* v4name[9] = {"top", "landed", "ref", "empty", "stored", "arrived", "issued", "w3 stored", "w3 arrived"};
  for (int stage = 0; stage < 2; ++stage)
    for (int g = 0; g < 3; ++g)
      for (int k = 0; k < 3; ++k) {
        const std::vector<double> v = cycles(cuda::decode_sm90::kTraceProdBase + 3 * (3 * stage + g) + k);
        if (v.empty()) continue;
        std::printf("      P%d %-7s %-6s | V4 %-10s n %4zu  p10 %8.0f  med %8.0f  p90 %8.0f\n", stage, gname[g], kname[k],
                    v4name[3 * g + k], v.size(), v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10]);
      }
}

void trace_decode_calls(BenchContext& ctx, const std::function<void()>& call) {
  std::vector<uint64_t> st(static_cast<std::size_t>(cuda::decode_sm90::kTraceCtas) * cuda::decode_sm90::kTraceStride);
  call();
  if (!cuda::decode_sm90::trace_dump(st.data())) {
    std::printf("    (--trace: this build has no decode trace; configure with -DMLA_DECODE_TRACE=ON)\n");
    return;
  }
  call();  // warm: right after the previous call
  cuda::decode_sm90::trace_dump(st.data());
  print_decode_trace("warm", st);
  ctx.flush_l2();
  call();
  cuda::decode_sm90::trace_dump(st.data());
  print_decode_trace("cold, after the L2 flush", st);
}

// One mqa_decode shape: b requests of `s_k` keys (varlen: uniform in [1, s_k], seeded), s_q queries,
// h heads, every request's pages scattered over one cache (sequential: request i's pages are i * pages ..,
// as FlashMLA's benchmark builds its block tables). flashmla_us > 0 is printed beside the row.
struct DecodeCase {
  int64_t b, s_q, h, s_k, page;
  CacheFormat format;
  bool varlen;
  double flashmla_us;
  int splits = 0;  // 0: the planner's default
  bool sequential = false;
  bool batch_invariant = false;  // the batch-invariant mode (mla/ops.h): exactly `splits` (or the full-batch policy)
  double target_us = 0;          // > 0: a target time printed beside the row (issue 48's "done when")
  bool graph = false;            // timed graph-replayed (BenchContext::time_graph_ms)
  bool fp8_compute = false;      // mqa_decode's fp8_compute (e4m3 products over an fp8 per-tensor cache)
};

// " target 10 us (x1.83)" after a row's config: the measured time over the target.
std::string target_note(double target_us, double ms) {
  if (target_us <= 0) return {};
  char buf[48];
  std::snprintf(buf, sizeof(buf), " target %.0f us (x%.2f)", target_us, ms * 1e3 / target_us);
  return buf;
}

// Each case, then (when `twin` and `pick` takes it) a copy changed by `mark` right after it: a mode's cost in one run.
template <class Case, class Pick, class Mark>
std::vector<Case> with_twins(const std::vector<Case>& cases, bool twin, Pick&& pick, Mark&& mark) {
  std::vector<Case> out;
  for (const Case& c : cases) {
    out.push_back(c);
    if (!twin || !pick(c)) continue;
    out.push_back(c);
    mark(out.back());
  }
  return out;
}
// Every case again in the batch-invariant mode.
template <class Case>
std::vector<Case> with_batch_invariant_twins(const std::vector<Case>& cases, bool twin) {
  return with_twins(cases, twin, [](const Case&) { return true; }, [](Case& c) { c.batch_invariant = true; });
}
// Every fp8 per-tensor case (outside the batch-invariant mode) again with fp8 compute.
std::vector<DecodeCase> with_fp8_compute_twins(const std::vector<DecodeCase>& cases, bool twin) {
  return with_twins(
      cases, twin, [](const DecodeCase& c) { return c.format == CacheFormat::fp8 && !c.batch_invariant; },
      [](DecodeCase& c) { c.fp8_compute = true; });
}

void run_decode_case(BenchContext& ctx, const DecodeCase& c) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t pages = (c.s_k + c.page - 1) / c.page;
  CacheBuffer cb = allocate_cache(c.format, c.b * pages, c.page, dev, c.format == CacheFormat::fp8 ? 0.01f : 1.0f);
  fill_cache(cb.cache, 61, ctx.stream());
  std::vector<int32_t> table = random_permutation(c.b * pages, 62);
  if (c.sequential) std::iota(table.begin(), table.end(), 0);
  Tensor bt = device_i32(table, {c.b, pages}, dev);
  std::vector<int32_t> lens(static_cast<std::size_t>(c.b), static_cast<int32_t>(c.s_k));
  if (c.varlen) {
    std::mt19937_64 g(64);
    std::uniform_int_distribution<int32_t> u(1, static_cast<int32_t>(c.s_k));
    for (auto& l : lens) l = u(g);
  }
  double keys = 0;
  for (int32_t l : lens) keys += l;
  Tensor sl = device_i32(lens, {c.b}, dev);
  Tensor q = Tensor::empty({c.b, c.s_q, c.h, 576}, DType::bf16, dev);
  fill_uniform(q, -1, 1, 63, ctx.stream());
  Tensor out = Tensor::empty({c.b, c.s_q, c.h, 512}, DType::bf16, dev), lse = Tensor::empty({c.b, c.s_q, c.h}, DType::f32, dev);
  // Batch-invariant rows: the split count of a config whose full batch (max_num_seqs) is this row's b at these
  // lengths (batch_invariant_splits), unless --splits gives one.
  const int splits = c.batch_invariant && c.splits == 0
                         ? decode_num_splits(c.b, c.s_q, c.h, pages * c.page, multiprocessor_count(dev))
                         : c.splits;
  const std::size_t ws_bytes = mqa_decode_workspace_bytes(c.b, c.s_q, c.h, pages * c.page, dev, splits);
  Tensor ws = ws_bytes ? Tensor::empty({static_cast<int64_t>(ws_bytes)}, DType::u8, dev) : Tensor();
  // What a step plan would pass for these host lengths (mla/plan.h DecodeRun::whole_requests), as the layer does.
  bool whole = false;
  if (c.splits == 0 && !c.batch_invariant) {
    std::vector<int32_t> qsl(static_cast<std::size_t>(c.b) + 1);
    for (std::size_t i = 0; i < qsl.size(); ++i) qsl[i] = static_cast<int32_t>(i * c.s_q);
    const DecodeSchedule sched = plan_decode_schedule(qsl, lens, c.b, c.page, c.h, multiprocessor_count(dev));
    whole = sched.runs.size() == 1 && sched.runs[0].whole_requests;
  }
  double ms = 0;
  std::string timing;
  try {
    ms = ctx.time_ms(
        [&] {
          mqa_decode(q, cb.cache, bt, sl, out, lse, kScale, true, ws.view(), op, splits, whole, c.batch_invariant,
                     c.fp8_compute);
        },
        c.graph, timing);
  } catch (const VariantUnsupported& e) {  // a forced variant that declines this shape: no row
    std::printf("  (skipped: %s)\n", e.what());
    return;
  }
  const double bytes = keys * static_cast<double>(cache_entry_bytes(c.format)) +
                       static_cast<double>(c.b) * c.s_q * c.h * (576 + 512) * 2.0;
  const double flops = 2.0 * c.h * c.s_q * keys * (576 + 512);
  std::string cfg = "b=" + std::to_string(c.b) + " s_q=" + std::to_string(c.s_q) + " h=" + std::to_string(c.h) +
                    " s_k=" + std::to_string(c.s_k) + (c.varlen ? " varlen" : "") + " p" + std::to_string(c.page) +
                    (c.sequential ? " seq" : "") + " " +
                    to_string(c.format) + (c.splits ? " splits=" + std::to_string(c.splits) : ws_bytes ? " split" : "") +
                    (c.batch_invariant ? " batch-invariant splits=" + std::to_string(splits) : "") +
                    (c.fp8_compute ? " fp8-compute" : "") + " [" +
                    last_variant("mqa_decode") + "]" + timing;
  if (c.flashmla_us > 0) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), " FlashMLA %.0f us (x%.2f)", c.flashmla_us, ms * 1e3 / c.flashmla_us);
    cfg += buf;
  }
  cfg += target_note(c.target_us, ms);
  ctx.report("mqa_decode", cfg, ms, bytes, flops,
             "FLOPs = 2*h*s_q*sum(seq_lens)*(576+512); bytes = sum(seq_lens)*row_bytes + q + out");
  report_gather_floor(ctx, cb.cache.data.data, slot_stride_bytes(cb.cache), cache_entry_bytes(c.format),
                      decode_row_slots(table, lens, pages, c.page), c.graph);
  if (ctx.options().decode.trace)
    trace_decode_calls(ctx, [&] {
      mqa_decode(q, cb.cache, bt, sl, out, lse, kScale, true, ws.view(), op, splits, whole, c.batch_invariant,
                 c.fp8_compute);
    });
}

// Issue 7's shapes (nvidia-h200 FlashMLA times from the issue, b = 128, page 64, bf16, median, L2
// flushed), then its other "done when" rows.
std::vector<DecodeCase> issue7_grid() {
  constexpr CacheFormat bf = CacheFormat::bf16;
  std::vector<DecodeCase> g = {
      {128, 1, 128, 4096, 64, bf, false, 229}, {128, 1, 128, 8192, 64, bf, false, 445},
      {128, 1, 16, 4096, 64, bf, false, 164},  {128, 1, 16, 8192, 64, bf, false, 311},
      {128, 2, 128, 8192, 64, bf, false, 803}, {128, 2, 16, 8192, 64, bf, false, 311},
      {4, 1, 16, 1024, 64, bf, false, 0},      {4, 1, 16, 1024, 64, bf, false, 0, 8},
      {4, 1, 16, 1024, 64, bf, false, 0, 16},  {128, 1, 16, 8192, 64, bf, true, 0},
  };
  for (int64_t h : {8, 32, 64}) g.push_back({128, 1, h, 4096, 64, bf, false, 0});
  for (int64_t page : {1, 16, 32, 128, 256}) g.push_back({128, 1, 16, 4096, page, bf, false, 0});
  for (CacheFormat f : {CacheFormat::fp8, CacheFormat::fp8_ds_mla})
    for (int64_t h : {16, 128}) g.push_back({128, 1, h, 4096, 64, f, false, 0});
  // FlashMLA's benchmark block tables (each request's pages contiguous): the same shapes as its rows above.
  for (int64_t h : {16, 128}) g.push_back({128, 1, h, 4096, 64, bf, false, h == 16 ? 164.0 : 229.0, 0, true});
  return g;
}

// Issue 48's small dense decode steps (bf16, page 64, uniform lengths), graph-replayed, each with the issue's
// "done when" bound on nvidia-h200.
std::vector<DecodeCase> issue48_decode_grid() {
  struct S {
    int64_t b, s_q, h, s_k;
    double target_us;
  };
  const S shapes[] = {{4, 1, 16, 1024, 10}, {1, 1, 128, 640, 10}, {8, 1, 128, 640, 14},
                      {1, 1, 64, 8192, 20}, {8, 1, 64, 8192, 40}, {4, 6, 16, 4096, 20}};
  std::vector<DecodeCase> g;
  for (const S& x : shapes) {
    DecodeCase c{x.b, x.s_q, x.h, x.s_k, 64, CacheFormat::bf16, false, 0};
    c.target_us = x.target_us;
    c.graph = true;
    g.push_back(c);
  }
  return g;
}

void bench_decode(BenchContext& ctx) {
  const BenchOptions::DecodeShape& d = ctx.options().decode;
  const std::string& grid = ctx.options().decode_grid;
  std::vector<DecodeCase> cases;
  if (d.b > 0) {
    cases.push_back({d.b, d.s_q, d.h, d.s_k, d.page, cache_format_from_string(d.format), d.varlen, 0, d.splits,
                     d.sequential_pages});
    cases.back().graph = d.graph;
  } else if (grid == "issue7") {
    cases = issue7_grid();
  } else if (grid == "issue48") {
    cases = issue48_decode_grid();
  } else {
    check_grid_name(grid);  // another op's grid: the default rows here
    // Default rows: b 64 / 128 x s_k 4096, h 16 / 128, page 64, bf16 and fp8_ds_mla.
    const int64_t s_k = ctx.quick() ? 1024 : 4096;
    const std::vector<int64_t> batches = ctx.quick() ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
    for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla})
      for (int64_t b : batches)
        for (int64_t h : {16, 128}) cases.push_back({b, 1, h, s_k, 64, f, false, 0});
  }
  for (const DecodeCase& c : with_fp8_compute_twins(with_batch_invariant_twins(cases, d.batch_invariant), d.fp8_compute))
    run_decode_case(ctx, c);
}

// One mha_prefill shape: b requests of s_q queries and s_k keys (varlen: s_q per request uniform in
// [1, s_q], s_k = s_q causal or uniform in [1, s_k], seeded), h heads, k_pe shared by all heads.
struct PrefillCase {
  int64_t b, sq, sk, h;
  bool causal, varlen;
};

// Issue 9's grid: b in {1, 4} x s in {1024, 4096, 16384} x h in {16, 128} causal, then the non-causal
// context chunk s_q 1024 x s_k 8192.
std::vector<PrefillCase> issue9_grid() {
  std::vector<PrefillCase> g;
  for (int64_t b : {1, 4})
    for (int64_t s : {1024, 4096, 16384})
      for (int64_t h : {16, 128}) g.push_back({b, s, s, h, true, false});
  for (int64_t b : {1, 4})
    for (int64_t h : {16, 128}) g.push_back({b, 1024, 8192, h, false, false});
  return g;
}

// The GEMM ceiling at one prefill row's work, timed right after it: the ceilings op times 8192^3 GEMMs of
// ~1.4 ms, at whatever clock the GPU has then, but the GPU power-throttles (1485-1650 MHz at 700 W) in
// long rows, so a long row is also compared with cuBLAS bf16 16384 x 16384 x k, 2 * 16384^2 * k ~ the
// row's FLOPs (k a multiple of 256), timed the same way (L2 flushed, median): the same duty cycle.
void report_equal_work_gemm(BenchContext& ctx, double flops) {
  const Device dev = Device::cuda(ctx.device());
  constexpr int64_t n = 16384;
  const int64_t k = std::max<int64_t>(256, std::llround(flops / (2.0 * n * n) / 256.0) * 256);
  Tensor a = Tensor::empty({n, k}, DType::bf16, dev), b = Tensor::empty({k, n}, DType::bf16, dev);
  Tensor c = Tensor::empty({n, n}, DType::bf16, dev);
  fill_uniform(a, -1, 1, 73, ctx.stream());
  fill_uniform(b, -1, 1, 74, ctx.stream());
  const Context op = ctx.op_context();
  const double ms = ctx.time_ms([&] { gemm(a, b, c, 1.0f, 0.0f, op); });
  ctx.report("gemm", "equal work to the row above: 16384x16384x" + std::to_string(k), ms,
             2.0 * (2.0 * n * k + static_cast<double>(n) * n), 2.0 * n * n * static_cast<double>(k),
             "cuBLAS bf16, flops = 2 m n k ~ the mha_prefill row's; bytes = a + b + c");
}

// The fp8 ceiling of an fp8 row: cuBLASLt e4m3 at the same 16384 x 16384 x k, through gemm_fp8_block (DeepSeek's
// block scales, fp32 accumulation without fast accumulation: somewhat below a per-tensor e4m3 GEMM's peak, so a
// lower bound of the fp8 ceiling), timed the same way right after the row.
void report_equal_work_fp8_gemm(BenchContext& ctx, double flops) {
  const Device dev = Device::cuda(ctx.device());
  constexpr int64_t n = 16384;
  const int64_t k = std::max<int64_t>(512, std::llround(flops / (2.0 * n * n) / 512.0) * 512);
  const int64_t kb = k / 128, kb4 = (kb + 3) / 4 * 4;
  Tensor a = Tensor::empty({n, k}, DType::fp8_e4m3, dev), w = Tensor::empty({n, k}, DType::fp8_e4m3, dev);
  Tensor a_scales = Tensor::empty({kb, n}, DType::f32, dev), w_store = Tensor::empty({n / 128, kb4}, DType::f32, dev);
  Tensor c = Tensor::empty({n, n}, DType::bf16, dev);
  fill_e4m3_codes(a, 75, ctx.stream());
  fill_e4m3_codes(w, 76, ctx.stream());
  fill_uniform(a_scales, 0.5, 1.0, 77, ctx.stream());
  fill_uniform(w_store, 0.5, 1.0, 78, ctx.stream());
  const int64_t ws_shape[] = {n / 128, kb}, ws_stride[] = {kb4, 1};
  const TensorView w_scales(w_store.data(), DType::f32, ws_shape, ws_stride, dev);
  const Context op = ctx.op_context();
  const double ms = ctx.time_ms([&] { gemm_fp8_block(a, a_scales, w, w_scales, c, op); });
  ctx.report("gemm", "fp8 equal work to the row above: 16384x16384x" + std::to_string(k), ms,
             static_cast<double>(2 * n * k) + 2.0 * n * n, 2.0 * n * n * static_cast<double>(k),
             "cuBLASLt e4m3 (gemm_fp8_block: block scales, no fast accumulation), flops = 2 m n k ~ the row's; "
             "bytes = a + w + c");
}

void run_prefill_case(BenchContext& ctx, const PrefillCase& c) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  std::vector<int32_t> cq = {0}, ck = {0};
  double pairs = 0;  // (query, visible key) pairs; causal sq == sk counts s^2 / 2 (the usual convention)
  std::mt19937_64 g(72);
  for (int64_t r = 0; r < c.b; ++r) {
    int64_t sq = c.sq, sk = c.sk;
    if (c.varlen) {
      sq = std::uniform_int_distribution<int64_t>(1, c.sq)(g);
      sk = c.causal ? sq : std::uniform_int_distribution<int64_t>(1, c.sk)(g);
    }
    cq.push_back(static_cast<int32_t>(cq.back() + sq));
    ck.push_back(static_cast<int32_t>(ck.back() + sk));
    const double q = static_cast<double>(sq), k = static_cast<double>(sk);
    pairs += c.causal ? (q <= k ? q * (k - q) + q * q / 2 : k * k / 2) : q * k;
  }
  const int64_t tq = cq.back(), tk = ck.back();
  Tensor q = Tensor::empty({tq, c.h, 192}, DType::bf16, dev), kn = Tensor::empty({tk, c.h, 128}, DType::bf16, dev);
  Tensor kp_store = Tensor::empty({tk, 1, 64}, DType::bf16, dev), v = Tensor::empty({tk, c.h, 128}, DType::bf16, dev);
  for (const Tensor* t : {&q, &kn, &kp_store, &v}) fill_uniform(*t, -1, 1, 71, ctx.stream());
  const int64_t kp_shape[] = {tk, c.h, 64}, kp_stride[] = {64, 0, 1};
  const TensorView kp(kp_store.data(), DType::bf16, kp_shape, kp_stride, dev);
  Tensor cu_q = device_i32(cq, {c.b + 1}, dev), cu_k = device_i32(ck, {c.b + 1}, dev);
  Tensor out = Tensor::empty({tq, c.h, 128}, DType::bf16, dev), lse = Tensor::empty({c.h, tq}, DType::f32, dev);
  // --fp8-prefill: the op's fp8 compute (SEMANTICS §10.1); inputs in [-1, 1] with scales 1/256 (codes <= 256).
  const bool fp8 = ctx.options().fp8_prefill;
  PrefillOptions popts;
  Tensor ws;
  if (fp8) {
    popts.fp8 = true;
    popts.q_scale = popts.k_scale = popts.v_scale = 1.0f / 256;
    ws = Tensor::empty({static_cast<int64_t>(mha_prefill_workspace_bytes(tq, tk, c.h, c.b, true, dev))}, DType::u8, dev);
    popts.workspace = ws.view();
  }
  double ms = 0;
  try {
    ms = ctx.time_ms(
        [&] { mha_prefill(q, kn, kp, v, cu_q, cu_k, c.sq, c.sk, out, lse, kScale, c.causal, popts, op); });
  } catch (const VariantUnsupported& e) {  // a forced variant that declines this shape: no row
    std::printf("  (skipped: %s)\n", e.what());
    return;
  }
  const double flops = static_cast<double>(c.h) * pairs * 2.0 * (192 + 128);
  const double bytes = 2.0 * (tq * c.h * (192 + 128) + tk * c.h * (128 + 128) + tk * 64) + 4.0 * tq * c.h;
  ctx.report("mha_prefill",
             "b=" + std::to_string(c.b) + " s_q=" + std::to_string(c.sq) + " s_k=" + std::to_string(c.sk) +
                 " h=" + std::to_string(c.h) + (c.causal ? " causal" : " non-causal") + (c.varlen ? " varlen" : "") +
                 (fp8 ? " fp8" : "") + " [" + last_variant("mha_prefill") + "]",
             ms, bytes, flops,
             std::string("FLOPs = h*pairs*2*(192+128), pairs = sum over requests of s_q*s_k (non-causal) or "
                         "s_q*(s_k-s_q)+s_q^2/2 (causal); bytes = q + k_nope + k_pe + v + out + lse") +
                 (fp8 ? "; fp8: the time includes the quantise pass; the fp8 tensor-core peak is 2x the bf16 one "
                        "(the fp8 equal-work GEMM row below is the fp8 ceiling)"
                      : ""));
  if (flops >= 5e11) report_equal_work_gemm(ctx, flops);  // rows of >= ~1 ms: the clock drops in them
  if (fp8 && flops >= 5e11) report_equal_work_fp8_gemm(ctx, flops);
}

void bench_prefill(BenchContext& ctx) {
  const BenchOptions::DecodeShape& d = ctx.options().decode;
  const std::string& grid = ctx.options().decode_grid;
  std::vector<PrefillCase> cases;
  if (d.b > 0) {
    cases.push_back({d.b, d.s_q, d.s_k, d.h, !d.non_causal, d.varlen});
  } else if (grid == "issue9") {
    cases = issue9_grid();
  } else {
    check_grid_name(grid);
    const int64_t div = ctx.quick() ? 4 : 1;
    cases = {{1, 4096 / div, 4096 / div, 128, true, false},
             {4, 2048 / div, 2048 / div, 16, true, false},
             {1, 1024 / div, 8192 / div, 128, false, false}};
  }
  for (const PrefillCase& c : cases) run_prefill_case(ctx, c);
}

// One sparse_mqa shape: T tokens, h heads, topk indices per token drawn without repetition from `pool`
// cache rows (page 64; pool 0: T * topk rows, a permutation, so every row is read once), no lengths.
// flashmla_us > 0 is printed beside the row. DeepSeek-V4 shapes (SparseOptions): d_qk 512 rows with
// whole-row values (d_v 512), extra_topk > 0 rows per token of a second cache (page 64, T * extra_topk
// rows, each read once) and a per-head sink; the extra cache's format is the main one's unless extra_format >= 0
// (a CacheFormat value: V4.1's v41 window with a v41_fp4 compressed cache).
struct SparseCase {
  int64_t t, h, topk, pool;
  CacheFormat format;
  double flashmla_us;
  int d_qk = 576;
  int64_t extra_topk = 0;
  bool batch_invariant = false;  // the batch-invariant mode (SparseOptions::batch_invariant)
  double target_us = 0;          // > 0: a target time printed beside the row (issue 48's "done when")
  bool graph = false;            // timed graph-replayed (BenchContext::time_graph_ms)
  int extra_format = -1;         // CacheFormat of the extra cache, -1: the main cache's
  int64_t extra_pool = 0;        // extra-cache rows the extra indices are drawn from (0: T * extra_topk, each once)
};

// Each of t tokens' topk distinct rows of a pool of `rows` (a partial shuffle per token, seeded); `distinct`: the
// rows read at least once.
std::vector<int32_t> pool_indices(int64_t t, int64_t topk, int64_t rows, uint64_t seed, double& distinct) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> perm(static_cast<std::size_t>(rows)), idx;
  for (int64_t i = 0; i < rows; ++i) perm[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t tok = 0; tok < t; ++tok)
    for (int64_t j = 0; j < topk; ++j) {
      const auto k = static_cast<std::size_t>(std::uniform_int_distribution<int64_t>(j, rows - 1)(g));
      std::swap(perm[static_cast<std::size_t>(j)], perm[k]);
      idx.push_back(perm[static_cast<std::size_t>(j)]);
    }
  std::vector<int32_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  distinct = static_cast<double>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
  return idx;
}

// The read floor of a sparse_mqa row: the main cache's rows through idx, then (DeepSeek-V4) the extra cache's
// through extra_idx, in one launch (a v4 cache is two sets, its bodies and its scale slots: cache_row_sets).
void report_sparse_floor(BenchContext& ctx, const KVCache& main, const std::vector<int32_t>& idx, const KVCache& extra,
                         const std::vector<int32_t>& extra_idx, bool graph) {
  std::vector<RowSet> sets = cache_row_sets(main, idx);
  if (!extra_idx.empty())
    for (RowSet& r : cache_row_sets(extra, extra_idx)) sets.push_back(std::move(r));
  report_gather_floor(ctx, sets, graph);
}

void run_sparse_case(BenchContext& ctx, const SparseCase& c) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  constexpr int64_t page = 64;
  const int64_t rows = ((c.pool > 0 ? c.pool : c.t * c.topk) + page - 1) / page * page;
  if (c.topk > rows) throw Error("mla bench: sparse_mqa --topk larger than the --pool of cache rows");
  const bool v4 = c.d_qk != 576 || c.extra_topk > 0;
  const int64_t d_qk = c.d_qk, d_v = 512;
  const bool records = cache_format_info(c.format).record;
  const CacheFormat extra_format = c.extra_format >= 0 ? static_cast<CacheFormat>(c.extra_format) : c.format;
  CacheBuffer cb = allocate_cache(c.format, rows / page, page, dev, 1.0f, c.d_qk);
  if (records) fill_record_cache(cb.cache, 81, ctx.stream(), op);
  else fill_cache(cb.cache, 81, ctx.stream());
  std::vector<int32_t> idx_host;
  std::vector<int32_t> extra_host;
  double distinct = 0, extra_rows = 0;
  if (c.pool == 0) {
    idx_host = random_permutation(c.t * c.topk, 82);
    distinct = static_cast<double>(c.t * c.topk);
  } else {  // each token: topk distinct rows of the pool (a partial shuffle)
    idx_host = pool_indices(c.t, c.topk, rows, 82, distinct);
  }
  Tensor idx = device_i32(idx_host, {c.t, c.topk}, dev);
  Tensor q = Tensor::empty({c.t, c.h, d_qk}, DType::bf16, dev);
  fill_uniform(q, -1, 1, 83, ctx.stream());
  Tensor out = Tensor::empty({c.t, c.h, d_v}, DType::bf16, dev), lse = Tensor::empty({c.t, c.h}, DType::f32, dev);
  SparseOptions opts;
  opts.batch_invariant = c.batch_invariant;
  CacheBuffer extra;
  Tensor extra_idx, sink;
  if (v4) {
    opts.values_include_rope = true;
    sink = Tensor::empty({c.h}, DType::f32, dev);
    fill_uniform(sink, -1, 1, 85, ctx.stream());
    opts.attn_sink = sink.view();
    if (c.extra_topk > 0) {
      const int64_t e_rows = ((c.extra_pool > 0 ? c.extra_pool : c.t * c.extra_topk) + page - 1) / page * page;
      if (c.extra_topk > e_rows) throw Error("mla bench: sparse_mqa extra top-k larger than the extra pool");
      extra = allocate_cache(extra_format, e_rows / page, page, dev, 1.0f, c.d_qk);
      if (cache_format_info(extra_format).record) fill_record_cache(extra.cache, 86, ctx.stream(), op);
      else fill_cache(extra.cache, 86, ctx.stream());
      if (c.extra_pool > 0) {
        extra_host = pool_indices(c.t, c.extra_topk, e_rows, 87, extra_rows);
      } else {
        extra_host = random_permutation(c.t * c.extra_topk, 87);
        extra_rows = static_cast<double>(c.t * c.extra_topk);
      }
      extra_idx = device_i32(extra_host, {c.t, c.extra_topk}, dev);
      opts.extra = {extra.cache, extra_idx.view(), {}};
    }
  }
  double ms = 0;
  std::string timing;
  try {
    ms = ctx.time_ms([&] { sparse_mqa(q, cb.cache, idx, {}, out, lse, kScale, opts, op); }, c.graph, timing);
  } catch (const VariantUnsupported& e) {  // a forced variant that declines this shape: no row
    std::printf("  (skipped: %s)\n", e.what());
    return;
  }
  const double bytes = distinct * static_cast<double>(cache_entry_bytes(c.format, c.d_qk)) +
                       extra_rows * static_cast<double>(cache_entry_bytes(extra_format, c.d_qk)) +
                       static_cast<double>(c.t) * c.h * static_cast<double>(d_qk + d_v) * 2.0;
  const double flops = 2.0 * c.t * c.h * static_cast<double>(c.topk + c.extra_topk) * static_cast<double>(d_qk + d_v);
  std::string cfg = "T=" + std::to_string(c.t) + " topk=" + std::to_string(c.topk) +
                    (c.extra_topk ? "+" + std::to_string(c.extra_topk) + " extra" : "") +
                    (v4 ? " d_qk=" + std::to_string(c.d_qk) + " sink" : "") + " h=" + std::to_string(c.h) +
                    (c.pool ? " pool=" + std::to_string(c.pool) : "") +
                    (c.extra_pool ? "+" + std::to_string(c.extra_pool) : "") + " " + to_string(c.format) +
                    (extra_format != c.format ? "+" + std::string(to_string(extra_format)) : "") +
                    (c.batch_invariant ? " batch-invariant" : "") + " [" +
                    last_variant("sparse_mqa") + "]" + timing;
  if (c.flashmla_us > 0) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), " FlashMLA %.0f us (x%.2f)", c.flashmla_us, ms * 1e3 / c.flashmla_us);
    cfg += buf;
  }
  cfg += target_note(c.target_us, ms);
  ctx.report("sparse_mqa", cfg, ms, bytes, flops,
             "FLOPs = 2*T*h*(topk+extra_topk)*(d_qk+d_v); bytes = distinct rows*row_bytes (each cache's) + q + out");
  // Decode shapes: the DRAM read floor of their rows. Prefill shapes (compute-bound, their pool mostly L2-resident):
  // the same kernel over every (token, index) row once, i.e. the rate at which an SM's gathers come out of the L2
  // (a kernel over h rows makes h / 64 such passes).
  report_sparse_floor(ctx, cb.cache, idx_host, extra.cache, extra_host, c.graph);
  if (ctx.options().decode.trace)
    trace_decode_calls(ctx, [&] { sparse_mqa(q, cb.cache, idx, {}, out, lse, kScale, opts, op); });
}

// Issue 8's table (nvidia-h200 FlashMLA times from the issue: fp8_ds_mla, topk 2048, median, L2 flushed;
// decode b = 128 tokens of s_q 1 = T 128), then h 16 / 32 x topk 512 / 1024 / 2048 (target: 85% of the
// copy bandwidth), small decode steps (T 1 / 4 / 16 / 64 at h 16 and 32: a token's top-k split over a cluster,
// core/sparse_split.h), bf16 rows, and the sparse prefill shapes (bf16 kv, 4096 tokens over a pool of
// s_k rows).
std::vector<SparseCase> issue8_grid() {
  constexpr CacheFormat ds = CacheFormat::fp8_ds_mla, bf = CacheFormat::bf16;
  std::vector<SparseCase> g = {{128, 128, 2048, 0, ds, 185}, {128, 64, 2048, 0, ds, 118}};
  for (int64_t h : {16, 32})
    for (int64_t topk : {512, 1024, 2048}) g.push_back({128, h, topk, 0, ds, 0});
  for (int64_t h : {16, 32})
    for (int64_t t : {1, 4, 16, 64}) g.push_back({t, h, 2048, 0, ds, 0});
  for (int64_t h : {16, 128}) g.push_back({128, h, 2048, 0, bf, 0});
  g.push_back({4096, 128, 2048, 8192, bf, 3546});
  g.push_back({4096, 128, 2048, 131072, bf, 0});
  return g;
}

// DeepSeek-V4 decode (SEMANTICS §11.8; the portable engine): T 128 tokens, a 128-row window (main cache) and the
// indexer's top 512 (Flash) / 1024 (Pro) rows of the compressed cache (extra), d_qk = d_v = 512, a sink;
// h 16 / 64 / 128 heads per rank; bf16 and fp8 (per-tensor) rows, V4's 584-byte records in both caches (v4), and
// V4.1's native records (a v41 window with a v41_fp4 compressed cache), written by write_cache. Then issue 47's
// small decode step, T 8, h 16, window 128 + extra 512, v4 and v41 + v41_fp4, graph-replayed beside the issue's
// 12 us target. Each row's read floor covers both caches. Last, issue 47's sparse prefill line (T 4096, top-k 640 =
// window 128 + extra 512, h 128 Pro / 64 Flash; target 500 TFLOP/s): the window's rows drawn from a 4096-row pool
// (a request's own tokens), the picks from 1024 compressed entries (its ratio-4 entries), v4 and v41 + v41_fp4.
std::vector<SparseCase> v4_grid() {
  struct F {
    CacheFormat main;
    int extra;  // -1: the main format
  };
  const F v4{CacheFormat::v4, -1}, v41{CacheFormat::v41, static_cast<int>(CacheFormat::v41_fp4)};
  auto row = [](int64_t t, int64_t h, int64_t extra, const F& f) {
    SparseCase c{t, h, 128, 0, f.main, 0, 512, extra};
    c.extra_format = f.extra;
    return c;
  };
  std::vector<SparseCase> g;
  for (const F f : {F{CacheFormat::bf16, -1}, F{CacheFormat::fp8, -1}, v4, v41})
    for (int64_t extra : {512, 1024})
      for (int64_t h : {16, 64, 128}) g.push_back(row(128, h, extra, f));
  for (const F& f : {v4, v41}) {
    g.push_back(row(8, 16, 512, f));
    g.back().target_us = 12;
    g.back().graph = true;
  }
  // The small-T split's other shapes (sparse_split::record_splits): one token, T 8 over 128 + 1024, T 32.
  for (const F& f : {v4, v41})
    for (const auto [t, extra] : {std::pair<int64_t, int64_t>{1, 512}, {8, 1024}, {32, 512}}) {
      g.push_back(row(t, 16, extra, f));
      g.back().graph = true;
    }
  // The 64-row tile's small steps (h 64 / 128: the split of both tiles).
  for (const F& f : {v4, v41})
    for (const int64_t h : {64, 128}) {
      g.push_back(row(8, h, 512, f));
      g.back().graph = true;
    }
  for (const F& f : {v4, v41})
    for (int64_t h : {128, 64}) {
      g.push_back(row(4096, h, 512, f));
      g.back().pool = 4096;
      g.back().extra_pool = 1024;
    }
  return g;
}

// Issue 48's small sparse decode steps (fp8_ds_mla, topk 2048, every row read once), graph-replayed, each with
// the issue's "done when" bound on nvidia-h200.
std::vector<SparseCase> issue48_sparse_grid() {
  struct S {
    int64_t t, h;
    double target_us;
  };
  std::vector<SparseCase> g;
  for (const S& x : {S{1, 16, 8}, S{8, 16, 10}, S{8, 64, 20}}) {
    SparseCase c{x.t, x.h, 2048, 0, CacheFormat::fp8_ds_mla, 0};
    c.target_us = x.target_us;
    c.graph = true;
    g.push_back(c);
  }
  return g;
}

void bench_sparse(BenchContext& ctx) {
  const BenchOptions::DecodeShape& d = ctx.options().decode;
  const std::string& grid = ctx.options().decode_grid;
  std::vector<SparseCase> cases;
  if (d.b > 0) {
    cases.push_back({d.b, d.h, d.topk, d.pool, cache_format_from_string(d.format), 0});
    cases.back().graph = d.graph;
    if (d.extra_topk > 0) {  // a DeepSeek-V4 row (v4_grid's shape)
      cases.back().d_qk = 512;
      cases.back().extra_topk = d.extra_topk;
      cases.back().extra_pool = d.extra_pool;
      if (!d.extra_format.empty()) cases.back().extra_format = static_cast<int>(cache_format_from_string(d.extra_format));
    }
  } else if (grid == "issue8") {
    cases = issue8_grid();
  } else if (grid == "v4") {
    cases = v4_grid();
  } else if (grid == "issue48") {
    cases = issue48_sparse_grid();
  } else {
    check_grid_name(grid);
    const std::vector<int64_t> tokens = ctx.quick() ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
    for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla})
      for (int64_t t : tokens)
        for (int64_t h : {16, 128}) cases.push_back({t, h, 2048, 0, f, 0});
  }
  for (const SparseCase& c : with_batch_invariant_twins(cases, d.batch_invariant)) run_sparse_case(ctx, c);
}

}  // namespace

void register_attention(Registry& r) {
  r.add("mqa_decode", "absorbed MQA decode over the paged cache (bf16, fp8_ds_mla; h 16 / 128)", bench_decode);
  r.add("mha_prefill", "varlen MHA prefill (causal self-attention, non-causal context chunk)", bench_prefill);
  r.add("sparse_mqa", "sparse MQA over top-2048 cache rows (bf16, fp8_ds_mla)", bench_sparse);
}

}  // namespace mla::bench
