// SPDX-License-Identifier: Apache-2.0
#pragma once
// Independent oracles of the lightning indexer for the CPU and GPU tests (docs/INDEXER.md). They do
// not call the library's helpers (own e4m3 decoder, own cache byte layout, own order rule), so a wrong
// rule in the library fails a test instead of agreeing with itself.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

namespace mla::test::indexer {

// OCP e4m3fn: bias 7, 3 mantissa bits, 0x7f / 0xff NaN, no inf.
inline double e4m3_value(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

// e4m3_value of every code (the oracles' inner loops).
inline const double* e4m3_values() {
  static const std::vector<double> t = [] {
    std::vector<double> v(256);
    for (int i = 0; i < 256; ++i) v[static_cast<std::size_t>(i)] = e4m3_value(static_cast<uint8_t>(i));
    return v;
  }();
  return t.data();
}

// Token `off` of a block that starts at `block` (page_size tokens): codes at off*128, then the scales.
inline const uint8_t* key_codes(const uint8_t* block, int64_t off) { return block + off * 128; }
inline float key_scale(const uint8_t* block, int64_t page_size, int64_t off) {
  float s;
  std::memcpy(&s, block + page_size * 128 + off * 4, 4);
  return s;
}

// sum_h w[h] * relu((q[h] . k) * s) in float64; q: h x 128 codes (row stride q_head), w: h floats.
inline double logit(const uint8_t* q, int64_t q_head, const float* w, int64_t h, const uint8_t* k, float s) {
  const double* ev = e4m3_values();
  double sum = 0;
  for (int64_t hh = 0; hh < h; ++hh) {
    double dot = 0;
    for (int d = 0; d < 128; ++d) dot += ev[q[hh * q_head + d]] * ev[k[d]];
    const double v = dot * static_cast<double>(s);
    sum += static_cast<double>(w[hh]) * (std::isnan(v) ? v : std::max(v, 0.0));
  }
  return sum;
}

// The error bound of a logit computed from these fp8 inputs with fp32 (or coarser) accumulation:
// sum_h |w[h]| * sum_d |q k| * |s|: every rounding of the sums is relative to this magnitude.
inline double logit_magnitude(const uint8_t* q, int64_t q_head, const float* w, int64_t h, const uint8_t* k, float s) {
  const double* ev = e4m3_values();
  double sum = 0;
  for (int64_t hh = 0; hh < h; ++hh) {
    double dot = 0;
    for (int d = 0; d < 128; ++d) dot += std::fabs(ev[q[hh * q_head + d]] * ev[k[d]]);
    sum += std::fabs(static_cast<double>(w[hh])) * dot * std::fabs(static_cast<double>(s));
  }
  return sum;
}

// "a ranks before b" by the rule of docs/INDEXER.md: larger value first, NaN last, +0 before -0,
// then the lower position.
inline bool ranks_before(float a, int32_t pa, float b, int32_t pb) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  if (!na && std::signbit(a) != std::signbit(b)) return !std::signbit(a);
  return pa < pb;
}

// Top-k of row[start, end) by full sort: ascending positions (relative to start), -1 padded to k.
inline std::vector<int32_t> topk_row(const float* row, int64_t start, int64_t end, int64_t k) {
  std::vector<int32_t> pos;
  for (int64_t j = start; j < end; ++j) pos.push_back(static_cast<int32_t>(j - start));
  std::sort(pos.begin(), pos.end(),
            [&](int32_t a, int32_t b) { return ranks_before(row[start + a], a, row[start + b], b); });
  if (static_cast<int64_t>(pos.size()) > k) pos.resize(static_cast<std::size_t>(k));
  std::sort(pos.begin(), pos.end());
  pos.resize(static_cast<std::size_t>(k), -1);
  return pos;
}

// calc_diff (vLLM's logits check): 1 - 2 sum(x y) / sum(x^2 + y^2) over positions finite in both.
inline double calc_diff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, sq = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    xy += x[i] * y[i];
    sq += x[i] * x[i] + y[i] * y[i];
  }
  return sq == 0 ? 0.0 : 1.0 - 2.0 * xy / sq;
}

// Compares a top-k row `got` with the oracle's selection from the float64 logits `ref` (row[start,
// end)): valid entries form a prefix of ascending positions inside the row, the count is
// min(k, end - start), and every position in one set but not the other has an oracle value within
// `tol` of the oracle's k-th value (a near-tie that rounding may decide either way). "" when it holds.
inline std::string check_topk_row(const std::vector<int32_t>& got, const std::vector<double>& ref, int64_t start,
                                  int64_t end, int64_t k, double tol) {
  const int64_t len = std::max<int64_t>(end - start, 0), want_n = std::min(k, len);
  std::vector<float> rf(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) rf[i] = static_cast<float>(ref[i]);
  int64_t n = 0;
  while (n < static_cast<int64_t>(got.size()) && got[static_cast<std::size_t>(n)] >= 0) ++n;
  for (int64_t i = n; i < static_cast<int64_t>(got.size()); ++i)
    if (got[static_cast<std::size_t>(i)] != -1) return "entry " + std::to_string(i) + " after the padding is not -1";
  if (n != want_n) return "valid count " + std::to_string(n) + ", expected " + std::to_string(want_n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = got[static_cast<std::size_t>(i)];
    if (p >= len) return "position " + std::to_string(p) + " outside the row of " + std::to_string(len);
    if (i > 0 && got[static_cast<std::size_t>(i - 1)] >= p) return "positions not strictly ascending at " + std::to_string(i);
  }
  if (n == 0) return "";
  const std::vector<int32_t> want = topk_row(rf.data(), start, end, k);
  double kth = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) kth = std::min(kth, ref[static_cast<std::size_t>(start + want[static_cast<std::size_t>(i)])]);
  std::vector<int32_t> a(got.begin(), got.begin() + n), b(want.begin(), want.begin() + n), diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  for (int32_t p : diff) {
    const double v = ref[static_cast<std::size_t>(start + p)];
    if (!(std::fabs(v - kth) <= tol))
      return "position " + std::to_string(p) + " (value " + std::to_string(v) + ") differs from the oracle's set; k-th value " +
             std::to_string(kth) + ", tolerance " + std::to_string(tol);
  }
  return "";
}

}  // namespace mla::test::indexer

#include <random>

#include "mla/indexer.h"
#include "support/test_util.h"

namespace mla::test::indexer {

// A random finite e4m3 code (never the NaN codes 0x7f / 0xff).
inline uint8_t random_code(std::mt19937_64& g) {
  for (;;) {
    const auto c = static_cast<uint8_t>(g() & 0xff);
    if ((c & 0x7f) != 0x7f) return c;
  }
}
// Codes whose values look like quantised activations (|v| mostly 1..448, a spread of magnitudes).
inline void fill_codes(uint8_t* p, int64_t n, std::mt19937_64& g) {
  for (int64_t i = 0; i < n; ++i) p[i] = random_code(g);
}

// A decode problem on the host: b requests of seq_lens[r] positions in a paged indexer cache (blocks
// shuffled, the unused ones NaN-filled), s_q query rows per request, h heads.
struct DecodeProblem {
  int64_t b = 0, s_q = 1, h = 64, page = 64, max_blocks = 0, width = 0;
  std::vector<int32_t> seq_lens;
  IndexerCacheBuffer cache;
  Tensor block_table, seq_lens_t, q, weights;  // [b, max_blocks] i32, [b] i32, [T, h, 128] fp8, [T, h] f32
};

inline DecodeProblem make_decode_problem(const std::vector<int32_t>& seq_lens, int64_t s_q, int64_t h, int64_t page,
                                         uint64_t seed, int64_t width = 0) {
  DecodeProblem p;
  std::mt19937_64 g(seed);
  p.b = static_cast<int64_t>(seq_lens.size());
  p.s_q = s_q;
  p.h = h;
  p.page = page;
  p.seq_lens = seq_lens;
  int64_t max_len = 1;
  for (int32_t l : seq_lens) max_len = std::max<int64_t>(max_len, l);
  p.max_blocks = (max_len + page - 1) / page;
  p.width = width > 0 ? width : max_len;
  const int64_t num_blocks = p.b * p.max_blocks + 3;
  p.cache = allocate_indexer_cache(num_blocks, page, Device::cpu());
  auto* bytes = static_cast<uint8_t*>(p.cache.storage.data());
  std::memset(bytes, 0x7f, static_cast<std::size_t>(p.cache.storage.nbytes()));  // NaN codes and NaN scales
  std::vector<int32_t> perm(static_cast<std::size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  p.block_table = Tensor::empty({p.b, p.max_blocks}, DType::i32);
  std::uniform_real_distribution<float> sc(0.5f, 2.0f);
  for (int64_t r = 0; r < p.b; ++r) {
    for (int64_t j = 0; j < p.max_blocks; ++j) {
      const int32_t blk = perm[static_cast<std::size_t>(r * p.max_blocks + j)];
      static_cast<int32_t*>(p.block_table.data())[r * p.max_blocks + j] = blk;
      uint8_t* base = bytes + blk * page * kIndexerEntryBytes;
      for (int64_t o = 0; o < page; ++o) {
        if (j * page + o >= seq_lens[static_cast<std::size_t>(r)]) continue;  // past the length: stays NaN
        fill_codes(base + o * 128, 128, g);
        const float s = std::ldexp(sc(g), -9);
        std::memcpy(base + page * 128 + o * 4, &s, 4);
      }
    }
  }
  p.seq_lens_t = int_tensor(seq_lens);
  const int64_t T = p.b * s_q;
  p.q = Tensor::empty({T, h, 128}, DType::fp8_e4m3);
  fill_codes(static_cast<uint8_t*>(p.q.data()), T * h * 128, g);
  p.weights = Tensor::empty({T, h}, DType::f32);
  std::uniform_real_distribution<float> wd(-1.0f, 1.0f);
  for (int64_t i = 0; i < T * h; ++i) static_cast<float*>(p.weights.data())[i] = wd(g) * 0.01f;
  return p;
}

// Visible length of decode row t.
inline int64_t decode_visible(const DecodeProblem& p, int64_t t) {
  return std::max<int64_t>(p.seq_lens[static_cast<std::size_t>(t / p.s_q)] - p.s_q + t % p.s_q + 1, 0);
}

// The float64 oracle logits [T, width] and their magnitudes (logit_magnitude) of a decode problem.
inline void decode_oracle(const DecodeProblem& p, std::vector<double>& ref, std::vector<double>& mag) {
  const int64_t T = p.b * p.s_q;
  ref.assign(static_cast<std::size_t>(T * p.width), -std::numeric_limits<double>::infinity());
  mag.assign(ref.size(), 0.0);
  const auto* bytes = static_cast<const uint8_t*>(p.cache.storage.data());
  const auto* bt = static_cast<const int32_t*>(p.block_table.data());
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* q = static_cast<const uint8_t*>(p.q.data()) + t * p.h * 128;
    const float* w = static_cast<const float*>(p.weights.data()) + t * p.h;
    const int64_t vis = std::min(decode_visible(p, t), p.width);
    for (int64_t j = 0; j < vis; ++j) {
      const uint8_t* block = bytes + bt[(t / p.s_q) * p.max_blocks + j / p.page] * p.page * kIndexerEntryBytes;
      const uint8_t* k = key_codes(block, j % p.page);
      const float s = key_scale(block, p.page, j % p.page);
      ref[static_cast<std::size_t>(t * p.width + j)] = logit(q, 128, w, p.h, k, s);
      mag[static_cast<std::size_t>(t * p.width + j)] = logit_magnitude(q, 128, w, p.h, k, s);
    }
  }
}

// Checks every decode row's top-k `got` [T, k] against the oracle logits `ref` (decode_oracle) with
// the near-tie tolerance rel * (the row's largest logit magnitude). "" or "row t: <why>".
inline std::string check_decode_topk(const DecodeProblem& p, const std::vector<double>& ref,
                                     const std::vector<double>& mag, const std::vector<int32_t>& got, int64_t k,
                                     double rel) {
  for (int64_t t = 0; t < p.b * p.s_q; ++t) {
    const std::vector<double> row(ref.begin() + t * p.width, ref.begin() + (t + 1) * p.width);
    double tol = 0;
    for (int64_t j = 0; j < p.width; ++j) tol = std::max(tol, rel * mag[static_cast<std::size_t>(t * p.width + j)]);
    const std::string e = check_topk_row(std::vector<int32_t>(got.begin() + t * k, got.begin() + (t + 1) * k), row,
                                         0, decode_visible(p, t), k, tol);
    if (!e.empty()) return "row " + std::to_string(t) + ": " + e;
  }
  return "";
}

}  // namespace mla::test::indexer

namespace mla::test::indexer {

// indexer_prepare's oracle (float64, straight from the formulas of mla/indexer.h: LayerNorm, NeoX rope
// on dims < 64, the Hadamard matrix product, the ue8m0 scale, codes by nearest value).
struct PrepareOracle {
  std::vector<double> q_scaled;  // [T, h, 128] q / s before rounding to e4m3
  std::vector<float> q_scale;    // [T, h]
  std::vector<double> weights;   // [T, h]
  std::vector<double> k;         // [T, 128]
};

inline void oracle_transform(std::vector<double>& x, const float* cs, bool hadamard) {
  for (int i = 0; i < 32; ++i) {
    const double c = cs[i], s = cs[32 + i], a = x[static_cast<std::size_t>(i)], b = x[static_cast<std::size_t>(i + 32)];
    x[static_cast<std::size_t>(i)] = a * c - b * s;
    x[static_cast<std::size_t>(i + 32)] = b * c + a * s;
  }
  if (!hadamard) return;
  std::vector<double> y(128, 0.0);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j)
      y[static_cast<std::size_t>(i)] += ((__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) *
                                        x[static_cast<std::size_t>(j)];
  for (int i = 0; i < 128; ++i) x[static_cast<std::size_t>(i)] = y[static_cast<std::size_t>(i)] / std::sqrt(128.0);
}

// Inputs as f32 host tensors: q [T, h, 128], k [T, 128], w_raw [T, h], positions (int32), cos_sin [P, 64],
// ln_w, ln_b [128].
inline PrepareOracle prepare_oracle(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& w_raw, const std::vector<int32_t>& pos,
                                    const std::vector<float>& cos_sin, const std::vector<float>& ln_w,
                                    const std::vector<float>& ln_b, int64_t h, double eps, bool hadamard) {
  const int64_t T = static_cast<int64_t>(pos.size());
  PrepareOracle o;
  for (int64_t t = 0; t < T; ++t) {
    const float* cs = cos_sin.data() + pos[static_cast<std::size_t>(t)] * 64;
    std::vector<double> x(k.begin() + t * 128, k.begin() + (t + 1) * 128);
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= 128;
    for (double v : x) var += (v - mean) * (v - mean);
    var /= 128;
    for (int d = 0; d < 128; ++d)
      x[static_cast<std::size_t>(d)] = (x[static_cast<std::size_t>(d)] - mean) / std::sqrt(var + eps) * ln_w[static_cast<std::size_t>(d)] +
                                       ln_b[static_cast<std::size_t>(d)];
    oracle_transform(x, cs, hadamard);
    o.k.insert(o.k.end(), x.begin(), x.end());
    for (int64_t hh = 0; hh < h; ++hh) {
      std::vector<double> y(q.begin() + (t * h + hh) * 128, q.begin() + (t * h + hh + 1) * 128);
      oracle_transform(y, cs, hadamard);
      double amax = 0;
      for (double v : y) amax = std::max(amax, std::fabs(v));
      const float plain = std::max(static_cast<float>(amax), 1e-4f) / 448.0f;
      const float s = static_cast<float>(std::exp2(std::ceil(std::log2(static_cast<double>(plain)))));
      for (double v : y) o.q_scaled.push_back(v / s);
      o.q_scale.push_back(s);
      o.weights.push_back(static_cast<double>(w_raw[static_cast<std::size_t>(t * h + hh)]) / std::sqrt(static_cast<double>(h)) /
                          std::sqrt(128.0) * s);
    }
  }
  return o;
}

// The e4m3 code nearest to x (ties to the even code), saturating at +-448; by the independent decoder.
inline uint8_t nearest_code(double x) {
  if (std::isnan(x)) return 0x7f;
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  const double* ev = e4m3_values();
  for (int c = 0; c < 256; ++c) {
    const double v = ev[c];
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    const double err = std::fabs(v - std::clamp(x, -448.0, 448.0));
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = static_cast<uint8_t>(c), best_err = err;
  }
  return best;
}

// Random inputs of indexer_prepare (f32) with a real rope table (theta 10000, 64 rope dims).
struct PrepareInputs {
  int64_t T, h, P = 40;
  Tensor q, k, w_raw, positions, cos_sin, ln_w, ln_b;
  PrepareInputs(int64_t t, int64_t heads) : T(t), h(heads) {
    q = test::random_tensor({T, h, 128}, DType::f32, Device::cpu(), -3, 3);
    k = test::random_tensor({T, 128}, DType::f32, Device::cpu(), -2, 4);
    w_raw = test::random_tensor({T, h}, DType::f32, Device::cpu(), -1, 1);
    ln_w = test::random_tensor({128}, DType::f32, Device::cpu(), 0.5, 1.5);
    ln_b = test::random_tensor({128}, DType::f32, Device::cpu(), -0.1, 0.1);
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < T; ++i) pos.push_back(static_cast<int32_t>((i * 7 + 3) % P));
    positions = test::int_tensor(pos);
    cos_sin = Tensor::empty({P, 64}, DType::f32);
    for (int64_t p = 0; p < P; ++p)
      for (int i = 0; i < 32; ++i) {
        const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * i / 64.0);
        static_cast<float*>(cos_sin.data())[p * 64 + i] = static_cast<float>(std::cos(a));
        static_cast<float*>(cos_sin.data())[p * 64 + 32 + i] = static_cast<float>(std::sin(a));
      }
  }
  std::vector<float> f(const Tensor& t) const {
    const std::vector<double> d = test::to_doubles(t);
    return std::vector<float>(d.begin(), d.end());
  }
  PrepareOracle oracle(bool hadamard) const {
    return prepare_oracle(f(q), f(k), f(w_raw), test::to_ints(positions), f(cos_sin), f(ln_w), f(ln_b), h, 1e-6,
                              hadamard);
  }
};

}  // namespace mla::test::indexer
