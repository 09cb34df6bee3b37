// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>

#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/tensor.h"
#include "support/test_util.h"

namespace mla {
namespace {

TEST(Tensor, ViewsShareMemoryAndKeepStrides) {
  Tensor t = Tensor::zeros({4, 3, 5}, DType::f32);
  TensorView s = t.view().slice(1, 1, 3);
  EXPECT_EQ(s.shape_str(), "[4, 2, 5]");
  EXPECT_EQ(s.stride[0], 15);
  EXPECT_FALSE(s.is_contiguous());
  TensorView tr = t.view().transpose(0, 2);
  EXPECT_EQ(tr.size(0), 5);
  EXPECT_EQ(tr.stride_of(0), 1);
  TensorView sel = t.view().select(0, 2);
  EXPECT_EQ(sel.ndim, 2);
  EXPECT_EQ(static_cast<float*>(sel.data) - static_cast<float*>(t.data()), 30);
  EXPECT_THROW(t.view().slice(1, 2, 4), Error);
  EXPECT_THROW(tr.reshape({60}), Error);
  EXPECT_EQ(t.view().reshape({12, 5}).size(0), 12);
}

TEST(Tensor, CopyAndFillStrided) {
  Tensor a = test::random_tensor({3, 4}, DType::f64);
  Tensor b = Tensor::empty({4, 3}, DType::f64);
  copy(b.view().transpose(0, 1), a.view());
  auto av = test::to_doubles(a.view()), bv = test::to_doubles(b.view());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(av[i * 4 + j], bv[j * 3 + i]);
  fill(b.view().slice(0, 1, 2), NAN);
  EXPECT_TRUE(std::isnan(test::to_doubles(b.view())[3]));
  EXPECT_THROW(copy(a.view(), b.view()), Error);
}

TEST(Tensor, EmptyTensorsAreContiguousAndCopy) {
  Tensor a = Tensor::empty({0, 576}, DType::bf16);
  EXPECT_TRUE(a.view().is_contiguous());
  Tensor b = Tensor::empty({3, 0, 4}, DType::f32);
  EXPECT_TRUE(b.view().is_contiguous());
  Tensor c = Tensor::empty({3, 0, 4}, DType::f32);
  EXPECT_NO_THROW(copy(c.view(), b.view()));
  EXPECT_EQ(b.to(Device::cpu()).numel(), 0);
}

TEST(Numeric, E4m3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(num::float_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(num::float_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(num::float_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(num::float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(num::float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(num::float_to_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125 -> even (1)
  EXPECT_EQ(num::float_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25 -> even (1.25)
  EXPECT_EQ(num::float_to_e4m3(std::ldexp(1.f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(num::float_to_e4m3(std::ldexp(1.f, -10)), 0x00);  // tie to even (0)
  EXPECT_TRUE(std::isnan(num::e4m3_to_float(num::float_to_e4m3(NAN))));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(num::float_to_e4m3(num::e4m3_to_float(static_cast<uint8_t>(b))), b) << b;
  }
}

TEST(Numeric, Bf16AndF16RoundTrip) {
  for (uint32_t h = 0; h < 65536; h += 7) {
    const float f = num::bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) { EXPECT_EQ(num::float_to_bf16(f), h); }
    const float g = num::f16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(g)) { EXPECT_EQ(num::float_to_f16(g), h); }
  }
  EXPECT_EQ(num::float_to_bf16(1.0f + std::ldexp(1.f, -8)), 0x3f80);  // tie -> even
}

TEST(Cache, LayoutsAndValidation) {
  EXPECT_EQ(cache_entry_bytes(CacheFormat::bf16), 1152);
  EXPECT_EQ(cache_entry_bytes(CacheFormat::fp8), 576);
  EXPECT_EQ(cache_entry_bytes(CacheFormat::fp8_ds_mla), 656);
  auto c = allocate_cache(CacheFormat::fp8_ds_mla, 3, 16, Device::cpu());
  EXPECT_EQ(c.cache.num_slots(), 48);
  KVCache bad = c.cache;
  bad.format = CacheFormat::bf16;
  EXPECT_THROW(validate_cache(bad), Error);
  KVCache bad_scale = allocate_cache(CacheFormat::fp8, 1, 1, Device::cpu()).cache;
  bad_scale.scale = 0.f;
  EXPECT_THROW(validate_cache(bad_scale), Error);
}

TEST(ModelDims, Presets) {
  auto v3 = ModelDims::deepseek_v3(8);
  EXPECT_EQ(v3.num_heads, 16);
  EXPECT_EQ(v3.d_qk(), 576);
  EXPECT_EQ(v3.d_v(), 512);
  EXPECT_NEAR(v3.softmax_scale, std::pow(0.1 * std::log(40.0) + 1, 2) / std::sqrt(192.0), 1e-12);
  EXPECT_EQ(ModelDims::preset("v3.2").index_topk, 2048);
  EXPECT_EQ(ModelDims::preset("v2-lite").num_heads, 16);
  EXPECT_THROW(ModelDims::deepseek_v3(3), Error);
  EXPECT_THROW(ModelDims::preset("llama"), Error);
}


// Size arithmetic past int64 throws instead of wrapping (issue 14; each wrapped at a955383).
TEST(Tensor, SizeArithmeticOverflowThrows) {
  const int64_t big = int64_t(1) << 40;
  EXPECT_THROW(Tensor::empty({big, big}, DType::f32), Error);            // element count
  EXPECT_THROW(Tensor::empty({int64_t(1) << 62, 4}, DType::u8), Error);  // element count
  EXPECT_THROW(Tensor::empty({int64_t(1) << 61, 1}, DType::f64), Error); // bytes
  EXPECT_THROW(Tensor::zeros({big, big, 0, big}, DType::bf16), Error);   // contiguous strides of the later dims
  const int64_t ok_shape[2] = {2, 3};
  const int64_t bad_strides[2] = {int64_t(1) << 62, 1};
  EXPECT_THROW(TensorView(nullptr, DType::f32, ok_shape, bad_strides), Error);  // span in bytes
  const int64_t neg_strides[2] = {-(int64_t(1) << 62), 1};
  EXPECT_THROW(TensorView(nullptr, DType::f64, ok_shape, neg_strides), Error);
  // A view whose fields were edited by hand: numel() itself refuses to wrap.
  TensorView v(nullptr, DType::f32, ok_shape);
  v.shape[0] = big;
  v.shape[1] = big;
  EXPECT_THROW(v.numel(), Error);
  EXPECT_THROW(v.reshape({4}), Error);
  // Empty extents stay fine, and the largest representable sizes are not refused by arithmetic.
  EXPECT_EQ(TensorView(nullptr, DType::f32, {0, big, 4}).numel(), 0);
  EXPECT_EQ(TensorView(nullptr, DType::u8, {int64_t(1) << 31, int64_t(1) << 31}).numel(), int64_t(1) << 62);
}

TEST(Cache, AllocationSizesAreChecked) {
  // 2^55 blocks of 8 rows of 576 bf16: returned a 0-byte buffer that write_cache then overran.
  EXPECT_THROW(allocate_cache(CacheFormat::bf16, int64_t(1) << 55, 8, Device::cpu()), Error);
  EXPECT_THROW(allocate_cache(CacheFormat::fp8_ds_mla, 1, int64_t(1) << 58, Device::cpu()), Error);
  EXPECT_THROW(allocate_cache(CacheFormat::bf16, int64_t(1) << 62, int64_t(1) << 62, Device::cpu()), Error);
}

// Issue 51: fill() of an integer view refuses values it cannot hold (float -> int conversion out of
// range is undefined), views whose negative strides reach below address 0 are refused, and slicing an
// empty view with an extent near 2^62 does not overflow its pointer offset.
TEST(Tensor, HostileFillStridesAndEmptySlices) {
  Tensor i32 = Tensor::zeros({3}, DType::i32), i64 = Tensor::zeros({3}, DType::i64), u8 = Tensor::zeros({3}, DType::u8);
  for (double v : std::initializer_list<double>{NAN, INFINITY, -INFINITY, 2147483648.0, -2147483649.0, 1e300})
    EXPECT_THROW(fill(i32, v), Error) << v;
  for (double v : std::initializer_list<double>{NAN, 9223372036854775808.0, -1e19}) EXPECT_THROW(fill(i64, v), Error) << v;
  for (double v : std::initializer_list<double>{NAN, 256.0, -1.0}) EXPECT_THROW(fill(u8, v), Error) << v;
  for (double x : test::to_doubles(i32)) EXPECT_EQ(x, 0.0);
  fill(i32, -2147483648.0);
  EXPECT_EQ(test::to_doubles(i32)[2], -2147483648.0);
  fill(i64, -9223372036854775808.0);
  fill(u8, 255.0);
  EXPECT_EQ(test::to_doubles(u8)[0], 255.0);
  fill(Tensor::zeros({2}, DType::f32), NAN);  // floats take anything
  // Negative strides below address 0, and positive ones past the top of the address space.
  const int64_t shape[] = {4}, back[] = {-1}, fwd[] = {1};
  EXPECT_THROW(TensorView(reinterpret_cast<void*>(uintptr_t(8)), DType::f32, shape, back), Error);
  EXPECT_NO_THROW(TensorView(reinterpret_cast<void*>(uintptr_t(12)), DType::f32, shape, back));
  EXPECT_THROW(TensorView(reinterpret_cast<void*>(~uintptr_t(0) - 8), DType::f32, shape, fwd), Error);
  float buf[4] = {1, 2, 3, 4};
  const TensorView rev(buf + 3, DType::f32, shape, back);
  Tensor dst = Tensor::zeros({4}, DType::f32);
  copy(dst, rev);
  EXPECT_EQ(test::to_doubles(dst), (std::vector<double>{4, 3, 2, 1}));
  // An empty view with an extent near 2^62: slices and selects keep its pointer.
  const int64_t wide[] = {0, int64_t(1) << 62};
  const TensorView empty(buf, DType::f32, wide);
  const TensorView tail = empty.slice(1, (int64_t(1) << 62) - 1, int64_t(1) << 62);
  EXPECT_EQ(tail.data, empty.data);
  EXPECT_EQ(tail.numel(), 0);
  EXPECT_EQ(empty.select(1, (int64_t(1) << 62) - 1).data, empty.data);
}

}  // namespace
}  // namespace mla
