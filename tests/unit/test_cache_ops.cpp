// SPDX-License-Identifier: Apache-2.0
// write_cache (concat_and_cache_mla, semantics §3-§4) on the CPU: per-format round trips, skipped
// slots, padded inputs, strided views, saturation, and rejected inputs that must write nothing.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "cache_test_util.h"
#include "core/numeric.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::pattern_cache;
using test::untouched_except;

// Element (t, i) of a 2-D view as double.
double at(const TensorView& v, int64_t t, int64_t i) {
  return num::load(static_cast<const char*>(v.data) + (t * v.stride[0] + i * v.stride[1]) * v.element_size(),
                   v.dtype);
}

// `n` distinct slots of a cache with `num_slots`, shuffled, with every third one replaced by -1.
std::vector<int64_t> some_slots(int64_t n, int64_t num_slots) {
  std::vector<int64_t> all(static_cast<std::size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), test::rng());
  std::vector<int64_t> s(all.begin(), all.begin() + n);
  for (std::size_t i = 1; i < s.size(); i += 3) s[i] = -1;
  return s;
}
std::set<int64_t> written_set(const std::vector<int64_t>& slots) {
  std::set<int64_t> w;
  for (int64_t s : slots)
    if (s >= 0) w.insert(s);
  return w;
}

class WriteCache : public ::testing::TestWithParam<int64_t> {};  // page size

TEST_P(WriteCache, Bf16IsBitExactAndSkipsNegativeSlots) {
  test::reseed(11 + GetParam());
  const int64_t page = GetParam(), T = 9;
  auto pc = pattern_cache(CacheFormat::bf16, 12, page);
  Tensor kv_c = test::random_tensor({T, 512}, DType::bf16), k_pe = test::random_tensor({T, 64}, DType::bf16);
  const auto s = some_slots(T, pc.cache.num_slots());
  write_cache(kv_c, k_pe, test::int64_tensor(s), pc.cache);
  for (int64_t t = 0; t < T; ++t) {
    if (s[t] < 0) continue;
    const uint8_t* row = test::row_ptr(pc.cache, s[t]);
    EXPECT_EQ(std::memcmp(row, kv_c.view().ptr_at({t, 0}), 1024), 0) << "latent of token " << t;
    EXPECT_EQ(std::memcmp(row + 1024, k_pe.view().ptr_at({t, 0}), 128), 0) << "rope of token " << t;
  }
  EXPECT_EQ(untouched_except(pc, written_set(s)), "");
}

TEST_P(WriteCache, Fp8DividesByScaleAndSaturates) {
  test::reseed(21 + GetParam());
  const int64_t page = GetParam(), T = 6;
  const float scale = 0.05f;  // |x| > 22.4 saturates
  auto pc = pattern_cache(CacheFormat::fp8, 8, page, scale);
  Tensor kv_c = test::random_tensor({T, 512}, DType::bf16, Device::cpu(), -30, 30);
  Tensor k_pe = test::random_tensor({T, 64}, DType::f32, Device::cpu(), -30, 30);
  auto s = some_slots(T, pc.cache.num_slots());
  write_cache(kv_c, k_pe, test::int64_tensor(s), pc.cache);
  int saturated = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (s[t] < 0) continue;
    const uint8_t* row = test::row_ptr(pc.cache, s[t]);
    for (int i = 0; i < 576; ++i) {
      const double x = i < 512 ? at(kv_c, t, i) : at(k_pe, t, i - 512);
      const double q = num::e4m3_to_float(row[i]), y = static_cast<float>(x) / scale;
      if (std::fabs(y) >= 448) {
        EXPECT_EQ(q, std::copysign(448.0, y)) << "token " << t << " col " << i;
        ++saturated;
      } else {
        EXPECT_LE(std::fabs(q - y), test::e4m3_step(y)) << "token " << t << " col " << i;
      }
      EXPECT_EQ(row[i], num::float_to_e4m3(static_cast<float>(x) / scale));
    }
  }
  EXPECT_GT(saturated, 0);
  EXPECT_EQ(untouched_except(pc, written_set(s)), "");
}

// Expected fp8_ds_mla tile scales, written out from §3.3 (independently of the writer).
float amax_of_tile(const TensorView& kv_c, int64_t t, int tile) {
  float amax = 0;
  for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(static_cast<float>(at(kv_c, t, tile * 128 + i))));
  return amax;
}

// A bf16 kv_c whose four tiles live on very different scales: tiny, all zero, large, ordinary.
Tensor ds_mla_input(int64_t T) {
  Tensor kv_c = Tensor::empty({T, 512}, DType::bf16);
  const double mag[4] = {1e-6, 0.0, 3000.0, 1.0};
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 512; ++i) num::store(kv_c.view().ptr_at({t, i}), DType::bf16, mag[i / 128] * u(test::rng()));
  return kv_c;
}

void check_ds_mla_rows(const test::PatternCache& pc, const TensorView& kv_c, const TensorView& k_pe,
                       const std::vector<int64_t>& s, DsMlaScale mode) {
  for (int64_t t = 0; t < static_cast<int64_t>(s.size()); ++t) {
    if (s[t] < 0) continue;
    const uint8_t* row = test::row_ptr(pc.cache, s[t]);
    for (int tile = 0; tile < 4; ++tile) {
      float scale;
      std::memcpy(&scale, row + 512 + 4 * tile, 4);
      const float amax = amax_of_tile(kv_c, t, tile);
      if (mode == DsMlaScale::amax) {
        EXPECT_EQ(scale, std::max(amax / 448.0f, FLT_MIN)) << "token " << t << " tile " << tile;
      } else {
        const float floor = std::max(amax / 448.0f, 1e-4f);
        int e;
        EXPECT_EQ(std::frexp(scale, &e), 0.5f) << "scale " << scale << " is not a power of two";
        EXPECT_GE(scale, floor);
        EXPECT_LT(scale / 2, floor) << "not the smallest power of two >= " << floor;
        if (amax == 0) { EXPECT_EQ(scale, std::ldexp(1.0f, -13)); }
      }
      bool hit_max = false;
      for (int i = tile * 128; i < tile * 128 + 128; ++i) {
        const double y = static_cast<float>(at(kv_c, t, i)) / scale, q = num::e4m3_to_float(row[i]);
        EXPECT_LE(std::fabs(q - y), test::e4m3_step(y)) << "token " << t << " col " << i;
        EXPECT_EQ(row[i], num::float_to_e4m3(static_cast<float>(at(kv_c, t, i)) / scale));
        hit_max |= std::fabs(q) == 448.0;
      }
      // amax mode maps the largest element of a non-zero tile to the top of the e4m3 range.
      if (mode == DsMlaScale::amax && amax > 0) {
        EXPECT_TRUE(hit_max) << "token " << t << " tile " << tile;
      }
    }
    for (int j = 0; j < 64; ++j) {
      uint16_t h;
      std::memcpy(&h, row + 528 + 2 * j, 2);
      const auto* src = static_cast<const char*>(k_pe.ptr_at({t, j}));
      const uint16_t want = k_pe.dtype == DType::bf16 ? *reinterpret_cast<const uint16_t*>(src)
                                                      : num::float_to_bf16(static_cast<float>(at(k_pe, t, j)));
      EXPECT_EQ(h, want) << "rope of token " << t << " col " << j;
    }
  }
  EXPECT_EQ(untouched_except(pc, written_set(s)), "");
}

TEST_P(WriteCache, DsMlaAmaxScales) {
  test::reseed(31 + GetParam());
  const int64_t T = 7;
  auto pc = pattern_cache(CacheFormat::fp8_ds_mla, 8, GetParam());
  Tensor kv_c = ds_mla_input(T), k_pe = test::random_tensor({T, 64}, DType::bf16, Device::cpu(), -4, 4);
  auto s = some_slots(T, pc.cache.num_slots());
  write_cache(kv_c, k_pe, test::int64_tensor(s), pc.cache, DsMlaScale::amax);
  check_ds_mla_rows(pc, kv_c, k_pe, s, DsMlaScale::amax);
}

TEST_P(WriteCache, DsMlaPow2ScalesAndWideRope) {
  test::reseed(41 + GetParam());
  const int64_t T = 7;
  auto pc = pattern_cache(CacheFormat::fp8_ds_mla, 8, GetParam());
  Tensor kv_c = ds_mla_input(T), k_pe = test::random_tensor({T, 64}, DType::f32, Device::cpu(), -4, 4);
  auto s = some_slots(T, pc.cache.num_slots());
  write_cache(kv_c, k_pe, test::int64_tensor(s), pc.cache, DsMlaScale::pow2);
  check_ds_mla_rows(pc, kv_c, k_pe, s, DsMlaScale::pow2);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, WriteCache, ::testing::Values(1, 16, 64));

TEST(WriteCacheEdges, PaddedTokensAndInt32Slots) {
  // kv_c holds 8 rows, slot_mapping names 5: rows 5..7 (NaN) are never written.
  auto pc = pattern_cache(CacheFormat::bf16, 2, 16);
  Tensor kv_c = test::random_tensor({8, 512}, DType::bf16), k_pe = test::random_tensor({8, 64}, DType::bf16);
  fill(kv_c.view().slice(0, 5, 8), NAN);
  const std::vector<int32_t> s = {3, -1, 17, 0, 31};
  write_cache(kv_c, k_pe, test::int_tensor(s), pc.cache);
  EXPECT_EQ(untouched_except(pc, {3, 17, 0, 31}), "");
  for (int t : {0, 2, 3, 4})
    EXPECT_EQ(std::memcmp(test::row_ptr(pc.cache, s[t]), kv_c.view().ptr_at({t, 0}), 1024), 0);
  // Zero tokens: nothing happens.
  write_cache(kv_c, k_pe, test::int64_tensor({}), pc.cache);
  EXPECT_EQ(untouched_except(pc, {3, 17, 0, 31}), "");
}

// Issue 51: slot_mapping stored inside the cache tensor (in the row of the first token's slot). The
// slots are read as validated before any row is written; re-reading them after the first row was
// written took a bf16 row for a slot and wrote far outside the cache.
TEST(WriteCacheEdges, SlotMappingInsideTheCache) {
  auto pc = pattern_cache(CacheFormat::bf16, 2, 16);
  Tensor kv_c = test::random_tensor({3, 512}, DType::bf16), k_pe = test::random_tensor({3, 64}, DType::bf16);
  fill(kv_c.view().slice(0, 0, 1), 1e30);  // the row that lands on the slots: no slot value survives it
  const std::vector<int64_t> s = {5, 9, 30};
  auto* row5 = const_cast<uint8_t*>(test::row_ptr(pc.cache, 5));
  std::memcpy(row5, s.data(), sizeof(int64_t) * s.size());
  const TensorView slots(row5, DType::i64, {3});
  write_cache(kv_c, k_pe, slots, pc.cache);
  EXPECT_EQ(untouched_except(pc, {5, 9, 30}), "");
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(std::memcmp(test::row_ptr(pc.cache, s[t]), kv_c.view().ptr_at({t, 0}), 1024), 0) << t;
}

TEST(WriteCacheEdges, StridedInputsAndStridedCacheView) {
  // kv_c and k_pe are column ranges of one [T, 600] buffer; the cache is layer 1 of a 3-layer allocation.
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    test::reseed(51);
    const int64_t T = 5;
    Tensor buf = test::random_tensor({T, 600}, DType::bf16);
    const TensorView kv_c = buf.view().slice(1, 0, 512), k_pe = buf.view().slice(1, 530, 594);
    auto pc = pattern_cache(f, 3, 4, 0.02f, /*layers=*/3, /*layer=*/1);
    const std::vector<int64_t> s = {11, 0, -1, 5, 6};
    write_cache(kv_c, k_pe, test::int64_tensor(s), pc.cache);
    EXPECT_EQ(untouched_except(pc, {11, 0, 5, 6}), "") << to_string(f);
    // Same data written contiguously into a plain cache gives the same row bytes.
    Tensor kv_c2 = Tensor::empty({T, 512}, DType::bf16), k_pe2 = Tensor::empty({T, 64}, DType::bf16);
    copy(kv_c2, kv_c);
    copy(k_pe2, k_pe);
    auto plain = pattern_cache(f, 3, 4, 0.02f);
    write_cache(kv_c2, k_pe2, test::int64_tensor(s), plain.cache);
    for (int64_t slot : {11, 0, 5, 6})
      EXPECT_EQ(test::row_bytes(pc.cache, slot), test::row_bytes(plain.cache, slot)) << to_string(f) << slot;
  }
}

TEST(WriteCacheEdges, DsMlaPow2ScaleOfExactPowers) {
  // amax/448 exactly 2^-3 keeps 2^-3; one bf16 ulp more needs 2^-2; 2^-14 is below the 1e-4 floor.
  auto pc = pattern_cache(CacheFormat::fp8_ds_mla, 1, 1);
  Tensor kv_c = Tensor::zeros({1, 512}, DType::bf16), k_pe = Tensor::zeros({1, 64}, DType::bf16);
  const double amax[4] = {56.0, 56.0 * (1 + std::ldexp(1.0, -7)), 448.0 * std::ldexp(1.0, -14), 448.0};
  for (int tile = 0; tile < 4; ++tile) num::store(kv_c.view().ptr_at({0, tile * 128 + 5}), DType::bf16, -amax[tile]);
  write_cache(kv_c, k_pe, test::int64_tensor({0}), pc.cache, DsMlaScale::pow2);
  const float want[4] = {0.125f, 0.25f, std::ldexp(1.0f, -13), 1.0f};
  for (int tile = 0; tile < 4; ++tile) {
    float scale;
    std::memcpy(&scale, test::row_ptr(pc.cache, 0) + 512 + 4 * tile, 4);
    EXPECT_EQ(scale, want[tile]) << "tile " << tile;
  }
}

TEST(WriteCacheEdges, Fp8SaturatesAtPlusMinus448) {
  auto pc = pattern_cache(CacheFormat::fp8, 1, 2, 1.0f);
  Tensor kv_c = Tensor::empty({1, 512}, DType::f32), k_pe = Tensor::empty({1, 64}, DType::f32);
  fill(kv_c, 1e6);
  fill(kv_c.view().slice(1, 256, 512), -448.5);
  fill(k_pe, INFINITY);
  write_cache(kv_c, k_pe, test::int64_tensor({1}), pc.cache);
  const uint8_t* row = test::row_ptr(pc.cache, 1);
  for (int i = 0; i < 576; ++i) EXPECT_EQ(row[i], i >= 256 && i < 512 ? 0xfe : 0x7e) << i;
}

TEST(WriteCacheEdges, F64InputsRoundOnceToBf16) {
  // 1 + 2^-8 + 2^-30 lies just above the bf16 tie between 1 and 1 + 2^-7: correct rounding gives
  // 1 + 2^-7 (0x3f81); rounding through float first would land on the tie and give 1 (0x3f80).
  auto pc = pattern_cache(CacheFormat::bf16, 1, 1);
  Tensor kv_c = Tensor::empty({1, 512}, DType::f64), k_pe = Tensor::empty({1, 64}, DType::f64);
  fill(kv_c, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  fill(k_pe, -(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30)));  // just below the tie: -1 (0xbf80)
  write_cache(kv_c, k_pe, test::int64_tensor({0}), pc.cache);
  const uint8_t* row = test::row_ptr(pc.cache, 0);
  uint16_t h;
  std::memcpy(&h, row, 2);
  EXPECT_EQ(h, 0x3f81);
  std::memcpy(&h, row + 1024, 2);
  EXPECT_EQ(h, 0xbf80);
}

TEST(WriteCacheErrors, BadInputsThrowAndWriteNothing) {
  auto pc = pattern_cache(CacheFormat::fp8_ds_mla, 2, 4);
  Tensor kv_c = test::random_tensor({3, 512}, DType::bf16), k_pe = test::random_tensor({3, 64}, DType::bf16);
  Tensor slots = test::int64_tensor({0, 1, 2});
  Tensor wide = test::random_tensor({3, 576}, DType::bf16), ints = Tensor::zeros({3, 512}, DType::i32);
  Tensor few_pe = test::random_tensor({2, 64}, DType::bf16), fslots = Tensor::zeros({3}, DType::f32);
  auto expect_rejected = [&](auto&& call, const char* what) {
    EXPECT_THROW(call(), Error) << what;
    EXPECT_EQ(untouched_except(pc, {}), "") << what;
  };
  expect_rejected([&] { write_cache(wide, k_pe, slots, pc.cache); }, "kv_c width");
  expect_rejected([&] { write_cache(ints, k_pe, slots, pc.cache); }, "kv_c dtype");
  expect_rejected([&] { write_cache(kv_c, few_pe, slots, pc.cache); }, "k_pe rows");
  expect_rejected([&] { write_cache(kv_c, k_pe, fslots, pc.cache); }, "slot dtype");
  expect_rejected([&] { write_cache(kv_c, k_pe, test::int64_tensor({0, 1, 2, 3}), pc.cache); }, "too many slots");
  expect_rejected([&] { write_cache(kv_c, k_pe, test::int64_tensor({0, 8, 1}), pc.cache); }, "slot == num_slots");
  expect_rejected([&] { write_cache(kv_c, k_pe, test::int64_tensor({2, -1, 2}), pc.cache); }, "duplicate slot");
  expect_rejected([&] { write_cache(kv_c, test::on_fake_cuda(k_pe), slots, pc.cache); }, "device mismatch");
  expect_rejected([&] { write_cache(kv_c.view().reshape({3, 512, 1}), k_pe, slots, pc.cache); }, "kv_c rank");
  expect_rejected([&] { write_cache(kv_c.view().transpose(0, 1), k_pe, slots, pc.cache); }, "kv_c transposed");
  KVCache wrong = pc.cache;
  wrong.format = CacheFormat::bf16;
  expect_rejected([&] { write_cache(kv_c, k_pe, slots, wrong); }, "cache format/dtype");
  expect_rejected([&] { write_cache(kv_c, k_pe, slots, pc.cache, static_cast<DsMlaScale>(7)); }, "scale mode");
}

}  // namespace
}  // namespace mla
