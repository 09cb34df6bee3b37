// SPDX-License-Identifier: Apache-2.0
// The body of `mla run`: the trace through MlaAttention, step by step — schedule, plan, seeded
// inputs, forward (timed, device synchronised), oracle check on sampled steps, commit.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "check.h"
#include "commands.h"
#include "core/numeric.h"
#include "mla/error.h"
#include "mla/indexer.h"
#include "mla/layer.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "progress.h"
#include "run_internal.h"
#include "synth.h"
#include "trace.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla::app {

void poison(void* p, Device dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(p, 0xff, bytes);
    return;
  }
#if MLA_WITH_CUDA
  cuda_rt::memset(p, dev.index, 0xff, bytes);
#endif
}

void synchronize(Device dev) {
#if MLA_WITH_CUDA
  if (dev.is_cuda()) cuda_rt::synchronize(dev.index);
#else
  (void)dev;
#endif
}

LayerOptions layer_options(const RunConfig& cfg) {
  LayerOptions lo;
  lo.dims = cfg.dims;
  lo.cache_format = cfg.format;
  lo.sparse = cfg.sparse;
  lo.device = cfg.device;
  lo.dtype = DType::bf16;
  lo.out_quant = cfg.out_quant;
  lo.out_scale = cfg.out_scale;
  lo.kv_scales = cfg.kv_scales;
  lo.fp8_prefill = cfg.fp8_prefill;
  return lo;
}

namespace {

// Activations are uniform(-1, 1); kv_b_proj entries uniform(+-1/sqrt(L)) (fan-in initialisation),
// so that the up-projected K and V have magnitudes like the activations'.
constexpr double kInputRange = 1.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A host buffer and, on CUDA, its device twin (the same buffer on the CPU). A step uses the leading
// part of each, viewed with the step's shape.
struct Staged {
  Tensor host, dev;
  Staged(std::initializer_list<int64_t> capacity, DType t, Device device) {
    host = Tensor::empty(capacity, t, Device::cpu());
    dev = device.is_cpu() ? host : Tensor::empty(capacity, t, device);
  }
  template <class T>
  T* h() const { return host.view().data_as<T>(); }
  TensorView host_view(std::initializer_list<int64_t> shape) const {
    return TensorView(host.data(), host.dtype(), shape, host.device());
  }
  TensorView dev_view(std::initializer_list<int64_t> shape) const {
    return TensorView(dev.data(), dev.dtype(), shape, dev.device());
  }
  void upload(std::initializer_list<int64_t> shape) const {
    if (dev.data() != host.data()) copy(dev_view(shape), host_view(shape));
  }
  void download(std::initializer_list<int64_t> shape) const {
    if (dev.data() != host.data()) copy(host_view(shape), dev_view(shape));
  }
};


OracleCheck::Config check_config(const RunConfig& cfg) {
  OracleCheck::Config cc;
  cc.samples = cfg.check_samples;
  cc.steps = cfg.steps;
  cc.sparse = cfg.sparse;
  cc.format = cfg.format;
  cc.fp8_scale = cfg.fp8_scale;
  cc.page_size = cfg.trace.page_size;
  cc.seed = cfg.seed;
  cc.fp8_prefill = cfg.fp8_prefill;
  return cc;
}

// Seeded data streams: 0 the weight, then four per step (q, kv_c, k_pe, top-k rows).
uint64_t weight_stream(uint64_t seed) { return substream(seed, 0); }
uint64_t step_stream(uint64_t seed, int64_t step, int k) {
  return substream(seed, static_cast<uint64_t>(1 + 4 * step + k));
}

// kv_b_proj [h_q * (P + V), L] in bf16; the oracle gets the same values in float64.
Tensor make_weight(const RunConfig& cfg, OracleModel& oracle) {
  const ModelDims& d = cfg.dims;
  const double a = 1.0 / std::sqrt(static_cast<double>(d.kv_lora_rank));
  Tensor w = Tensor::empty({int64_t{d.num_heads} * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank}, DType::bf16);
  fill_uniform_bf16(w.view().data_as<uint16_t>(), w.numel(), weight_stream(cfg.seed), -a, a);
  oracle.dims = d;
  oracle.kv_b_proj.resize(static_cast<std::size_t>(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i)
    oracle.kv_b_proj[static_cast<std::size_t>(i)] = num::bf16_to_float(w.view().data_as<uint16_t>()[i]);
  return w;
}

class TraceRunner {
 public:
  explicit TraceRunner(const RunConfig& cfg);
  // One step of the trace; false when every request had finished.
  bool step(int64_t index);
  void finish() { stats_.requests_finished = sched_.num_finished(); }

  const OracleCheck& checker() const { return checker_; }
  RunStats& stats() { return stats_; }
  int64_t tokens_done() const { return tokens_done_; }
  double forward_seconds() const { return forward_seconds_; }

 private:
  void prepare_inputs(const StepBatch& batch, int64_t index);
  ForwardArgs forward_args(const StepBatch& batch) const;
  void check(const StepBatch& batch, const Plan& plan, const std::vector<int64_t>& tokens);
  void compute_indexer_topk(const StepBatch& batch, int64_t index);
  const int32_t* host_topk(int64_t T);
  double forward_one(const Plan& plan, const ForwardArgs& args, int64_t index);
  void record(const StepBatch& batch, const Plan& plan, double secs);

  const RunConfig& cfg_;
  int64_t H_, P_, R_, V_, L_, topk_width_;
  OracleModel oracle_;
  MlaAttention layer_;
  PlannerConfig planner_;
  CacheBuffer cache_;
  int64_t page_bytes_;
  std::size_t ws_bytes_;
  Tensor workspace_;
  PinnedBuffer meta_staging_;  // the plan's metadata, written once per step ...
  Tensor meta_;                // ... and uploaded here once: every layer's forward() reads it
  Staged q_, kv_c_, k_pe_, out_, slots_, block_table_, seq_lens_, topk_;
  // --out-quant: the layer's codes and scales (quantize_output's layouts for the step's T rows), and
  // their dequantised values and code steps for the check.
  int64_t out_width_ = 0;
  Staged qcodes_, qscales_;
  std::vector<double> qvalues_, qsteps_;
  // The lightning indexer (sparse runs with real_indexer): its K cache shares the latent cache's
  // block ids; per step the new tokens' random indexer keys are written, each request's keys gathered,
  // and its tokens' logits and top-k rows computed from random fp8 indexer queries.
  IndexerCacheBuffer icache_;
  Staged ik_, iq_, iw_, izero_, iend_, icu_;
  Tensor igk_, igs_, ilogits_;
  bool topk_on_host_ = true;  // false after the indexer wrote this step's rows on the device
  std::vector<uint16_t> itmp_;  // bf16 staging of the random indexer queries / weights (reused each step)
  std::unique_ptr<DcpGroup> dcp_;  // --dcp N > 1: the layer runs on the group (the global cache is one page)
  Scheduler sched_;
  OracleCheck checker_;
  RunStats stats_;
  int64_t tokens_done_ = 0;
  double forward_seconds_ = 0;
};

TraceRunner::TraceRunner(const RunConfig& cfg)
    : cfg_(cfg),
      H_(cfg.dims.num_heads),
      P_(cfg.dims.qk_nope_head_dim),
      R_(cfg.dims.qk_rope_head_dim),
      V_(cfg.dims.v_head_dim),
      L_(cfg.dims.kv_lora_rank),
      topk_width_(cfg.sparse ? cfg.dims.index_topk : 0),
      layer_(layer_options(cfg), make_weight(cfg, oracle_).view()),
      planner_(planner_config(cfg)),
      cache_(allocate_cache(cfg.format, cfg.dcp > 1 ? 1 : cfg.trace.pool_blocks(), cfg.trace.page_size, cfg.device,
                            cfg.fp8_scale)),
      page_bytes_(cfg.trace.page_size * cache_entry_bytes(cfg.format)),
      ws_bytes_(layer_.max_workspace_bytes(planner_, cfg.trace.token_budget)),
      workspace_(Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(ws_bytes_, 1))}, DType::u8, cfg.device)),
      meta_staging_(max_step_metadata_bytes(planner_, cfg.trace.token_budget)),
      meta_(Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(meta_staging_.size(), 16))}, DType::u8,
                          cfg.device)),
      q_({cfg.trace.token_budget, H_, P_ + R_}, DType::bf16, cfg.device),
      kv_c_({cfg.trace.token_budget, L_}, DType::bf16, cfg.device),
      k_pe_({cfg.trace.token_budget, R_}, DType::bf16, cfg.device),
      out_({cfg.trace.token_budget, H_ * V_}, DType::bf16, cfg.device),
      slots_({cfg.trace.token_budget}, DType::i64, cfg.device),
      block_table_({cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request()}, DType::i32, cfg.device),
      seq_lens_({cfg.trace.max_num_seqs}, DType::i32, cfg.device),
      topk_({std::max<int64_t>(1, cfg.trace.token_budget * topk_width_)}, DType::i32, cfg.device),
      out_width_(H_ * V_),
      qcodes_({cfg.out_quant == OutputQuant::none ? 1
                                                  : cfg.trace.token_budget * (cfg.out_quant == OutputQuant::nvfp4
                                                                                  ? out_width_ / 2 : out_width_)},
              cfg.out_quant == OutputQuant::nvfp4 ? DType::u8 : DType::fp8_e4m3, cfg.device),
      qscales_({std::max<int64_t>(1, output_quant_group(cfg.out_quant) == 0
                                          ? 0 : cfg.trace.token_budget * out_width_ / output_quant_group(cfg.out_quant))},
               cfg.out_quant == OutputQuant::nvfp4 ? DType::fp8_e4m3 : DType::f32, cfg.device),
      ik_({cfg.real_indexer ? cfg.trace.token_budget : 1, kIndexerHeadDim}, DType::bf16, cfg.device),
      iq_({cfg.real_indexer ? cfg.trace.token_budget : 1, kIndexerHeads, kIndexerHeadDim}, DType::fp8_e4m3,
          cfg.device),
      iw_({cfg.real_indexer ? cfg.trace.token_budget : 1, kIndexerHeads}, DType::f32, cfg.device),
      izero_({cfg.trace.token_budget}, DType::i32, cfg.device),
      iend_({cfg.trace.token_budget}, DType::i32, cfg.device),
      icu_({cfg.trace.max_num_seqs + 1}, DType::i32, cfg.device),
      sched_(cfg.trace),
      checker_(oracle_, check_config(cfg)) {
  poison(cache_.cache.data.data, cfg.device, static_cast<std::size_t>(cache_.storage.nbytes()));
  if (cfg.dcp > 1) dcp_ = std::make_unique<DcpGroup>(cfg, make_weight(cfg, oracle_));
  if (cfg.real_indexer) {
    icache_ = allocate_indexer_cache(cfg.trace.pool_blocks(), cfg.trace.page_size, cfg.device);
    poison(icache_.cache.data.data, cfg.device, static_cast<std::size_t>(icache_.storage.nbytes()));
    const int64_t rows = cfg.trace.max_num_seqs * cfg.trace.max_context;
    igk_ = Tensor::empty({rows, kIndexerHeadDim}, DType::fp8_e4m3, cfg.device);
    igs_ = Tensor::empty({rows}, DType::f32, cfg.device);
    ilogits_ = Tensor::empty({cfg.trace.token_budget * cfg.trace.max_context}, DType::f32, cfg.device);
    std::fill(izero_.h<int32_t>(), izero_.h<int32_t>() + cfg.trace.token_budget, 0);
    izero_.upload({cfg.trace.token_budget});
  }
}

// Top-k rows from the lightning indexer (the layer's sparse input): random bf16 indexer keys of the
// step's tokens into the indexer cache at their slots, every request's keys gathered (cu = cumulative
// seq_lens), then per request the fp8 logits of its tokens over its keys (token at position p sees
// keys [0, p]) and the top `topk` of each row; the rest of each row stays -1.
void TraceRunner::compute_indexer_topk(const StepBatch& batch, int64_t index) {
  const int64_t T = batch.num_tokens(), R = batch.num_reqs();
  const uint64_t stream = step_stream(cfg_.seed, index, 3);
  fill_uniform_bf16(ik_.h<uint16_t>(), T * kIndexerHeadDim, substream(stream, 1), -1.0, 1.0);
  // Up to token_budget * 8192 values a step: the conversions run on every core like the fills (one
  // thread made the default trace's input generation, not its forward, the bulk of the wall time).
  const int64_t nq = T * kIndexerHeads * kIndexerHeadDim;
  if (static_cast<int64_t>(itmp_.size()) < nq) itmp_.resize(static_cast<std::size_t>(nq));
  uint16_t* tmp = itmp_.data();
  uint8_t* iq = iq_.h<uint8_t>();
  fill_uniform_bf16(tmp, nq, substream(stream, 2), -1.0, 1.0);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nq; ++i)  // e4m3 codes of values in [-64, 64)
    iq[i] = num::float_to_e4m3(64.0f * num::bf16_to_float(tmp[i]));
  fill_uniform_bf16(tmp, T * kIndexerHeads, substream(stream, 3), -1.0, 1.0);
  float* iw = iw_.h<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < T * kIndexerHeads; ++i)
    iw[i] = num::bf16_to_float(tmp[i]) / static_cast<float>(kIndexerHeads);
  for (int64_t t = 0; t < T; ++t) iend_.h<int32_t>()[t] = batch.token_pos[static_cast<std::size_t>(t)] + 1;
  int32_t* cu = icu_.h<int32_t>();
  cu[0] = 0;
  for (int64_t r = 0; r < R; ++r) cu[r + 1] = cu[r] + batch.seq_lens[static_cast<std::size_t>(r)];
  // Every row -1 (0xFF bytes) on the device, where the top-k is written: no host fill, no upload.
  poison(topk_.dev.data(), cfg_.device, static_cast<std::size_t>(T * topk_width_) * sizeof(int32_t));
  topk_on_host_ = false;
  ik_.upload({T, kIndexerHeadDim});
  iq_.upload({T, kIndexerHeads, kIndexerHeadDim});
  iw_.upload({T, kIndexerHeads});
  iend_.upload({T});
  icu_.upload({R + 1});

  const TensorView slots = slots_.dev_view({T}), bt = block_table_.dev_view({R, batch.max_blocks});
  indexer_write_k(ik_.dev_view({T, kIndexerHeadDim}), slots, icache_.cache);
  const int64_t total = cu[R];
  const TensorView gk = igk_.view().slice(0, 0, total), gs = igs_.view().slice(0, 0, total);
  indexer_gather_k(icache_.cache, gk, gs, bt, icu_.dev_view({R + 1}));
  const TensorView q = iq_.dev_view({T, kIndexerHeads, kIndexerHeadDim}), w = iw_.dev_view({T, kIndexerHeads});
  const TensorView zero = izero_.dev_view({T}), end = iend_.dev_view({T});
  const TensorView out = topk_.dev_view({T, topk_width_}).slice(1, 0, cfg_.topk);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q0 = batch.query_start_loc[static_cast<std::size_t>(r)];
    const int64_t q1 = batch.query_start_loc[static_cast<std::size_t>(r) + 1];
    const int64_t len = cu[r + 1] - cu[r];
    if (q1 == q0 || len == 0) continue;
    const TensorView logits(ilogits_.data(), DType::f32, {q1 - q0, len}, cfg_.device);
    indexer_logits_prefill(q.slice(0, q0, q1), w.slice(0, q0, q1), gk.slice(0, cu[r], cu[r + 1]),
                           gs.slice(0, cu[r], cu[r + 1]), zero.slice(0, q0, q1), end.slice(0, q0, q1), logits);
    indexer_topk(logits, {}, end.slice(0, q0, q1), out.slice(0, q0, q1));
  }
}

// The step's top-k rows on the host (the oracle check and the DCP group read them there): downloaded
// once per step, and only when needed, since the indexer writes them on the device.
const int32_t* TraceRunner::host_topk(int64_t T) {
  if (!topk_on_host_) topk_.download({T, topk_width_});
  topk_on_host_ = true;
  return topk_.h<int32_t>();
}

void TraceRunner::prepare_inputs(const StepBatch& batch, int64_t index) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t T = batch.num_tokens();
  // Fresh random activations every step; metadata from the scheduler.
  fill_uniform_bf16(q_.h<uint16_t>(), T * H_ * (P_ + R_), step_stream(cfg_.seed, index, 0), -kInputRange,
                    kInputRange);
  fill_uniform_bf16(kv_c_.h<uint16_t>(), T * L_, step_stream(cfg_.seed, index, 1), -kInputRange, kInputRange);
  fill_uniform_bf16(k_pe_.h<uint16_t>(), T * R_, step_stream(cfg_.seed, index, 2), -kInputRange, kInputRange);
  std::copy(batch.slot_mapping.begin(), batch.slot_mapping.end(), slots_.h<int64_t>());
  std::copy(batch.block_table.begin(), batch.block_table.end(), block_table_.h<int32_t>());
  std::copy(batch.seq_lens.begin(), batch.seq_lens.end(), seq_lens_.h<int32_t>());
  if (cfg_.sparse && !cfg_.real_indexer)
    fill_sparse_topk(topk_.h<int32_t>(), T, batch.token_pos.data(), topk_width_, cfg_.topk,
                     step_stream(cfg_.seed, index, 3));
  q_.upload({T, H_, P_ + R_});
  kv_c_.upload({T, L_});
  k_pe_.upload({T, R_});
  slots_.upload({T});
  block_table_.upload({batch.num_reqs() * batch.max_blocks});
  seq_lens_.upload({batch.num_reqs()});
  if (cfg_.sparse && !cfg_.real_indexer) topk_.upload({T, topk_width_});
  stats_.inputs_seconds += seconds_since(t0);
  if (cfg_.real_indexer) {
    const auto t1 = std::chrono::steady_clock::now();
    compute_indexer_topk(batch, index);
    stats_.indexer_seconds += seconds_since(t1);
  }
}

ForwardArgs TraceRunner::forward_args(const StepBatch& batch) const {
  const int64_t T = batch.num_tokens(), Rq = batch.num_reqs();
  ForwardArgs args;
  args.q = q_.dev_view({T, H_, P_ + R_});
  args.kv_c = kv_c_.dev_view({T, L_});
  args.k_pe = k_pe_.dev_view({T, R_});
  args.slot_mapping = slots_.dev_view({T});
  args.block_table = block_table_.dev_view({Rq, batch.max_blocks});
  args.seq_lens = seq_lens_.dev_view({Rq});
  if (cfg_.sparse) args.topk_indices = topk_.dev_view({T, topk_width_});
  args.out = out_.dev_view({T, H_ * V_});
  if (const OutputQuant k = cfg_.out_quant; k != OutputQuant::none) {
    const int64_t G = output_quant_group(k);
    args.out = qcodes_.dev_view({T, k == OutputQuant::nvfp4 ? out_width_ / 2 : out_width_});
    if (k == OutputQuant::nvfp4) args.out_scales = qscales_.dev_view({T, out_width_ / 16});
    else if (G > 0) args.out_scales = qscales_.dev_view({out_width_ / G, T});
  }
  args.metadata = meta_.view();
  return args;
}

bool TraceRunner::step(int64_t index) {
  if (sched_.done()) return false;
  const StepBatch batch = sched_.schedule();
  const int64_t T = batch.num_tokens();
  BatchDesc desc;
  desc.query_start_loc = batch.query_start_loc;
  desc.seq_lens = batch.seq_lens;
  const Plan plan = make_plan(desc, planner_);
  if (const std::size_t need = layer_.workspace_bytes(plan); need > ws_bytes_)
    throw Error(fmt::format("step {}: the plan needs {} workspace bytes but max_workspace_bytes promised {} for "
                            "{} tokens (layer/planner inconsistency)",
                            index, need, ws_bytes_, cfg_.trace.token_budget));
  prepare_inputs(batch, index);
  const ForwardArgs args = forward_args(batch);
  double secs = 0;
  if (dcp_) {
    secs = dcp_->forward(batch, {q_.h<uint16_t>(), kv_c_.h<uint16_t>(), k_pe_.h<uint16_t>(),
                                 cfg_.sparse ? host_topk(T) : nullptr, topk_width_},
                         out_.h<uint16_t>(), index == 0 && cfg_.cuda);
    out_.upload({T, H_ * V_});  // check() downloads it again
  } else {
    secs = forward_one(plan, args, index);
  }
  record(batch, plan, secs);
  if (checker_.enabled())
    if (const std::vector<int64_t> picked = checker_.pick(batch); !picked.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      check(batch, plan, picked);
      stats_.check_seconds += seconds_since(t0);
    }

  for (int32_t b : sched_.commit(batch)) {
    if (dcp_) dcp_->release(b);
    else poison(cache_.cache.data.select(0, b).data, cfg_.device, static_cast<std::size_t>(page_bytes_));
    if (cfg_.real_indexer)
      poison(icache_.cache.data.select(0, b).data, cfg_.device,
             static_cast<std::size_t>(cfg_.trace.page_size * kIndexerEntryBytes));
  }
  return true;
}

// The single layer's timed step (with an untimed warm-up first on CUDA).
double TraceRunner::forward_one(const Plan& plan, const ForwardArgs& args, int64_t index) {
  const TensorView ws = workspace_.view();
  if (index == 0 && cfg_.cuda) {
    // Untimed warm-up (library handles, first launches). Rewriting the same rows is idempotent.
    upload_step_metadata(plan, meta_staging_.view(), meta_.view());
    layer_.forward(plan, args, cache_.cache, ws);
    synchronize(cfg_.device);
  }
  poison(args.out.data, cfg_.device, static_cast<std::size_t>(args.out.span_bytes()));
  if (args.out_scales.defined())
    poison(args.out_scales.data, cfg_.device, static_cast<std::size_t>(args.out_scales.span_bytes()));
  synchronize(cfg_.device);

  // The timed step: one metadata upload, then the layer (an engine runs every layer here).
  const auto t0 = std::chrono::steady_clock::now();
  upload_step_metadata(plan, meta_staging_.view(), meta_.view());
  layer_.forward(plan, args, cache_.cache, ws);
  synchronize(cfg_.device);
  const double secs = seconds_since(t0);
  // --kv-scales auto: once the layer calibrated, its scale is the cache's (the check reads rows with it).
  if (const std::optional<float> scale = layer_.kv_scale()) checker_.set_fp8_scale(*scale);
  return secs;
}

void TraceRunner::record(const StepBatch& batch, const Plan& plan, double secs) {
  const int64_t T = batch.num_tokens();
  StepRecord rec;
  rec.decode_tokens = plan.split.num_decode_tokens;
  rec.prefill_tokens = plan.split.num_prefill_tokens;
  for (int k = 0; k < kNumTokenKinds; ++k) rec.kind_tokens[static_cast<std::size_t>(k)] = batch.tokens_of_kind[k];
  for (const auto& chunk : plan.context.chunks) rec.context_rows += chunk.total;
  rec.num_reqs = batch.num_reqs();
  rec.seconds = secs;
  stats_.steps.push_back(rec);
  tokens_done_ += T;
  forward_seconds_ += secs;
}

void TraceRunner::check(const StepBatch& batch, const Plan& plan, const std::vector<int64_t>& tokens) {
  const int64_t T = batch.num_tokens();
  const OutputQuant k = cfg_.out_quant;
  if (k == OutputQuant::none) {
    out_.download({T, H_ * V_});
  } else {
    const int64_t code_bytes = T * (k == OutputQuant::nvfp4 ? out_width_ / 2 : out_width_);
    qcodes_.download({code_bytes});
    const int64_t G = output_quant_group(k);
    if (G > 0) qscales_.download({T * out_width_ / G});
    qvalues_.resize(static_cast<std::size_t>(T * out_width_));
    qsteps_.resize(qvalues_.size());
    dequantize_output(k, qcodes_.h<uint8_t>(), qscales_.host.data(), cfg_.out_scale, T, out_width_, qvalues_.data(),
                      qsteps_.data());
  }
  std::map<int64_t, std::vector<uint8_t>> pages;  // device pages copied to the host for this check
  StepData sd;
  sd.batch = &batch;
  sd.plan = &plan;
  sd.q = q_.h<uint16_t>();
  sd.kv_c = kv_c_.h<uint16_t>();
  sd.k_pe = k_pe_.h<uint16_t>();
  sd.topk = cfg_.sparse ? host_topk(batch.num_tokens()) : nullptr;
  sd.topk_width = topk_width_;
  sd.out = out_.h<uint16_t>();
  if (k != OutputQuant::none) {
    sd.out_values = qvalues_.data();
    sd.out_code_step = qsteps_.data();
  }
  sd.page = [&](int64_t block) -> const uint8_t* {
    if (dcp_) return dcp_->page(batch, block);
    const TensorView blk = cache_.cache.data.select(0, block);
    if (!cfg_.cuda) return static_cast<const uint8_t*>(blk.data);
    auto& bytes = pages[block];
    if (bytes.empty()) {
      bytes.resize(static_cast<std::size_t>(page_bytes_));
      const int64_t elems = page_bytes_ / static_cast<int64_t>(blk.element_size());
      copy(TensorView(bytes.data(), blk.dtype, {elems}, Device::cpu()), blk.reshape({elems}));
    }
    return bytes.data();
  };
  checker_.check(sd, tokens);
}

}  // namespace

PlannerConfig planner_config(const RunConfig& cfg) {
  PlannerConfig pc;
  pc.dims = cfg.dims;
  pc.cache_format = cfg.format;
  pc.page_size = cfg.trace.page_size;
  pc.max_model_len = cfg.trace.max_context;
  pc.max_num_seqs = cfg.trace.max_num_seqs;
  pc.sparse = cfg.sparse;
  pc.decode_threshold = cfg.trace.decode_threshold;
  pc.require_uniform = cfg.sparse;  // FlashMLA-sparse: uniform decodes; dense: varlen
  pc.sparse_prefill_mode = cfg.sparse_prefill;
  pc.num_sms = multiprocessor_count(cfg.device);  // decode split-KV schedule (0 on the CPU)
  pc.compute_capability = compute_capability(cfg.device);  // the automatic sparse prefill mode
  pc.batch_invariant = cfg.batch_invariant;
  pc.validate();
  return pc;
}

PlannerConfig rank_planner_config(const RunConfig& cfg, int rank, Device dev) {
  PlannerConfig pc = planner_config(cfg);
  pc.dims.num_heads = cfg.dims.num_heads / cfg.dcp;
  pc.dcp = {cfg.dcp, rank, cfg.dcp_interleave};
  pc.num_sms = multiprocessor_count(dev);
  pc.compute_capability = compute_capability(dev);
  pc.validate();
  return pc;
}

int run_trace(const RunConfig& cfg, bool show_progress, OutputFile& json) {
  const auto t_start = std::chrono::steady_clock::now();
  TraceRunner runner(cfg);
  runner.stats().setup_seconds = seconds_since(t_start);
  Progress progress(cfg.steps, show_progress);
  for (int64_t i = 0; i < cfg.steps && runner.step(i); ++i) {
    const int64_t failures = runner.checker().num_failures();
    progress.update(i + 1, runner.tokens_done(), runner.forward_seconds(),
                    failures == 0 ? "" : fmt::format("{} check failure(s)", failures));
  }
  progress.finish();
  runner.finish();
  runner.stats().wall_seconds = seconds_since(t_start);

  if (cfg.dcp_rank > 0) return runner.checker().passed() || !runner.checker().enabled() ? kExitOk : kExitCheckFailed;
  print_summary(cfg, runner.stats(), runner.checker());
  if (json.enabled()) write_json(json, cfg, runner.stats(), runner.checker());
  if (!runner.checker().enabled()) return kExitOk;
  return runner.checker().passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace mla::app
