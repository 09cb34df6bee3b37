// SPDX-License-Identifier: Apache-2.0
#pragma once
// Scenario builder and independent float64 reference for the MlaAttention tests (tests/unit and
// tests/gpu). A Scenario lists requests (context, new tokens); make_step draws seeded inputs whose
// values are exactly representable in bf16, builds the Plan, shuffled block tables, context rows
// written into a NaN-filled cache, and (sparse) top-k rows. naive_layer() recomputes every actual
// token as plain MHA: explicit up-projection of each key with the original kv_b_proj weight, softmax
// over its key set (causal context + new tokens, or its top-k positions), values from the
// dequantised cache read by a decoder of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/layer.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "mla/tensor.h"
#include "support/test_util.h"

namespace mla::test::layer {

inline constexpr int kL = 512, kR = 64;

struct Req {
  int32_t context = 0, query = 0;
};

struct Scenario {
  int h = 4, P = 32, V = 32;  // L = 512, R = 64 (fp8_ds_mla needs them; the MHA dims are free)
  CacheFormat format = CacheFormat::bf16;
  bool sparse = false;
  int topk = 16;
  int64_t page_size = 16;
  std::vector<Req> reqs;
  int64_t decode_threshold = 1;
  bool require_uniform = false;
  int64_t context_workspace_rows = 0, sparse_workspace_rows = 0;
  SparsePrefillMode sparse_prefill_mode = SparsePrefillMode::automatic;
  int64_t max_model_len = 256, max_num_seqs = 16;
  int64_t pad_tokens = 0;  // CUDA-graph padding rows after the actual tokens
  // Decode schedule: the SM count it is planned for (H100/H200: 132; the CPU ignores it) and the
  // CUDA-graph bound of BatchDesc::decode_seq_len_bound (0: none).
  int num_sms = 132;
  int64_t decode_seq_len_bound = 0;
  // Lower bounds of the block table's width and the cache's block count, so that batches of one padded
  // shape with different lengths share buffer shapes (CUDA-graph replays).
  int64_t min_table_blocks = 0, min_cache_blocks = 0;
  float fp8_scale = 0.01f;
  uint64_t seed = 1;
  // make_step draws the weight and the context tokens' values unless these are off (the fuzz target
  // tests/fuzz/fuzz_layer.cpp keeps one layer per shape and fills the cache itself: zeros instead).
  bool draw_weight = true, draw_context = true;
  bool batch_invariant = false;  // PlannerConfig::batch_invariant and LayerOptions::batch_invariant
  int compute_capability = 0;    // PlannerConfig::compute_capability (0: unknown)

  ModelDims dims() const {
    ModelDims d;
    d.kv_lora_rank = kL;
    d.qk_rope_head_dim = kR;
    d.qk_nope_head_dim = P;
    d.v_head_dim = V;
    d.num_heads = h;
    d.softmax_scale = 1.0 / std::sqrt(static_cast<double>(P + kR));
    d.index_topk = sparse ? topk : 0;
    return d;
  }
  PlannerConfig config() const {
    PlannerConfig c;
    c.dims = dims();
    c.cache_format = format;
    c.page_size = page_size;
    c.max_model_len = max_model_len;
    c.max_num_seqs = max_num_seqs;
    c.sparse = sparse;
    c.decode_threshold = decode_threshold;
    c.require_uniform = require_uniform;
    c.context_workspace_rows = context_workspace_rows;
    c.sparse_workspace_rows = sparse_workspace_rows;
    c.sparse_prefill_mode = sparse_prefill_mode;
    c.num_sms = num_sms;
    c.batch_invariant = batch_invariant;
    c.compute_capability = compute_capability;
    return c;
  }
  LayerOptions options(Device device, DType dtype) const {
    LayerOptions o;
    o.dims = dims();
    o.cache_format = format;
    o.sparse = sparse;
    o.device = device;
    o.dtype = dtype;
    o.batch_invariant = batch_invariant;
    return o;
  }
};

// Host inputs of one step. Activations are bf16 (exact in every layer dtype); padding rows are NaN.
struct StepData {
  Scenario sc;
  Plan plan;
  int64_t T = 0, t_act = 0, num_blocks = 0, max_blocks = 0;
  Tensor weight;                 // bf16 [h * (P + V), L]
  Tensor q, kv_c, k_pe;          // bf16 [T, h, P + R], [T, L], [T, R]
  Tensor slots;                  // i64 [T], -1 for padding
  Tensor block_table, seq_lens;  // i32 [num_reqs, max_blocks], [num_reqs]
  Tensor topk;                   // i32 [T, topk] (sparse)
  Tensor ctx_kv_c, ctx_k_pe, ctx_slots;  // context tokens, in the cache before the step
  std::vector<std::vector<int32_t>> bt;
  std::vector<int64_t> token_req, token_pos;  // per actual token: request, position in its sequence
};

inline StepData make_step(const Scenario& sc) {
  reseed(sc.seed);
  StepData d;
  d.sc = sc;
  const int64_t nr = static_cast<int64_t>(sc.reqs.size()), page = sc.page_size;
  std::vector<int32_t> qsl{0}, seq;
  for (const Req& r : sc.reqs) {
    qsl.push_back(qsl.back() + r.query);
    seq.push_back(r.context + r.query);
  }
  d.t_act = qsl.back();
  d.T = d.t_act + sc.pad_tokens;
  d.plan = make_plan(BatchDesc{qsl, seq, d.T, sc.decode_seq_len_bound}, sc.config());

  // Blocks: each request owns ceil(seq / page) shuffled blocks; the table's spare column and the
  // spare block stay NaN, so a read past seq_len shows.
  int64_t used = 0;
  for (int32_t s : seq) {
    used += (s + page - 1) / page;
    d.max_blocks = std::max<int64_t>(d.max_blocks, (s + page - 1) / page);
  }
  d.max_blocks = std::max(d.max_blocks + 1, sc.min_table_blocks);
  d.num_blocks = std::max(used + 1, sc.min_cache_blocks);
  std::vector<int32_t> ids(static_cast<std::size_t>(used));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  const int32_t spare = static_cast<int32_t>(used);
  std::size_t next = 0;
  for (int64_t r = 0; r < nr; ++r) {
    std::vector<int32_t> row(static_cast<std::size_t>(d.max_blocks), spare);
    for (int64_t j = 0; j < (seq[r] + page - 1) / page; ++j) row[j] = ids[next++];
    d.bt.push_back(row);
  }
  d.block_table = int_tensor_2d(d.bt);
  d.seq_lens = int_tensor(seq);
  auto slot_of = [&](int64_t r, int64_t pos) { return int64_t{d.bt[r][pos / page]} * page + pos % page; };

  const int64_t h = sc.h, T = d.T;
  d.weight = sc.draw_weight ? random_tensor({h * (sc.P + sc.V), kL}, DType::bf16, Device::cpu(), -0.05, 0.05)
                           : Tensor::zeros({h * (sc.P + sc.V), kL}, DType::bf16);
  d.q = random_tensor({T, h, sc.P + kR}, DType::bf16);
  d.kv_c = random_tensor({T, kL}, DType::bf16);
  d.k_pe = random_tensor({T, kR}, DType::bf16);
  if (sc.pad_tokens > 0) {
    fill(d.q.view().slice(0, d.t_act, T), NAN);
    fill(d.kv_c.view().slice(0, d.t_act, T), NAN);
    fill(d.k_pe.view().slice(0, d.t_act, T), NAN);
  }
  std::vector<int64_t> slots(static_cast<std::size_t>(T), -1), ctx_slots;
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t i = 0; i < sc.reqs[r].query; ++i) {
      const int64_t pos = sc.reqs[r].context + i;
      slots[qsl[r] + i] = slot_of(r, pos);
      d.token_req.push_back(r);
      d.token_pos.push_back(pos);
    }
    for (int64_t pos = 0; pos < sc.reqs[r].context; ++pos) ctx_slots.push_back(slot_of(r, pos));
  }
  d.slots = int64_tensor(slots);
  const int64_t nctx = static_cast<int64_t>(ctx_slots.size());
  d.ctx_kv_c = sc.draw_context ? random_tensor({std::max<int64_t>(nctx, 1), kL}, DType::bf16)
                               : Tensor::zeros({std::max<int64_t>(nctx, 1), kL}, DType::bf16);
  d.ctx_k_pe = sc.draw_context ? random_tensor({std::max<int64_t>(nctx, 1), kR}, DType::bf16)
                               : Tensor::zeros({std::max<int64_t>(nctx, 1), kR}, DType::bf16);
  d.ctx_slots = int64_tensor(ctx_slots);

  if (sc.sparse) {
    // Request-local positions the token may see ([0, pos]), valid ones first, -1 padded; the first
    // decode token sees nothing, the second also names a position outside its block table and one
    // at its request's seq_len (a NaN-poisoned row inside the table: invalid, never read, issue 14).
    std::vector<std::vector<int32_t>> rows(static_cast<std::size_t>(T), std::vector<int32_t>(sc.topk, -1));
    for (int64_t t = 0; t < d.t_act; ++t) {
      const bool decode = d.token_req[t] < d.plan.split.num_decodes;
      if (decode && t == 0) continue;
      std::vector<int32_t> cand(static_cast<std::size_t>(d.token_pos[t] + 1));
      std::iota(cand.begin(), cand.end(), 0);
      std::shuffle(cand.begin(), cand.end(), rng());
      const int64_t k = std::min<int64_t>(sc.topk - (t % 3), static_cast<int64_t>(cand.size()));
      for (int64_t j = 0; j < k; ++j) rows[t][j] = cand[j];
      if (decode && t == 1 && k >= 2) rows[t][1] = static_cast<int32_t>(d.max_blocks * page + 3);
      if (decode && t == 1 && k >= 3) rows[t][2] = d.plan.seq_lens[static_cast<std::size_t>(d.token_req[t])];
    }
    d.topk = int_tensor_2d(rows);
  }
  return d;
}

// A cache of num_blocks NaN rows (all bytes 0xff: NaN in every format) holding the context tokens,
// on `device`.
inline CacheBuffer make_cache(const StepData& d, Device device) {
  CacheBuffer cb = allocate_cache(d.sc.format, d.num_blocks, d.sc.page_size, Device::cpu(), d.sc.fp8_scale);
  std::memset(cb.storage.data(), 0xff, cb.storage.nbytes());
  if (d.ctx_slots.numel() > 0) write_cache(d.ctx_kv_c, d.ctx_k_pe, d.ctx_slots, cb.cache);
  if (device.is_cpu()) return cb;
  CacheBuffer dev;
  dev.storage = cb.storage.to(device);
  dev.cache = cb.cache;
  dev.cache.data = dev.storage.view();
  return dev;
}

// `src` converted element-wise to `dtype` on `device`.
inline Tensor convert(const Tensor& src, DType dtype, Device device) {
  Tensor h = Tensor::empty(std::span<const int64_t>(src.view().shape.data(), src.view().ndim), dtype);
  const std::vector<double> v = to_doubles(src);
  for (std::size_t i = 0; i < v.size(); ++i)
    num::store(static_cast<char*>(h.data()) + i * dtype_size(dtype), dtype, v[i]);
  return device.is_cpu() ? h : h.to(device);
}

// Device copies of the step's arguments in the layer dtype, with a NaN-poisoned out, and the plan's
// metadata uploaded once (pinned staging, one copy on the default stream).
struct DeviceArgs {
  Tensor q, kv_c, k_pe, slots, block_table, seq_lens, topk, out;
  PinnedBuffer staging;
  Tensor metadata;
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q;
    a.kv_c = kv_c;
    a.k_pe = k_pe;
    a.slot_mapping = slots;
    a.block_table = block_table;
    a.seq_lens = seq_lens;
    if (topk.defined()) a.topk_indices = topk;
    a.out = out;
    a.metadata = metadata;
    return a;
  }
};
inline DeviceArgs device_args(const StepData& d, Device device, DType dtype) {
  DeviceArgs a;
  a.q = convert(d.q, dtype, device);
  a.kv_c = convert(d.kv_c, dtype, device);
  a.k_pe = convert(d.k_pe, dtype, device);
  a.slots = device.is_cpu() ? d.slots : d.slots.to(device);
  a.block_table = device.is_cpu() ? d.block_table : d.block_table.to(device);
  a.seq_lens = device.is_cpu() ? d.seq_lens : d.seq_lens.to(device);
  if (d.sc.sparse) a.topk = device.is_cpu() ? d.topk : d.topk.to(device);
  a.out = poisoned({d.T, d.sc.h * d.sc.V}, dtype, device);
  a.staging = PinnedBuffer(d.plan.metadata.bytes());
  a.metadata = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(a.staging.size()), 16)}, DType::u8, device);
  upload_step_metadata(d.plan, a.staging.view(), a.metadata);
  return a;
}

struct LayerRun {
  std::vector<double> out;  // [T * h * V]
  Tensor cache;             // host copy of the cache after the step
  KVCache cache_view;       // descriptor of `cache`
  std::size_t workspace_bytes = 0;
};

// One forward step on a fresh cache, workspace exactly workspace_bytes(plan) and NaN-filled (0xff).
inline LayerRun run_layer(const StepData& d, Device device, DType dtype, Precision precision) {
  const MlaAttention layer(d.sc.options(device, dtype), d.weight);
  CacheBuffer cb = make_cache(d, device);
  DeviceArgs a = device_args(d, device, dtype);
  LayerRun run;
  run.workspace_bytes = layer.workspace_bytes(d.plan);
  Tensor ws = Tensor::empty({static_cast<int64_t>(run.workspace_bytes)}, DType::u8, device);
  fill(ws.view(), 255.0);
  layer.forward(d.plan, a.args(), cb.cache, ws.view(), Context{nullptr, precision});
  run.out = to_doubles(a.out);  // synchronous copy: waits for the step on the default stream
  run.cache = device.is_cpu() ? cb.storage : cb.storage.to(Device::cpu());
  run.cache_view = cb.cache;
  run.cache_view.data = run.cache.view();
  return run;
}

// The 576 dequantised values of a cache row, decoded here (not by the library's reader).
inline std::vector<double> decode_row(const KVCache& c, int64_t slot) {
  const auto* p = static_cast<const uint8_t*>(c.data.ptr_at({slot / c.page_size(), slot % c.page_size(), 0}));
  std::vector<double> v(kL + kR);
  for (int i = 0; i < kL + kR; ++i) {
    switch (c.format) {
      case CacheFormat::bf16: v[i] = num::load(p + 2 * i, DType::bf16); break;
      case CacheFormat::fp8: v[i] = num::load(p + i, DType::fp8_e4m3) * static_cast<double>(c.scale); break;
      case CacheFormat::fp8_ds_mla:
        if (i < kL) {
          float s;
          std::memcpy(&s, p + 512 + 4 * (i / 128), 4);
          v[i] = num::load(p + i, DType::fp8_e4m3) * static_cast<double>(s);
        } else {
          v[i] = num::load(p + 528 + 2 * (i - kL), DType::bf16);
        }
        break;
      case CacheFormat::f64: std::memcpy(&v[i], p + 8 * i, 8); break;
      default: ADD_FAILURE() << "layer tests take no " << to_string(c.format) << " cache (V4 records)"; return v;
    }
  }
  return v;
}

// Where a key's 576 values come from.
enum class Source { activation, cache, cache_bf16 };

// Float64 MHA of every actual token; rows of padding tokens are NaN (the layer must not write them).
inline std::vector<double> naive_layer(const StepData& d, const KVCache& cache_after) {
  const Scenario& sc = d.sc;
  const int64_t h = sc.h, P = sc.P, V = sc.V, page = sc.page_size;
  const double scale = sc.dims().softmax_scale;
  const std::vector<double> W = to_doubles(d.weight), q = to_doubles(d.q), kv = to_doubles(d.kv_c),
                            kpe = to_doubles(d.k_pe);
  const Plan& plan = d.plan;
  const bool separate = sc.sparse && sc.format == CacheFormat::fp8_ds_mla && !plan.sparse_mixed_batch;

  // Up-projected key of (source, request, position): per head k_nope [P] | v [V], then rope [R].
  std::map<std::tuple<int, int64_t, int64_t>, std::vector<double>> memo;
  auto key = [&](Source src, int64_t r, int64_t pos) -> const std::vector<double>& {
    auto it = memo.find({static_cast<int>(src), r, pos});
    if (it != memo.end()) return it->second;
    std::vector<double> row(kL + kR);
    if (src == Source::activation) {
      const int64_t t = plan.query_start_loc[r] + (pos - sc.reqs[r].context);
      for (int i = 0; i < kL; ++i) row[i] = kv[t * kL + i];
      for (int i = 0; i < kR; ++i) row[kL + i] = kpe[t * kR + i];
    } else {
      row = decode_row(cache_after, int64_t{d.bt[r][pos / page]} * page + pos % page);
      if (src == Source::cache_bf16)
        for (double& x : row) x = num::round_bf16(static_cast<float>(x));
    }
    std::vector<double> k(h * (P + V) + kR);
    for (int64_t j = 0; j < h * (P + V); ++j) {
      double acc = 0;
      for (int l = 0; l < kL; ++l) acc += W[j * kL + l] * row[l];
      k[j] = acc;
    }
    for (int i = 0; i < kR; ++i) k[h * (P + V) + i] = row[kL + i];
    return memo.emplace(std::make_tuple(static_cast<int>(src), r, pos), std::move(k)).first->second;
  };

  std::vector<double> out(static_cast<std::size_t>(d.T * h * V), std::numeric_limits<double>::quiet_NaN());
  const std::vector<int32_t> topk = sc.sparse ? to_ints(d.topk) : std::vector<int32_t>{};
  for (int64_t t = 0; t < d.t_act; ++t) {
    const int64_t r = d.token_req[t], pos = d.token_pos[t];
    const bool prefill = r >= plan.split.num_decodes;
    std::vector<const std::vector<double>*> keys;
    if (!sc.sparse) {
      // Prefills attend to their new tokens as computed (kv_c), to context through the cache.
      for (int64_t j = 0; j <= pos; ++j)
        keys.push_back(&key(prefill && j >= sc.reqs[r].context ? Source::activation : Source::cache, r, j));
    } else {
      for (int k = 0; k < sc.topk; ++k) {
        const int64_t j = topk[t * sc.topk + k];
        if (j < 0 || j >= plan.seq_lens[static_cast<std::size_t>(r)] || j / page >= d.max_blocks) continue;
        keys.push_back(&key(separate && prefill ? Source::cache_bf16 : Source::cache, r, j));
      }
    }
    for (int64_t n = 0; n < h; ++n) {
      double* o = &out[(t * h + n) * V];
      std::fill(o, o + V, 0.0);
      if (keys.empty()) continue;  // no key: out 0
      const double* qn = &q[(t * h + n) * (P + kR)];
      std::vector<double> s(keys.size());
      double mx = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const std::vector<double>& k = *keys[j];
        double acc = 0;
        for (int64_t p = 0; p < P; ++p) acc += qn[p] * k[n * (P + V) + p];
        for (int i = 0; i < kR; ++i) acc += qn[P + i] * k[h * (P + V) + i];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (std::size_t j = 0; j < keys.size(); ++j)
        for (int64_t v = 0; v < V; ++v) o[v] += s[j] / sum * (*keys[j])[n * (P + V) + P + v];
    }
  }
  return out;
}

// Random batches in decode -> extend -> prefill order with at most n tokens.
inline BatchDesc random_batch(const PlannerConfig& c, int64_t n, std::mt19937_64& g) {
  auto uni = [&g](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); };
  BatchDesc b;
  b.query_start_loc = {0};
  const int64_t thr = c.decode_threshold, len = c.max_model_len;
  const int64_t nreq = uni(1, c.max_num_seqs);
  const int64_t nd = uni(0, nreq), ne = uni(0, nreq - nd);
  const int64_t s_q = uni(1, std::min(thr, len - 1));
  auto add = [&](int64_t ctx, int64_t q) {
    if (b.query_start_loc.back() + q > n) return;
    b.query_start_loc.push_back(static_cast<int32_t>(b.query_start_loc.back() + q));
    b.seq_lens.push_back(static_cast<int32_t>(ctx + q));
  };
  for (int64_t i = 0; i < nd; ++i) add(uni(1, len - s_q), s_q);
  if (thr + 1 < len)
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t q = uni(thr + 1, std::min<int64_t>(len - 1, thr + 40));
      add(uni(1, len - q), q);
    }
  for (int64_t i = nd + ne; i < nreq; ++i) add(0, uni(1, std::min<int64_t>(len, 40)));
  b.num_tokens = b.query_start_loc.back() + uni(0, n - b.query_start_loc.back());
  return b;
}

// Relative tolerance of each actual token against the float64 naive reference: 1e-9 for every
// token (issue 2). The oracle layer computes in float64 and keeps its partial LSEs in f64 too (the ops
// accept f64 LSEs on the CPU): with fp32 LSEs, each context merge would weigh its two parts by
// exp(lse - max) with a relative error of about 2 * 2^-24 * |lse|, ~1e-8, too coarse for this bound.
inline constexpr double kExactTol = 1e-9;
inline std::vector<double> token_tolerance(const StepData& d) {
  return std::vector<double>(static_cast<std::size_t>(d.t_act), kExactTol);
}

// max over actual elements of |got - ref| / (tol(token) * max |ref|): <= 1 passes. Padding rows of
// `got` must still be NaN (never written), else the result is +inf.
inline double error_ratio(const std::vector<double>& got, const std::vector<double>& ref, const StepData& d,
                          const std::vector<double>& tol) {
  const int64_t row = d.sc.h * d.sc.V, actual = d.t_act * row;
  double mag = 0, worst = 0;
  for (int64_t i = 0; i < actual; ++i) mag = std::max(mag, std::fabs(ref[i]));
  for (int64_t i = 0; i < actual; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / (tol[i / row] * (mag > 0 ? mag : 1.0)));
  }
  for (std::size_t i = static_cast<std::size_t>(actual); i < got.size(); ++i)
    if (!std::isnan(got[i])) return std::numeric_limits<double>::infinity();
  return worst;
}
inline double error_ratio(const std::vector<double>& got, const std::vector<double>& ref, const StepData& d) {
  return error_ratio(got, ref, d, token_tolerance(d));
}

}  // namespace mla::test::layer
