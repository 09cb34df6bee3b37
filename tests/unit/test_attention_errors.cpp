// SPDX-License-Identifier: Apache-2.0
// Bad inputs to mqa_decode, mha_prefill and sparse_mqa raise mla::Error and leave every output untouched.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "attention_test_util.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr double kSentinel = 7.0;

// Outputs pre-filled with a sentinel; `expect_rejected` checks that the call throws and that no output
// element changed.
void expect_rejected(const std::function<void()>& call, const std::vector<TensorView>& outputs, const char* what) {
  for (const TensorView& o : outputs) fill(o, kSentinel);
  EXPECT_THROW(call(), Error) << what;
  for (const TensorView& o : outputs)
    for (double x : test::to_doubles(o)) ASSERT_EQ(x, kSentinel) << what << ": output written before the error";
}

TensorView strided(const Tensor& t, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
  return TensorView(t.data(), t.dtype(), std::span<const int64_t>(shape.begin(), shape.size()),
                    std::span<const int64_t>(stride.begin(), stride.size()));
}

TEST(AttentionErrors, MqaDecode) {
  test::reseed(31);
  const int64_t b = 2, s_q = 1, h = 4, page = 16;
  test::PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, {20, 9}, 2);
  const KVCache& cache = pb.cb.cache;
  Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16);
  Tensor out = Tensor::empty({b, s_q, h, 512}, DType::f32), lse = Tensor::empty({b, s_q, h}, DType::f32);
  const std::vector<TensorView> outs = {out.view(), lse.view()};
  auto call = [&](const TensorView& qq, const KVCache& c, const TensorView& bt, const TensorView& sl,
                  const TensorView& o, const TensorView& l,
                  double scale = 0.1) { return [=, &c] { mqa_decode(qq, c, bt, sl, o, l, scale, true, {}, {}); }; };
  // The valid call passes (so that each rejection below is due to its one defect).
  fill(out.view(), kSentinel);
  EXPECT_NO_THROW(call(q, cache, pb.block_table, pb.seq_lens, out, lse)());

  Tensor q3 = test::random_tensor({b, h, 576}, DType::bf16);
  expect_rejected(call(q3, cache, pb.block_table, pb.seq_lens, out, lse), outs, "q with 3 dims");
  Tensor qi = Tensor::zeros({b, s_q, h, 576}, DType::i32);
  expect_rejected(call(qi, cache, pb.block_table, pb.seq_lens, out, lse), outs, "integer q");
  Tensor qw = test::random_tensor({b, s_q, h, 320}, DType::bf16);
  expect_rejected(call(qw, cache, pb.block_table, pb.seq_lens, out, lse), outs, "q width != d_qk");
  Tensor qbuf = test::random_tensor({b, s_q, h, 576 * 2}, DType::bf16);
  expect_rejected(call(strided(qbuf, {b, s_q, h, 576}, {h * 1152, h * 1152, 1152, 2}), cache, pb.block_table,
                       pb.seq_lens, out, lse),
                  outs, "q inner stride 2");
  Tensor bt64 = Tensor::zeros({b, 2}, DType::i64);
  expect_rejected(call(q, cache, bt64, pb.seq_lens, out, lse), outs, "i64 block table");
  Tensor bt1 = test::int_tensor_2d({{0, 1}});
  expect_rejected(call(q, cache, bt1, pb.seq_lens, out, lse), outs, "block table rows != b");
  Tensor sl3 = test::int_tensor({1, 1, 1});
  expect_rejected(call(q, cache, pb.block_table, sl3, out, lse), outs, "seq_lens length != b");
  Tensor sl_long = test::int_tensor({33, 1});
  expect_rejected(call(q, cache, pb.block_table, sl_long, out, lse), outs, "seq_len > max_blocks * page");
  Tensor sl_neg = test::int_tensor({-1, 1});
  expect_rejected(call(q, cache, pb.block_table, sl_neg, out, lse), outs, "negative seq_len");
  const int64_t nb = cache.num_blocks();
  Tensor bt_oob = test::int_tensor_2d({{0, static_cast<int32_t>(nb)}, {1, 2}});
  expect_rejected(call(q, cache, bt_oob, pb.seq_lens, out, lse), outs, "block id >= num_blocks in use");
  Tensor bt_neg = test::int_tensor_2d({{-1, 0}, {1, 2}});
  expect_rejected(call(q, cache, bt_neg, pb.seq_lens, out, lse), outs, "block id -1 in use");
  Tensor out_wide = Tensor::empty({b, s_q, h, 576}, DType::f32);
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, out_wide, lse), {out_wide.view(), lse.view()},
                  "d_v > d_latent");
  Tensor out_h = Tensor::empty({b, s_q, h + 1, 512}, DType::f32);
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, out_h, lse), {out_h.view(), lse.view()},
                  "out heads != q heads");
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, strided(out, {b, s_q, h, 512}, {512, 512, 0, 1}), lse),
                  outs, "out with overlapping heads");
  // f64 LSEs are accepted on the CPU (the float64 oracle); integer ones never are.
  Tensor lse_int = Tensor::empty({b, s_q, h}, DType::i32);
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, out, lse_int), {out.view(), lse_int.view()}, "i32 lse");
  Tensor lse_short = Tensor::empty({b, s_q, h - 1}, DType::f32);
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, out, lse_short), {out.view(), lse_short.view()},
                  "lse shape");
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, test::on_fake_cuda(out), lse), outs, "out on cuda");
  expect_rejected(call(q, cache, pb.block_table, pb.seq_lens, out, lse, NAN), outs, "NaN softmax scale");
  KVCache bad = cache;
  bad.format = CacheFormat::fp8;  // bf16 data under an fp8 descriptor
  expect_rejected(call(q, bad, pb.block_table, pb.seq_lens, out, lse), outs, "cache dtype vs format");
}

TEST(AttentionErrors, MhaPrefill) {
  test::reseed(32);
  const int64_t tq = 6, tk = 8, h = 2;
  Tensor q = test::random_tensor({tq, h, 24}, DType::f32), kn = test::random_tensor({tk, h, 16}, DType::f32);
  Tensor pe = test::random_tensor({tk, h, 8}, DType::f32), v = test::random_tensor({tk, h, 12}, DType::f32);
  Tensor out = Tensor::empty({tq, h, 12}, DType::f32), lse = Tensor::empty({h, tq}, DType::f32);
  const std::vector<TensorView> outs = {out.view(), lse.view()};
  Tensor cu_q = test::int_tensor({0, 2, 6}), cu_k = test::int_tensor({0, 3, 8});
  auto call = [&](const TensorView& qq, const TensorView& k, const TensorView& p, const TensorView& vv,
                  const TensorView& cq, const TensorView& ck, int64_t mq, int64_t mk, const TensorView& o,
                  const TensorView& l) { return [=] { mha_prefill(qq, k, p, vv, cq, ck, mq, mk, o, l, 0.2, true); }; };
  fill(out.view(), kSentinel);
  EXPECT_NO_THROW(call(q, kn, pe, v, cu_q, cu_k, 4, 5, out, lse)());

  Tensor q_bad = test::random_tensor({tq, h, 25}, DType::f32);
  expect_rejected(call(q_bad, kn, pe, v, cu_q, cu_k, 4, 5, out, lse), outs, "q width != d_nope + d_rope");
  Tensor pe_short = test::random_tensor({tk - 1, h, 8}, DType::f32);
  expect_rejected(call(q, kn, pe_short, v, cu_q, cu_k, 4, 5, out, lse), outs, "k_pe rows != Tk");
  Tensor v_heads = test::random_tensor({tk, h + 1, 12}, DType::f32);
  expect_rejected(call(q, kn, pe, v_heads, cu_q, cu_k, 4, 5, out, lse), outs, "v heads");
  Tensor cu_desc = test::int_tensor({0, 4, 2});
  expect_rejected(call(q, kn, pe, v, cu_desc, cu_k, 4, 5, out, lse), outs, "cu_seqlens_q decreasing");
  Tensor cu_big = test::int_tensor({0, 3, 9});
  expect_rejected(call(q, kn, pe, v, cu_q, cu_big, 4, 6, out, lse), outs, "cu_seqlens_k beyond Tk");
  Tensor cu_len = test::int_tensor({0, 8});
  expect_rejected(call(q, kn, pe, v, cu_q, cu_len, 4, 8, out, lse), outs, "cu_seqlens lengths differ");
  expect_rejected(call(q, kn, pe, v, cu_q, cu_k, 3, 5, out, lse), outs, "request longer than max_seqlen_q");
  Tensor cu64 = Tensor::zeros({3}, DType::i64);
  expect_rejected(call(q, kn, pe, v, cu64, cu_k, 4, 5, out, lse), outs, "i64 cu_seqlens");
  Tensor lse_t = Tensor::empty({tq, h}, DType::f32);
  expect_rejected(call(q, kn, pe, v, cu_q, cu_k, 4, 5, out, lse_t), {out.view(), lse_t.view()}, "lse [Tq, h]");
  Tensor out_dv = Tensor::empty({tq, h, 16}, DType::f32);
  expect_rejected(call(q, kn, pe, v, cu_q, cu_k, 4, 5, out_dv, lse), {out_dv.view(), lse.view()}, "out d_v");
  expect_rejected(call(q, kn, test::on_fake_cuda(pe), v, cu_q, cu_k, 4, 5, out, lse), outs, "k_pe on cuda");
}

TEST(AttentionErrors, SparseMqa) {
  test::reseed(33);
  const int64_t t = 3, h = 2, topk = 4;
  CacheBuffer cb = test::nan_cache(CacheFormat::fp8_ds_mla, 2, 64);
  Tensor q = test::random_tensor({t, h, 576}, DType::bf16);
  Tensor idx = test::int_tensor_2d({{0, 1, 2, 3}, {0, -1, 5, 200}, {1, 1, 1, 1}});
  Tensor len = test::int_tensor({4, 2, 0});
  for (int64_t s = 0; s < 6; ++s) test::randomize_row(cb.cache, s);
  Tensor out = Tensor::empty({t, h, 512}, DType::bf16), lse = Tensor::empty({t, h}, DType::f32);
  const std::vector<TensorView> outs = {out.view(), lse.view()};
  auto call = [&](const TensorView& qq, const TensorView& ix, const TensorView& ln, const TensorView& o,
                  const TensorView& l) { return [=, &cb] { sparse_mqa(qq, cb.cache, ix, ln, o, l, 0.1); }; };
  fill(out.view(), kSentinel);
  EXPECT_NO_THROW(call(q, idx, len, out, lse)());

  Tensor len_big = test::int_tensor({5, 0, 0});
  expect_rejected(call(q, idx, len_big, out, lse), outs, "topk_length > topk");
  Tensor len_neg = test::int_tensor({1, -1, 0});
  expect_rejected(call(q, idx, len_neg, out, lse), outs, "negative topk_length");
  Tensor len_short = test::int_tensor({1, 1});
  expect_rejected(call(q, idx, len_short, out, lse), outs, "topk_length size != T");
  Tensor idx64 = Tensor::zeros({t, topk}, DType::i64);
  expect_rejected(call(q, idx64, len, out, lse), outs, "i64 indices");
  Tensor idx_rows = test::int_tensor_2d({{0, 1, 2, 3}});
  expect_rejected(call(q, idx_rows, len, out, lse), outs, "indices rows != T");
  Tensor out_wide = Tensor::empty({t, h, 513}, DType::bf16);
  expect_rejected(call(q, idx, len, out_wide, lse), {out_wide.view(), lse.view()}, "d_v > 512");
  Tensor lse_h = Tensor::empty({t, h + 1}, DType::f32);
  expect_rejected(call(q, idx, len, out, lse_h), {out.view(), lse_h.view()}, "lse heads");
  Tensor q_w = test::random_tensor({t, h, 512}, DType::bf16);
  expect_rejected(call(q_w, idx, len, out, lse), outs, "q width != 576");
  expect_rejected(call(q, test::on_fake_cuda(idx), len, out, lse), outs, "indices on cuda");
}

}  // namespace
}  // namespace mla
