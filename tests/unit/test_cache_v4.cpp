// SPDX-License-Identifier: Apache-2.0
// The DeepSeek-V4 record formats (v4, v41, v41_fp4; mla/cache_format.h "Block-scaled records") on the
// CPU: their layouts, the writer's codes and scales against hand-computed bytes (ue8m0 rounding, e2m1
// rounding, the clamps, zero / denormal / NaN / infinite rows), slot -1 and page sizes, the readers
// (gathers) against an independent decoder, sparse_mqa over each format (and a v41 window cache with a
// v41_fp4 extra cache) equal to the same call over f64 caches holding the decoded values, and the
// refusals of the ops that do not take them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cache_test_util.h"
#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "sparse_v4_test_util.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::error_of;
using V4 = CacheFormatTraits<CacheFormat::v4>;
using V41 = CacheFormatTraits<CacheFormat::v41>;
using Fp4 = CacheFormatTraits<CacheFormat::v41_fp4>;

// The records of the layouts, stated here independently of the traits.
static_assert(V4::entry_bytes(512, 64) == 584 && V4::page_row_bytes() == 576 && V4::num_tiles(448) == 7);
static_assert(V4::page_scale_offset(64, 0) == 64 * 576 && V4::page_scale_offset(64, 5) == 64 * 576 + 40);
static_assert(V4::rope_offset(448) == 448 && V4::admits(512, 64) && !V4::admits(576, 64));
static_assert(V41::entry_bytes(512, 64) == 528 && V41::scale_offset(448) == 512 && V41::num_tiles(448) == 16);
static_assert(V41::page_row_bytes() == 0 && V41::rope_offset(448) == 448);
static_assert(Fp4::entry_bytes(512, 64) == 288 && Fp4::scale_offset(448) == 256 && Fp4::num_tiles(448) == 32);
static_assert(Fp4::rope_offset(448) == 224 && page_row_bytes(CacheFormat::fp8_ds_mla) == 0);

TEST(CacheV4, TableNamesAndSizes) {
  EXPECT_EQ(cache_entry_bytes(CacheFormat::v4, 512, 64), 584);
  EXPECT_EQ(cache_entry_bytes(CacheFormat::v41, 512, 64), 528);
  EXPECT_EQ(cache_entry_bytes(CacheFormat::v41_fp4, 512, 64), 288);
  EXPECT_EQ(cache_format_from_string("v4"), CacheFormat::v4);
  EXPECT_EQ(cache_format_from_string("v41"), CacheFormat::v41);
  EXPECT_EQ(cache_format_from_string("v41_fp4"), CacheFormat::v41_fp4);
  EXPECT_EQ(cache_format_from_string("nvfp4"), CacheFormat::v41_fp4);
  EXPECT_EQ(static_cast<int>(CacheFormat::v4), 4);
  EXPECT_EQ(static_cast<int>(CacheFormat::v41), 5);
  EXPECT_EQ(static_cast<int>(CacheFormat::v41_fp4), 6);
  for (CacheFormat f : test::kRecordFormats) {
    EXPECT_TRUE(cache_format_info(f).record);
    EXPECT_TRUE(cache_format_info(f).device);  // CUDA kernels: src/cuda/cache/, the portable MQA engine
    EXPECT_EQ(cache_dtype(f), DType::u8);
  }
}

// The integer-arithmetic forms device code uses (core/numeric.h) against the library-call forms.
TEST(CacheV4, DeviceRulesMatchHostRules) {
  for (uint32_t b = 0; b < 256; ++b) {
    const double d = num::ue8m0_to_double(static_cast<uint8_t>(b));
    const float f = num::ue8m0_to_float(b);
    if (std::isnan(d)) {
      EXPECT_TRUE(std::isnan(f)) << b;
    } else {
      EXPECT_EQ(static_cast<double>(f), d) << b;
    }
    if (b >= 1 && b <= 253) {
      EXPECT_EQ(static_cast<double>(num::ue8m0_recip(b)) * d, 1.0) << b;
    }
  }
  EXPECT_TRUE(std::isnan(num::ue8m0_recip(0xff)));
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(num::e2m1_value(c), num::e2m1_to_float(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(std::signbit(num::e2m1_value(c)), c >= 8) << c;
  }
  // pow2_scale_ue8m0 against the frexp formulation over magnitudes from 0 to the largest float.
  for (float a : {0.0f, 1e-30f, 0.0448f, 0.04480001f, 1.0f, 447.9f, 448.0f, 448.1f, 896.0f, 1e20f, 3.4e38f, INFINITY}) {
    const float s = std::fmax(a / 448.0f, 1e-4f);
    int e = 0;
    const float m = std::isfinite(s) ? std::frexp(s, &e) : 0.0f;
    const int want = std::isfinite(s) ? (m == 0.5f ? e - 1 : e) + 127 : 255;
    EXPECT_EQ(num::pow2_scale_ue8m0(a), want) << a;
  }
}

TEST(CacheV4, ScaleAndCodeRounding) {
  // ue8m0: 2^ceil(log2(max(amax / 448, 1e-4))) as the byte e + 127.
  EXPECT_EQ(num::pow2_scale_ue8m0(448.0f), 127);        // scale 1 exactly
  EXPECT_EQ(num::pow2_scale_ue8m0(449.0f), 128);        // just above: 2
  EXPECT_EQ(num::pow2_scale_ue8m0(224.0f), 126);        // 0.5
  EXPECT_EQ(num::pow2_scale_ue8m0(3.0f), 120);          // 3 / 448 -> 2^-7
  EXPECT_EQ(num::pow2_scale_ue8m0(0.0f), 127 - 13);     // the 1e-4 floor: 2^-13
  EXPECT_EQ(num::pow2_scale_ue8m0(1e-30f), 127 - 13);
  EXPECT_EQ(num::pow2_scale_ue8m0(INFINITY), 0xff);     // NaN scale
  EXPECT_EQ(num::ue8m0_to_double(127), 1.0);
  EXPECT_EQ(num::ue8m0_to_double(0), std::ldexp(1.0, -127));
  EXPECT_TRUE(std::isnan(num::ue8m0_to_double(0xff)));
  // e2m1: nearest, ties to the even code, saturation at 6, sign in bit 3.
  const float in[] = {0.0f, 0.25f, 0.26f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.1f, 7.0f, INFINITY, -0.3f, -6.0f};
  const uint8_t want[] = {0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 0x9, 0xf};
  for (std::size_t i = 0; i < sizeof(in) / sizeof(in[0]); ++i) EXPECT_EQ(num::float_to_e2m1(in[i]), want[i]) << in[i];
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(num::e2m1_to_float(c), test::test_e2m1(c)) << int(c);
}

// One token written to slot `slot` of a fresh pattern-filled cache; returns the cache.
test::PatternCache write_one(CacheFormat f, int64_t page, int64_t slot, const std::vector<float>& x) {
  test::PatternCache p = test::pattern_cache(f, 2, page);
  Tensor kv = Tensor::empty({1, 448}, DType::f32), pe = Tensor::empty({1, 64}, DType::f32);
  std::memcpy(kv.data(), x.data(), 448 * 4);
  std::memcpy(pe.data(), x.data() + 448, 64 * 4);
  const Tensor s = test::int_tensor({static_cast<int32_t>(slot)});
  write_cache(kv.view(), pe.view(), s.view(), p.cache);
  return p;
}
const uint8_t* page_of(const test::PatternCache& p, int64_t slot) {
  return static_cast<const uint8_t*>(p.storage.data()) + slot / p.cache.page_size() * p.cache.data.stride[0];
}

TEST(CacheV4, V41WriterBytes) {
  std::vector<float> x(512, 1.0f);
  x[5] = 3.0f;                                                 // tile 0: amax 3 -> scale 2^-7 (byte 120)
  for (int i = 32; i < 64; ++i) x[i] = 0.0f;                   // tile 1: zero -> the floor 2^-13 (byte 114)
  x[64] = 1e-40f;                                              // tile 2: a denormal float
  for (int i = 65; i < 96; ++i) x[i] = 0.0f;
  x[100] = NAN;                                                // tile 3: NaN ignored by amax, its code NaN
  x[480] = INFINITY;                                           // tile 15 (rope): infinite amax -> NaN scale
  const test::PatternCache p = write_one(CacheFormat::v41, 5, 7, x);
  const uint8_t* r = page_of(p, 7) + (7 % 5) * 528;
  EXPECT_EQ(r[0], 0x70);  // 1 / 2^-7 = 128: e4m3 exponent field 14, mantissa 0
  EXPECT_EQ(r[5], 0x7c);  // 384 = 1.5 * 2^8
  EXPECT_EQ(r[512], 120);
  EXPECT_EQ(r[513], 114);
  EXPECT_EQ(r[32], 0x00);
  EXPECT_EQ(r[514], 114);
  EXPECT_EQ(r[64], 0x00);  // 1e-40 / 2^-13 rounds to 0
  EXPECT_EQ(r[515], 119);  // amax 1: ceil(log2(1 / 448)) = -8
  EXPECT_EQ(r[100], 0x7f);
  EXPECT_EQ(r[96], 0x78);  // 1 / 2^-8 = 256 = 2^8: exponent field 15, mantissa 0
  EXPECT_EQ(r[527], 0xff);
  const std::vector<double> v = test::decode_row(p.cache, 7);
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[5], 3.0);
  EXPECT_TRUE(std::isnan(v[100]));
  EXPECT_TRUE(std::isnan(v[481]));
  EXPECT_EQ(test::untouched_except(p, {7}), "");
}

TEST(CacheV4, V4WriterBytesAndPageRegion) {
  std::vector<float> x(512);
  for (int i = 0; i < 512; ++i) x[i] = static_cast<float>(i % 64 == 0 ? 448 << (i / 64) : 1);  // tile t: amax 448 * 2^t
  x[448] = 1.5f;
  x[511] = -2.0f;
  for (int64_t page : {1, 3, 64, 256}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const int64_t slot = page + page / 2;  // second page
    const test::PatternCache p = write_one(CacheFormat::v4, page, slot, x);
    const uint8_t* pg = page_of(p, slot);
    const int64_t r = slot % page;
    const uint8_t* row = pg + r * 576;
    const uint8_t* sc = pg + page * 576 + r * 8;
    for (int t = 0; t < 7; ++t) {
      EXPECT_EQ(sc[t], 127 + t) << t;
      EXPECT_EQ(row[64 * t], 0x7e) << t;  // 448
    }
    EXPECT_EQ(sc[7], 0);  // the pad byte
    uint16_t h;
    std::memcpy(&h, row + 448, 2);
    EXPECT_EQ(h, 0x3fc0);  // bf16 1.5
    std::memcpy(&h, row + 448 + 126, 2);
    EXPECT_EQ(h, 0xc000);  // bf16 -2
    // Every other byte of the storage (other rows' bodies and scale slots) is untouched.
    const auto* base = static_cast<const uint8_t*>(p.storage.data());
    for (std::size_t i = 0; i < p.storage.nbytes(); ++i) {
      const bool mine = (base + i >= row && base + i < row + 576) || (base + i >= sc && base + i < sc + 8);
      if (!mine) {
        ASSERT_EQ(base[i], test::kPattern) << "byte " << i;
      }
    }
    const std::vector<double> v = test::decode_row(p.cache, slot);
    for (int i = 0; i < 512; ++i) ASSERT_EQ(v[i], static_cast<double>(x[i])) << i;  // exact in this record
  }
}

TEST(CacheV4, Fp4WriterBytes) {
  std::vector<float> x(512, 0.0f);
  // tile 0: amax 6 -> scale 1 (e4m3 0x38); codes by e2m1 rounding, low nibble first.
  const float t0[16] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -6.0f, 6.0f, 0.5f, -0.26f, 0, 0, 0, 0, 0};
  std::copy(t0, t0 + 16, x.begin());
  // tile 1 stays zero: the clamp's floor 2^-9 (e4m3 0x01). tile 2: amax 6000 -> the ceiling 448 (0x7e).
  x[32] = 6000.0f;
  x[33] = 448.0f;
  // tile 3: a NaN: the NaN scale 0x7f, codes 0. tile 4: scale 1.5/6 = 0.25 exactly (0x28), 1.5 -> code 6.
  x[48] = NAN;
  x[49] = 2.0f;
  x[64] = 1.5f;
  x[65] = 0.375f;
  // tile 5: an infinity saturates like a finite overflow: scale 448, code 6.
  x[80] = INFINITY;
  // the rope (columns 448..511) is coded too: tile 28.
  x[448] = -3.0f;
  const test::PatternCache p = write_one(CacheFormat::v41_fp4, 4, 2, x);
  const uint8_t* r = page_of(p, 2) + 2 * 288;
  EXPECT_EQ(r[256], 0x38);
  EXPECT_EQ(r[0], 0x2 << 4 | 0x0);   // 0.25 -> 0, 0.75 -> 1.0 (code 2)
  EXPECT_EQ(r[1], 0x4 << 4 | 0x2);   // 1.25 -> 1.0, 1.75 -> 2 (code 4)
  EXPECT_EQ(r[2], 0x6 << 4 | 0x4);   // 2.5 -> 2, 3.5 -> 4 (code 6)
  EXPECT_EQ(r[3], 0xf << 4 | 0x6);   // 5 -> 4, -6 -> code 0xf
  EXPECT_EQ(r[4], 0x1 << 4 | 0x7);   // 6, 0.5
  EXPECT_EQ(r[5], 0x0 << 4 | 0x9);   // -0.26 -> -0.5 (code 9)
  EXPECT_EQ(r[257], 0x01);
  EXPECT_EQ(r[258], 0x7e);
  EXPECT_EQ(r[16], 0x2 << 4 | 0x7);  // 6000 / 448 saturates to 6 (code 7); 448 / 448 = 1 (code 2)
  EXPECT_EQ(r[259], 0x7f);
  EXPECT_EQ(r[24], 0x00);
  EXPECT_EQ(r[260], 0x28);
  EXPECT_EQ(r[32], 0x3 << 4 | 0x7);  // 1.5 / 0.25 = 6 (code 7), 0.375 / 0.25 = 1.5 (code 3)
  EXPECT_EQ(r[261], 0x7e);
  EXPECT_EQ(r[40], 0x07);
  EXPECT_EQ(r[256 + 28], 0x30);      // amax 3 -> 0.5 (e4m3 0x30)
  EXPECT_EQ(r[224], 0x0f);           // -3 / 0.5 = -6 (code 0xf)
  const std::vector<double> v = test::decode_row(p.cache, 2);
  EXPECT_EQ(v[1], 1.0);
  EXPECT_EQ(v[32], 6.0 * 448);
  EXPECT_EQ(v[33], 448.0);
  EXPECT_TRUE(std::isnan(v[48]) && std::isnan(v[63]));
  EXPECT_EQ(v[448], -3.0);
  EXPECT_EQ(test::untouched_except(p, {2}), "");
}

// The gathers read the records as the independent decoder does (every page size; slot -1 skipped).
TEST(CacheV4, GatherAndUpconvertReadTheCodes) {
  for (CacheFormat f : test::kRecordFormats)
    for (int64_t page : {1, 3, 64}) {
      SCOPED_TRACE(std::string(to_string(f)) + " page " + std::to_string(page));
      test::reseed(40 + page);
      const test::V4Cache c = test::v4_cache(f, 512, (20 + page - 1) / page, page);
      const int64_t n = c.cb.cache.num_slots();
      std::vector<int32_t> table;
      for (int64_t b = 0; b < c.cb.cache.num_blocks(); ++b) table.push_back(static_cast<int32_t>(b));
      const Tensor bt = test::int_tensor_2d({table});
      const Tensor cu = test::int_tensor({0, static_cast<int32_t>(n)});
      Tensor dst = test::poisoned({n, 512}, DType::f64);
      gather_cache(c.cb.cache, dst.view(), bt.view(), cu.view(), {}, Context{nullptr, Precision::reference});
      Tensor up = test::poisoned({n, 512}, DType::f64);
      const Tensor ws = test::int_tensor({0});
      upconvert_ds_mla(c.cb.cache, up.view(), bt.view(), ws.view(), {});
      const std::vector<double> g = test::to_doubles(dst.view()), u = test::to_doubles(up.view());
      for (int32_t s : c.live) {
        const std::vector<double> want = test::decode_row(c.cb.cache, s);
        for (int i = 0; i < 512; ++i) {
          ASSERT_EQ(g[static_cast<std::size_t>(s * 512 + i)], want[static_cast<std::size_t>(i)]) << s << " " << i;
          ASSERT_EQ(u[static_cast<std::size_t>(s * 512 + i)], want[static_cast<std::size_t>(i)]) << s << " " << i;
        }
      }
    }
}

TEST(CacheV4, WriteSkipsPadSlots) {
  for (CacheFormat f : test::kRecordFormats) {
    SCOPED_TRACE(to_string(f));
    test::PatternCache p = test::pattern_cache(f, 3, 4);
    const Tensor kv = test::random_tensor({3, 448}, DType::bf16), pe = test::random_tensor({3, 64}, DType::bf16);
    const Tensor s = test::int_tensor({-1, 5, -1});
    write_cache(kv.view(), pe.view(), s.view(), p.cache);
    if (f != CacheFormat::v4) {
      EXPECT_EQ(test::untouched_except(p, {5}), "");
    }
    const std::vector<double> v = test::decode_row(p.cache, 5);
    const std::vector<double> in = test::to_doubles(kv.view());
    for (int i = 0; i < 448; ++i)  // each value within its block's quantisation step
      ASSERT_NEAR(v[static_cast<std::size_t>(i)], in[static_cast<std::size_t>(448 + i)], f == CacheFormat::v41_fp4 ? 0.5 : 0.07)
          << i;
  }
}

// sparse_mqa over record caches equals the same call over f64 caches holding their decoded values (the
// float64 oracle reads code * scale exactly), and the independent formula; main and extra may differ.
TEST(CacheV4, SparseOverRecordsEqualsDecodedF64) {
  const std::pair<CacheFormat, CacheFormat> pairs[] = {{CacheFormat::v4, CacheFormat::v4},
                                                       {CacheFormat::v41, CacheFormat::v41},
                                                       {CacheFormat::v41_fp4, CacheFormat::v41_fp4},
                                                       {CacheFormat::v41, CacheFormat::v41_fp4},
                                                       {CacheFormat::v4, CacheFormat::v41}};
  uint64_t seed = 70;
  for (auto [fm, fe] : pairs) {
    SCOPED_TRACE(std::string(to_string(fm)) + " + " + to_string(fe));
    test::reseed(seed++);
    const int64_t t = 6, h = 3, pm = 16, pe = 4;
    const test::V4Cache main = test::v4_cache(fm, 512, 8, pm), extra = test::v4_cache(fe, 512, 10, pe);
    auto to_f64 = [](const test::V4Cache& c) {
      CacheBuffer b = allocate_cache(CacheFormat::f64, c.cb.cache.num_blocks(), c.cb.cache.page_size(), Device::cpu(),
                                     1.0f, 512, 64);
      for (int64_t s = 0; s < c.cb.cache.num_slots(); ++s) {
        const std::vector<double> v = test::decode_row(c.cb.cache, s);
        std::memcpy(b.cache.data.ptr_at({s / b.cache.page_size(), s % b.cache.page_size(), 0}), v.data(), 512 * 8);
      }
      return b;
    };
    const CacheBuffer m64 = to_f64(main), e64 = to_f64(extra);
    const test::V4List ml = test::v4_list(main, t, 21, false), el = test::v4_list(extra, t, 9, true);
    const Tensor mi = test::int_tensor_2d(ml.rows), mlen = test::int_tensor(ml.lengths);
    const Tensor ei = test::int_tensor_2d(el.rows), elen = test::int_tensor(el.lengths);
    Tensor sink = Tensor::empty({h}, DType::f32);
    std::vector<double> sinks;
    for (int64_t x = 0; x < h; ++x) sinks.push_back(static_cast<float*>(sink.data())[x] = static_cast<float>(x) - 1.0f);
    const Tensor q16 = test::random_tensor({t, h, 512}, DType::bf16);
    const std::vector<double> qv = test::to_doubles(q16.view());
    Tensor q64 = Tensor::empty({t, h, 512}, DType::f64);
    std::copy(qv.begin(), qv.end(), static_cast<double*>(q64.data()));
    const double scale = 1.0 / std::sqrt(512.0);
    auto run = [&](const KVCache& mc, const KVCache& ec) {
      SparseOptions o;
      o.attn_sink = sink.view();
      o.extra = {ec, ei.view(), elen.view()};
      o.values_include_rope = true;
      Tensor out = test::poisoned({t, h, 512}, DType::f64), lse = test::poisoned({t, h}, DType::f64);
      sparse_mqa(q64.view(), mc, mi.view(), mlen.view(), out.view(), lse.view(), scale, o,
                 Context{nullptr, Precision::reference});
      std::vector<double> r = test::to_doubles(out.view()), l = test::to_doubles(lse.view());
      r.insert(r.end(), l.begin(), l.end());
      return r;
    };
    const std::vector<double> got = run(main.cb.cache, extra.cb.cache), want = run(m64.cache, e64.cache);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;  // bit for bit
    const test::OracleOut ref =
        test::v4_oracle(qv, t, h, 512, 512, scale, main.cb.cache, ml, true, &extra.cb.cache, &el, true, sinks);
    std::vector<double> ref_all = ref.out;
    ref_all.insert(ref_all.end(), ref.lse.begin(), ref.lse.end());
    EXPECT_EQ(test::check_close(got, ref_all, DType::f64, 1e-12), "");
    // Fast precision reads the same codes.
    Tensor out16 = test::poisoned({t, h, 512}, DType::bf16), lse32 = test::poisoned({t, h}, DType::f32);
    SparseOptions o;
    o.attn_sink = sink.view();
    o.extra = {extra.cb.cache, ei.view(), elen.view()};
    o.values_include_rope = true;
    sparse_mqa(q16.view(), main.cb.cache, mi.view(), mlen.view(), out16.view(), lse32.view(), scale, o);
    EXPECT_EQ(test::check_close(test::to_doubles(out16.view()), ref.out, DType::bf16, 1e-6), "");
  }
}

TEST(CacheV4, OpsThatDoNotTakeRecordsRefuse) {
  const CacheBuffer v41 = allocate_cache(CacheFormat::v41, 2, 4, Device::cpu(), 1.0f, 512, 64);
  const CacheBuffer v4 = allocate_cache(CacheFormat::v4, 2, 4, Device::cpu(), 1.0f, 512, 64);
  // Fixed row widths.
  EXPECT_NE(error_of([] { allocate_cache(CacheFormat::v4, 2, 4, Device::cpu()); }).find("needs d_qk 512 and d_rope 64"),
            std::string::npos);
  // CUDA caches of records are valid (the record kernels exist); the plain device dispatch names the record
  // dispatch instead of calling a record "CPU-only".
  {
    Tensor bytes = Tensor::empty({2, 4, 288}, DType::u8);
    const TensorView on_gpu(bytes.view().data, DType::u8, {2, 4, 288}, Device::cuda(0));
    EXPECT_NO_THROW(validate_cache(KVCache{on_gpu, CacheFormat::v41_fp4, 1.0f, 512, 64}));
    const std::string d = error_of([] { dispatch_device_cache_format(CacheFormat::v4, [](auto) { return 0; }); });
    EXPECT_NE(d.find("dispatch_record_cache_format"), std::string::npos) << d;
    int calls = 0;
    visit_record_cache_format(CacheFormat::v41, [&](auto fmt) { calls += decltype(fmt)::kFormat == CacheFormat::v41; });
    visit_record_cache_format(CacheFormat::fp8, [&](auto) { calls += 10; });
    EXPECT_EQ(calls, 1);
  }
  // A v4 page is one contiguous run (its scale region follows its rows).
  Tensor layers = Tensor::empty({2, 2, 4, 584}, DType::u8);
  KVCache strided{layers.view().select(1, 0), CacheFormat::v4, 1.0f, 512, 64};
  EXPECT_NO_THROW(validate_cache(strided));  // pages apart, each page contiguous: fine
  const Tensor wide = Tensor::empty({2, 4, 600}, DType::u8);
  std::string e = error_of([&] {
    KVCache c{wide.view().slice(2, 0, 584), CacheFormat::v4, 1.0f, 512, 64};
    validate_cache(c);
  });
  EXPECT_NE(e.find("page must be contiguous"), std::string::npos) << e;

  // mqa_decode refuses them, naming the ops that take them.
  const Tensor q = test::random_tensor({1, 1, 2, 512}, DType::bf16), bt = test::int_tensor_2d({{0}}),
               sl = test::int_tensor({3});
  Tensor out = test::poisoned({1, 1, 2, 448}, DType::bf16);
  e = error_of([&] { mqa_decode(q.view(), v41.cache, bt.view(), sl.view(), out.view(), {}, 0.1, true, {}); });
  EXPECT_NE(e.find("mqa_decode: the v41 cache format (DeepSeek-V4 records) is read by sparse_mqa"), std::string::npos)
      << e;
  // sparse_mqa needs the V4 options (whole-row values).
  const Tensor q3 = test::random_tensor({1, 2, 512}, DType::bf16), idx = test::int_tensor_2d({{0, 1}});
  Tensor o3 = test::poisoned({1, 2, 448}, DType::bf16);
  e = error_of([&] { sparse_mqa(q3.view(), v41.cache, idx.view(), {}, o3.view(), {}, 0.1); });
  EXPECT_NE(e.find("needs SparseOptions::values_include_rope"), std::string::npos) << e;
  // A record extra cache beside a plain main cache is refused (mixing is among the records only).
  const CacheBuffer bf = allocate_cache(CacheFormat::bf16, 2, 4, Device::cpu(), 1.0f, 512, 64);
  SparseOptions o;
  o.values_include_rope = true;
  o.extra = {v41.cache, idx.view(), {}};
  Tensor o512 = test::poisoned({1, 2, 512}, DType::bf16);
  e = error_of([&] { sparse_mqa(q3.view(), bf.cache, idx.view(), {}, o512.view(), {}, 0.1, o); });
  EXPECT_NE(e.find("the extra cache must have the main cache's format"), std::string::npos) << e;
  EXPECT_TRUE(test::to_doubles(o512.view())[0] != test::to_doubles(o512.view())[0]);  // still poisoned
  // cp_gather_cache copies raw rows: a v4 row is not one run of bytes.
  Tensor raw = Tensor::empty({4, 584}, DType::u8);
  const Tensor cu = test::int_tensor({0, 4});
  e = error_of([&] { cp_gather_cache(v4.cache, raw.view(), bt.view(), cu.view(), {}); });
  EXPECT_NE(e.find("per-page region"), std::string::npos) << e;
  // v41 rows are one run: cp_gather_cache copies them.
  Tensor raw41 = Tensor::empty({4, 528}, DType::u8);
  EXPECT_NO_THROW(cp_gather_cache(v41.cache, raw41.view(), bt.view(), cu.view(), {}));
}

}  // namespace
}  // namespace mla
