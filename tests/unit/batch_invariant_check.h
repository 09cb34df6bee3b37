// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch invariance of mqa_decode and sparse_mqa (PlannerConfig::batch_invariant, mla/ops.h): one fixed
// request (its query rows, pages and length) or one fixed token (its query rows and top-k rows) is placed at a
// random position among random other requests of random lengths, batch after batch, and its output and LSE
// bytes must equal those of the first batch. Shared by the CPU unit tests and the GPU tests (any device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "mla/tensor.h"

namespace mla::test {

struct InvarianceCase {
  CacheFormat format = CacheFormat::bf16;
  int64_t s_q = 1, h = 16;       // mqa_decode: s_q query tokens; sparse_mqa: s_q is 1
  int64_t fixed_len = 1500;      // keys of the fixed request (top-k entries of the fixed token)
  int64_t max_len = 1600;        // the other requests' lengths are uniform in [0, max_len]
  int64_t max_batch = 6;         // batch sizes uniform in [1, max_batch]
  int splits = 1;                // mqa_decode's num_splits (>= 1 under batch_invariant)
  int compositions = 100;
  bool batch_invariant = true;
  DType out_dtype = DType::bf16;
  uint64_t seed = 480;
};

// The bytes of row `r` of a [n, ...] tensor on any device.
inline std::vector<uint8_t> row_bytes(const Tensor& t, int64_t r) {
  const Tensor host = t.to(Device::cpu());
  const std::size_t row = host.nbytes() / static_cast<std::size_t>(host.size(0));
  const auto* p = static_cast<const uint8_t*>(host.data()) + static_cast<std::size_t>(r) * row;
  return {p, p + row};
}

// The fixed row's bytes of the first composition, and how many later ones differed from them.
struct FirstBytes {
  std::vector<uint8_t> out, lse;
  bool have = false;
  int differ = 0;
  // Row `at` of this composition's out and lse; returns whether it equals the first composition's.
  bool same(const Tensor& o, const Tensor& l, int64_t at) {
    std::vector<uint8_t> got_out = row_bytes(o, at), got_lse = row_bytes(l, at);
    if (!have) {
      out = std::move(got_out);
      lse = std::move(got_lse);
      have = true;
      return true;
    }
    const bool eq = got_out == out && got_lse == lse;
    differ += eq ? 0 : 1;
    return eq;
  }
};

// A host cache of `blocks` pages with every row random, and its copy on `dev` (the same storage on the CPU).
struct InvarianceCache {
  CacheBuffer host;
  Tensor storage;
  KVCache cache;
};
inline InvarianceCache invariance_cache(CacheFormat format, int64_t blocks, int64_t page, Device dev) {
  InvarianceCache c{nan_cache(format, blocks, page), {}, {}};
  for (int64_t s = 0; s < blocks * page; ++s) randomize_row(c.host.cache, s);
  c.cache = c.host.cache;
  if (dev.is_cuda()) {
    c.storage = c.host.storage.to(dev);
    c.cache.data.data = static_cast<char*>(c.storage.data()) + (static_cast<const char*>(c.host.cache.data.data) -
                                                                static_cast<const char*>(c.host.storage.data()));
    c.cache.data.device = dev;
  }
  return c;
}

inline int64_t draw(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<int64_t>(rng()() % static_cast<uint64_t>(hi - lo + 1));
}

// mqa_decode (causal): returns how many compositions gave the fixed request other bytes than the first.
inline int decode_variations(Device dev, const InvarianceCase& k, const Context& ctx = {}) {
  reseed(k.seed);
  const int64_t page = 16, fixed_pages = (k.fixed_len + page - 1) / page;
  const int64_t blocks = fixed_pages + (k.max_len + page - 1) / page + 8;
  const InvarianceCache c = invariance_cache(k.format, blocks, page, dev);
  std::vector<int32_t> fixed_ids(static_cast<std::size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) fixed_ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(fixed_ids.begin(), fixed_ids.end(), rng());
  fixed_ids.resize(static_cast<std::size_t>(fixed_pages));
  const Tensor fixed_q = random_tensor({1, k.s_q, k.h, 576}, DType::bf16);
  const std::size_t q_row = fixed_q.nbytes();

  FirstBytes first;
  for (int n = 0; n < k.compositions; ++n) {
    const int64_t b = draw(1, k.max_batch), at = draw(0, b - 1);
    std::vector<int32_t> lens(static_cast<std::size_t>(b));
    for (int64_t r = 0; r < b; ++r) lens[r] = static_cast<int32_t>(r == at ? k.fixed_len : draw(0, k.max_len));
    int64_t width = 0;
    for (int32_t l : lens) width = std::max<int64_t>(width, (l + page - 1) / page);
    width += draw(0, 3);  // block-table columns past the longest request
    std::vector<std::vector<int32_t>> table(static_cast<std::size_t>(b));
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = 0; j < width; ++j)
        table[r].push_back(r == at ? (j < fixed_pages ? fixed_ids[j] : -1) : static_cast<int32_t>(draw(0, blocks - 1)));
    Tensor q = random_tensor({b, k.s_q, k.h, 576}, DType::bf16);
    std::memcpy(static_cast<uint8_t*>(q.data()) + static_cast<std::size_t>(at) * q_row, fixed_q.data(), q_row);
    const Tensor qd = q.to(dev), bt = int_tensor_2d(table, dev), sl = int_tensor(lens, dev);
    Tensor out = poisoned({b, k.s_q, k.h, 512}, k.out_dtype, dev), lse = poisoned({b, k.s_q, k.h}, DType::f32, dev);
    Tensor ws;
    if (dev.is_cuda())
      ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(
                             mqa_decode_workspace_bytes(b, k.s_q, k.h, width * page, dev, k.splits), 16))},
                         DType::u8, dev);
    mqa_decode(qd, c.cache, bt, sl, out, lse, 0.0722, /*causal=*/true, ws.defined() ? ws.view() : TensorView{}, ctx,
               k.splits, /*whole_requests=*/false, k.batch_invariant);
    const bool same = first.same(out, lse, at);
    if (k.batch_invariant) {
      EXPECT_TRUE(same) << "composition " << n << ": b " << b << ", the fixed request at " << at << ", "
                        << to_string(k.format) << " s_q " << k.s_q << " h " << k.h << " splits " << k.splits;
    }
  }
  return first.differ;
}

// sparse_mqa: returns how many compositions gave the fixed token other bytes than the first. Every call has
// the same top-k width (the model's index_topk); the fixed token's first fixed_len entries are valid.
inline int sparse_variations(Device dev, const InvarianceCase& k, int64_t topk, const Context& ctx = {}) {
  reseed(k.seed + 1);
  const int64_t page = 16, blocks = (topk + page - 1) / page * 2 + 4, slots = blocks * page;
  const InvarianceCache c = invariance_cache(k.format, blocks, page, dev);
  std::vector<int32_t> fixed_row(static_cast<std::size_t>(topk), -1);
  for (int64_t j = 0; j < k.fixed_len; ++j) fixed_row[j] = static_cast<int32_t>(draw(0, slots - 1));
  const Tensor fixed_q = random_tensor({1, k.h, 576}, DType::bf16);
  const std::size_t q_row = fixed_q.nbytes();

  FirstBytes first;
  for (int n = 0; n < k.compositions; ++n) {
    const int64_t t = draw(1, k.max_batch), at = draw(0, t - 1);
    std::vector<std::vector<int32_t>> idx(static_cast<std::size_t>(t));
    for (int64_t r = 0; r < t; ++r) {
      if (r == at) {
        idx[r] = fixed_row;
        continue;
      }
      const int64_t valid = draw(0, std::min(k.max_len, topk));
      for (int64_t j = 0; j < topk; ++j) idx[r].push_back(j < valid ? static_cast<int32_t>(draw(0, slots - 1)) : -1);
    }
    Tensor q = random_tensor({t, k.h, 576}, DType::bf16);
    std::memcpy(static_cast<uint8_t*>(q.data()) + static_cast<std::size_t>(at) * q_row, fixed_q.data(), q_row);
    Tensor out = poisoned({t, k.h, 512}, k.out_dtype, dev), lse = poisoned({t, k.h}, DType::f32, dev);
    SparseOptions opts;
    opts.batch_invariant = k.batch_invariant;
    sparse_mqa(q.to(dev), c.cache, int_tensor_2d(idx, dev), {}, out, lse, 0.0722, opts, ctx);
    const bool same = first.same(out, lse, at);
    if (k.batch_invariant) {
      EXPECT_TRUE(same) << "composition " << n << ": T " << t << ", the fixed token at " << at << ", "
                        << to_string(k.format) << " h " << k.h;
    }
  }
  return first.differ;
}

}  // namespace mla::test
