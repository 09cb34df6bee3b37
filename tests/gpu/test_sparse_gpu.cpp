// SPDX-License-Identifier: Apache-2.0
// CUDA sparse_mqa against the CPU backend's float64 reference (DESIGN.md §5), every registered variant:
// every cache format, page sizes 1/16/64, h in {1..128} (3 and 24 included), top-k widths that are not
// multiples of 64 (133, 192, 640, 2048), indices that are invalid (negative, >= num_slots), duplicated
// or cut off by topk_length (the cut-off ones point at NaN rows, so a stray read shows), lonely tokens
// (out 0, lse -inf), a flat bf16 workspace as the key source and strided index rows.
//
// The sm90_seesaw and sm90_convert kernels read an fp8_ds_mla row as its bf16 upconvert (SEMANTICS §3.3:
// bf16(code * scale)): their oracle is the float64 reference over the upconverted cache; sm90_raw and the portable
// variant keep the codes exact and apply the scales in fp32, their oracle reads the fp8 cache.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_gpu_util.h"
#include "runtime/device_api.h"
#include "unit/attention_test_util.h"
#include "unit/sparse_v4_test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

constexpr double kScale = 0.0722;

// A cache whose even slots hold random rows ("live") and odd slots stay NaN ("dead"): valid indices
// pick live rows; entries that must never be read pick dead ones (unit/sparse_v4_test_util.h).
using SparseCache = test::V4Cache;
SparseCache sparse_cache(CacheFormat f, int64_t nb, int64_t page) { return test::v4_cache(f, 576, nb, page); }

// Index rows [t, topk] and lengths. Token 0: only invalid entries (lonely). Token 1: length 0 (lonely;
// its entries are dead rows). Token 2: length topk / 3 with dead rows after it. Others: full length
// or random, mixing live rows, duplicates of earlier entries and invalid values.
struct Indices {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> lengths;
};
Indices make_indices(const SparseCache& c, int64_t t, int64_t topk, int64_t num_slots) {
  std::mt19937_64& g = test::rng();
  const std::vector<int32_t> invalid = {-1, -7, static_cast<int32_t>(num_slots), static_cast<int32_t>(num_slots + 13),
                                        INT_MAX, INT_MIN};
  auto pick = [&](const std::vector<int32_t>& v) { return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(g)]; };
  Indices ix;
  for (int64_t tok = 0; tok < t; ++tok) {
    std::vector<int32_t> row;
    int32_t len = static_cast<int32_t>(topk);
    if (tok == 1) len = 0;
    if (tok == 2) len = static_cast<int32_t>(topk / 3);
    if (tok >= 4) len = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(topk))(g);
    for (int64_t j = 0; j < topk; ++j) {
      const int u = std::uniform_int_distribution<int>(0, 9)(g);
      int32_t v;
      if (j >= len || tok == 1) v = pick(c.dead);
      else if (tok == 0 || u < 2) v = pick(invalid);
      else if (u < 3 && !row.empty()) v = row[std::uniform_int_distribution<std::size_t>(0, row.size() - 1)(g)];
      else v = pick(c.live);
      row.push_back(v);
    }
    ix.rows.push_back(row);
    ix.lengths.push_back(len);
  }
  return ix;
}

// Whether `variant` reads `format` rows as their bf16 upconvert at h heads (the oracle must then too).
bool reads_upconverted(const std::string& variant, CacheFormat format, int64_t /*h*/) {
  return test::variant_upconverts(variant, format);
}

// Oracle (host) and GPU run with poisoned outputs; `indices` / `lengths` are host tensors. `act`: the
// GPU's q / out dtype (q holds bf16 values, passed to the GPU converted: attention_gpu_util.h).
// `oracle_cache`: the cache the reference reads (default: `cache`; see reads_upconverted).
void check_sparse(const Tensor& q, const Tensor& cache_storage, const KVCache& cache, const TensorView& indices,
                  const TensorView& lengths, int64_t dv, const std::string& what, DType act = DType::bf16,
                  const KVCache* oracle_cache = nullptr) {
  const int64_t t = q.size(0), h = q.size(1);
  Tensor ref_out = test::poisoned({t, h, dv}, DType::f64), ref_lse = test::poisoned({t, h}, DType::f32);
  sparse_mqa(q, oracle_cache ? *oracle_cache : cache, indices, lengths, ref_out, ref_lse, kScale, test::reference_ctx());

  const Device gpu = Device::cuda(0);
  test::DeviceCache dc = test::to_device(cache_storage, cache);
  Tensor qd = test::converted(q, act).to(gpu);
  // Index rows keep their (possibly padded) row stride on the device.
  Tensor idx_store = Tensor::empty({indices.size(0), indices.stride[0]}, DType::i32);
  std::memcpy(idx_store.data(), indices.data, static_cast<std::size_t>(indices.size(0) * indices.stride[0]) * 4);
  Tensor idx_dev = idx_store.to(gpu);
  const TensorView idx = idx_dev.view().slice(1, 0, indices.size(1));
  Tensor len_dev = lengths.defined() ? Tensor(test::int_tensor(test::to_ints(lengths), gpu)) : Tensor();
  Tensor out = test::poisoned({t, h, dv}, act, gpu), lse = test::poisoned({t, h}, DType::f32, gpu);
  sparse_mqa(qd, dc.cache, idx, len_dev.view(), out, lse, kScale, Context{});
  cuda_rt::synchronize(0);
  test::expect_attention_close(out, ref_out, lse, ref_lse, what);
}

// check_sparse for `variant` (forced by the caller): the oracle reads what the variant reads.
void check_variant(const std::string& variant, const Tensor& q, const CacheBuffer& cb, const TensorView& indices,
                   const TensorView& lengths, const std::string& what) {
  if (reads_upconverted(variant, cb.cache.format, q.size(1))) {
    const CacheBuffer u = test::upconverted_cache(cb.cache);
    check_sparse(q, cb.storage, cb.cache, indices, lengths, 512, what, DType::bf16, &u.cache);
  } else {
    check_sparse(q, cb.storage, cb.cache, indices, lengths, 512, what);
  }
}

using SweepParam = std::tuple<CacheFormat, int64_t /*page*/, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuSweep : public ::testing::TestWithParam<SweepParam> {};

// 7 tokens (two lonely ones), top-k 133 (two full 64-key tiles and a partial one), random lengths.
TEST_P(SparseGpuSweep, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, page, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(page * 1000 + h) + static_cast<uint64_t>(format) * 100000 + 300);
  const int64_t t = 7, topk = 133, nb = (400 + page - 1) / page;
  const SparseCache c = sparse_cache(format, nb, page);
  const Indices ix = make_indices(c, t, topk, nb * page);
  Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
  MLA_SKIP_IF_DECLINED(check_variant(variant, q, c.cb, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths), "sweep"));
  test::expect_variant_ran("sparse_mqa", variant);
}

INSTANTIATE_TEST_SUITE_P(All, SparseGpuSweep,
                         ::testing::Combine(::testing::ValuesIn(test::kDeviceFormats), ::testing::Values(1, 16, 64),
                                            ::testing::Values(1, 3, 8, 16, 24, 32, 64, 100, 128),
                                            ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + "_h" +
                                  std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
                         });

// Few tokens over long index rows: 7 tokens, top-k 1000 (16 tiles), so the small-T split (core/sparse_split.h) runs
// in up to 8 ranks a (row tile, token) where a variant has one (sm90_raw at <= 32 rows; sm90_convert, the seesaw over
// one row tile), with make_indices' lonely, empty, one-third and random-length tokens leaving ranks without keys.
using SplitParam = std::tuple<int64_t /*page*/, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuSmallT : public ::testing::TestWithParam<SplitParam> {};

TEST_P(SparseGpuSmallT, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [page, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(page * 1000 + h) + 700);
  const int64_t t = 7, topk = 1000, nb = (2400 + page - 1) / page;
  const SparseCache c = sparse_cache(CacheFormat::fp8_ds_mla, nb, page);
  const Indices ix = make_indices(c, t, topk, nb * page);
  Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
  MLA_SKIP_IF_DECLINED(
      check_variant(variant, q, c.cb, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths), "small T"));
  test::expect_variant_ran("sparse_mqa", variant);
}

INSTANTIATE_TEST_SUITE_P(All, SparseGpuSmallT,
                         ::testing::Combine(::testing::Values(1, 64), ::testing::Values(16, 40, 64, 128),
                                            ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
                         [](const ::testing::TestParamInfo<SplitParam>& info) {
                           return "page" + std::to_string(std::get<0>(info.param)) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
                         });

using WidthParam = std::tuple<CacheFormat, int64_t /*topk*/, std::string /*variant*/>;
class SparseGpuWidths : public ::testing::TestWithParam<WidthParam> {};

// Top-k widths 1, 64, 192, 640 and 2048 at h 8, 16, 32 and 128 (small kernel N 8 / 16 / 32, seesaw), page 64, 5 tokens, with lengths (tokens 0-2
// as in make_indices) and, at 2048, without (every entry up to topk counts; invalid values still never
// read; dead rows replaced by live ones), peaky queries.
TEST_P(SparseGpuWidths, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, topk, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(topk) + static_cast<uint64_t>(format) * 100000 + 301);
  const int64_t t = 5, page = 64, nb = 80;
  const SparseCache c = sparse_cache(format, nb, page);
  for (int64_t h : {8, 16, 32, 128}) {
    Indices ix = make_indices(c, t, topk, nb * page);
    Tensor q = test::random_tensor({t, h, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
    const std::string what = "topk " + std::to_string(topk) + " h " + std::to_string(h);
    MLA_SKIP_IF_DECLINED(
        check_variant(variant, q, c.cb, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths), what));
    test::expect_variant_ran("sparse_mqa", variant);
    if (topk == 2048) {
      for (auto& row : ix.rows)
        for (int32_t& v : row)
          if (v >= 0 && v < nb * page && v % 2 == 1) v -= 1;
      check_variant(variant, q, c.cb, test::int_tensor_2d(ix.rows), {}, what + " no lengths");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SparseGpuWidths,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8_ds_mla),
                                            ::testing::Values(1, 64, 192, 640, 2048),
                                            ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
                         [](const ::testing::TestParamInfo<WidthParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_topk" +
                                  std::to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
                         });

// Logits whose row maxima jump across 64-entry tiles by more and by less than the lazy maximum's threshold
// (unit/attention_test_util.h logit_jump_scale; test_decode_gpu.cpp DecodeGpuLogitJumps says why). Slot j holds
// tile j / 64's magnitude; token 0 reads the slots in order, token 1 too with a length that ends mid-tile, token 2
// in reverse (its maximum comes first and never moves) and token 3 in order with every third entry invalid.
using JumpParam = std::tuple<CacheFormat, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuLogitJumps : public ::testing::TestWithParam<JumpParam> {};

TEST_P(SparseGpuLogitJumps, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(h) + static_cast<uint64_t>(format) * 1000 + 302);
  const int64_t topk = 2048, page = 64, nb = topk / page + 1;
  const CacheBuffer cb = test::nan_cache(format, nb, page);
  for (int64_t j = 0; j < topk; ++j) {
    test::randomize_row(cb.cache, j);
    ASSERT_TRUE(test::scale_row(cb.cache, j, test::logit_jump_scale(j / 64)));
  }
  std::vector<std::vector<int32_t>> rows(4);
  for (int32_t j = 0; j < topk; ++j) {
    rows[0].push_back(j);
    rows[1].push_back(j);
    rows[2].push_back(static_cast<int32_t>(topk) - 1 - j);
    rows[3].push_back(j % 3 == 1 ? -1 : j);
  }
  Tensor q = test::random_tensor({4, h, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
  MLA_SKIP_IF_DECLINED(check_variant(variant, q, cb, test::int_tensor_2d(rows),
                                     test::int_tensor({2048, 1000, 2048, 2048}), "logit jumps"));
  test::expect_variant_ran("sparse_mqa", variant);
}

INSTANTIATE_TEST_SUITE_P(All, SparseGpuLogitJumps,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8_ds_mla),
                                            ::testing::Values(16, 32, 64, 128),
                                            ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
                         [](const ::testing::TestParamInfo<JumpParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
                         });

// Many tokens (more CTAs than SMs at h 128: two waves; each token's entries spread over the whole cache) at
// h 128 and 32, fp8_ds_mla and bf16, every variant.
TEST(SparseGpu, ManyTokensEveryVariant) {
  MLA_SKIP_WITHOUT_GPU();
  for (const std::string& variant : test::variants_of("sparse_mqa")) {
    if (!variant_runs_on_device("sparse_mqa", variant, 0)) continue;
    ForceVariant force("sparse_mqa", variant);
    int ran = 0;
    for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla})
      for (int64_t h : {32, 128}) {
        test::reseed(320 + static_cast<uint64_t>(h));
        const int64_t t = 150, topk = 128, page = 64, nb = 40;
        const SparseCache c = sparse_cache(f, nb, page);
        const Indices ix = make_indices(c, t, topk, nb * page);
        Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
        try {
          check_variant(variant, q, c.cb, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths),
                        variant + " " + to_string(f) + " h " + std::to_string(h));
        } catch (const VariantUnsupported&) {
          continue;  // the small / raw kernels past 32 heads, or over the other format
        }
        ++ran;
        test::expect_variant_ran("sparse_mqa", variant);
      }
    EXPECT_GT(ran, 0) << variant;
  }
}

// Small decode steps (T 1 .. 16 tokens of fp8_ds_mla at up to 32 heads): sm90_raw splits each token's
// top-k over a thread-block cluster of 2 / 4 / 8 CTAs merged through distributed shared memory
// (core/sparse_split.h: T 1 / 2 / 5 / 16 x topk 256 / 640 / 2048 take 2, 4 and 8 ranks, some of them without a
// tile for the shorter tokens), h 1 / 8 / 16 / 24 / 32 (the raw kernel's N 8 / 16 / 32), random lengths, lonely
// tokens and invalid / duplicate entries as make_indices makes them (T < 5: its tokens 3 .., the full and random
// ones), peaky queries.
TEST(SparseGpu, SmallStepsClusterSplit) {
  MLA_SKIP_WITHOUT_GPU();
  MLA_FORCE_VARIANT("sparse_mqa", "sm90_raw");
  const int64_t page = 64, nb = 80;
  for (int64_t topk : {256, 640, 2048}) {
    test::reseed(330 + static_cast<uint64_t>(topk));
    const SparseCache c = sparse_cache(CacheFormat::fp8_ds_mla, nb, page);
    for (int64_t t : {1, 2, 5, 16})
      for (int64_t h : {1, 8, 16, 24, 32}) {
        Indices ix = make_indices(c, t + 3, topk, nb * page);
        const std::size_t first = t < 5 ? 3 : 0;
        ix.rows = {ix.rows.begin() + first, ix.rows.begin() + first + t};
        ix.lengths = {ix.lengths.begin() + first, ix.lengths.begin() + first + t};
        Tensor q = test::random_tensor({t, h, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
        check_variant("sm90_raw", q, c.cb, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths),
                      "T " + std::to_string(t) + " topk " + std::to_string(topk) + " h " + std::to_string(h));
        test::expect_variant_ran("sparse_mqa", "sm90_raw");
      }
  }
}

// f16 / f32 q and out (the engine is templated on the activation type), every cache format.
TEST(SparseGpu, F16AndF32Activations) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(310);
  for (DType act : {DType::f16, DType::f32}) {
    for (CacheFormat f : test::kDeviceFormats) {
      const int64_t t = 5, topk = 100, page = 16, nb = 25;
      const SparseCache c = sparse_cache(f, nb, page);
      const Indices ix = make_indices(c, t, topk, nb * page);
      Tensor q = test::random_tensor({t, 24, 576}, DType::bf16);
      check_sparse(q, c.cb.storage, c.cb.cache, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths), 512,
                   std::string(to_string(f)) + " " + to_string(act), act);
    }
  }
}

// A flat bf16 workspace [rows, 576] viewed as a one-block cache (the separate-mode prefill path), index
// rows inside a wider buffer (row stride > topk), narrow d_v, odd head count.
TEST(SparseGpu, FlatWorkspaceStridedIndices) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(302);
  const int64_t rows = 333, t = 5, h = 24, topk = 70, dv = 300;
  const SparseCache c = sparse_cache(CacheFormat::bf16, 1, rows);
  const Indices ix = make_indices(c, t, topk, rows);
  std::vector<std::vector<int32_t>> wide = ix.rows;
  for (auto& r : wide) r.resize(static_cast<std::size_t>(topk + 9), -1);
  Tensor idx_store = test::int_tensor_2d(wide);
  Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
  check_sparse(q, c.cb.storage, c.cb.cache, idx_store.view().slice(1, 0, topk), test::int_tensor(ix.lengths), dv,
               "flat workspace");
}

// ---- DeepSeek-V4 options (SparseOptions, SEMANTICS §11.8) ----------------------------------------
// Every variant (sm90 declines a sink or an extra cache: skipped with its reason) against the CPU
// backend's float64 reference with the same options (itself checked against the formula in
// tests/unit/test_sparse_v4.cpp): an extra cache at its own page size with lonely, main-only and
// extra-only tokens (unit/sparse_v4_test_util.h), duplicate / -1 / out-of-range entries, NaN rows
// wherever an entry must not be read, odd top-k in both lists, a sink per head (one head -inf),
// d_qk 512 with whole-row values (d_v 512) or V3.2 rows (576, d_v 512).
using V4Param = std::tuple<CacheFormat, int /*d_qk*/, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuV4 : public ::testing::TestWithParam<V4Param> {};

struct V4Shape {
  int64_t page_main, page_extra, topk_main, topk_extra;
  bool sink, extra, lengths;
  DType act;
  bool rotate = false;  // SparseOptions::out_rotation over the last 64 columns (the V4 block's inverse rope)
  // q as the first d_qk columns of rows d_qk + q_pad wide: 8 keeps 16-byte strides (sm90_convert's TMA boxes
  // step over the padding), 4 does not (sm90_convert declines it).
  int64_t q_pad = 0;
  // out as the first 512 columns of rows 512 + out_pad wide: 0 and 8 keep 16-byte row starts (sm90_convert's 64-row
  // tile writes whole rows from shared memory), 2 leaves 4-byte starts (its fragment's own stores); the padding
  // must stay as poisoned.
  int64_t out_pad = 0;
  int64_t tokens = 7;
  // Every token t with t % empty_every == 5 without a key in either list (both lengths 0; needs `lengths`).
  int64_t empty_every = 0;
};

// A device copy of a byte cache one byte off its storage's start: no 16-byte copy is legal (the loaders'
// byte-wise paths).
test::DeviceCache to_device_shifted(const Tensor& storage, const KVCache& c) {
  Tensor shifted = Tensor::empty({static_cast<int64_t>(storage.nbytes()) + 1}, DType::u8);
  std::memcpy(static_cast<char*>(shifted.data()) + 1, storage.data(), storage.nbytes());
  KVCache h = c;
  h.data.data = static_cast<char*>(shifted.data()) + 1 +
                (static_cast<const char*>(c.data.data) - static_cast<const char*>(storage.data()));
  return test::to_device(shifted, h);
}

// `extra_format`: the extra cache's (records may mix: V4.1's v41 window with a v41_fp4 compressed cache);
// `shifted`: both device caches one byte off (byte caches only).
void check_v4(CacheFormat format, int d_qk, int64_t h, const V4Shape& s, const std::string& what,
              CacheFormat extra_format, bool shifted = false) {
  const int64_t t = s.tokens, dv = 512;
  const test::V4Cache main = test::v4_cache(format, d_qk, (300 + s.page_main - 1) / s.page_main, s.page_main);
  const test::V4Cache extra =
      test::v4_cache(extra_format, d_qk, (90 + s.page_extra - 1) / s.page_extra, s.page_extra);
  test::V4List ml = test::v4_list(main, t, s.topk_main, false), el = test::v4_list(extra, t, s.topk_extra, true);
  for (int64_t tok = 0; s.empty_every > 0 && tok < t; ++tok)
    if (tok % s.empty_every == 5) {
      ml.lengths[static_cast<std::size_t>(tok)] = 0;
      el.lengths[static_cast<std::size_t>(tok)] = 0;
    }
  const Tensor m_idx = test::int_tensor_2d(ml.rows), m_len = test::int_tensor(ml.lengths);
  const Tensor e_idx = test::int_tensor_2d(el.rows), e_len = test::int_tensor(el.lengths);
  Tensor sink = Tensor::empty({h}, DType::f32);
  for (int64_t hh = 0; hh < h; ++hh)
    static_cast<float*>(sink.data())[hh] = hh == 1 ? -INFINITY : static_cast<float>(test::uniform(-3.0, 3.0));
  const Tensor q_rows = test::random_tensor({t, h, d_qk + s.q_pad}, DType::bf16);
  const TensorView q = q_rows.view().slice(2, 0, d_qk);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_qk));

  SparseOptions host;
  if (s.sink) host.attn_sink = sink.view();
  if (s.extra) host.extra = {extra.cb.cache, e_idx.view(), s.lengths ? e_len.view() : TensorView{}};
  host.values_include_rope = d_qk == 512;
  constexpr int64_t kRot = 64;
  Tensor rot_pos = Tensor::empty({t}, DType::i64), rot_freq = Tensor::empty({kRot / 2}, DType::f64);
  for (int64_t i = 0; i < t; ++i) static_cast<int64_t*>(rot_pos.data())[i] = 977 * i * i + 3;
  for (int64_t i = 0; i < kRot / 2; ++i)
    static_cast<double*>(rot_freq.data())[i] = -std::pow(10000.0, -2.0 * static_cast<double>(i) / kRot);
  if (s.rotate) host.out_rotation = {rot_pos.view(), rot_freq.view(), kRot};
  const Device gpu = Device::cuda(0);
  const test::DeviceCache dm = shifted ? to_device_shifted(main.cb.storage, main.cb.cache)
                                       : test::to_device(main.cb.storage, main.cb.cache);
  const test::DeviceCache de = shifted ? to_device_shifted(extra.cb.storage, extra.cb.cache)
                                       : test::to_device(extra.cb.storage, extra.cb.cache);
  const Tensor m_idx_d = m_idx.to(gpu), m_len_d = m_len.to(gpu), e_idx_d = e_idx.to(gpu), e_len_d = e_len.to(gpu);
  const Tensor sink_d = sink.to(gpu), qd_rows = test::converted(q_rows, s.act).to(gpu);
  const TensorView qd = qd_rows.view().slice(2, 0, d_qk);
  const Tensor rot_pos_d = rot_pos.to(gpu), rot_freq_d = rot_freq.to(gpu);
  SparseOptions dev = host;
  if (s.sink) dev.attn_sink = sink_d.view();
  if (s.rotate) dev.out_rotation = {rot_pos_d.view(), rot_freq_d.view(), kRot};
  if (s.extra) dev.extra = {de.cache, e_idx_d.view(), s.lengths ? e_len_d.view() : TensorView{}};
  Tensor out_rows = test::poisoned({t, h, dv + s.out_pad}, s.act, gpu), lse = test::poisoned({t, h}, DType::f32, gpu);
  const TensorView out = out_rows.view().slice(2, 0, dv);
  sparse_mqa(qd, dm.cache, m_idx_d, s.lengths ? m_len_d.view() : TensorView{}, out, lse, scale, dev, Context{});
  cuda_rt::synchronize(0);
  // A strided device view copies off the GPU only whole: the rows come back, then split into out and padding.
  const Tensor host_rows = out_rows.to(Device::cpu());
  if (s.out_pad > 0) {
    for (double x : test::to_doubles(host_rows.view().slice(2, dv, dv + s.out_pad))) {
      ASSERT_TRUE(std::isnan(x)) << what << ": a padding column of out was written";
    }
  }
  // The oracle after the device call: a forced variant that declines the launch skips before the float64 pass.
  Tensor ref_out = test::poisoned({t, h, dv}, DType::f64), ref_lse = test::poisoned({t, h}, DType::f32);
  sparse_mqa(q, main.cb.cache, m_idx, s.lengths ? m_len.view() : TensorView{}, ref_out, ref_lse, scale, host,
             test::reference_ctx());
  test::expect_attention_close(host_rows.view().slice(2, 0, dv), ref_out, lse, ref_lse, what);
}

std::string v4_name(const ::testing::TestParamInfo<V4Param>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_dqk" + std::to_string(std::get<1>(info.param)) + "_h" +
         std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
}

TEST_P(SparseGpuV4, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, d_qk, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(h * 10 + d_qk) + static_cast<uint64_t>(format) * 100000 + 400);
  const std::vector<V4Shape> shapes = {
      {64, 4, 133, 37, true, true, true, DType::bf16},   {16, 1, 37, 200, true, true, true, DType::bf16},
      {1, 64, 5, 64, true, true, false, DType::bf16},    {64, 16, 70, 13, false, true, true, DType::bf16},
      {16, 16, 45, 0, true, false, true, DType::bf16},   {64, 4, 33, 21, true, true, true, DType::f32}};
  // A variant that declines one shape (e.g. sm90_convert: f32 queries, v4 pages not 16-byte aligned) still runs
  // the others; the test is skipped only when it declines every shape.
  int ran = 0;
  std::string declined;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const V4Shape& s = shapes[i];
    const std::string what = "shape " + std::to_string(i) + " pages " + std::to_string(s.page_main) + "/" +
                             std::to_string(s.page_extra) + " topk " + std::to_string(s.topk_main) + "+" +
                             std::to_string(s.topk_extra);
    try {
      check_v4(format, d_qk, h, s, what, format);
    } catch (const VariantUnsupported& e) {
      declined = e.what();
      continue;
    }
    test::expect_variant_ran("sparse_mqa", variant);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << declined;
}

INSTANTIATE_TEST_SUITE_P(
    All, SparseGpuV4,
    ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8), ::testing::Values(512),
                       ::testing::Values(1, 16, 72, 128), ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
    v4_name);
// DeepSeek-V4's own records (SEMANTICS §3.5), written by the CPU writer from rows of magnitudes 2^-12 .. 2^12,
// their dead rows all 0xff bytes (NaN codes and scales; v4's in its page's scale region).
INSTANTIATE_TEST_SUITE_P(
    Records, SparseGpuV4,
    ::testing::Combine(::testing::Values(CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4),
                       ::testing::Values(512), ::testing::Values(1, 16, 72, 128),
                       ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
    v4_name);
INSTANTIATE_TEST_SUITE_P(
    V32Rows, SparseGpuV4,
    ::testing::Combine(::testing::Values(CacheFormat::fp8_ds_mla, CacheFormat::bf16), ::testing::Values(576),
                       ::testing::Values(16, 128), ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
    v4_name);

// More (row tile, token) units than SMs: the unsplit 64-row sm90 kernel's persistent CTAs run two or three units each
// (the stages, their barriers' phases and Q's buffer carried from one unit to the next), with tokens without keys
// among them (written by S and R between units with keys), the output rotation, both output paths (16-byte row
// starts, rows 512 or 520 wide: O staged in Q's buffer and stored by TMA boxes of an out tensor map; 4-byte starts:
// the fragment's own stores), q rows 520 wide, lengths and sinks per token.
using V4PersistentParam = std::tuple<CacheFormat, CacheFormat, int64_t /*h*/>;
class SparseGpuV4Persistent : public ::testing::TestWithParam<V4PersistentParam> {};

TEST_P(SparseGpuV4Persistent, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [main_format, extra_format, h] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", "sm90_convert");
  test::reseed(static_cast<uint64_t>(h) + static_cast<uint64_t>(main_format) * 1000 +
               static_cast<uint64_t>(extra_format) * 100 + 1700);
  const int64_t tokens = cuda_rt::device_info(0).sm_count + 19;  // two row tiles: units > 2 x SMs
  const std::vector<V4Shape> shapes = {
      {64, 4, 133, 37, true, true, true, DType::bf16, true, 0, 0, tokens, 17},
      {64, 4, 133, 37, true, true, true, DType::bf16, true, 0, 2, tokens, 17},
      {64, 4, 133, 37, true, true, true, DType::bf16, true, 8, 8, tokens, 17},
      {16, 64, 64, 128, true, true, true, DType::bf16, false, 0, 0, tokens, 9}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string what = std::string(to_string(main_format)) + " + " + to_string(extra_format) + " shape " +
                             std::to_string(i);
    check_v4(main_format, 512, h, shapes[i], what, extra_format);
    test::expect_variant_ran("sparse_mqa", "sm90_convert");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, SparseGpuV4Persistent,
    ::testing::Values(V4PersistentParam{CacheFormat::v4, CacheFormat::v4, 72},
                      V4PersistentParam{CacheFormat::v4, CacheFormat::v4, 128},
                      V4PersistentParam{CacheFormat::v41, CacheFormat::v41_fp4, 72},
                      V4PersistentParam{CacheFormat::v41, CacheFormat::v41_fp4, 128},
                      V4PersistentParam{CacheFormat::v41, CacheFormat::v41, 72},
                      V4PersistentParam{CacheFormat::v41_fp4, CacheFormat::v41_fp4, 128}),
    [](const auto& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_h" +
             std::to_string(std::get<2>(info.param));
    });

// A main and an extra cache of different record formats in one call (V4.1: a v41 window with a v41_fp4
// compressed cache; every other pair too), every variant (sm90_convert takes the pairs convert_v4_supports names),
// also with both caches one byte off their storage (the portable loader's byte-wise copies, v4's page-scale slot
// included; sm90_convert declines them).
using V4MixParam = std::tuple<CacheFormat, CacheFormat, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuV4Mixed : public ::testing::TestWithParam<V4MixParam> {};

TEST_P(SparseGpuV4Mixed, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [main_format, extra_format, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(h) + static_cast<uint64_t>(main_format) * 1000 +
               static_cast<uint64_t>(extra_format) * 100 + 900);
  const std::vector<V4Shape> shapes = {{64, 4, 133, 37, true, true, true, DType::bf16},
                                       {16, 1, 37, 200, true, true, true, DType::bf16},
                                       {1, 64, 5, 64, true, true, false, DType::bf16},
                                       {64, 256, 128, 512, true, true, true, DType::f32},
                                       // 10 and 18 tiles a token: at h <= 16 the small-T split in 5 and 8 ranks
                                       // (sparse_split::record_splits), ragged lengths leaving ranks empty
                                       {64, 256, 128, 512, true, true, true, DType::bf16},
                                       {16, 64, 128, 1024, true, true, true, DType::bf16},
                                       // the output rotation (the V4 block's inverse rope) unsplit and split
                                       {64, 4, 133, 37, true, true, true, DType::bf16, true},
                                       {64, 256, 128, 512, true, true, true, DType::bf16, true},
                                       // q rows wider than d_qk: 16-byte strides, split and not; odd strides
                                       {64, 4, 133, 37, true, true, true, DType::bf16, false, 8},
                                       {64, 256, 128, 512, true, true, true, DType::bf16, false, 8},
                                       {64, 4, 133, 37, true, true, true, DType::bf16, false, 4},
                                       // out rows wider than 512: 16-byte starts, then 4-byte ones
                                       {64, 256, 128, 512, true, true, true, DType::bf16, false, 0, 8},
                                       {64, 4, 133, 37, true, true, true, DType::bf16, true, 0, 2}};
  int ran = 0;
  std::string declined;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (bool shifted : {false, true}) {
      const V4Shape& s = shapes[i];
      const std::string what = std::string(to_string(main_format)) + " + " + to_string(extra_format) + " shape " +
                               std::to_string(i) + (shifted ? " shifted" : "");
      try {
        check_v4(main_format, 512, h, s, what, extra_format, shifted);
      } catch (const VariantUnsupported& e) {
        declined = e.what();
        continue;
      }
      test::expect_variant_ran("sparse_mqa", variant);
      ++ran;
    }
  if (ran == 0) GTEST_SKIP() << declined;
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, SparseGpuV4Mixed,
    ::testing::Combine(::testing::Values(CacheFormat::v41, CacheFormat::v4, CacheFormat::v41_fp4),
                       ::testing::Values(CacheFormat::v41_fp4, CacheFormat::v4, CacheFormat::v41),
                       ::testing::Values(int64_t{16}, int64_t{64}, int64_t{128}),
                       ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
    [](const auto& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_h" +
             std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
    });

}  // namespace
}  // namespace mla
