// SPDX-License-Identifier: Apache-2.0
#pragma once
// Inputs and a float64 oracle for sparse_mqa's DeepSeek-V4 options (SparseOptions: attention sink, extra
// cache, whole-row values), shared by the CPU tests (tests/unit/test_sparse_v4.cpp) and the GPU tests
// (tests/gpu/test_sparse_gpu.cpp). The oracle is written from the formula of SEMANTICS §11.8, not from
// the library: per token and head, keys = the valid main rows then the valid extra rows, softmax with the
// sink in the denominator (test::oracle_attend).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attention_test_util.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla::test {

// A cache of `format` and row width d_qk (rope 64) whose even slots hold random rows ("live") and odd
// slots stay NaN ("dead": indexed only where an entry must never be read).
struct V4Cache {
  CacheBuffer cb;
  std::vector<int32_t> live, dead;
};
// A block-scaled record cache (v4, v41, v41_fp4) gets its live rows from write_cache (random inputs of
// magnitudes spread over 2^-12 .. 2^12 per row); its dead rows keep the 0xff bytes, NaN in each of them.
inline V4Cache v4_cache(CacheFormat f, int d_qk, int64_t nb, int64_t page) {
  V4Cache c{allocate_cache(f, nb, page, Device::cpu(), f == CacheFormat::fp8 ? 0.005f : 1.0f, d_qk, 64), {}, {}};
  std::memset(c.cb.storage.data(), 0xff, c.cb.storage.nbytes());
  if (cache_format_info(f).record) {
    for (int64_t s = 0; s < nb * page; ++s) (s % 2 == 0 ? c.live : c.dead).push_back(static_cast<int32_t>(s));
    const auto n = static_cast<int64_t>(c.live.size());
    Tensor kv = Tensor::empty({n, d_qk - 64}, DType::f32), pe = Tensor::empty({n, 64}, DType::f32);
    for (int64_t r = 0; r < n; ++r) {
      const double m = std::ldexp(1.0, std::uniform_int_distribution<int>(-12, 12)(rng()));
      for (int64_t i = 0; i < d_qk - 64; ++i) static_cast<float*>(kv.data())[r * (d_qk - 64) + i] = static_cast<float>(uniform(-m, m));
      for (int64_t i = 0; i < 64; ++i) static_cast<float*>(pe.data())[r * 64 + i] = static_cast<float>(uniform(-m, m));
    }
    const Tensor slots = int_tensor(c.live);
    write_cache(kv.view(), pe.view(), slots.view(), c.cb.cache);
    return c;
  }
  for (int64_t s = 0; s < nb * page; ++s) {
    if (s % 2 == 0) {
      randomize_row(c.cb.cache, s);
      c.live.push_back(static_cast<int32_t>(s));
    } else {
      c.dead.push_back(static_cast<int32_t>(s));
    }
  }
  return c;
}

// One index list [t][topk] and its lengths. Roles by token (both lists are built with the same roles,
// `extra` selecting the extra list's side):
//   0: no valid entry in either list (lonely: out 0, lse = sink)
//   1: main entries only (extra length 0, its entries dead rows)
//   2: extra entries only (every main entry -1 or out of range)
//   3: full length, many duplicates
//   4+: random length, a mix of live rows, duplicates, -1 and other invalid values; dead rows past the length
struct V4List {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> lengths;
};
inline V4List v4_list(const V4Cache& c, int64_t t, int64_t topk, bool extra) {
  std::mt19937_64& g = rng();
  const int64_t n = c.cb.cache.num_slots();
  const std::vector<int32_t> invalid = {-1, -1, -7, static_cast<int32_t>(n), static_cast<int32_t>(n + 5), INT_MIN};
  auto pick = [&](const std::vector<int32_t>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(g)];
  };
  V4List l;
  for (int64_t tok = 0; tok < t; ++tok) {
    int32_t len = static_cast<int32_t>(topk);
    if (tok == 1 && extra) len = 0;
    if (tok >= 4) len = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(topk))(g);
    const bool none_valid = tok == 0 || (tok == 2 && !extra);
    std::vector<int32_t> row;
    for (int64_t j = 0; j < topk; ++j) {
      const int u = std::uniform_int_distribution<int>(0, 9)(g);
      int32_t v;
      if (j >= len) v = pick(c.dead);
      else if (none_valid || u < 2) v = pick(invalid);
      else if ((u < 4 || tok == 3) && !row.empty() && row.back() >= 0 && row.back() < n) v = row.back();
      else v = pick(c.live);
      row.push_back(v);
    }
    l.rows.push_back(row);
    l.lengths.push_back(len);
  }
  return l;
}

// Valid rows of token `tok` of a list (every row below its length in [0, num_slots)), decoded to float64.
inline void v4_append_keys(const KVCache& c, const V4List& l, int64_t tok, bool use_len,
                           std::vector<std::vector<double>>& keys) {
  const std::vector<int32_t>& row = l.rows[static_cast<std::size_t>(tok)];
  const int64_t len = use_len ? l.lengths[static_cast<std::size_t>(tok)] : static_cast<int64_t>(row.size());
  for (int64_t j = 0; j < len; ++j) {
    const int64_t r = row[static_cast<std::size_t>(j)];
    if (r >= 0 && r < c.num_slots()) keys.push_back(decode_row(c, r));
  }
}

// The formula of the header (test::oracle_attend with its sink) for q [t, h, d] (float64 values), sinks
// [h] (empty: none). `extra` may be null.
inline OracleOut v4_oracle(const std::vector<double>& q, int64_t t, int64_t h, int64_t d, int64_t dv, double scale,
                           const KVCache& main, const V4List& main_list, bool main_len, const KVCache* extra,
                           const V4List* extra_list, bool extra_len, const std::vector<double>& sinks) {
  OracleOut res;
  for (int64_t tok = 0; tok < t; ++tok) {
    std::vector<std::vector<double>> rows;
    v4_append_keys(main, main_list, tok, main_len, rows);
    if (extra) v4_append_keys(*extra, *extra_list, tok, extra_len, rows);
    std::vector<const double*> keys;
    for (const auto& r : rows) keys.push_back(r.data());
    for (int64_t hh = 0; hh < h; ++hh)
      oracle_attend(q.data() + (tok * h + hh) * d, keys, d, keys, dv, scale, res,
                    sinks.empty() ? -std::numeric_limits<double>::infinity() : sinks[static_cast<std::size_t>(hh)]);
  }
  return res;
}

}  // namespace mla::test
