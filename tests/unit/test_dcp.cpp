// SPDX-License-Identifier: Apache-2.0
// Decode context parallelism on the CPU with W simulated ranks (semantics §13): the layout functions
// (mla/dcp.h), the N-way combine op, and the end-to-end claim that attending every rank's shard and
// combining the partials equals attending the whole cache (dense causal s_q 1 and 3, sparse with the
// DCP filter), in every cache format, at float64 precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "attention_test_util.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(DcpLayout, ShardsPartitionEveryPrefix) {
  for (int w : {1, 2, 3, 4, 8})
    for (int il : {1, 2, 16, 64})
      for (int64_t len : {0, 1, 5, 63, 64, 65, 200, 1031}) {
        int64_t total = 0;
        std::vector<std::set<int64_t>> local(static_cast<std::size_t>(w));
        for (int64_t p = 0; p < len; ++p) {
          const int r = dcp_owner(p, {w, 0, il});
          ASSERT_TRUE(r >= 0 && r < w);
          EXPECT_EQ(r, (p / il) % w);
          EXPECT_TRUE(local[static_cast<std::size_t>(r)].insert(dcp_local_position(p, {w, r, il})).second)
              << "two positions share a local slot";
        }
        for (int r = 0; r < w; ++r) {
          const int64_t n = dcp_local_length(len, {w, r, il});
          total += n;
          // The owned positions fill local slots [0, n) exactly, in order of the global positions.
          ASSERT_EQ(static_cast<int64_t>(local[static_cast<std::size_t>(r)].size()), n)
              << "w " << w << " I " << il << " len " << len << " rank " << r;
          if (n > 0) {
            EXPECT_EQ(*local[static_cast<std::size_t>(r)].rbegin(), n - 1);
          }
        }
        EXPECT_EQ(total, len);
      }
}

TEST(DcpLayout, QueryLengthsAndFilter) {
  const DcpLayout l{2, 1, 2};  // rank 1 owns positions 2, 3, 6, 7, ...
  const std::vector<int32_t> seq = {7, 0, 3};
  std::vector<int32_t> out(9);
  dcp_local_query_lengths(seq, 3, true, l, out);
  // Request 0 sees [0, 5), [0, 6), [0, 7): rank 1 owns {2, 3}, {2, 3}, {2, 3, 6}.
  EXPECT_EQ(out, (std::vector<int32_t>{2, 2, 3, 0, 0, 0, 0, 0, 1}));
  dcp_local_query_lengths(seq, 3, false, l, out);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 3, 3, 0, 0, 0, 1, 1, 1}));
  std::vector<int32_t> idx = {0, 2, 3, 6, -1, 7, 5, 11};
  dcp_filter_topk(idx, l);
  EXPECT_EQ(idx, (std::vector<int32_t>{-1, 0, 1, 2, -1, 3, -1, 5}));
  EXPECT_THROW(validate_dcp_layout({0, 0, 1}), Error);
  EXPECT_THROW(validate_dcp_layout({2, 2, 1}), Error);
  EXPECT_THROW(validate_dcp_layout({2, -1, 1}), Error);
  EXPECT_THROW(validate_dcp_layout({2, 0, 0}), Error);
  EXPECT_THROW(validate_dcp_layout({2, 0, 3}, 16), Error);
  EXPECT_THROW(dcp_owner(-1, {2, 0, 1}), Error);
  EXPECT_THROW(dcp_local_query_lengths(seq, 2, true, l, out), Error);
}

// combine_attn_states against the formula of §13 in float64, with strided parts, a transposed lse and
// the edge rules: +inf / -inf parts are empty (their NaN outputs are ignored), all empty -> 0 / -inf,
// a NaN lse -> NaN row.
TEST(CombineAttnStates, MatchesFormulaAndEdgeRules) {
  test::reseed(31);
  for (int64_t n : {1, 2, 3, 7}) {
    const int64_t t = 5, h = 3, d = 40;
    Tensor parts_store = test::random_tensor({n, t, h, d + 8}, DType::f32);
    TensorView parts = parts_store.view();
    parts.shape[3] = d;  // padded rows: strides differ from the shape
    Tensor lse_store = test::random_tensor({n, h, t}, DType::f32, Device::cpu(), -3.0, 3.0);
    const int64_t lshape[] = {n, t, h}, lstride[] = {h * t, 1, t};
    TensorView lses(lse_store.data(), DType::f32, lshape, lstride);  // transposed [N, T, H] view
    auto* lp = static_cast<float*>(lse_store.data());
    auto lse_at = [&](int64_t k, int64_t i, int64_t j) -> float& { return lp[k * h * t + j * t + i]; };
    auto* pp = static_cast<float*>(parts_store.data());
    auto part_at = [&](int64_t k, int64_t i, int64_t j, int64_t x) -> float& {
      return pp[((k * t + i) * h + j) * (d + 8) + x];
    };
    // Token 1: every part empty (±inf, outputs NaN). Token 2: part 0 empty with a NaN output.
    // Token 3, head 1: a NaN lse.
    for (int64_t k = 0; k < n; ++k) {
      lse_at(k, 1, 0) = k % 2 ? INFINITY : -INFINITY;
      for (int64_t x = 0; x < d; ++x) part_at(k, 1, 0, x) = NAN;
    }
    lse_at(0, 2, 2) = INFINITY;
    for (int64_t x = 0; x < d; ++x) part_at(0, 2, 2, x) = NAN;
    lse_at(n - 1, 3, 1) = NAN;

    Tensor out = test::poisoned({t, h, d}, DType::f64), out_lse = test::poisoned({t, h}, DType::f64);
    combine_attn_states(out, out_lse, parts, lses, {nullptr, Precision::reference});
    const std::vector<double> o = test::to_doubles(out), ol = test::to_doubles(out_lse);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < h; ++j) {
        double m = -kInf;
        bool nan = false;
        for (int64_t k = 0; k < n; ++k) {
          const double l = lse_at(k, i, j);
          nan |= std::isnan(l);
          if (std::isfinite(l)) m = std::max(m, l);
        }
        double sum = 0;
        for (int64_t k = 0; k < n; ++k)
          if (std::isfinite(lse_at(k, i, j))) sum += std::exp(lse_at(k, i, j) - m);
        const double want_lse = nan ? NAN : std::isinf(m) ? -kInf : std::log(sum) + m;
        const double got_lse = ol[static_cast<std::size_t>(i * h + j)];
        if (std::isnan(want_lse)) {
          EXPECT_TRUE(std::isnan(got_lse));
        } else if (std::isinf(want_lse)) {
          EXPECT_EQ(got_lse, -kInf);
        } else {
          EXPECT_NEAR(got_lse, want_lse, 1e-12);
        }
        for (int64_t x = 0; x < d; ++x) {
          double want = 0;
          for (int64_t k = 0; k < n; ++k)
            if (std::isfinite(lse_at(k, i, j))) want += part_at(k, i, j, x) * std::exp(lse_at(k, i, j) - m) / sum;
          const double got = o[static_cast<std::size_t>((i * h + j) * d + x)];
          if (nan) {
            EXPECT_TRUE(std::isnan(got));
          } else if (std::isinf(m)) {
            EXPECT_EQ(got, 0.0);
          } else {
            EXPECT_NEAR(got, want, 1e-12) << "n " << n << " t " << i << " h " << j << " x " << x;
          }
        }
      }
    // fast precision, bf16 parts and output: within bf16 rounding of the float64 result.
    Tensor pb = Tensor::empty({n, t, h, d}, DType::bf16), ob = Tensor::empty({t, h, d}, DType::bf16);
    test::fill_random(pb.view());
    Tensor lse2 = test::random_tensor({n, t, h}, DType::f32, Device::cpu(), -3.0, 3.0);
    Tensor o64 = Tensor::empty({t, h, d}, DType::f64);
    combine_attn_states(ob, {}, pb, lse2, {});
    combine_attn_states(o64, {}, pb, lse2, {nullptr, Precision::reference});
    const std::vector<double> a = test::to_doubles(ob), b = test::to_doubles(o64);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-2 * std::abs(b[i]) + 1e-6);
  }
}

// The optional sink of combine_attn_states: one more part of value 0 and lse sink[h] (ops.h). Splitting a key set
// into parts and attending them without the sink, then combining with it, equals one softmax over the keys and
// the sink (a sink on each part would count it N times: lse + ln N for a row without keys). Rows: keys spread over
// the parts, every part empty (out 0, lse = sink), a NaN lse; heads: finite sinks, -inf (no sink: bit-equal to the
// call without one), NaN and +inf (the row NaN).
TEST(CombineAttnStates, SinkJoinsOnce) {
  test::reseed(84);
  const int64_t n = 3, t = 4, h = 5, d = 24;
  Tensor parts = test::random_tensor({n, t, h, d}, DType::f32);
  Tensor lses = test::random_tensor({n, t, h}, DType::f32, Device::cpu(), -3.0, 3.0);
  auto* lp = static_cast<float*>(lses.data());
  auto lse_at = [&](int64_t k, int64_t i, int64_t j) -> float& { return lp[(k * t + i) * h + j]; };
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < h; ++j) lse_at(k, 1, j) = k == 1 ? INFINITY : -INFINITY;  // token 1: no keys anywhere
  lse_at(1, 2, 0) = -INFINITY;                                                       // token 2: part 1 empty
  lse_at(2, 3, 0) = NAN;                                                             // token 3: a NaN part
  Tensor sink = Tensor::empty({h}, DType::f32);
  const float sinks[] = {0.5f, -INFINITY, NAN, INFINITY, 7.0f};
  std::memcpy(sink.data(), sinks, sizeof(sinks));
  Tensor out = test::poisoned({t, h, d}, DType::f64), out_lse = test::poisoned({t, h}, DType::f64);
  combine_attn_states(out, out_lse, parts, lses, {nullptr, Precision::reference}, sink);
  const std::vector<double> o = test::to_doubles(out), ol = test::to_doubles(out_lse), pv = test::to_doubles(parts);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < h; ++j) {
      const double s = sinks[j];
      bool nan = std::isnan(s) || s == kInf;
      double m = std::isfinite(s) ? s : -kInf;
      for (int64_t k = 0; k < n; ++k) {
        nan |= std::isnan(lse_at(k, i, j));
        if (std::isfinite(lse_at(k, i, j))) m = std::max<double>(m, lse_at(k, i, j));
      }
      double l = std::isfinite(s) ? std::exp(s - m) : 0.0;
      for (int64_t k = 0; k < n; ++k)
        if (std::isfinite(lse_at(k, i, j))) l += std::exp(lse_at(k, i, j) - m);
      const double got_lse = ol[static_cast<std::size_t>(i * h + j)];
      SCOPED_TRACE(::testing::Message() << "t " << i << " h " << j);
      if (nan) {
        EXPECT_TRUE(std::isnan(got_lse));
      } else if (m == -kInf) {
        EXPECT_EQ(got_lse, -kInf);
      } else {
        EXPECT_NEAR(got_lse, m + std::log(l), 1e-12);
      }
      if (i == 1 && std::isfinite(s)) EXPECT_EQ(got_lse, static_cast<double>(s));  // only the sink: lse = sink, once
      for (int64_t x = 0; x < d; ++x) {
        double want = 0;
        for (int64_t k = 0; k < n; ++k)
          if (std::isfinite(lse_at(k, i, j)))
            want += pv[static_cast<std::size_t>(((k * t + i) * h + j) * d + x)] * std::exp(lse_at(k, i, j) - m) / l;
        const double got = o[static_cast<std::size_t>((i * h + j) * d + x)];
        if (nan) EXPECT_TRUE(std::isnan(got));
        else EXPECT_NEAR(got, m == -kInf ? 0.0 : want, 1e-12);
      }
    }
  // Head 1's sink is -inf: the same bytes as the call without a sink (both precisions).
  for (const Context ctx : {Context{}, Context{nullptr, Precision::reference}}) {
    Tensor a = test::poisoned({t, 1, d}, DType::f32), al = test::poisoned({t, 1}, DType::f32);
    Tensor b = test::poisoned({t, 1, d}, DType::f32), bl = test::poisoned({t, 1}, DType::f32);
    const TensorView p1 = parts.view().slice(2, 1, 2), l1 = lses.view().slice(2, 1, 2);
    combine_attn_states(a, al, p1, l1, ctx, sink.view().slice(0, 1, 2));
    combine_attn_states(b, bl, p1, l1, ctx);
    EXPECT_EQ(test::to_doubles(a), test::to_doubles(b));
    EXPECT_EQ(test::to_doubles(al), test::to_doubles(bl));
  }
  // A sink of the wrong size or dtype is refused.
  EXPECT_THROW(combine_attn_states(out, out_lse, parts, lses, {}, Tensor::zeros({h + 1}, DType::f32)), Error);
  EXPECT_THROW(combine_attn_states(out, out_lse, parts, lses, {}, Tensor::zeros({h}, DType::i32)), Error);
}

TEST(CombineAttnStates, RefusesBadArguments) {
  Tensor parts = Tensor::zeros({2, 3, 4, 8}, DType::f32), lses = Tensor::zeros({2, 3, 4}, DType::f32);
  Tensor out = test::poisoned({3, 4, 8}, DType::f32), out_lse = test::poisoned({3, 4}, DType::f32);
  const std::vector<double> before = test::to_doubles(out);
  auto refused = [&](auto&& call) {
    EXPECT_THROW(call(), Error);
    const std::vector<double> after = test::to_doubles(out);
    for (std::size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(std::isnan(after[i]) && std::isnan(before[i]));
  };
  refused([&] { combine_attn_states(out, out_lse, parts, Tensor::zeros({2, 4, 3}, DType::f32)); });
  refused([&] { combine_attn_states(out, out_lse, parts, Tensor::zeros({3, 3, 4}, DType::f32)); });
  refused([&] { combine_attn_states(out, out_lse, Tensor::zeros({2, 3, 4, 7}, DType::f32), lses); });
  refused([&] { combine_attn_states(out, Tensor::zeros({4, 3}, DType::f32), parts, lses); });
  refused([&] { combine_attn_states(out, out_lse, Tensor::zeros({0, 3, 4, 8}, DType::f32), Tensor::zeros({0, 3, 4}, DType::f32)); });
  refused([&] {
    combine_attn_states(out, out_lse, Tensor::zeros({kCombineMaxParts + 1, 3, 4, 8}, DType::f32),
                        Tensor::zeros({kCombineMaxParts + 1, 3, 4}, DType::f32));
  });
  refused([&] { combine_attn_states(out, out_lse, parts, Tensor::zeros({2, 3, 4}, DType::i32)); });
}

// One rank's shard of a PagedBatch: the rows of the positions it owns, copied byte for byte (exact in
// every format) into a cache of its own with a local block table; every other row NaN.
struct Shard {
  CacheBuffer cb;
  std::vector<std::vector<int32_t>> table;  // [b][local blocks]
  int64_t page;
  int64_t slot(int64_t r, int64_t local) const {
    return int64_t(table[static_cast<std::size_t>(r)][static_cast<std::size_t>(local / page)]) * page + local % page;
  }
};

Shard make_shard(const test::PagedBatch& pb, const std::vector<int32_t>& lens, int64_t page, const DcpLayout& l) {
  const int64_t b = static_cast<int64_t>(lens.size());
  int64_t max_blocks = 1;
  for (int32_t len : lens) max_blocks = std::max(max_blocks, (dcp_local_length(len, l) + page - 1) / page);
  Shard s{test::nan_cache(pb.cb.cache.format, b * max_blocks + 1, page), {}, page};
  s.cb.cache.scale = pb.cb.cache.scale;
  const int64_t bytes = cache_entry_bytes(pb.cb.cache.format, pb.cb.cache.d_qk);
  for (int64_t r = 0; r < b; ++r) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < max_blocks; ++j) row.push_back(static_cast<int32_t>(r * max_blocks + j + 1));
    s.table.push_back(row);
    for (int64_t p = 0; p < lens[static_cast<std::size_t>(r)]; ++p)
      if (dcp_owner(p, l) == l.rank)
        std::memcpy(const_cast<uint8_t*>(test::row_ptr(s.cb.cache, s.slot(r, dcp_local_position(p, l)))),
                    test::row_ptr(pb.cb.cache, pb.slots[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)]),
                    static_cast<std::size_t>(bytes));
  }
  return s;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> a = test::to_doubles(got), b = test::to_doubles(want);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      EXPECT_EQ(a[i], b[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(a[i], b[i], 1e-9 * (1 + std::abs(b[i]))) << what << " at " << i;
    }
  }
}

// Dense decode: W shards attended with the per-query local lengths (a causal s_q = 3 step becomes
// 3·b rows of s_q = 1) and combined == the whole cache attended causally. Requests include a length-0
// one and lengths shorter than W·I (ranks with empty shards).
TEST(Dcp, DecodeShardsCombineToFullAttention) {
  test::reseed(41);
  const int64_t page = 16, h = 3;
  const std::vector<int32_t> lens = {70, 0, 5, 33, 129};
  const int64_t b = static_cast<int64_t>(lens.size());
  for (CacheFormat f : test::kAllFormats)
    for (int64_t s_q : {1, 3})
      for (DcpLayout base : {DcpLayout{2, 0, 1}, DcpLayout{3, 0, 16}, DcpLayout{4, 0, 2}}) {
        const std::string what = std::string(to_string(f)) + " s_q " + std::to_string(s_q) + " W " +
                                 std::to_string(base.world_size) + " I " + std::to_string(base.interleave);
        test::PagedBatch pb = test::paged_batch(f, page, lens, 9);
        Tensor q = test::random_tensor({b, s_q, h, 576}, DType::f64);
        Tensor want = Tensor::empty({b, s_q, h, 512}, DType::f64), want_lse = Tensor::empty({b, s_q, h}, DType::f64);
        const Context ref{nullptr, Precision::reference};
        mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, want, want_lse, 0.09, true, {}, ref);

        const int64_t w = base.world_size, rows = b * s_q;
        Tensor parts = Tensor::empty({w, rows, h, 512}, DType::f64), lses = Tensor::empty({w, rows, h}, DType::f64);
        for (int rank = 0; rank < w; ++rank) {
          const DcpLayout l{base.world_size, rank, base.interleave};
          Shard s = make_shard(pb, lens, page, l);
          std::vector<int32_t> qlens(static_cast<std::size_t>(rows));
          dcp_local_query_lengths(lens, s_q, true, l, qlens);
          std::vector<std::vector<int32_t>> table;  // one row per (request, query)
          for (int64_t r = 0; r < b; ++r)
            for (int64_t i = 0; i < s_q; ++i) table.push_back(s.table[static_cast<std::size_t>(r)]);
          TensorView qr(q.data(), DType::f64, {rows, 1, h, 576});
          char* pbase = static_cast<char*>(parts.data()) + rank * rows * h * 512 * 8;
          char* lbase = static_cast<char*>(lses.data()) + rank * rows * h * 8;
          mqa_decode(qr, s.cb.cache, test::int_tensor_2d(table), test::int_tensor(qlens),
                     TensorView(pbase, DType::f64, {rows, 1, h, 512}), TensorView(lbase, DType::f64, {rows, 1, h}),
                     0.09, true, {}, ref);
        }
        Tensor got = test::poisoned({rows, h, 512}, DType::f64), got_lse = test::poisoned({rows, h}, DType::f64);
        combine_attn_states(got, got_lse, parts, lses, ref);
        expect_same(got, want, what + " out");
        expect_same(got_lse, want_lse, what + " lse");
      }
}

// Sparse: request-local top-k positions, filtered per rank (dcp_filter_topk) and mapped through the
// rank's table; -1 and duplicate entries included; a token whose positions all live on one rank
// leaves the other ranks' rows empty.
TEST(Dcp, SparseShardsCombineToFullAttention) {
  test::reseed(43);
  const int64_t page = 16, h = 4, topk = 24;
  const std::vector<int32_t> lens = {90, 40, 7};
  const int64_t b = static_cast<int64_t>(lens.size());
  for (CacheFormat f : test::kAllFormats)
    for (DcpLayout base : {DcpLayout{2, 0, 1}, DcpLayout{4, 0, 16}}) {
      const std::string what = std::string(to_string(f)) + " W " + std::to_string(base.world_size);
      test::PagedBatch pb = test::paged_batch(f, page, lens, 6);
      const std::vector<std::vector<int32_t>> tbl = [&] {
        std::vector<std::vector<int32_t>> t;
        const std::vector<int32_t> flat = test::to_ints(pb.block_table);
        for (int64_t r = 0; r < b; ++r) t.emplace_back(flat.begin() + r * 6, flat.begin() + (r + 1) * 6);
        return t;
      }();
      // Token r of request r: random positions below its length, some -1, one duplicate.
      std::vector<std::vector<int32_t>> pos(static_cast<std::size_t>(b));
      for (int64_t r = 0; r < b; ++r) {
        std::uniform_int_distribution<int32_t> u(-3, lens[static_cast<std::size_t>(r)] - 1);
        for (int64_t k = 0; k < topk; ++k) pos[r].push_back(std::max(-1, u(test::rng())));
        pos[r][1] = pos[r][0];
      }
      auto to_slots = [&](const std::vector<std::vector<int32_t>>& p,
                          const std::vector<std::vector<int32_t>>& table) {
        std::vector<std::vector<int32_t>> s = p;
        for (int64_t r = 0; r < b; ++r)
          for (int32_t& x : s[r])
            if (x >= 0) x = table[r][static_cast<std::size_t>(x / page)] * static_cast<int32_t>(page) + x % page;
        return test::int_tensor_2d(s);
      };
      Tensor q = test::random_tensor({b, h, 576}, DType::f64);
      const Context ref{nullptr, Precision::reference};
      Tensor want = Tensor::empty({b, h, 512}, DType::f64), want_lse = Tensor::empty({b, h}, DType::f64);
      sparse_mqa(q, pb.cb.cache, to_slots(pos, tbl), {}, want, want_lse, 0.07, ref);

      const int64_t w = base.world_size;
      Tensor parts = Tensor::empty({w, b, h, 512}, DType::f64), lses = Tensor::empty({w, b, h}, DType::f64);
      for (int rank = 0; rank < w; ++rank) {
        const DcpLayout l{base.world_size, rank, base.interleave};
        Shard s = make_shard(pb, lens, page, l);
        std::vector<std::vector<int32_t>> local = pos;
        for (auto& row : local) dcp_filter_topk(row, l);
        char* pbase = static_cast<char*>(parts.data()) + rank * b * h * 512 * 8;
        char* lbase = static_cast<char*>(lses.data()) + rank * b * h * 8;
        sparse_mqa(q, s.cb.cache, to_slots(local, s.table), {}, TensorView(pbase, DType::f64, {b, h, 512}),
                   TensorView(lbase, DType::f64, {b, h}), 0.07, ref);
      }
      Tensor got = test::poisoned({b, h, 512}, DType::f64), got_lse = test::poisoned({b, h}, DType::f64);
      combine_attn_states(got, got_lse, parts, lses, ref);
      expect_same(got, want, what + " out");
      expect_same(got_lse, want_lse, what + " lse");
    }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// Issue 51: the world size is bounded (4096, the groups' limit): 2^24 ranks took a second and a
// gigabyte in make_plan, 2^31 - 1 let std::bad_alloc escape.
// A dense config with a 96-row context workspace and a batch of a decode, an extend, a long-context
// prefill and a fresh prefill.
PlannerConfig context_config() {
  PlannerConfig c;
  c.dims.num_heads = 4;
  c.page_size = 16;
  c.max_model_len = 512;
  c.context_workspace_rows = 96;
  return c;
}
const BatchDesc kContextBatch{{0, 1, 6, 15, 20}, {41, 55, 300, 5}};

TEST(DcpPlan, WorldSizeIsBounded) {
  PlannerConfig c = context_config();
  const BatchDesc& batch = kContextBatch;
  c.dcp = {4096, 4095, 1};
  EXPECT_NO_THROW(make_plan(batch, c));
  EXPECT_NO_THROW(validate_dcp_layout({4096, 0, 1}));
  for (int w : {4097, 1 << 24, std::numeric_limits<int>::max()}) {
    c.dcp = {w, 0, 1};
    EXPECT_THROW(make_plan(batch, c), Error) << w;
    EXPECT_THROW(validate_dcp_layout({w, 0, 1}), Error) << w;
    EXPECT_THROW(dcp_local_length(100, {w, 0, 1}), Error) << w;
  }
}

// make_plan's DCP context chunks: every rank's local ranges, all-gather blocks and copy segments put
// exactly the chunk's global positions into request order (simulated on positions, every rank).
TEST(DcpPlan, ContextSegmentsReassembleEveryChunk) {
  for (int w : {2, 3, 4})
    for (int il : {1, 4, 16}) {
      PlannerConfig c = context_config();
      const BatchDesc& batch = kContextBatch;
      for (int r = 0; r < w; ++r) {
        c.dcp = {w, r, il};
        const Plan p = make_plan(batch, c);
        ASSERT_EQ(p.dcp_chunks.size(), p.context.chunks.size());
        for (std::size_t k = 0; k < p.context.chunks.size(); ++k) {
          const ContextChunk& ch = p.context.chunks[k];
          const DcpChunk& dc = p.dcp_chunks[k];
          // What every rank sends: its share of each prefill's range, in local order, padded.
          std::vector<int64_t> recv(static_cast<std::size_t>(w * dc.pad_rows), -1);
          for (int q = 0; q < w; ++q) {
            int64_t at = q * dc.pad_rows;
            for (std::size_t i = 0; i < ch.lens.size(); ++i)
              for (int64_t g = ch.seq_starts[i]; g < ch.seq_starts[i] + ch.lens[i]; ++g)
                if (dcp_owner(g, {w, q, il}) == q) recv[static_cast<std::size_t>(at++)] = g;
            ASSERT_LE(at, (q + 1) * dc.pad_rows);
          }
          std::vector<int64_t> rows(static_cast<std::size_t>(ch.total), -2);
          for (const DcpSegment& g : dc.segments)
            for (int64_t b = 0; b < g.count; ++b)
              for (int64_t x = 0; x < g.rows; ++x) {
                const int64_t dst = g.dst_row + b * w * il + x;
                ASSERT_TRUE(dst >= 0 && dst < ch.total);
                EXPECT_EQ(rows[static_cast<std::size_t>(dst)], -2) << "row written twice";
                rows[static_cast<std::size_t>(dst)] = recv[static_cast<std::size_t>(g.src_row + b * g.rows + x)];
              }
          for (std::size_t i = 0; i < ch.lens.size(); ++i)
            for (int64_t j = 0; j < ch.lens[i]; ++j)
              EXPECT_EQ(rows[static_cast<std::size_t>(ch.cu_seq_lens[i] + j)], ch.seq_starts[i] + j)
                  << "W " << w << " I " << il << " chunk " << k << " prefill " << i;
          // This rank's own share: local_cu / local_starts.
          for (std::size_t i = 0; i < ch.lens.size(); ++i) {
            const int64_t s = ch.seq_starts[i], e = s + ch.lens[i];
            EXPECT_EQ(dc.local_starts[i], dcp_local_length(s, c.dcp));
            EXPECT_EQ(dc.local_cu[i + 1] - dc.local_cu[i], dcp_local_length(e, c.dcp) - dcp_local_length(s, c.dcp));
          }
        }
      }
    }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// dcp_localize_topk (the op) against the host filter plus the seq_len rule; bad input writes nothing.
TEST(DcpLocalize, MatchesTheHostFilterAndRefusesBadInput) {
  test::reseed(81);
  const std::vector<int32_t> lens = {50, 3, 0, 200};
  const std::vector<int32_t> req = {0, 3, 1, 2, 3, 7, -1};  // the last two name no request
  std::vector<std::vector<int32_t>> idx(req.size());
  std::uniform_int_distribution<int32_t> u(-3, 220);
  for (auto& row : idx)
    for (int k = 0; k < 37; ++k) row.push_back(u(test::rng()));
  for (DcpLayout l : {DcpLayout{2, 1, 1}, DcpLayout{3, 0, 4}, DcpLayout{4, 3, 16}}) {
    Tensor out = Tensor::empty({static_cast<int64_t>(req.size()), 37}, DType::i32);
    dcp_localize_topk(test::int_tensor(req), test::int_tensor(lens), test::int_tensor_2d(idx), out, l);
    const std::vector<int32_t> got = test::to_ints(out);
    for (std::size_t t = 0; t < req.size(); ++t) {
      std::vector<int32_t> want = idx[t];
      const int32_t len = req[t] >= 0 && req[t] < 4 ? lens[static_cast<std::size_t>(req[t])] : 0;
      for (int32_t& x : want)
        if (x >= len) x = -1;
      dcp_filter_topk(want, l);
      for (std::size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[t * 37 + k], want[k]) << "t " << t << " k " << k;
    }
  }
  Tensor idx_t = test::int_tensor_2d(idx), out = test::int_tensor_2d(std::vector<std::vector<int32_t>>(req.size(), std::vector<int32_t>(37, 77)));
  const Tensor r = test::int_tensor(req), l = test::int_tensor(lens);
  EXPECT_THROW(dcp_localize_topk(r, l, idx_t, out, {2, 2, 1}), Error);                 // rank out of range
  EXPECT_THROW(dcp_localize_topk(r, l, idx_t, idx_t, {2, 0, 1}), Error);               // out aliases indices
  EXPECT_THROW(dcp_localize_topk(test::int_tensor({0, 1}), l, idx_t, out, {2, 0, 1}), Error);  // req_id too short
  for (int32_t v : test::to_ints(out)) EXPECT_EQ(v, 77);
}

// dcp_compact_topk (the V4 step's localize) against the host filter: token t's entries below its valid length
// that this rank owns, below the request's length, as local positions in their order at the front, -1 after
// them, their count; every rank's kept entries together are the valid entries, each once. Bad input writes
// nothing.
TEST(DcpCompact, PacksTheRanksEntriesAndRefusesBadInput) {
  test::reseed(83);
  const std::vector<int32_t> lens = {50, 3, 0, 200};
  const std::vector<int32_t> req = {0, 3, 1, 2, 3, 7, -1, 3, 0};  // tokens 5 and 6 name no request
  const std::vector<int32_t> valid = {37, 0, 37, 37, 5, 37, 37, -4, 60};  // -4 counts as 0, 60 as 37
  const int64_t T = static_cast<int64_t>(req.size()), K = 37;
  std::vector<std::vector<int32_t>> idx(req.size());
  std::uniform_int_distribution<int32_t> u(-3, 220);
  for (auto& row : idx)
    for (int k = 0; k < K; ++k) row.push_back(u(test::rng()));
  for (int k = 0; k < K; k += 3) idx[0][static_cast<std::size_t>(k)] = idx[0][0];  // duplicates stay duplicates
  for (int w : {1, 2, 3, 4})
    for (int il : {1, 4, 16}) {
      std::vector<int64_t> kept(req.size(), 0);
      for (int r = 0; r < w; ++r) {
        const DcpLayout l{w, r, il};
        SCOPED_TRACE(::testing::Message() << "W " << w << " rank " << r << " I " << il);
        Tensor out = test::poisoned({T, K}, DType::i32), counts = test::poisoned({T}, DType::i32);
        dcp_compact_topk(test::int_tensor(req), test::int_tensor(lens), test::int_tensor_2d(idx), test::int_tensor(valid),
                         out, counts, l);
        const std::vector<int32_t> got = test::to_ints(out), n = test::to_ints(counts);
        for (std::size_t t = 0; t < req.size(); ++t) {
          const int32_t len = req[t] >= 0 && req[t] < 4 ? lens[static_cast<std::size_t>(req[t])] : 0;
          std::vector<int32_t> want;
          for (int64_t k = 0; k < std::clamp<int64_t>(valid[t], 0, K); ++k) {
            const int32_t p = idx[t][static_cast<std::size_t>(k)];
            if (p >= 0 && p < len && dcp_owner(p, l) == r) want.push_back(static_cast<int32_t>(dcp_local_position(p, l)));
          }
          EXPECT_EQ(n[t], static_cast<int32_t>(want.size())) << "t " << t;
          kept[t] += n[t];
          want.resize(static_cast<std::size_t>(K), -1);
          for (int64_t k = 0; k < K; ++k) EXPECT_EQ(got[t * K + k], want[static_cast<std::size_t>(k)]) << "t " << t << " k " << k;
        }
      }
      for (std::size_t t = 0; t < req.size(); ++t) {  // the ranks' counts add up to the valid entries
        const int32_t len = req[t] >= 0 && req[t] < 4 ? lens[static_cast<std::size_t>(req[t])] : 0;
        int64_t all = 0;
        for (int64_t k = 0; k < std::clamp<int64_t>(valid[t], 0, K); ++k)
          all += idx[t][static_cast<std::size_t>(k)] >= 0 && idx[t][static_cast<std::size_t>(k)] < len;
        EXPECT_EQ(kept[t], all) << "W " << w << " t " << t;
      }
    }
  // Without topk_length every column counts.
  {
    Tensor out = Tensor::empty({T, K}, DType::i32), counts = Tensor::empty({T}, DType::i32);
    dcp_compact_topk(test::int_tensor(req), test::int_tensor(lens), test::int_tensor_2d(idx), {}, out, counts, {1, 0, 1});
    const std::vector<int32_t> n = test::to_ints(counts);
    for (std::size_t t = 0; t < req.size(); ++t) {
      const int32_t len = req[t] >= 0 && req[t] < 4 ? lens[static_cast<std::size_t>(req[t])] : 0;
      EXPECT_EQ(n[t], std::count_if(idx[t].begin(), idx[t].end(), [&](int32_t p) { return p >= 0 && p < len; }));
    }
  }
  Tensor idx_t = test::int_tensor_2d(idx);
  Tensor out = test::int_tensor_2d(std::vector<std::vector<int32_t>>(req.size(), std::vector<int32_t>(K, 77)));
  Tensor counts = test::int_tensor(std::vector<int32_t>(req.size(), 77));
  const Tensor r = test::int_tensor(req), l = test::int_tensor(lens), v = test::int_tensor(valid);
  EXPECT_THROW(dcp_compact_topk(r, l, idx_t, v, out, counts, {2, 2, 1}), Error);               // rank out of range
  EXPECT_THROW(dcp_compact_topk(r, l, idx_t, v, idx_t, counts, {2, 0, 1}), Error);             // out aliases indices
  EXPECT_THROW(dcp_compact_topk(test::int_tensor({0, 1}), l, idx_t, v, out, counts, {2, 0, 1}), Error);  // short req_id
  EXPECT_THROW(dcp_compact_topk(r, l, idx_t, test::int_tensor({1, 2}), out, counts, {2, 0, 1}), Error);  // short lengths
  EXPECT_THROW(dcp_compact_topk(r, l, idx_t, v, out, {}, {2, 0, 1}), Error);                   // no counts
  EXPECT_THROW(dcp_compact_topk(r, l, idx_t, v, out, test::int_tensor({1}), {2, 0, 1}), Error);  // counts too short
  for (int32_t x : test::to_ints(out)) EXPECT_EQ(x, 77);
  for (int32_t x : test::to_ints(counts)) EXPECT_EQ(x, 77);
}

}  // namespace
}  // namespace mla
