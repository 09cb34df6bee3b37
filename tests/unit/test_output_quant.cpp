// SPDX-License-Identifier: Apache-2.0
// quantize_output and abs_max on the CPU (mla/block_ops.h, docs/SEMANTICS.md §15): every key's codes
// and scales against values computed by hand (rounding ties, saturation, zeros, NaN, padding rows),
// the keys' names, and refused arguments (nothing written).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mla/block_ops.h"
#include "mla/error.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// x [rows, cols] f32 from row-major values.
Tensor f32_matrix(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Tensor t = Tensor::empty({rows, cols}, DType::f32);
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.data()); }

TEST(OutputQuant, KeysParseAndPrint) {
  for (OutputQuant q : {OutputQuant::none, OutputQuant::fp8, OutputQuant::fp8_group128, OutputQuant::fp8_group64,
                        OutputQuant::nvfp4})
    EXPECT_EQ(parse_output_quant(to_string(q)), q);
  try {
    parse_output_quant("int8");
    FAIL() << "int8 parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_group128"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'int8'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_output_quant(static_cast<OutputQuant>(9), "test"), Error);
  EXPECT_EQ(output_quant_group(OutputQuant::fp8_group128), 128);
  EXPECT_EQ(output_quant_group(OutputQuant::fp8_group64), 64);
  EXPECT_EQ(output_quant_group(OutputQuant::nvfp4), 16);
  EXPECT_EQ(output_quant_group(OutputQuant::fp8), 0);
}

// fp8, static scale: code = e4m3(x / scale), round to nearest even, saturating, NaN -> 0x7f; padding rows 0.
TEST(OutputQuant, Fp8StaticScaleCodes) {
  // With scale 0.5: 1 -> 2 (0x40); -2.5 -> -5 (0xca); 0 -> 0; 1000 -> 2000 saturates to 448 (0x7e);
  // -inf -> -448 (0xfe); NaN -> 0x7f; 0.53125 -> 1.0625, the tie between 1 (0x38) and 1.125 (0x39) -> 0x38;
  // 0.59375 -> 1.1875, the tie between 1.125 and 1.25 (0x3a) -> 0x3a.
  const Tensor x = f32_matrix(1, 8, {1.0f, -2.5f, 0.0f, 1000.0f, -std::numeric_limits<float>::infinity(), kNaN,
                                     0.53125f, 0.59375f});
  Tensor codes = test::poisoned({2, 8}, DType::fp8_e4m3);
  quantize_output(x.view(), OutputQuant::fp8, codes.view(), {}, 0.5f);
  const std::vector<uint8_t> want{0x40, 0xca, 0x00, 0x7e, 0xfe, 0x7f, 0x38, 0x3a};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(bytes(codes)[j], want[j]) << j;
  for (int j = 8; j < 16; ++j) EXPECT_EQ(bytes(codes)[j], 0) << "padding " << j;
}

// Groups of 128: scale = amax / 448 (1 for an all-zero group), codes e4m3(x / scale); group-major scales;
// a NaN makes its group's scale NaN and every code of the group NaN.
TEST(OutputQuant, Fp8Group128ScalesAndCodes) {
  const int64_t K = 384;
  std::vector<float> v(2 * K, 0.0f);
  v[0] = 896.0f;   // amax of group 0: scale 2
  v[1] = 3.0f;     // 1.5 -> 0x3c
  v[2] = -1.0625f; // -0.53125 -> between 0.5 (0x30) and 0.5625 (0x31): tie -> 0x30, negative 0xb0
  v[K + 130] = kNaN;                  // row 1 group 1
  v[K + 256] = -44.8f;                // row 1 group 2: scale 0.1f
  v[K + 257] = 22.4f;
  const Tensor x = f32_matrix(2, K, v);
  Tensor codes = test::poisoned({3, K}, DType::fp8_e4m3), scales = test::poisoned({3, 3}, DType::f32);
  quantize_output(x.view(), OutputQuant::fp8_group128, codes.view(), scales.view(), 0.0f);
  const float* s = static_cast<const float*>(scales.data());  // [group, row]
  EXPECT_EQ(s[0 * 3 + 0], 2.0f);
  EXPECT_EQ(s[1 * 3 + 0], 1.0f);  // all zeros
  EXPECT_EQ(s[2 * 3 + 0], 1.0f);
  EXPECT_EQ(s[0 * 3 + 1], 1.0f);
  EXPECT_TRUE(std::isnan(s[1 * 3 + 1]));
  EXPECT_EQ(s[2 * 3 + 1], 44.8f / 448.0f);
  for (int g = 0; g < 3; ++g) EXPECT_EQ(s[g * 3 + 2], 1.0f) << "padding row's scale, group " << g;
  const uint8_t* c = bytes(codes);
  EXPECT_EQ(c[0], 0x7e);
  EXPECT_EQ(c[1], 0x3c);
  EXPECT_EQ(c[2], 0xb0);
  for (int j = 3; j < K; ++j) ASSERT_EQ(c[j], 0) << j;
  for (int j = 128; j < 256; ++j) ASSERT_EQ(c[K + j] & 0x7f, 0x7f) << "NaN group, column " << j;
  EXPECT_EQ(c[K + 256], num::float_to_e4m3(-44.8f / (44.8f / 448.0f)));
  EXPECT_EQ(c[K + 256], 0xfe);
  EXPECT_EQ(c[K + 257], num::float_to_e4m3(22.4f / (44.8f / 448.0f)));
  for (int j = 0; j < K; ++j) ASSERT_EQ(c[2 * K + j], 0) << "padding " << j;
}

TEST(OutputQuant, Fp8Group64UsesGroupsOf64) {
  std::vector<float> v(128, 0.0f);
  v[0] = 44.8f;   // group 0: scale 0.1
  v[64] = 448.0f; // group 1: scale 1
  v[65] = 1.0f;
  const Tensor x = f32_matrix(1, 128, v);
  Tensor codes = test::poisoned({1, 128}, DType::fp8_e4m3), scales = test::poisoned({2, 1}, DType::f32);
  quantize_output(x.view(), OutputQuant::fp8_group64, codes.view(), scales.view(), 0.0f);
  const float* s = static_cast<const float*>(scales.data());
  EXPECT_EQ(s[0], 44.8f / 448.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(bytes(codes)[0], num::float_to_e4m3(44.8f / (44.8f / 448.0f)));
  EXPECT_EQ(bytes(codes)[64], 0x7e);
  EXPECT_EQ(bytes(codes)[65], 0x38);
}

TEST(OutputQuant, E2m1RoundsToNearestEvenAndSaturates) {
  const std::vector<std::pair<float, uint8_t>> cases = {
      {0.0f, 0x0}, {-0.0f, 0x8}, {0.25f, 0x0}, {0.26f, 0x1}, {0.75f, 0x2}, {1.25f, 0x2}, {1.3f, 0x3},
      {1.75f, 0x4}, {2.5f, 0x4}, {2.6f, 0x5}, {3.5f, 0x6}, {5.0f, 0x6}, {5.1f, 0x7}, {100.0f, 0x7},
      {-std::numeric_limits<float>::infinity(), 0xf}, {-3.0f, 0xd}, {-0.1f, 0x8}, {kNaN, 0x7}};
  for (const auto& [x, code] : cases) EXPECT_EQ(num::float_to_e2m1(x), code) << x;
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(num::float_to_e2m1(num::e2m1_to_float(c)), c) << int(c);
}

// nvfp4: block scale code = e4m3(global * (amax / 6)), codes e2m1(x / (scale / global)), element 2i in
// the low nibble; an all-zero block has scale code 0 and zero codes; a NaN makes the block's scale NaN.
TEST(OutputQuant, Nvfp4BlocksCodesAndScales) {
  std::vector<float> v(64, 0.0f);
  const std::vector<float> b0 = {6, -3, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.0f, 0.2f, -0.3f, 4.5f, 1, 0.5f, 2};
  for (int i = 0; i < 16; ++i) v[i] = b0[i];
  // block 1 stays zero; block 2 saturates: amax 100 -> 100 / 6 = 16.67 -> e4m3 16 (0x58), 100 / 16 -> 6.
  v[32] = 100.0f;
  v[33] = -8.0f;  // -0.5 -> 0x9
  v[48] = kNaN;   // block 3
  const Tensor x = f32_matrix(1, 64, v);
  for (const float global : {1.0f, 2.0f}) {
    Tensor codes = test::poisoned({2, 32}, DType::u8), scales = test::poisoned({2, 4}, DType::fp8_e4m3);
    // Block 0 is scaled by the global scale: with 2, its amax 6 gives a scale code of 2 (0x40) and the
    // same element codes.
    quantize_output(x.view(), OutputQuant::nvfp4, codes.view(), scales.view(), global);
    const uint8_t* c = bytes(codes);
    const uint8_t* s = bytes(scales);
    EXPECT_EQ(s[0], global == 1.0f ? 0x38 : 0x40);
    const std::vector<uint8_t> want0{0xd7, 0x20, 0x42, 0x64, 0x86, 0x90, 0x26, 0x41};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(c[i], want0[i]) << "global " << global << " byte " << i;
    EXPECT_EQ(s[1], 0);
    for (int i = 8; i < 16; ++i) EXPECT_EQ(c[i], 0) << i;
    EXPECT_EQ(s[2], num::float_to_e4m3(global * (100.0f / 6.0f)));
    if (global == 1.0f) {
      EXPECT_EQ(s[2], 0x58);
      EXPECT_EQ(c[16], 0x97);  // 6 (0x7) low, -0.5 (0x9) high
    }
    EXPECT_EQ(s[3] & 0x7f, 0x7f);
    for (int i = 32; i < 64; ++i) EXPECT_EQ(c[i], 0) << "padding row " << i;
    for (int i = 4; i < 8; ++i) EXPECT_EQ(s[i], 0) << "padding row's scale " << i;
  }
}

TEST(OutputQuant, AcceptsU8CodesAndBf16Input) {
  Tensor x = test::random_tensor({3, 128}, DType::bf16);
  Tensor a = test::poisoned({3, 128}, DType::fp8_e4m3), b = test::poisoned({3, 128}, DType::u8);
  Tensor sa = test::poisoned({1, 3}, DType::f32), sb = test::poisoned({1, 3}, DType::f32);
  quantize_output(x.view(), OutputQuant::fp8_group128, a.view(), sa.view(), 0.0f);
  quantize_output(x.view(), OutputQuant::fp8_group128, b.view(), sb.view(), 0.0f);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 3 * 128), 0);
  EXPECT_EQ(std::memcmp(sa.data(), sb.data(), 3 * 4), 0);
}

TEST(OutputQuant, RefusesBadArgumentsBeforeWriting) {
  const Tensor x = test::random_tensor({2, 128}, DType::f32);
  Tensor codes = test::poisoned({2, 128}, DType::fp8_e4m3), scales = test::poisoned({1, 2}, DType::f32);
  Tensor fp4 = test::poisoned({2, 64}, DType::u8), fp4s = test::poisoned({2, 8}, DType::fp8_e4m3);
  const std::vector<uint8_t> before(bytes(codes), bytes(codes) + 256);
  auto expect_refused = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_EQ(std::memcmp(bytes(codes), before.data(), 256), 0) << what << ": codes written";
  };
  expect_refused([&] { quantize_output(x.view(), OutputQuant::none, codes.view(), {}, 1.0f); }, "none");
  expect_refused([&] { quantize_output(x.view(), static_cast<OutputQuant>(7), codes.view(), {}, 1.0f); }, "bad key");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8, codes.view(), {}, 0.0f); }, "zero scale");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8, codes.view(), {}, kNaN); }, "NaN scale");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8, codes.view(), scales.view(), 1.0f); },
                 "fp8 with scales");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8_group128, codes.view(), {}, 1.0f); },
                 "group without scales");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8_group64, codes.view(), scales.view(), 1.0f); },
                 "group64 with group128's scales");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8, codes.view().slice(0, 0, 1), {}, 1.0f); },
                 "fewer code rows than x");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::fp8, x.view(), {}, 1.0f); }, "f32 codes");
  expect_refused([&] { quantize_output(x.view(), OutputQuant::nvfp4, codes.view(), fp4s.view(), 1.0f); },
                 "nvfp4 codes of K columns");
  expect_refused([&] { quantize_output(x.view().slice(1, 0, 120), OutputQuant::fp8_group64, codes.view().slice(1, 0, 120),
                                       scales.view(), 1.0f); },
                 "K not a multiple of the group");
  EXPECT_THROW(quantize_output(x.view(), OutputQuant::nvfp4, fp4.view(), fp4s.view(), -1.0f), Error);
  EXPECT_THROW(quantize_output(x.view(), OutputQuant::nvfp4, fp4.view(), fp4s.view().slice(1, 0, 4), 1.0f), Error);
  // x and codes share bytes.
  Tensor both = test::poisoned({2, 512}, DType::u8);
  const TensorView xin(both.data(), DType::f32, {2, 64}, Device::cpu());
  const TensorView out(static_cast<uint8_t*>(both.data()) + 256, DType::u8, {2, 64}, Device::cpu());
  EXPECT_THROW(quantize_output(xin, OutputQuant::fp8_group64, out, scales.view(), 1.0f), Error);
}

// Group scales may be a column slice of a wider [K / G, T] matrix (rows [t0, t1) of a larger output): the
// slice's columns equal the contiguous run's and nothing outside them is written.
TEST(OutputQuant, GroupScalesMayBeAColumnSlice) {
  const Tensor x = test::random_tensor({3, 256}, DType::f32, Device::cpu(), -4.0, 4.0);
  for (OutputQuant k : {OutputQuant::fp8_group128, OutputQuant::fp8_group64}) {
    const int64_t groups = 256 / output_quant_group(k);
    Tensor codes = test::poisoned({4, 256}, DType::u8), scales = test::poisoned({groups, 4}, DType::f32);
    quantize_output(x.view(), k, codes.view(), scales.view(), 0.0f);
    Tensor wide = test::poisoned({groups, 9}, DType::f32), codes2 = test::poisoned({4, 256}, DType::u8);
    quantize_output(x.view(), k, codes2.view(), wide.view().slice(1, 3, 7), 0.0f);
    EXPECT_EQ(std::memcmp(codes.data(), codes2.data(), 4 * 256), 0);
    const auto* a = static_cast<const float*>(scales.data());
    const auto* b = static_cast<const float*>(wide.data());
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < 9; ++c) {
        if (c < 3 || c >= 7) EXPECT_TRUE(std::isnan(b[g * 9 + c])) << "written outside the slice";
        else EXPECT_EQ(b[g * 9 + c], a[g * 4 + c - 3]) << to_string(k) << " group " << g << " row " << c - 3;
      }
    // Rows closer than M_pad apart overlap: refused.
    const std::array<int64_t, 2> shape{groups, 4}, stride{2, 1};
    EXPECT_THROW(quantize_output(x.view(), k, codes2.view(), TensorView(wide.data(), DType::f32, shape, stride,
                                                                        Device::cpu()), 0.0f),
                 Error);
  }
}

// up_project_quantized on the CPU is quantize_output of bmm's product, byte for byte, for each key and the
// layer dtypes; bad arguments are refused before anything is written.
TEST(OutputQuant, UpProjectQuantizedIsQuantizeOfTheProduct) {
  constexpr int64_t M = 5, h = 2, L = 24, V = 128, M_pad = 7;
  for (const DType dt : {DType::bf16, DType::f32}) {
    const Tensor o = test::random_tensor({M, h, L}, dt), w = test::random_tensor({h, L, V}, dt);
    Tensor x = Tensor::empty({M, h * V}, dt);
    bmm(o.view().transpose(0, 1), w.view(), x.view().reshape({M, h, V}).transpose(0, 1));
    for (OutputQuant k : {OutputQuant::fp8, OutputQuant::fp8_group128, OutputQuant::fp8_group64, OutputQuant::nvfp4}) {
      const bool fp4 = k == OutputQuant::nvfp4;
      const int64_t G = output_quant_group(k), cw = fp4 ? h * V / 2 : h * V;
      Tensor want = test::poisoned({M_pad, cw}, DType::u8), got = test::poisoned({M_pad, cw}, DType::u8);
      Tensor ws, gs;
      if (fp4) {
        ws = test::poisoned({M_pad, h * V / 16}, DType::u8);
        gs = test::poisoned({M_pad, h * V / 16}, DType::u8);
      } else if (G > 0) {
        ws = test::poisoned({h * V / G, M_pad}, DType::f32);
        gs = test::poisoned({h * V / G, M_pad}, DType::f32);
      }
      const float scale = fp4 ? 448.0f * 6.0f / 8.0f : 1.0f / 64.0f;
      quantize_output(x.view(), k, want.view(), ws.defined() ? ws.view() : TensorView{}, scale);
      up_project_quantized(o.view(), w.view(), k, got.view(), gs.defined() ? gs.view() : TensorView{}, scale);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.nbytes()), 0) << to_string(k) << " " << to_string(dt);
      if (ws.defined()) EXPECT_EQ(std::memcmp(ws.data(), gs.data(), ws.nbytes()), 0) << to_string(k);
    }
  }
  const Tensor o = test::random_tensor({M, h, L}, DType::f32), w64 = test::random_tensor({h, L, 64}, DType::f32);
  const Tensor w = test::random_tensor({h, L, V}, DType::f32), wb = test::random_tensor({h, L, V}, DType::bf16);
  Tensor codes = test::poisoned({M, h * V}, DType::u8), scales = test::poisoned({h * V / 128, M}, DType::f32);
  Tensor codes64 = test::poisoned({M, h * 64}, DType::u8), scales64 = test::poisoned({h * 64 / 128, M}, DType::f32);
  const std::vector<uint8_t> before(bytes(codes), bytes(codes) + codes.nbytes());
  auto expect_refused = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_EQ(std::memcmp(bytes(codes), before.data(), before.size()), 0) << what << ": codes written";
  };
  const auto g128 = OutputQuant::fp8_group128;
  expect_refused([&] { up_project_quantized(o.view(), w.view(), OutputQuant::none, codes.view(), {}, 1.0f); }, "none");
  expect_refused([&] { up_project_quantized(o.view(), wb.view(), g128, codes.view(), scales.view(), 1.0f); },
                 "w_uv of another dtype");
  expect_refused([&] { up_project_quantized(o.view(), w.view().slice(0, 0, 1), g128, codes.view(), scales.view(), 1.0f); },
                 "w_uv of another head count");
  expect_refused([&] { up_project_quantized(o.view().slice(0, 0, 4).slice(2, 0, 16), w.view(), g128, codes.view(),
                                            scales.view(), 1.0f); },
                 "w_uv of another L");
  expect_refused([&] { up_project_quantized(o.view(), w.view(), g128, codes.view().slice(0, 0, 4), scales.view(), 1.0f); },
                 "fewer code rows than o_lat");
  EXPECT_THROW(up_project_quantized(o.view(), w64.view(), g128, codes64.view(), scales64.view(), 1.0f), Error)
      << "a group of 128 spanning two heads of V = 64";
  EXPECT_THROW(up_project_quantized(o.view(), w.view(), g128, o.view().reshape({M, h * L}), scales.view(), 1.0f), Error)
      << "f32 codes";
}

TEST(OutputQuant, AbsMaxPropagatesNaN) {
  Tensor out = test::poisoned({1}, DType::f32);
  abs_max(f32_matrix(2, 3, {1, -7.5f, 2, 0, 3, -0.0f}).view(), out.view());
  EXPECT_EQ(*static_cast<float*>(out.data()), 7.5f);
  abs_max(f32_matrix(1, 3, {1, kNaN, 2}).view(), out.view());
  EXPECT_TRUE(std::isnan(*static_cast<float*>(out.data())));
  abs_max(f32_matrix(1, 3, {kNaN, 9, 2}).view(), out.view());
  EXPECT_TRUE(std::isnan(*static_cast<float*>(out.data())));
  abs_max(Tensor::empty({0, 3}, DType::f32).view(), out.view());
  EXPECT_EQ(*static_cast<float*>(out.data()), 0.0f);
  EXPECT_THROW(abs_max(f32_matrix(1, 1, {1}).view(), Tensor::empty({2}, DType::f32).view()), Error);
  EXPECT_THROW(abs_max(f32_matrix(1, 1, {1}).view(), Tensor::empty({1}, DType::f64).view()), Error);
}

}  // namespace
}  // namespace mla
