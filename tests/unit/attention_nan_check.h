// SPDX-License-Identifier: Apache-2.0
#pragma once
// The NaN rule of the attention ops (docs/SEMANTICS.md §14.6a), checked the same way on every backend:
// a visible key with a NaN score turns its whole output row and LSE into NaN (even when every visible
// key is NaN); a NaN key that is masked, invalid or past topk_length changes nothing; only an empty set
// of visible keys gives out 0 / LSE -inf. Inputs are built on the host and copied to `dev`; the CPU
// unit tests run it on the CPU (fast and reference precision), the GPU tests on every CUDA variant.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla::test::nan_check {

// shared_nan: finite, or (on CUDA) NaN from a key masked for this row but shared with a later query of the
// same request in one product (docs/SEMANTICS.md §14.6a): all finite with a finite lse, or an all-NaN
// output (its lse comes from the scores, which the mask kept finite, and may be finite or NaN).
enum class Expect { finite, nan, empty, shared_nan };

inline const char* name(Expect e) {
  return e == Expect::finite ? "finite" : e == Expect::nan ? "NaN" : e == Expect::empty ? "empty" : "finite or NaN";
}

// out [rows, dv] and lse [rows] (host doubles) against the expectation of each row.
inline void expect_rows(const std::vector<double>& out, const std::vector<double>& lse, int64_t dv,
                        const std::vector<Expect>& want, const std::string& what) {
  ASSERT_EQ(lse.size(), want.size()) << what;
  for (std::size_t r = 0; r < want.size(); ++r) {
    const double* o = out.data() + r * static_cast<std::size_t>(dv);
    int nan = 0, finite = 0, zero = 0;
    for (int64_t x = 0; x < dv; ++x) {
      nan += std::isnan(o[x]);
      finite += std::isfinite(o[x]);
      zero += o[x] == 0.0;
    }
    const std::string at = what + ", row " + std::to_string(r) + " (expected " + name(want[r]) + ")";
    switch (want[r]) {
      case Expect::nan:
        EXPECT_EQ(nan, dv) << at;
        EXPECT_TRUE(std::isnan(lse[r])) << at << ": lse " << lse[r];
        break;
      case Expect::finite:
        EXPECT_EQ(finite, dv) << at;
        EXPECT_TRUE(std::isfinite(lse[r])) << at << ": lse " << lse[r];
        break;
      case Expect::shared_nan:
        EXPECT_TRUE((finite == dv && std::isfinite(lse[r])) || (nan == dv && !std::isinf(lse[r])))
            << at << ": " << finite << " finite, " << nan << " NaN of " << dv << ", lse " << lse[r];
        break;
      case Expect::empty:
        EXPECT_EQ(zero, dv) << at;
        EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << at << ": lse " << lse[r];
        break;
    }
  }
}

// mqa_decode, causal, s_q 2, h 3, page 16, cache `format`. Requests: 0 one NaN key every query sees;
// 1 finite; 2 seq_len 0; 3 a NaN key only query 1 sees (the last position: on CUDA query 0 may turn NaN
// through the shared P·V product, §14.6a); 4 every key NaN.
inline void check_decode(Device dev, CacheFormat format, const Context& ctx) {
  reseed(71);
  const int64_t s_q = 2, h = 3, page = 16, dv = 512;
  const std::vector<int32_t> lens = {20, 9, 0, 5, 3};
  const int64_t b = static_cast<int64_t>(lens.size());
  PagedBatch pb = paged_batch(format, page, lens, 2);
  poison_row(pb.cb.cache, pb.slots[0][3]);
  poison_row(pb.cb.cache, pb.slots[3][4]);
  for (int64_t slot : pb.slots[4]) poison_row(pb.cb.cache, slot);
  Tensor q = random_tensor({b, s_q, h, 576}, DType::bf16);

  Tensor storage = pb.cb.storage.to(dev);
  KVCache cache = pb.cb.cache;
  cache.data.data = static_cast<char*>(storage.data()) +
                    (static_cast<const char*>(pb.cb.cache.data.data) - static_cast<const char*>(pb.cb.storage.data()));
  cache.data.device = dev;
  Tensor qd = q.to(dev), table = pb.block_table.to(dev), sl = pb.seq_lens.to(dev);
  Tensor out = poisoned({b, s_q, h, dv}, DType::bf16, dev), lse = poisoned({b, s_q, h}, DType::f32, dev);
  Tensor ws;
  if (dev.is_cuda()) ws = Tensor::empty({static_cast<int64_t>(mqa_decode_workspace_bytes(b, s_q, h, 2 * page, dev))},
                                        DType::u8, dev);
  mqa_decode(qd, cache, table, sl, out, lse, 0.07, true, ws.defined() ? ws.view() : TensorView{}, ctx);

  std::vector<Expect> want;
  const Expect masked_in_step = dev.is_cuda() ? Expect::shared_nan : Expect::finite;
  const Expect per_request[5][2] = {{Expect::nan, Expect::nan},
                                    {Expect::finite, Expect::finite},
                                    {Expect::empty, Expect::empty},
                                    {masked_in_step, Expect::nan},
                                    {Expect::nan, Expect::nan}};
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < s_q; ++i)
      for (int64_t k = 0; k < h; ++k) want.push_back(per_request[r][i]);
  expect_rows(to_doubles(out), to_doubles(lse), dv, want, std::string("mqa_decode ") + to_string(format));
}

// sparse_mqa, h 4, topk 6, page 16, cache `format`, with topk_length. Tokens: 0 one NaN row among finite
// ones; 1 finite rows, -1 entries, and a NaN row past topk_length; 2 only invalid entries; 3 every row NaN.
inline void check_sparse(Device dev, CacheFormat format, const Context& ctx) {
  reseed(72);
  const int64_t t = 4, h = 4, page = 16, dv = 512, blocks = 4;
  CacheBuffer cb = nan_cache(format, blocks, page);
  for (int64_t s = 0; s < 20; ++s) randomize_row(cb.cache, s);  // rows 20.. stay NaN
  const int32_t nan_row = 33, out_of_range = static_cast<int32_t>(blocks * page);
  Tensor idx = int_tensor_2d({{1, 5, nan_row, 7, 2, 3},
                              {4, -1, 6, -1, nan_row, nan_row},
                              {-1, out_of_range, -1, -7, -1, -1},
                              {nan_row, 40, 41, -1, 50, 60}});
  Tensor len = int_tensor({6, 4, 6, 6});
  Tensor q = random_tensor({t, h, 576}, DType::bf16);

  Tensor storage = cb.storage.to(dev);
  KVCache cache = cb.cache;
  cache.data.data = static_cast<char*>(storage.data()) +
                    (static_cast<const char*>(cb.cache.data.data) - static_cast<const char*>(cb.storage.data()));
  cache.data.device = dev;
  Tensor out = poisoned({t, h, dv}, DType::bf16, dev), lse = poisoned({t, h}, DType::f32, dev);
  sparse_mqa(q.to(dev), cache, idx.to(dev), len.to(dev), out, lse, 0.07, ctx);
  std::vector<Expect> want;
  for (Expect e : {Expect::nan, Expect::finite, Expect::empty, Expect::nan})
    for (int64_t k = 0; k < h; ++k) want.push_back(e);
  expect_rows(to_doubles(out), to_doubles(lse), dv, want, std::string("sparse_mqa ") + to_string(format));
}

// mha_prefill, causal, h 2, q/k 192 (128 nope + 64 rope), v 128. Request 0 (4 queries, 6 keys): key 3
// NaN in k_nope, seen by queries 1..3 (query i sees keys j <= 2 + i); request 1: no keys.
inline void check_prefill(Device dev, const Context& ctx) {
  reseed(73);
  const int64_t h = 2, tq = 6, tk = 6;
  Tensor q = random_tensor({tq, h, 192}, DType::bf16), kn = random_tensor({tk, h, 128}, DType::bf16);
  Tensor pe = random_tensor({tk, h, 64}, DType::bf16), v = random_tensor({tk, h, 128}, DType::bf16);
  for (int64_t k = 0; k < h; ++k) num::store(static_cast<char*>(kn.data()) + 2 * ((3 * h + k) * 128 + 17), DType::bf16, NAN);
  Tensor cuq = int_tensor({0, 4, 6}, dev), cuk = int_tensor({0, 6, 6}, dev);
  Tensor out = poisoned({tq, h, 128}, DType::bf16, dev), lse = poisoned({h, tq}, DType::f32, dev);
  mha_prefill(q.to(dev), kn.to(dev), pe.to(dev), v.to(dev), cuq, cuk, 4, 6, out, lse, 0.07, true, ctx);
  // lse is [h, tq]: reorder to [tq, h] rows.
  const std::vector<double> l = to_doubles(lse);
  std::vector<double> lse_rows;
  std::vector<Expect> want;
  const Expect per_query[6] = {Expect::finite, Expect::nan,   Expect::nan,
                               Expect::nan,    Expect::empty, Expect::empty};
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t k = 0; k < h; ++k) {
      lse_rows.push_back(l[static_cast<std::size_t>(k * tq + i)]);
      want.push_back(per_query[i]);
    }
  expect_rows(to_doubles(out), lse_rows, 128, want, "mha_prefill");
}

}  // namespace mla::test::nan_check
