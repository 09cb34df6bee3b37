// CUDA sparse_mqa against the CPU backend's float64 reference (DESIGN.md §5): every cache format, page
// sizes 1/16/64, h in {1..128}, indices that are invalid (negative, >= num_slots), duplicated or cut off
// by topk_length (the cut-off ones point at NaN rows, so a stray read shows), lonely tokens (out 0,
// lse -inf), top-k 2048, a flat bf16 workspace as the key source and strided index rows.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_gpu_util.h"
#include "runtime/device_api.h"
#include "unit/attention_test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

constexpr double kScale = 0.0722;

// A cache whose even slots hold random rows ("live") and odd slots stay NaN ("dead"): valid indices
// pick live rows; entries that must never be read pick dead ones.
struct SparseCache {
  CacheBuffer cb;
  std::vector<int32_t> live, dead;
};
SparseCache sparse_cache(CacheFormat f, int64_t nb, int64_t page) {
  SparseCache s{test::nan_cache(f, nb, page), {}, {}};
  for (int64_t slot = 0; slot < nb * page; ++slot) {
    if (slot % 2 == 0) {
      test::randomize_row(s.cb.cache, slot);
      s.live.push_back(static_cast<int32_t>(slot));
    } else {
      s.dead.push_back(static_cast<int32_t>(slot));
    }
  }
  return s;
}

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

// Oracle (host) and GPU run with poisoned outputs; `indices` / `lengths` are host tensors. `act`: the
// GPU's q / out dtype (q holds bf16 values, passed to the GPU converted: attention_gpu_util.h).
void check_sparse(const Tensor& q, const Tensor& cache_storage, const KVCache& cache, const TensorView& indices,
                  const TensorView& lengths, int64_t dv, const std::string& what, DType act = DType::bf16) {
  const int64_t t = q.size(0), h = q.size(1);
  Tensor ref_out = test::poisoned({t, h, dv}, DType::f64), ref_lse = test::poisoned({t, h}, DType::f32);
  sparse_mqa(q, cache, indices, lengths, ref_out, ref_lse, kScale, test::reference_ctx());

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

using SweepParam = std::tuple<CacheFormat, int64_t /*page*/, int64_t /*h*/, std::string /*variant*/>;
class SparseGpuSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(SparseGpuSweep, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, page, h, variant] = GetParam();
  MLA_FORCE_VARIANT("sparse_mqa", variant);
  test::reseed(static_cast<uint64_t>(page * 1000 + h) + static_cast<uint64_t>(format) * 100000 + 300);
  const int64_t t = 7, topk = 100, nb = (400 + page - 1) / page;
  const SparseCache c = sparse_cache(format, nb, page);
  const Indices ix = make_indices(c, t, topk, nb * page);
  Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
  MLA_SKIP_IF_DECLINED(check_sparse(q, c.cb.storage, c.cb.cache, test::int_tensor_2d(ix.rows),
                                    test::int_tensor(ix.lengths), 512, "sweep"));
  test::expect_variant_ran("sparse_mqa", variant);
}

INSTANTIATE_TEST_SUITE_P(All, SparseGpuSweep,
                         ::testing::Combine(::testing::ValuesIn(test::kAllFormats), ::testing::Values(1, 16, 64),
                                            ::testing::Values(1, 8, 16, 32, 64, 128),
                                            ::testing::ValuesIn(test::variants_of("sparse_mqa"))),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + "_h" +
                                  std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
                         });

// f16 / f32 q and out (the engine is templated on the activation type), every cache format.
TEST(SparseGpu, F16AndF32Activations) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(310);
  for (DType act : {DType::f16, DType::f32}) {
    for (CacheFormat f : test::kAllFormats) {
      const int64_t t = 5, topk = 100, page = 16, nb = 25;
      const SparseCache c = sparse_cache(f, nb, page);
      const Indices ix = make_indices(c, t, topk, nb * page);
      Tensor q = test::random_tensor({t, 24, 576}, DType::bf16);
      check_sparse(q, c.cb.storage, c.cb.cache, test::int_tensor_2d(ix.rows), test::int_tensor(ix.lengths), 512,
                   std::string(to_string(f)) + " " + to_string(act), act);
    }
  }
}

// DeepSeek V3.2 shape: top-k 2048 (64 key tiles), 128 heads, page 64, no topk_length (every entry up to
// topk counts; invalid values still never read), peaky queries.
TEST(SparseGpu, TopK2048NoLengths) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(301);
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    const int64_t t = 3, topk = 2048, page = 64, nb = 80;
    const SparseCache c = sparse_cache(f, nb, page);
    Indices ix = make_indices(c, t, topk, nb * page);
    for (auto& row : ix.rows)  // without lengths, dead rows would be read: replace them by live ones
      for (int32_t& v : row)
        if (v >= 0 && v < nb * page && v % 2 == 1) v -= 1;
    Tensor q = test::random_tensor({t, 128, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
    check_sparse(q, c.cb.storage, c.cb.cache, test::int_tensor_2d(ix.rows), {}, 512, to_string(f));
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

}  // namespace
}  // namespace mla
