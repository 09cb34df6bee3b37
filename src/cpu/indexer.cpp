// SPDX-License-Identifier: Apache-2.0
// CPU backend of the lightning indexer (mla/indexer.h, docs/INDEXER.md). The logits are computed from
// the exact e4m3 values with Acc = double sums in Precision::reference (the oracle the CUDA kernels
// are tested against) and float sums in Precision::fast. Top-k is exact on the given logits (the same
// order key as CUDA: core/indexer_math.h), so both backends select the same positions from the same
// logits.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/index_view.h"
#include "core/indexer_math.h"
#include "core/numeric.h"
#include "cpu/convert.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

constexpr int64_t D = kIndexerHeadDim;

// The 256 e4m3 values (exact in float).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[static_cast<std::size_t>(i)] = num::e4m3_to_float(static_cast<uint8_t>(i));
    return v;
  }();
  return t;
}

// Byte address of a block of the cache.
inline uint8_t* block_ptr(const IndexerKCache& c, int64_t block) {
  return static_cast<uint8_t*>(c.data.data) + block * c.data.stride[0];
}
inline uint8_t* codes_at(const IndexerKCache& c, int64_t block, int64_t off) { return block_ptr(c, block) + off * D; }
inline uint8_t* scale_at(const IndexerKCache& c, int64_t block, int64_t off) {
  return block_ptr(c, block) + c.page_size() * D + off * kIndexerScaleBytes;
}

// One key as seen by the logits loop: its 128 codes and its scale.
struct KeyRef {
  const uint8_t* codes;
  float scale;
};

// logits[cols] of one query row: q [h][128] and w [h] already in Acc, keys by key(j).
template <class Acc, class KeyFn>
void logits_row(const Acc* q, const Acc* w, int64_t h, int64_t lo, int64_t hi, int64_t width, float* out,
                const KeyFn& key) {
  const auto& lut = e4m3_table();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < width; ++j) {
    if (j < lo || j >= hi) {
      out[j] = ninf;
      continue;
    }
    const KeyRef k = key(j);
    Acc kv[D];
    for (int64_t d = 0; d < D; ++d) kv[d] = static_cast<Acc>(lut[k.codes[d]]);
    Acc sum = 0;
    for (int64_t hh = 0; hh < h; ++hh) {
      const Acc* qh = q + hh * D;
      Acc part[8] = {};  // 8 independent sums: the compiler vectorises the fixed-size inner loop
      for (int64_t d = 0; d < D; d += 8)
        for (int i = 0; i < 8; ++i) part[i] += qh[d + i] * kv[d + i];
      const Acc dot = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      sum += w[hh] * indexer::relu_nan(dot * static_cast<Acc>(k.scale));
    }
    out[j] = static_cast<float>(sum);
  }
}

// The query row t of q [T, h, 128] and weights [T, h] as Acc.
template <class Acc>
void load_query(const TensorView& q, const TensorView& weights, int64_t t, std::vector<Acc>& qv, std::vector<Acc>& wv) {
  const auto& lut = e4m3_table();
  const int64_t h = q.size(1);
  qv.resize(static_cast<std::size_t>(h * D));
  wv.resize(static_cast<std::size_t>(h));
  const uint8_t* qb = static_cast<const uint8_t*>(q.data);
  const float* wb = static_cast<const float*>(weights.data);
  for (int64_t hh = 0; hh < h; ++hh) {
    const uint8_t* row = qb + t * q.stride[0] + hh * q.stride[1];
    for (int64_t d = 0; d < D; ++d) qv[static_cast<std::size_t>(hh * D + d)] = static_cast<Acc>(lut[row[d]]);
    wv[static_cast<std::size_t>(hh)] = static_cast<Acc>(wb[t * weights.stride[0] + hh * weights.stride[1]]);
  }
}

template <class Acc>
void logits_prefill_impl(const TensorView& q, const TensorView& weights, const TensorView& k,
                         const TensorView& k_scale, const TensorView& row_starts, const TensorView& row_ends,
                         const TensorView& logits) {
  const int64_t T = q.size(0), Tk = k.size(0), h = q.size(1);
  const uint8_t* kb = static_cast<const uint8_t*>(k.data);
  const float* sb = static_cast<const float*>(k_scale.data);
  auto key = [&](int64_t j) { return KeyRef{kb + j * k.stride[0], sb[j * k_scale.stride[0]]}; };
#pragma omp parallel
  {
    std::vector<Acc> qv, wv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      load_query(q, weights, t, qv, wv);
      const int64_t lo = std::max<int64_t>(index_at(row_starts, t), 0);
      const int64_t hi = std::min<int64_t>(index_at(row_ends, t), Tk);
      logits_row(qv.data(), wv.data(), h, lo, hi, Tk, static_cast<float*>(logits.data) + t * logits.stride[0], key);
    }
  }
}

template <class Acc>
void logits_decode_impl(const TensorView& q, const TensorView& weights, const IndexerKCache& cache,
                        const TensorView& block_table, const TensorView& seq_lens, int64_t s_q,
                        const TensorView& logits) {
  const int64_t T = q.size(0), h = q.size(1), N = logits.size(1), ps = cache.page_size();
#pragma omp parallel
  {
    std::vector<Acc> qv, wv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t / s_q, i = t % s_q;
      load_query(q, weights, t, qv, wv);
      const int64_t visible = std::clamp<int64_t>(index_at(seq_lens, b) - s_q + i + 1, 0, N);
      auto key = [&](int64_t p) {
        const int64_t blk = index_at(block_table, b, p / ps), off = p % ps;
        float s;
        std::memcpy(&s, scale_at(cache, blk, off), 4);
        return KeyRef{codes_at(cache, blk, off), s};
      };
      logits_row(qv.data(), wv.data(), h, 0, visible, N, static_cast<float*>(logits.data) + t * logits.stride[0], key);
    }
  }
}

// In-place 128-point Walsh-Hadamard transform (Sylvester order), scaled by 1/sqrt(128).
template <class Acc>
void hadamard128(Acc* x) {
  for (int m = 1; m < 128; m <<= 1)
    for (int i = 0; i < 128; ++i)
      if ((i & m) == 0) {
        const Acc a = x[i], b = x[i | m];
        x[i] = a + b;
        x[i | m] = a - b;
      }
  const Acc norm = static_cast<Acc>(1.0 / std::sqrt(128.0));
  for (int i = 0; i < 128; ++i) x[i] *= norm;
}

// Non-interleaved (NeoX) rope on dims [0, 64): dim i pairs with i + 32; cs = 32 cos then 32 sin.
template <class Acc>
void rope_neox(Acc* x, const float* cs) {
  for (int i = 0; i < 32; ++i) {
    const Acc c = cs[i], sn = cs[32 + i], a = x[i], b = x[i + 32];
    x[i] = a * c - b * sn;
    x[i + 32] = b * c + a * sn;
  }
}

template <class Acc>
void prepare_impl(const TensorView& q, const TensorView& k, const TensorView& weights_raw, const TensorView& positions,
                  const TensorView& cos_sin, const TensorView& k_norm_weight, const TensorView& k_norm_bias,
                  const TensorView& q_codes, const TensorView& weights, const TensorView& k_out, double eps,
                  bool hadamard) {
  const int64_t T = q.size(0), h = q.size(1);
  const Acc wscale = static_cast<Acc>(1.0 / std::sqrt(static_cast<double>(h)) / std::sqrt(128.0));
  auto row_ptr = [](const TensorView& v, int64_t i, int64_t j = 0) {
    return static_cast<const char*>(v.data) +
           (i * v.stride[0] + (v.ndim > 2 ? j * v.stride[1] : 0)) * static_cast<int64_t>(v.element_size());
  };
  const float* lnw = static_cast<const float*>(k_norm_weight.data);
  const float* lnb = static_cast<const float*>(k_norm_bias.data);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* cs = static_cast<const float*>(cos_sin.data) + index_at(positions, t) * cos_sin.stride[0];
    Acc x[D];
    load_row(row_ptr(k, t), k.dtype, x, D);
    Acc mean = 0, var = 0;
    for (int64_t d = 0; d < D; ++d) mean += x[d];
    mean /= static_cast<Acc>(D);
    for (int64_t d = 0; d < D; ++d) var += (x[d] - mean) * (x[d] - mean);
    const Acc inv = static_cast<Acc>(1) / std::sqrt(var / static_cast<Acc>(D) + static_cast<Acc>(eps));
    for (int64_t d = 0; d < D; ++d)
      x[d] = (x[d] - mean) * inv * static_cast<Acc>(lnw[d * k_norm_weight.stride[0]]) +
             static_cast<Acc>(lnb[d * k_norm_bias.stride[0]]);
    rope_neox(x, cs);
    if (hadamard) hadamard128(x);
    store_row(static_cast<char*>(k_out.data) + t * k_out.stride[0] * static_cast<int64_t>(k_out.element_size()),
              k_out.dtype, x, D);
    for (int64_t hh = 0; hh < h; ++hh) {
      load_row(row_ptr(q, t, hh), q.dtype, x, D);
      rope_neox(x, cs);
      if (hadamard) hadamard128(x);
      Acc amax = 0;
      for (int64_t d = 0; d < D; ++d) amax = std::fmax(amax, std::fabs(x[d]));
      const float sc = indexer::writer_scale(static_cast<float>(amax), true);
      uint8_t* codes = static_cast<uint8_t*>(q_codes.data) + t * q_codes.stride[0] + hh * q_codes.stride[1];
      for (int64_t d = 0; d < D; ++d) codes[d] = num::float_to_e4m3(to_float_odd(x[d] / static_cast<Acc>(sc)));
      const Acc raw = static_cast<Acc>(num::load(row_ptr(weights_raw, t) + hh * weights_raw.stride[1] *
                                                     static_cast<int64_t>(weights_raw.element_size()),
                                                 weights_raw.dtype));
      static_cast<float*>(weights.data)[t * weights.stride[0] + hh * weights.stride[1]] =
          static_cast<float>(raw * wscale * static_cast<Acc>(sc));
    }
  }
}

// Calls f(double{}) in Precision::reference, f(float{}) otherwise: the accumulation type.
template <class F>
void with_accumulator(const Context& ctx, F&& f) {
  if (ctx.precision == Precision::reference) f(0.0);
  else f(0.0f);
}

}  // namespace

void indexer_write_k(const TensorView& k, const TensorView& slot_mapping, const IndexerKCache& cache,
                     IndexerScale scale, const Context&) {
  const int64_t n = slot_mapping.size(0), ps = cache.page_size();
  const bool ue8m0 = scale == IndexerScale::ue8m0;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = index_at(slot_mapping, t);
    if (slot < 0) continue;
    float x[D];
    load_row(static_cast<const char*>(k.data) + t * k.stride[0] * static_cast<int64_t>(k.element_size()), k.dtype, x,
             D);
    float amax = 0.0f;
    for (int64_t d = 0; d < D; ++d) amax = std::fmax(amax, std::fabs(x[d]));
    const float s = indexer::writer_scale(amax, ue8m0);
    uint8_t* codes = codes_at(cache, slot / ps, slot % ps);
    for (int64_t d = 0; d < D; ++d) codes[d] = num::float_to_e4m3(x[d] / s);
    std::memcpy(scale_at(cache, slot / ps, slot % ps), &s, 4);
  }
}

void indexer_gather_k(const IndexerKCache& cache, const TensorView& dst_k, const TensorView& dst_scale,
                      const TensorView& block_table, const TensorView& cu_seq_lens, const Context&) {
  const int64_t B = cu_seq_lens.size(0) - 1, ps = cache.page_size();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row0 = index_at(cu_seq_lens, b), len = index_at(cu_seq_lens, b + 1) - row0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < len; ++i) {
      const int64_t blk = index_at(block_table, b, i / ps), off = i % ps;
      std::memcpy(static_cast<uint8_t*>(dst_k.data) + (row0 + i) * dst_k.stride[0], codes_at(cache, blk, off), D);
      std::memcpy(static_cast<float*>(dst_scale.data) + (row0 + i) * dst_scale.stride[0], scale_at(cache, blk, off),
                  4);
    }
  }
}

void indexer_logits_prefill(const TensorView& q, const TensorView& weights, const TensorView& k,
                            const TensorView& k_scale, const TensorView& row_starts, const TensorView& row_ends,
                            const TensorView& logits, const Context& ctx) {
  with_accumulator(ctx, [&](auto acc) {
    logits_prefill_impl<decltype(acc)>(q, weights, k, k_scale, row_starts, row_ends, logits);
  });
}

void indexer_logits_decode(const TensorView& q, const TensorView& weights, const IndexerKCache& cache,
                           const TensorView& block_table, const TensorView& seq_lens, int64_t s_q,
                           const TensorView& logits, const Context& ctx) {
  with_accumulator(ctx, [&](auto acc) {
    logits_decode_impl<decltype(acc)>(q, weights, cache, block_table, seq_lens, s_q, logits);
  });
}

void indexer_prepare(const TensorView& q, const TensorView& k, const TensorView& weights_raw,
                     const TensorView& positions, const TensorView& cos_sin, const TensorView& k_norm_weight,
                     const TensorView& k_norm_bias, const TensorView& q_codes, const TensorView& weights,
                     const TensorView& k_out, double eps, bool hadamard, const Context& ctx) {
  with_accumulator(ctx, [&](auto acc) {
    prepare_impl<decltype(acc)>(q, k, weights_raw, positions, cos_sin, k_norm_weight, k_norm_bias, q_codes, weights,
                                k_out, eps, hadamard);
  });
}

void indexer_topk_rows(const TensorView& logits, const TensorView& row_starts, const TensorView& row_ends,
                       const TensorView& seq_lens, int64_t s_q, const TensorView& out, const Context&) {
  const int64_t T = logits.size(0), N = logits.size(1), K = out.size(1);
#pragma omp parallel
  {
    std::vector<std::pair<uint32_t, int32_t>> cand;  // (order key, position)
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      int64_t start = 0, end = 0;
      if (seq_lens.defined()) {
        end = index_at(seq_lens, t / s_q) - s_q + t % s_q + 1;
      } else {
        start = row_starts.defined() ? index_at(row_starts, t) : 0;
        end = index_at(row_ends, t);
      }
      start = std::max<int64_t>(start, 0);
      end = std::min(end, N);
      const float* row = static_cast<const float*>(logits.data) + t * logits.stride[0];
      cand.clear();
      for (int64_t j = start; j < end; ++j)
        cand.emplace_back(indexer::topk_key(row[j]), static_cast<int32_t>(j - start));
      // Larger key first, then the lower position.
      auto better = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
      if (static_cast<int64_t>(cand.size()) > K) {
        std::nth_element(cand.begin(), cand.begin() + (K - 1), cand.end(), better);
        cand.resize(static_cast<std::size_t>(K));
      }
      std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      int32_t* o = static_cast<int32_t*>(out.data) + t * out.stride[0];
      const int64_t n = static_cast<int64_t>(cand.size());
      for (int64_t j = 0; j < K; ++j) o[j * out.stride[1]] = j < n ? cand[static_cast<std::size_t>(j)].second : -1;
    }
  }
}

}  // namespace mla::cpu
