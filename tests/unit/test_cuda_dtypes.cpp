// SPDX-License-Identifier: Apache-2.0
// Front-end rules for the CUDA activation dtypes (no device needed: only rejections are exercised, on
// views that claim to be on CUDA, so no kernel runs). CUDA takes bf16, f16 and f32 for merge inputs /
// outputs, gather destinations and attention q / out, one dtype per call; f64 and mixes are rejected
// with a message naming the argument, before anything is written.
#include <gtest/gtest.h>

#include <string>

#include "cache_test_util.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::error_of;

using test::on_fake_cuda;

TEST(CudaActivationDtypes, MergeRejectsF64AndMixes) {
  Tensor p16 = test::random_tensor({2, 3, 8}, DType::f16), p32 = test::random_tensor({2, 3, 8}, DType::f32);
  Tensor p64 = test::random_tensor({2, 3, 8}, DType::f64), lse = test::random_tensor({3, 2}, DType::f32);
  const TensorView l = on_fake_cuda(lse);
  EXPECT_NE(error_of([&] { merge_attn_states(on_fake_cuda(p64), {}, on_fake_cuda(p64), l, on_fake_cuda(p64), l); })
                .find("bf16, f16 or f32 on CUDA"),
            std::string::npos);
  EXPECT_NE(error_of([&] { merge_attn_states(on_fake_cuda(p16), {}, on_fake_cuda(p16), l, on_fake_cuda(p32), l); })
                .find("suffix must have prefix's dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { merge_attn_states(on_fake_cuda(p32), {}, on_fake_cuda(p16), l, on_fake_cuda(p16), l); })
                .find("out must have prefix's dtype"),
            std::string::npos);
}

TEST(CudaActivationDtypes, AttentionRejectsF64AndMixedQOut) {
  auto pc = test::pattern_cache(CacheFormat::bf16, 2, 4);
  KVCache c = pc.cache;
  c.data = on_fake_cuda(c.data);
  Tensor bt = test::int_tensor_2d({{0, 1}}), lens = test::int_tensor({3}), idx = test::int_tensor_2d({{0, 1}});
  Tensor q32 = test::random_tensor({1, 1, 4, 576}, DType::f32), q64 = test::random_tensor({1, 1, 4, 576}, DType::f64);
  Tensor o16 = test::random_tensor({1, 1, 4, 512}, DType::f16), o64 = test::random_tensor({1, 1, 4, 512}, DType::f64);
  EXPECT_NE(error_of([&] {
              mqa_decode(on_fake_cuda(q64), c, on_fake_cuda(bt), on_fake_cuda(lens), on_fake_cuda(o64), {}, 0.1);
            }).find("q must be bf16, f16 or f32 on CUDA"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mqa_decode(on_fake_cuda(q32), c, on_fake_cuda(bt), on_fake_cuda(lens), on_fake_cuda(o16), {}, 0.1);
            }).find("out must have q's dtype"),
            std::string::npos);
  Tensor sq = test::random_tensor({1, 4, 576}, DType::f32), so = test::random_tensor({1, 4, 512}, DType::bf16);
  EXPECT_NE(error_of([&] { sparse_mqa(on_fake_cuda(sq), c, on_fake_cuda(idx), {}, on_fake_cuda(so), {}, 0.1); })
                .find("out must have q's dtype"),
            std::string::npos);
}

TEST(CudaActivationDtypes, GatherRejectsF64Destination) {
  auto pc = test::pattern_cache(CacheFormat::fp8_ds_mla, 2, 4);
  KVCache c = pc.cache;
  c.data = on_fake_cuda(c.data);
  Tensor dst = test::poisoned({3, 576}, DType::f64);
  Tensor bt = test::int_tensor_2d({{0, 1}}), cu = test::int_tensor({0, 3}), ws = test::int_tensor({0});
  EXPECT_NE(error_of([&] { gather_cache(c, on_fake_cuda(dst), on_fake_cuda(bt), on_fake_cuda(cu), {}); })
                .find("dst must be bf16, f16 or f32 on CUDA"),
            std::string::npos);
  EXPECT_NE(error_of([&] { upconvert_ds_mla(c, on_fake_cuda(dst), on_fake_cuda(bt), on_fake_cuda(ws), {}); })
                .find("dst must be bf16, f16 or f32 on CUDA"),
            std::string::npos);
}

TEST(CudaActivationDtypes, WriteCacheTakesTheActivationDtypesAndRejectsF64) {
  auto pc = test::pattern_cache(CacheFormat::fp8, 2, 4);
  KVCache c = pc.cache;
  c.data = on_fake_cuda(c.data);
  Tensor kv64 = test::random_tensor({2, 512}, DType::f64), pe64 = test::random_tensor({2, 64}, DType::f64);
  Tensor slots = test::int_tensor({0, 1});
  EXPECT_NE(error_of([&] { write_cache(on_fake_cuda(kv64), on_fake_cuda(pe64), on_fake_cuda(slots), c); })
                .find("kv_c must be bf16, f16 or f32 on CUDA"),
            std::string::npos);
}

}  // namespace
}  // namespace mla
