// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DeepSeek-V4 block (mla/deepseek_v4.h) on small random weights: a two-request trace served in steps
// through DeepseekV4Attention, and a naive float64 formulation of the same block written from the
// formulas of docs/SEMANTICS.md §17 (not from the library): per token, the projections as dot products,
// RMSNorm, interleaved RoPE with its own YaRN table, softmax over the window and the listed compressed
// rows with the sink, the inverse rotation, the grouped o projection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "mla/deepseek_v4.h"
#include "support/test_util.h"

namespace mla::test::v4 {

// Real head dims (512 = 448 + 64 rope), everything else small; layers: sliding only, ratio 4 (top-k
// picks), ratio 8 (every causal entry).
inline DeepseekV4Config small_config(bool q_head_norm = true) {
  DeepseekV4Config c;
  c.model_type = "deepseek_v4";
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.q_lora_rank = 32;
  c.o_groups = 2;
  c.o_lora_rank = 16;
  c.sliding_window = 8;
  c.index_topk = 3;
  c.q_head_norm = q_head_norm;
  c.yarn_factor = 4.0;
  c.yarn_original_max_position_embeddings = 16;
  c.compress_ratios = {0, 4, 8};
  return c;
}

// bf16-representable random values (every dtype holds them exactly).
inline double bf16_uniform(double lo, double hi) {
  return num::bf16_to_float(num::float_to_bf16(static_cast<float>(uniform(lo, hi))));
}

// Random published-form weights (bf16 tensors) and the same values as float64 matrices [out][in].
struct Weights {
  std::vector<Tensor> keep;
  DeepseekV4Weights w;
  std::vector<double> q_a, q_b, kv, o_a, o_b, q_a_norm, kv_norm, sinks;

  explicit Weights(const DeepseekV4Config& c, uint64_t seed = 47) {
    reseed(seed);  // the same weights whatever ran before
    const int64_t H = c.hidden_size, D = c.head_dim, h = c.num_attention_heads, G = c.o_groups, OL = c.o_lora_rank;
    auto make = [&](int64_t out, int64_t in, double lo, double hi, std::vector<double>& vals) {
      Tensor t = Tensor::empty({out, in}, DType::bf16);
      vals.resize(static_cast<std::size_t>(out * in));
      for (int64_t i = 0; i < out * in; ++i) {
        vals[static_cast<std::size_t>(i)] = bf16_uniform(lo, hi);
        num::store(static_cast<char*>(t.data()) + 2 * i, DType::bf16, vals[static_cast<std::size_t>(i)]);
      }
      keep.push_back(t);
      return t.view();
    };
    auto lin = [&](int64_t out, int64_t in, std::vector<double>& vals) {
      const double a = std::sqrt(3.0 / static_cast<double>(in));
      DeepseekLinear l;
      l.weight = make(out, in, -a, a, vals);
      return l;
    };
    w.q_a_proj = lin(c.q_lora_rank, H, q_a);
    w.q_b_proj = lin(h * D, c.q_lora_rank, q_b);
    w.kv_proj = lin(D, H, kv);
    w.o_a_proj = lin(G * OL, h / G * D, o_a);
    w.o_b_proj = lin(H, G * OL, o_b);
    w.q_a_norm = make(1, c.q_lora_rank, 0.8, 1.2, q_a_norm).select(0, 0);
    w.kv_norm = make(1, D, 0.8, 1.2, kv_norm).select(0, 0);
    w.sinks = make(1, h, -1.0, 1.0, sinks).select(0, 0);
  }
};

// ---- the naive float64 formulation ----

inline std::vector<double> matvec(const std::vector<double>& w, int64_t out, int64_t in, const double* x) {
  std::vector<double> y(static_cast<std::size_t>(out), 0.0);
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) y[static_cast<std::size_t>(i)] += w[static_cast<std::size_t>(i * in + j)] * x[j];
  return y;
}
inline void rms(double* x, int64_t n, const double* g, double eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  const double r = 1.0 / std::sqrt(s / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * (g ? g[i] : 1.0);
}
// Inverse frequencies of the layer, from the formulas (plain; YaRN's ramp between 1 / (factor b^(2i/d))
// and 1 / b^(2i/d) over [floor(d(beta_fast)), ceil(d(beta_slow))]).
inline std::vector<double> naive_inv_freq(const DeepseekV4Config& c, int ratio) {
  const int d = c.qk_rope_head_dim;
  const double base = ratio == 0 ? c.rope_theta : c.compress_rope_theta;
  std::vector<double> f;
  auto corr = [&](double beta) {
    return d * std::log(static_cast<double>(c.yarn_original_max_position_embeddings) / (2 * std::numbers::pi * beta)) /
           (2 * std::log(base));
  };
  const double lo = std::max(0.0, std::floor(corr(c.yarn_beta_fast)));
  double hi = std::min(static_cast<double>(d - 1), std::ceil(corr(c.yarn_beta_slow)));
  if (hi == lo) hi += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    const double plain = 1.0 / std::pow(base, 2.0 * i / d);
    if (ratio == 0 || !c.compress_yarn) {
      f.push_back(plain);
      continue;
    }
    const double t = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);  // 0: extrapolate (plain), 1: interpolate
    f.push_back(t * plain / c.yarn_factor + (1 - t) * plain);
  }
  return f;
}
// Rotates the last R columns of x (pairs 2i, 2i + 1) by angle sign * pos * f[i].
inline void rotate(double* x, int64_t D, int64_t R, const std::vector<double>& f, int64_t pos, double sign) {
  double* r = x + (D - R);
  for (int64_t i = 0; i < R / 2; ++i) {
    const double a = sign * static_cast<double>(pos) * f[static_cast<std::size_t>(i)];
    const double x0 = r[2 * i], x1 = r[2 * i + 1];
    r[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
    r[2 * i + 1] = x1 * std::cos(a) + x0 * std::sin(a);
  }
}

// One request of the trace: its hidden rows [len][H] and compressed rows [entries][D].
struct Request {
  std::vector<std::vector<double>> hidden, compressed;
};

// The block's output for token `pos` of request `req` attending the compressed entries `picks` (< 0
// skipped), as heads [head0, head0 + heads) and groups of a rank would give it (the rank's partial sum).
inline std::vector<double> naive_token(const DeepseekV4Config& c, int ratio, const Weights& w, const Request& req,
                                       int64_t pos, const std::vector<int32_t>& picks, int tp = 1, int rank = 0,
                                       bool unrotate = true) {
  const int64_t H = c.hidden_size, D = c.head_dim, R = c.qk_rope_head_dim, h = c.num_attention_heads,
                QL = c.q_lora_rank, G = c.o_groups, OL = c.o_lora_rank, hpg = h / G;
  const std::vector<double> f = naive_inv_freq(c, ratio);
  auto kv_row = [&](int64_t p) {
    std::vector<double> k = matvec(w.kv, D, H, req.hidden[static_cast<std::size_t>(p)].data());
    rms(k.data(), D, w.kv_norm.data(), c.rms_norm_eps);
    rotate(k.data(), D, R, f, p, 1.0);
    return k;
  };
  std::vector<std::vector<double>> keys;
  for (int64_t p = std::max<int64_t>(0, pos - c.sliding_window + 1); p <= pos; ++p) keys.push_back(kv_row(p));
  for (const int32_t e : picks)
    if (e >= 0) keys.push_back(req.compressed[static_cast<std::size_t>(e)]);
  std::vector<double> qa = matvec(w.q_a, QL, H, req.hidden[static_cast<std::size_t>(pos)].data());
  rms(qa.data(), QL, w.q_a_norm.data(), c.rms_norm_eps);
  const std::vector<double> qb = matvec(w.q_b, h * D, QL, qa.data());
  const int64_t g_per_rank = G / tp, g0 = rank * g_per_rank;
  std::vector<double> ya(static_cast<std::size_t>(g_per_rank * OL), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t g = g0; g < g0 + g_per_rank; ++g) {
    std::vector<double> grp(static_cast<std::size_t>(hpg * D));
    for (int64_t hh = 0; hh < hpg; ++hh) {
      const int64_t head = g * hpg + hh;
      std::vector<double> q(qb.begin() + head * D, qb.begin() + (head + 1) * D);
      if (c.q_head_norm) rms(q.data(), D, nullptr, c.rms_norm_eps);
      rotate(q.data(), D, R, f, pos, 1.0);
      std::vector<double> s;
      double m = w.sinks[static_cast<std::size_t>(head)];
      for (const auto& k : keys) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += q[static_cast<std::size_t>(i)] * k[static_cast<std::size_t>(i)];
        s.push_back(d * scale);
        m = std::max(m, d * scale);
      }
      double l = std::exp(w.sinks[static_cast<std::size_t>(head)] - m);
      for (double x : s) l += std::exp(x - m);
      double* o = grp.data() + hh * D;
      for (std::size_t j = 0; j < keys.size(); ++j)
        for (int64_t i = 0; i < D; ++i) o[i] += std::exp(s[j] - m) / l * keys[j][static_cast<std::size_t>(i)];
      if (unrotate) rotate(o, D, R, f, pos, -1.0);
    }
    for (int64_t r = 0; r < OL; ++r)
      for (int64_t j = 0; j < hpg * D; ++j)
        ya[static_cast<std::size_t>((g - g0) * OL + r)] +=
            w.o_a[static_cast<std::size_t>((g * OL + r) * hpg * D + j)] * grp[static_cast<std::size_t>(j)];
  }
  std::vector<double> y(static_cast<std::size_t>(H), 0.0);
  for (int64_t i = 0; i < H; ++i)
    for (int64_t j = 0; j < g_per_rank * OL; ++j)
      y[static_cast<std::size_t>(i)] += w.o_b[static_cast<std::size_t>(i * G * OL + g0 * OL + j)] * ya[static_cast<std::size_t>(j)];
  return y;
}

// Block options: dtype, the two caches' formats, the tensor-parallel rank, the device.
inline DeepseekV4Options options(DType dt, CacheFormat main, CacheFormat extra, int tp = 1, int rank = 0,
                                 Device dev = Device::cpu()) {
  DeepseekV4Options o;
  o.device = dev;
  o.dtype = dt;
  o.cache_format = main;
  o.extra_cache_format = extra;
  o.tp = tp;
  o.rank = rank;
  return o;
}

// A way to run the block and its bound against a float64 reference.
struct Mode {
  DType dt;
  Precision precision;
  CacheFormat cache;  // both caches
  double bound;       // rel-L2
};

// ---- one served step ----

// A step's tensors (the undefined ones are not passed) and its run through a block.
struct Step {
  Tensor hidden, positions, req, block_table, slots, extra_topk, extra_block_table, extra_kv, extra_slots, out;

  DeepseekV4ForwardArgs args() const {
    auto v = [](const Tensor& t) { return t.defined() ? t.view() : TensorView{}; };
    DeepseekV4ForwardArgs a;
    a.hidden = v(hidden);
    a.positions = v(positions);
    a.req_id = v(req);
    a.block_table = v(block_table);
    a.slot_mapping = v(slots);
    a.extra_topk = v(extra_topk);
    a.extra_block_table = v(extra_block_table);
    a.extra_kv = v(extra_kv);
    a.extra_slot_mapping = v(extra_slots);
    a.out = v(out);
    return a;
  }
  // Runs the step with a NaN-poisoned workspace on the block's device; returns out as doubles.
  std::vector<double> run(const DeepseekV4Attention& blk, const KVCache& main, const KVCache& extra,
                          Precision precision) const {
    const int64_t T = hidden.size(0), K = extra_topk.defined() ? extra_topk.size(1) : 0;
    Tensor ws = Tensor::empty({static_cast<int64_t>(blk.workspace_bytes(T, K))}, DType::u8);
    std::memset(ws.data(), 0xff, ws.nbytes());
    if (blk.options().device.is_cuda()) ws = ws.to(blk.options().device);
    blk.forward(args(), main, extra, ws.view(), Context{nullptr, precision});
    return to_doubles(out.view());
  }
  // The same tensors on `dev` (extra_kv as f32 there: the CUDA cache writers take bf16 / f16 / f32 rows, and the
  // trace's rows are bf16 values, exact in f32).
  Step on(Device dev) const {
    if (dev.is_cpu()) return *this;
    auto to = [&](const Tensor& t) { return t.defined() ? t.to(dev) : Tensor{}; };
    Step d;
    d.hidden = to(hidden);
    d.positions = to(positions);
    d.req = to(req);
    d.block_table = to(block_table);
    d.slots = to(slots);
    d.extra_topk = to(extra_topk);
    d.extra_block_table = to(extra_block_table);
    if (extra_kv.defined()) {
      Tensor f32 = Tensor::empty({extra_kv.size(0), extra_kv.size(1)}, DType::f32);
      const std::vector<double> v = to_doubles(extra_kv.view());
      for (std::size_t i = 0; i < v.size(); ++i) static_cast<float*>(f32.data())[i] = static_cast<float>(v[i]);
      d.extra_kv = f32.to(dev);
    }
    d.extra_slots = to(extra_slots);
    d.out = to(out);
    return d;
  }
};

// f64 rows [n][D] as a [n, D] tensor.
inline Tensor rows_tensor(const std::vector<std::vector<double>>& rows, int64_t D) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), D}, DType::f64);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i].begin(), rows[i].end(), static_cast<double*>(t.data()) + i * static_cast<std::size_t>(D));
  return t;
}

// ---- the served trace ----

// Two requests (lengths 21 and 13) in three steps (a prefill of both, a chunk plus a decode, a decode
// plus the rest), main pages of 4 rows and extra pages of 2, page ids shuffled, caches NaN-poisoned.
struct Trace {
  std::vector<Request> reqs;
  std::vector<std::vector<std::pair<int, int>>> steps = {{{0, 12}, {1, 6}}, {{0, 8}, {1, 1}}, {{0, 1}, {1, 6}}};
  std::vector<std::vector<int32_t>> table, etable;  // per request: page ids
  std::vector<std::vector<std::vector<int32_t>>> picks;  // per request, per position: compressed entries
  int64_t page = 4, epage = 2, blocks = 0, eblocks = 0, K = 0;

  Trace(const DeepseekV4Config& c, int ratio, uint64_t seed) {
    reseed(seed);
    const int64_t H = c.hidden_size, D = c.head_dim;
    const std::vector<int64_t> lens = {21, 13};
    blocks = 1 + (21 + page - 1) / page + (13 + page - 1) / page;
    eblocks = 1 + 2 * ((21 + epage - 1) / epage);
    std::vector<int32_t> ids(static_cast<std::size_t>(blocks)), eids(static_cast<std::size_t>(eblocks));
    for (int32_t i = 0; i < blocks; ++i) ids[static_cast<std::size_t>(i)] = i;
    for (int32_t i = 0; i < eblocks; ++i) eids[static_cast<std::size_t>(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng());
    std::shuffle(eids.begin(), eids.end(), rng());
    std::size_t next = 0, enext = 0;
    K = ratio == 0 ? 0 : ratio == 4 ? c.index_topk : (21 + ratio - 1) / ratio;
    for (const int64_t len : lens) {
      Request r;
      for (int64_t p = 0; p < len; ++p) {
        std::vector<double> x(static_cast<std::size_t>(H));
        for (double& v : x) v = bf16_uniform(-1, 1);
        r.hidden.push_back(x);
      }
      const int64_t entries = ratio == 0 ? 0 : len / ratio;
      for (int64_t e = 0; e < entries; ++e) {
        std::vector<double> x(static_cast<std::size_t>(D));
        for (double& v : x) v = bf16_uniform(-1.5, 1.5);
        r.compressed.push_back(x);
      }
      std::vector<int32_t> t, et;
      for (int64_t b = 0; b < (len + page - 1) / page; ++b) t.push_back(ids[next++]);
      for (int64_t b = 0; b < (21 + epage - 1) / epage; ++b) et.push_back(eids[enext++]);
      table.push_back(t);
      etable.push_back(et);
      // Picks: ratio 4: up to K distinct causal entries in random order, -1 padded; else every causal entry.
      std::vector<std::vector<int32_t>> pk;
      for (int64_t p = 0; p < len; ++p) {
        std::vector<int32_t> row;
        const int32_t visible = ratio == 0 ? 0 : static_cast<int32_t>((p + 1) / ratio);
        for (int32_t e = 0; e < visible; ++e) row.push_back(e);
        if (ratio == 4) std::shuffle(row.begin(), row.end(), rng());
        row.resize(static_cast<std::size_t>(K), -1);
        pk.push_back(row);
      }
      picks.push_back(pk);
      reqs.push_back(r);
    }
  }

  // Serves the trace through `blk` with caches of its formats; returns each step's output rows in order
  // and (naive) the naive formulation's rows.
  std::vector<double> serve(const DeepseekV4Attention& blk, Precision precision) const {
    const DeepseekV4Config& c = blk.config();
    const int64_t H = c.hidden_size, D = c.head_dim;
    const DType dt = blk.options().dtype;
    CacheBuffer main = allocate_cache(blk.options().cache_format, blocks, page, Device::cpu(), 1.0f, 512, 64);
    CacheBuffer extra = allocate_cache(blk.options().extra_cache_format, eblocks, epage, Device::cpu(), 1.0f, 512, 64);
    std::memset(main.storage.data(), 0xff, main.storage.nbytes());
    std::memset(extra.storage.data(), 0xff, extra.storage.nbytes());
    const Device dev = blk.options().device;
    if (dev.is_cuda()) {  // the poisoned caches copied to the device, their views rebased onto the copies
      for (CacheBuffer* cb : {&main, &extra}) {
        const std::ptrdiff_t at = static_cast<const char*>(cb->cache.data.data) - static_cast<const char*>(cb->storage.data());
        cb->storage = cb->storage.to(dev);
        cb->cache.data.data = static_cast<char*>(cb->storage.data()) + at;
        cb->cache.data.device = dev;
      }
    }
    const int ratio = blk.compress_ratio();
    std::vector<int64_t> done(reqs.size(), 0);
    std::vector<double> out;
    std::vector<std::vector<int32_t>> bt_rows = table, ebt_rows = etable;
    for (auto& r : bt_rows) r.resize(6, 0);
    const Tensor bt = int_tensor_2d(bt_rows), ebt = int_tensor_2d(ebt_rows);
    for (const auto& step : steps) {
      int64_t T = 0;
      for (const auto& [r, n] : step) T += n;
      Tensor x = Tensor::empty({T, H}, dt), y = poisoned({T, H}, dt);
      std::vector<int64_t> pos, slots, eslots;
      std::vector<int32_t> rid;
      std::vector<std::vector<int32_t>> topk;
      std::vector<std::vector<double>> ekv;
      int64_t t = 0;
      for (const auto& [r, n] : step) {
        const Request& q = reqs[static_cast<std::size_t>(r)];
        for (int64_t i = 0; i < n; ++i, ++t) {
          const int64_t p = done[static_cast<std::size_t>(r)] + i;
          pos.push_back(p);
          rid.push_back(r);
          slots.push_back(int64_t{table[static_cast<std::size_t>(r)][static_cast<std::size_t>(p / page)]} * page + p % page);
          for (int64_t j = 0; j < H; ++j)
            num::store(x.view().ptr_at({t, j}), dt, q.hidden[static_cast<std::size_t>(p)][static_cast<std::size_t>(j)]);
          if (ratio > 0) {
            topk.push_back(picks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)]);
            // The compressor closes entry e at its window's last token (e + 1) * ratio - 1.
            if ((p + 1) % ratio == 0) {
              const int64_t e = (p + 1) / ratio - 1;
              ekv.push_back(q.compressed[static_cast<std::size_t>(e)]);
              eslots.push_back(int64_t{etable[static_cast<std::size_t>(r)][static_cast<std::size_t>(e / epage)]} * epage +
                               e % epage);
            }
          }
        }
        done[static_cast<std::size_t>(r)] += n;
      }
      Step st{x, int64_tensor(pos), int_tensor(rid), bt, int64_tensor(slots)};
      st.out = y;
      if (ratio > 0) {
        st.extra_topk = int_tensor_2d(topk);
        st.extra_block_table = ebt;
        if (!ekv.empty()) {
          st.extra_kv = rows_tensor(ekv, D);
          st.extra_slots = int64_tensor(eslots);
        }
      }
      const std::vector<double> o = st.on(dev).run(blk, main.cache, extra.cache, precision);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }

  std::vector<double> naive(const DeepseekV4Config& c, int ratio, const Weights& w, int tp = 1, int rank = 0,
                            bool unrotate = true) const {
    std::vector<int64_t> done(reqs.size(), 0);
    std::vector<double> out;
    for (const auto& step : steps)
      for (const auto& [r, n] : step) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t p = done[static_cast<std::size_t>(r)] + i;
          const std::vector<int32_t> pk = ratio > 0 ? picks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)]
                                                    : std::vector<int32_t>{};
          const std::vector<double> y = naive_token(c, ratio, w, reqs[static_cast<std::size_t>(r)], p, pk, tp, rank, unrotate);
          out.insert(out.end(), y.begin(), y.end());
        }
        done[static_cast<std::size_t>(r)] += n;
      }
    return out;
  }
};

}  // namespace mla::test::v4
