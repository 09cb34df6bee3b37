// SPDX-License-Identifier: Apache-2.0
// Whole-layer step benchmarks: MlaAttention::forward on CUDA for one scheduler step (write_cache of
// the new tokens, query absorption, attention, V up-projection, and for prefills kv_b_proj, chunked
// context and merges). The timed region is one step of one layer: the plan's metadata upload from
// pinned memory (upload_step_metadata; none for dense decode-only steps) and forward(). Plan (with the
// device's SM count), inputs, cache contents, weights and workspace (workspace_bytes(plan)) are built
// before. forward() rewrites the step's new tokens into the cache on every run: the same values at
// the same slots, so every timed run sees the same state.
//
//   layer_decode        dense decode-only: b in {64, 128} requests, s_q 1, seq_len 4096, h {16, 128},
//                       bf16 / fp8 / fp8_ds_mla caches
//   layer_mixed         dense: 32 decodes at 4096 + a prefill of 2048 new tokens after 8192 context
//                       (chunked through a 4096-row workspace: 2 chunks) + a fresh 2048-token prefill
//   layer_sparse_decode V3.2: b in {64, 128} decodes at 4096, topk 2048 random distinct positions,
//                       fp8_ds_mla, h 16 (mixed-batch mode) and 128 (separate mode)
//   layer_sparse_mixed  V3.2: 32 decodes at 4096 + a prefill of 2048 new tokens after 6144 context +
//                       a fresh 2048-token prefill (every token top-2048, -1 padded below 2048)
// --grid issue48 runs instead issue 48's layer decode step: layer_decode b 1 / 4 / 8, h 16, s_k 4096, bf16,
// graph-replayed (BenchContext::time_graph_ms), each followed by the step's kernels timed alone
// (report_standalone_kernels) and the step's ratio to their sum.
//
// Counts (DESIGN §6; row = one cache entry, 1152 B bf16, 576 B fp8, 656 B fp8_ds_mla):
//   attention FLOPs  decode 2*h*s_q*s_k*(576+512); prefill h*(s^2/2)*2*(192+128) causal over its new
//                    tokens + h*s*ctx*2*(192+128) against its context; sparse 2*h*valid_k*(576+512)
//                    per token (valid_k = its non-negative indices)
//   GEMM FLOPs       q absorption 2*T_mqa*h*128*512 + V up-projection 2*T_mqa*h*512*128 (T_mqa = decode
//                    tokens, every token when sparse) + kv_b_proj 2*rows*512*h*256 (rows = new prefill
//                    tokens + context rows gathered)
//   bytes            cache rows read once (sparse: distinct rows) + rows written + weights used
//                    (W_UK_T, W_UV 2*h*128*512*2 when there are MQA tokens; kv_b_proj h*256*512*2 with
//                    prefills) + q, kv_c, k_pe, slots (+ topk indices) in + out
// Each row is followed by the split of those counts and the floor max(bytes / copy, FLOPs / gemm), and by
// the step's phases (write_cache, decode.*, prefill.*, context.*: the layer's Context::phase_mark calls)
// timed with stream events over a second series of runs (PhaseTimer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mla/cache.h"
#include "mla/error.h"
#include "mla/layer.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "floor.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr int64_t kPage = 64;
constexpr int64_t kMaxModelLen = 16384;
constexpr double kAct = 2;  // bytes per bf16 activation / weight element

struct Req {
  int64_t context = 0, query = 0;
};

struct StepSpec {
  std::string op, label;
  CacheFormat format = CacheFormat::bf16;
  bool sparse = false;
  int h = 16;
  std::vector<Req> reqs;  // decodes first, then prefills with context, then fresh prefills (BatchDesc order)
  int64_t context_workspace_rows = 0;  // dense: 0 = the planner's default
  bool graph = false;       // the step timed graph-replayed (BenchContext::time_graph_ms)
  bool standalone = false;  // dense decode-only: then the step's kernels timed alone and their sum
};

// What one step must compute and move, split by origin (for the detail line under each row).
struct Cost {
  double attn_flops = 0, gemm_flops = 0;
  double cache_read = 0, cache_write = 0, weights = 0, activations = 0;
  double flops() const { return attn_flops + gemm_flops; }
  double bytes() const { return cache_read + cache_write + weights + activations; }
};

ModelDims dims_for(bool sparse, int h) {
  return sparse ? ModelDims::deepseek_v32(128 / h) : ModelDims::deepseek_v3(128 / h);
}

PlannerConfig config_for(const StepSpec& s, Device dev) {
  PlannerConfig c;
  c.num_sms = multiprocessor_count(dev);
  c.compute_capability = compute_capability(dev);  // what serving on this device plans (mla run sets it too)
  c.dims = dims_for(s.sparse, s.h);
  c.cache_format = s.format;
  c.page_size = kPage;
  c.max_model_len = kMaxModelLen;
  c.max_num_seqs = 256;
  c.sparse = s.sparse;
  c.decode_threshold = 1;
  c.require_uniform = s.sparse;  // sparse decodes are uniform in vLLM
  c.context_workspace_rows = s.context_workspace_rows;
  return c;
}

template <class T>
Tensor to_device(const std::vector<T>& v, std::initializer_list<int64_t> shape, DType dtype, Device dev) {
  Tensor h = Tensor::empty(shape, dtype);
  std::copy(v.begin(), v.end(), static_cast<T*>(h.data()));
  return h.to(dev);  // synchronous from pageable memory: the data is on the device when this returns
}

// Per-phase times of a step from the layer's phase marks (Context::phase_mark): a stream event at every
// mark; phase i lasts from mark i to mark i + 1; phases that repeat in one step (context chunks) are
// summed. Runs are harvested at the start of the next one (time_ms synchronises after each timed run)
// and by finish(); the first `skip` runs (time_ms's warm-up) are dropped.
class PhaseTimer {
 public:
  PhaseTimer(void* stream, int skip) : stream_(static_cast<cudaStream_t>(stream)), skip_(skip) {}
  ~PhaseTimer() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  Context context(Context base) {
    base.phase_mark = &PhaseTimer::on_mark;
    base.phase_user = this;
    return base;
  }
  void begin_run() {
    harvest();
    on_mark(this, "upload");
  }
  void finish() {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) throw Error("layer bench: phase run failed");
    harvest();
  }
  // Whether any harvested run passed the mark `name`.
  bool has(const std::string& name) const {
    return std::any_of(phases_.begin(), phases_.end(), [&](const auto& p) { return p.first == name; });
  }
  // "name median_ms" per phase in first-seen order, and the median of the runs' sums.
  std::string summary() const {
    std::string r;
    std::vector<float> total(runs_, 0.0f);
    for (const auto& [name, ms] : phases_) {
      std::vector<float> v = ms;
      for (int i = 0; i < runs_; ++i) total[i] += v[i];
      r += " " + name + " " + fmt_ms(median(v));
    }
    return r + "; sum " + fmt_ms(median(total));
  }

 private:
  static void on_mark(void* self, const char* phase) {
    auto* t = static_cast<PhaseTimer*>(self);
    if (t->used_ == t->events_.size()) {
      cudaEvent_t e;
      if (cudaEventCreate(&e) != cudaSuccess) throw Error("layer bench: cudaEventCreate");
      t->events_.push_back(e);
    }
    if (cudaEventRecord(t->events_[t->used_], t->stream_) != cudaSuccess) throw Error("layer bench: cudaEventRecord");
    t->names_.resize(t->used_ + 1);
    t->names_[t->used_++] = phase;
  }
  void harvest() {
    if (used_ >= 2 && seen_++ >= skip_) {
      std::map<std::string, float> run;
      std::vector<std::string> order;
      for (std::size_t i = 0; i + 1 < used_; ++i) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, events_[i], events_[i + 1]) != cudaSuccess) throw Error("layer bench: phase time");
        if (!run.count(names_[i])) order.push_back(names_[i]);
        run[names_[i]] += ms;
      }
      for (const std::string& n : order) {
        auto it = std::find_if(phases_.begin(), phases_.end(), [&](const auto& p) { return p.first == n; });
        if (it == phases_.end()) it = phases_.insert(phases_.end(), {n, std::vector<float>(runs_, 0.0f)});
        it->second.push_back(run[n]);
      }
      ++runs_;
      for (auto& p : phases_) p.second.resize(runs_, 0.0f);
    }
    used_ = 0;
  }
  static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n == 0 ? 0.0f : n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
  }
  static std::string fmt_ms(float ms) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", ms);
    return buf;
  }
  cudaStream_t stream_;
  int skip_, seen_ = 0, runs_ = 0;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  std::size_t used_ = 0;
  std::vector<std::pair<std::string, std::vector<float>>> phases_;
};

// fp8's static and nvfp4's global output scale for outputs of magnitude below ~4.
float out_scale(OutputQuant q) { return q == OutputQuant::nvfp4 ? 448.0f * 6.0f / 4.0f : 1.0f / 64.0f; }

// Whether a layer row runs LayerOptions::fp8_prefill: --fp8-prefill, a dense layer over an fp8 or fp8_ds_mla cache.
bool fp8_prefill_for(const BenchContext& ctx, CacheFormat f, bool sparse) {
  return ctx.options().fp8_prefill && !sparse && (f == CacheFormat::fp8 || f == CacheFormat::fp8_ds_mla);
}

// One layer per (format, sparse, h, output format, KV-scale mode), built once: deriving W_UK_T / W_UV / kv_b_proj on the host takes
// seconds at h = 128.
class Layers {
 public:
  explicit Layers(BenchContext& ctx) : ctx_(ctx) {}
  const MlaAttention& get(CacheFormat f, bool sparse, int h, OutputQuant q, KvScales k) {
    auto& slot = layers_[{f, sparse, h, q, k}];
    if (!slot) {
      const Device dev = Device::cuda(ctx_.device());
      LayerOptions o;
      o.dims = dims_for(sparse, h);
      o.cache_format = f;
      o.sparse = sparse;
      o.device = dev;
      o.dtype = DType::bf16;
      o.out_quant = q;
      o.out_scale = out_scale(q);
      o.kv_scales = k;
      // --fp8-prefill: the dense prefill's attention on e4m3 codes (scales 1) where the cache is fp8.
      o.fp8_prefill = fp8_prefill_for(ctx_, f, sparse);
      Tensor w = Tensor::empty({h * int64_t{128 + 128}, 512}, DType::bf16, dev);
      fill_uniform(w, -0.05, 0.05, 91, ctx_.stream());
      // The constructor copies the weight on the legacy stream, which does not wait for ours.
      if (cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream())) != cudaSuccess)
        throw Error("layer bench: weight fill failed");
      slot = std::make_unique<MlaAttention>(o, w);
    }
    return *slot;
  }

 private:
  BenchContext& ctx_;
  std::map<std::tuple<CacheFormat, bool, int, OutputQuant, KvScales>, std::unique_ptr<MlaAttention>> layers_;
};

// A dense decode-only step's kernels, each alone on bench-local tensors of the step's shapes (the cache, block
// table and lengths are the step's), graph-replayed like the step: the cache write of the T new tokens, the
// query absorption bmm (h, T, 128) x (h, 128, 512), mqa_decode as the plan's one decode run calls it, the V
// up-projection bmm (h, T, 512) x (h, 512, 128). The layer's copy of the rope columns into the absorbed
// queries (a layer-internal kernel) is not among them. Prints each time, their sum and the step's ratio to it,
// then the attention's read floor (floor.h, graph-replayed) and the sum with the attention at that floor.
void report_standalone_kernels(BenchContext& ctx, const Plan& plan, const ForwardArgs& a, const KVCache& cache,
                               int64_t h, double step_ms, const std::vector<int32_t>& table_host, int64_t table_cols,
                               const std::vector<int32_t>& lens_host) {
  if (plan.has_prefill() || plan.decode.runs.size() != 1) {
    std::printf("    standalone kernels: not measured (a decode-only step of one decode run only)\n");
    return;
  }
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const DecodeRun& r = plan.decode.runs[0];
  const int64_t T = plan.num_tokens, b = r.req_end - r.req_begin;
  Tensor q_nope = Tensor::empty({h, T, 128}, DType::bf16, dev), w_uk_t = Tensor::empty({h, 128, 512}, DType::bf16, dev);
  Tensor q_abs = Tensor::empty({b, r.s_q, h, 576}, DType::bf16, dev), o_lat = Tensor::empty({b, r.s_q, h, 512}, DType::bf16, dev);
  Tensor lat = Tensor::empty({h, T, 512}, DType::bf16, dev), w_uv = Tensor::empty({h, 512, 128}, DType::bf16, dev);
  Tensor v_out = Tensor::empty({h, T, 128}, DType::bf16, dev), lse = Tensor::empty({b, r.s_q, h}, DType::f32, dev);
  fill_uniform(q_nope, -1, 1, 101, ctx.stream());
  fill_uniform(w_uk_t, -0.05, 0.05, 102, ctx.stream());
  fill_uniform(q_abs, -1, 1, 103, ctx.stream());
  fill_uniform(lat, -1, 1, 104, ctx.stream());
  fill_uniform(w_uv, -0.05, 0.05, 105, ctx.stream());
  const std::size_t ws_bytes =
      mqa_decode_workspace_bytes(b, r.s_q, h, r.block_cols * cache.page_size(), dev, r.num_splits);
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(ws_bytes, 1))}, DType::u8, dev);
  const TensorView table = a.block_table.slice(0, r.req_begin, r.req_end).slice(1, 0, r.block_cols);
  const TensorView lens = a.seq_lens.slice(0, r.req_begin, r.req_end);
  struct Part {
    const char* name;
    std::function<void()> call;
  };
  const std::vector<Part> parts = {
      {"write_cache", [&] { write_cache(a.kv_c, a.k_pe, a.slot_mapping, cache, DsMlaScale::amax, op); }},
      {"absorb bmm", [&] { bmm(q_nope, w_uk_t, lat, 1.0f, 0.0f, op); }},
      {"mqa_decode",
       [&] {
         mqa_decode(q_abs, cache, table, lens, o_lat, lse, 0.0722, true, ws.view(), op, r.num_splits,
                    r.whole_requests);
       }},
      {"up_proj bmm", [&] { bmm(lat, w_uv, v_out, 1.0f, 0.0f, op); }},
  };
  double sum = 0;
  std::vector<double> parts_ms;
  std::string line;
  for (const Part& p : parts) {
    const BenchContext::GraphTiming t = ctx.time_graph_ms(p.call);
    sum += t.ms;
    parts_ms.push_back(t.ms);
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%s%s %.2f us%s", line.empty() ? "" : " + ", p.name, t.ms * 1e3,
                  t.graph ? "" : " (eager)");
    line += buf;
    if (!t.graph) std::printf("    (%s: %s)\n", p.name, t.label().c_str());
  }
  std::printf("    standalone kernels, graph-replayed: %s = %.2f us; the step is x%.2f of their sum (issue 48: <= 1.3 "
              "at b 1)\n",
              line.c_str(), sum * 1e3, sum > 0 ? step_ms / sum : 0.0);
  // mqa_decode's rows read once by the load-only floor kernels: the attention's floor in the same timing.
  const int64_t stride = cache.data.stride_of(1) * static_cast<int64_t>(cache.data.element_size());
  bool replayed = false;
  const double floor_ms =
      gather_floor_ms(ctx, cache.data.data, stride, cache_entry_bytes(cache.format, cache.d_qk, cache.d_rope),
                      decode_row_slots(table_host, lens_host, table_cols, cache.page_size()), true, &replayed);
  const double at_floor = sum - parts_ms[2] + floor_ms;
  std::printf("    mqa_decode's read floor (load-only%s) %.2f us; the kernels' sum with the attention at its floor "
              "%.2f us; the step is x%.2f of it\n",
              replayed ? ", graph" : ", eager", floor_ms * 1e3, at_floor * 1e3, at_floor > 0 ? step_ms / at_floor : 0.0);
  std::fflush(stdout);
}

// Times one step; returns its median ms.
// A step's time, and whether its quantised output went through the separate quantize_output pass (the layer's
// phase "out_quant") rather than only the W_UV product's quantising epilogue.
struct StepTime {
  double ms = 0;
  bool quant_pass = false;
};

StepTime run_step(BenchContext& ctx, Layers& layers, const StepSpec& s, OutputQuant quant) {
  const Device dev = Device::cuda(ctx.device());
  const PlannerConfig pc = config_for(s, dev);
  const KvScales kv = ctx.options().kv_scales == "auto" && s.format == CacheFormat::fp8 ? KvScales::from_first_batch
                                                                                          : KvScales::fixed;
  const MlaAttention& layer = layers.get(s.format, s.sparse, s.h, quant, kv);
  const int64_t h = s.h, nr = static_cast<int64_t>(s.reqs.size()), topk = pc.dims.index_topk;
  const double row = static_cast<double>(cache_entry_bytes(s.format));

  BatchDesc batch;
  batch.query_start_loc = {0};
  for (const Req& r : s.reqs) {
    batch.query_start_loc.push_back(static_cast<int32_t>(batch.query_start_loc.back() + r.query));
    batch.seq_lens.push_back(static_cast<int32_t>(r.context + r.query));
  }
  const Plan plan = make_plan(batch, pc);
  const int64_t T = plan.num_tokens;

  // Every request owns ceil(seq / page) blocks scattered over one cache; unused table columns repeat
  // a valid block (never read: reads stop at seq_len).
  int64_t blocks = 0, max_blocks = 0;
  for (int32_t len : batch.seq_lens) {
    blocks += (len + kPage - 1) / kPage;
    max_blocks = std::max<int64_t>(max_blocks, (len + kPage - 1) / kPage);
  }
  const std::vector<int32_t> perm = random_permutation(blocks, 92);
  std::vector<int32_t> table(static_cast<std::size_t>(nr * max_blocks));
  std::vector<int64_t> slots;
  std::size_t next = 0;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t nb = (batch.seq_lens[r] + kPage - 1) / kPage;
    for (int64_t j = 0; j < max_blocks; ++j) table[r * max_blocks + j] = perm[next + std::min(j, nb - 1)];
    for (int64_t i = 0; i < s.reqs[r].query; ++i) {
      const int64_t pos = s.reqs[r].context + i;
      slots.push_back(int64_t{table[r * max_blocks + pos / kPage]} * kPage + pos % kPage);
    }
    next += static_cast<std::size_t>(nb);
  }

  Cost cost;
  const double mqa_gemm = 2.0 * h * 128 * 512 * 2;  // per MQA token: absorption + V up-projection
  const double w_mqa = 2.0 * h * 128 * 512 * kAct, w_kvb = 1.0 * h * 256 * 512 * kAct;
  Tensor topk_dev;
  if (s.sparse) {
    // Top-k of each token: distinct request-local positions in [0, pos], -1 padded when fewer exist.
    std::vector<int32_t> idx(static_cast<std::size_t>(T * topk), -1), cand;
    std::mt19937_64 g(93);
    double valid = 0, distinct = 0;
    int64_t t = 0;
    for (int64_t r = 0; r < nr; ++r) {
      std::vector<char> seen(static_cast<std::size_t>(batch.seq_lens[r]), 0);
      for (int64_t i = 0; i < s.reqs[r].query; ++i, ++t) {
        const int64_t pos = s.reqs[r].context + i, k = std::min(topk, pos + 1);
        cand.resize(static_cast<std::size_t>(pos + 1));
        std::iota(cand.begin(), cand.end(), 0);
        for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates
          std::swap(cand[j], cand[std::uniform_int_distribution<int64_t>(j, pos)(g)]);
          idx[t * topk + j] = cand[j];
          distinct += seen[cand[j]] ? 0 : 1;
          seen[cand[j]] = 1;
        }
        valid += static_cast<double>(k);
      }
    }
    topk_dev = to_device(idx, {T, topk}, DType::i32, dev);
    cost.attn_flops = 2.0 * h * valid * (576 + 512);
    cost.gemm_flops = mqa_gemm * static_cast<double>(T);
    cost.cache_read = distinct * row;
    cost.weights = w_mqa;
    cost.activations += static_cast<double>(T * topk) * 4;
  } else {
    for (int64_t r = 0; r < nr; ++r) {
      const double ctx_len = static_cast<double>(s.reqs[r].context), q = static_cast<double>(s.reqs[r].query);
      if (r < plan.split.num_decodes) {
        cost.attn_flops += 2.0 * h * q * (ctx_len + q) * (576 + 512);
        cost.gemm_flops += mqa_gemm * q;
        cost.cache_read += (ctx_len + q) * row;
      } else {
        cost.attn_flops += h * (q * q / 2 + q * ctx_len) * 2.0 * (192 + 128);
        cost.gemm_flops += 2.0 * (q + ctx_len) * 512 * h * 256;
        cost.cache_read += ctx_len * row;
      }
    }
    cost.weights = (plan.has_decode() ? w_mqa : 0) + (plan.has_prefill() ? w_kvb : 0);
  }
  cost.cache_write = static_cast<double>(T) * row;
  cost.activations += static_cast<double>(T) * (h * 192 + 512 + 64 + h * 128) * kAct + static_cast<double>(T) * 8;

  CacheBuffer cb = allocate_cache(s.format, blocks, kPage, dev, s.format == CacheFormat::fp8 ? 0.01f : 1.0f);
  fill_cache(cb.cache, 94, ctx.stream());
  Tensor q = Tensor::empty({T, h, 192}, DType::bf16, dev), kv_c = Tensor::empty({T, 512}, DType::bf16, dev);
  Tensor k_pe = Tensor::empty({T, 64}, DType::bf16, dev), out = Tensor::empty({T, h * 128}, DType::bf16, dev);
  fill_uniform(q, -1, 1, 95, ctx.stream());
  fill_uniform(kv_c, -1, 1, 96, ctx.stream());
  fill_uniform(k_pe, -1, 1, 97, ctx.stream());
  Tensor slot_dev = to_device(slots, {T}, DType::i64, dev);
  Tensor table_dev = to_device(table, {nr, max_blocks}, DType::i32, dev);
  Tensor seq_dev = to_device(batch.seq_lens, {nr}, DType::i32, dev);
  const std::size_t ws_bytes = layer.workspace_bytes(plan);
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(ws_bytes, 1))}, DType::u8, dev);

  ForwardArgs a;
  a.q = q;
  a.kv_c = kv_c;
  a.k_pe = k_pe;
  a.slot_mapping = slot_dev;
  a.block_table = table_dev;
  a.seq_lens = seq_dev;
  if (s.sparse) a.topk_indices = topk_dev;
  a.out = out;
  // A quantised output: codes and scales in quantize_output's layouts for the step's T rows.
  Tensor qcodes, qscales;
  if (quant != OutputQuant::none) {
    const int64_t W = h * 128, G = output_quant_group(quant);
    qcodes = Tensor::empty({T, quant == OutputQuant::nvfp4 ? W / 2 : W},
                           quant == OutputQuant::nvfp4 ? DType::u8 : DType::fp8_e4m3, dev);
    if (quant == OutputQuant::nvfp4) qscales = Tensor::empty({T, W / 16}, DType::fp8_e4m3, dev);
    else if (G > 0) qscales = Tensor::empty({W / G, T}, DType::f32, dev);
    a.out = qcodes;
    if (qscales.defined()) a.out_scales = qscales;
  }
  PinnedBuffer staging(plan.metadata.bytes());
  Tensor meta = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(staging.size(), 16))}, DType::u8, dev);
  a.metadata = meta;
  const Context op = ctx.op_context();
  auto step = [&] {
    upload_step_metadata(plan, staging.view(), meta, op);
    layer.forward(plan, a, cb.cache, ws.view(), op);
  };
  std::string timing;
  const double ms = ctx.time_ms(step, s.graph, timing);

  // The same step again with the layer's phase marks: per-phase medians (the marks add host work only).
  PhaseTimer phases(ctx.stream(), ctx.options().warmup);
  const Context marked = phases.context(op);
  const double ms_marked = ctx.time_ms([&] {
    phases.begin_run();
    upload_step_metadata(plan, staging.view(), meta, marked);
    layer.forward(plan, a, cb.cache, ws.view(), marked);
  });
  phases.finish();

  std::string label = s.label + " h=" + std::to_string(h) + " " + to_string(s.format);
  if (quant != OutputQuant::none) label += std::string(" out=") + to_string(quant);
  if (fp8_prefill_for(ctx, s.format, s.sparse) && plan.split.num_prefills > 0) label += " fp8-prefill";
  if (kv == KvScales::from_first_batch) label += " kv-scales=auto";
  label += timing;
  if (!s.sparse && !plan.context.chunks.empty()) label += " (" + std::to_string(plan.context.chunks.size()) + " chunks)";
  if (s.sparse && s.format == CacheFormat::fp8_ds_mla) label += plan.sparse_mixed_batch ? " mixed-batch" : " separate";
  const char* formula =
      s.sparse ? "FLOPs = 2*h*sum_t(valid topk_t)*(576+512) + 2*T*h*128*512*2 (absorb + up-proj); bytes = distinct "
                 "rows read + T rows written + W_UK_T/W_UV + q/kv_c/k_pe/slots/topk in + out"
               : "FLOPs = decode 2*h*s_k*(576+512) + prefill h*(s^2/2 + s*ctx)*2*(192+128) + 2*T_dec*h*128*512*2 "
                 "(absorb + up-proj) + 2*(s+ctx)*512*h*256 (kv_b_proj); bytes = rows read once + T rows written + "
                 "weights + q/kv_c/k_pe/slots in + out";
  ctx.report(s.op, label, ms, cost.bytes(), cost.flops(), formula);
  const Ceilings& c = ctx.ceilings();
  const double t_bytes = c.copy_gbps > 0 ? cost.bytes() / (c.copy_gbps * 1e6) : 0;
  const double t_flops = c.gemm_tflops > 0 ? cost.flops() / (c.gemm_tflops * 1e9) : 0;
  std::printf("    attention %.2f + GEMM %.2f GFLOP; MB: cache read %.1f, written %.2f, weights %.1f, act %.1f; "
              "floor %.4f ms (%s), measured %.1fx; workspace %.1f MB\n",
              cost.attn_flops / 1e9, cost.gemm_flops / 1e9, cost.cache_read / 1e6, cost.cache_write / 1e6,
              cost.weights / 1e6, cost.activations / 1e6, std::max(t_bytes, t_flops),
              t_bytes >= t_flops ? "bytes" : "FLOPs", ms / std::max(std::max(t_bytes, t_flops), 1e-12),
              static_cast<double>(ws_bytes) / 1e6);
  std::printf("    phases ms (median of %d%s, step with marks %.4f ms):%s\n", ctx.options().iters,
              s.graph ? ", eager" : "", ms_marked, phases.summary().c_str());
  std::fflush(stdout);
  if (s.standalone && quant == OutputQuant::none)
    report_standalone_kernels(ctx, plan, a, cb.cache, h, ms, table, max_blocks, batch.seq_lens);
  return {ms, phases.has("out_quant")};
}

void bench_layer(BenchContext& ctx) {
  const bool quick = ctx.quick();
  // --quick: short sequences, few requests, h 16 and 32 (32 still takes the sparse separate mode).
  const int64_t seq = quick ? 1024 : 4096, new_tokens = quick ? 256 : 2048, ctx_dense = quick ? 1024 : 8192;
  const int64_t ctx_sparse = quick ? 768 : 6144, mixed_decodes = quick ? 8 : 32;
  const std::vector<int64_t> batches = quick ? std::vector<int64_t>{16} : std::vector<int64_t>{64, 128};
  const std::vector<int> heads = quick ? std::vector<int>{16, 32} : std::vector<int>{16, 128};
  Layers layers(ctx);
  // Every row unquantised, then (--out-quant) with the quantised output, in the same call.
  const OutputQuant quant = parse_output_quant(ctx.options().out_quant);
  // The quantised step's ratio to the unquantised one (issue 49: "no slower"). Which rows the W_UV product writes
  // quantised is the layer's rule (Step::fused_rows: on sm_90 none today, cuBLAS's bmm then the quantize_output
  // pass); the line says whether the separate pass ran (phase out_quant).
  auto run = [&](const StepSpec& s) {
    const double plain = run_step(ctx, layers, s, OutputQuant::none).ms;
    if (quant == OutputQuant::none) return;
    const StepTime q = run_step(ctx, layers, s, quant);
    std::printf("    out=%s step / unquantised step: %.4f / %.4f ms = x%.3f (%s)\n", to_string(quant), q.ms, plain,
                plain > 0 ? q.ms / plain : 0.0,
                q.quant_pass ? "quantize_output pass over the rows the W_UV product left unquantised"
                             : "the W_UV product's quantising epilogue, no separate pass");
    std::fflush(stdout);
  };

  if (ctx.options().decode_grid == "issue48") {
    // Issue 48's layer decode step (cache write to output) at b 1 / 4 / 8, h 16, s_k 4096, bf16, graph-replayed,
    // each followed by its kernels alone and the step's ratio to their sum.
    for (const int64_t b : {1, 4, 8}) {
      StepSpec s{"layer_decode", "b=" + std::to_string(b) + " s_k=4096", CacheFormat::bf16, false, 16,
                 std::vector<Req>(static_cast<std::size_t>(b), Req{4095, 1})};
      s.graph = true;
      s.standalone = true;
      run(s);
    }
    return;
  }
  check_grid_name(ctx.options().decode_grid);  // another op's grid: the default rows here
  auto decodes = [&](int64_t b) { return std::vector<Req>(static_cast<std::size_t>(b), Req{seq - 1, 1}); };
  auto mixed = [&](int64_t context) {
    std::vector<Req> r = decodes(mixed_decodes);
    r.push_back({context, new_tokens});
    r.push_back({0, new_tokens});
    return r;
  };
  const std::string mixed_label = std::to_string(mixed_decodes) + "x" + std::to_string(seq) + " + " +
                                  std::to_string(new_tokens) + "|ctx ";

  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla})
    for (int64_t b : batches)
      for (int h : heads)
        run({"layer_decode", "b=" + std::to_string(b) + " s_k=" + std::to_string(seq), f, false, h, decodes(b)});
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla})
    for (int h : heads) {
      // A 4096-row context workspace (quick: 512) makes the 8192-token context take two chunks.
      StepSpec s{"layer_mixed", mixed_label + std::to_string(ctx_dense) + " + " + std::to_string(new_tokens), f,
                 false, h, mixed(ctx_dense)};
      s.context_workspace_rows = ctx_dense / 2;
      run(s);
    }
  for (int64_t b : batches)
    for (int h : heads)
      run({"layer_sparse_decode", "b=" + std::to_string(b) + " s_k=" + std::to_string(seq) + " topk=2048",
                CacheFormat::fp8_ds_mla, true, h, decodes(b)});
  for (int h : heads)
    run({"layer_sparse_mixed", mixed_label + std::to_string(ctx_sparse) + " + " + std::to_string(new_tokens),
              CacheFormat::fp8_ds_mla, true, h, mixed(ctx_sparse)});
}

}  // namespace

void register_layer(Registry& r) {
  r.add("layer", "MlaAttention::forward for whole steps (dense and sparse; decode-only and mixed)", bench_layer);
}

}  // namespace mla::bench
