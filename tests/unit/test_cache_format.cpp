// SPDX-License-Identifier: Apache-2.0
// The cache-format description (mla/cache_format.h): the traits give the documented byte layouts,
// the runtime table and the dispatch helper agree with them, and an out-of-range CacheFormat or
// DsMlaScale is rejected at every public entry with a message naming the value, writing nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cache_test_util.h"
#include "mla/cache_format.h"
#include "mla/layer.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::error_of;

using Bf16 = CacheFormatTraits<CacheFormat::bf16>;
using Fp8 = CacheFormatTraits<CacheFormat::fp8>;
using DsMla = CacheFormatTraits<CacheFormat::fp8_ds_mla>;
using F64 = CacheFormatTraits<CacheFormat::f64>;

// The layouts of DESIGN.md §4, spelled out once here as the independent statement the traits must meet.
static_assert(Bf16::entry_bytes(576, 64) == 1152 && Bf16::entry_bytes(320, 64) == 640 && Bf16::rope_offset(512) == 1024);
static_assert(Fp8::entry_bytes(576, 64) == 576 && Fp8::rope_offset(512) == 512 && Fp8::rope_scaled() && Fp8::uniform());
static_assert(DsMla::scale_offset(512) == 512 && DsMla::rope_offset(512) == 528 && DsMla::entry_bytes(576, 64) == 656);
static_assert(DsMla::num_tiles(512) == 4 && !DsMla::rope_scaled() && !DsMla::uniform());
static_assert(DsMla::admits(576, 64) && !DsMla::admits(320, 64) && Bf16::admits(320, 64) && !Bf16::admits(64, 64));
static_assert(F64::entry_bytes(576, 64) == 4608 && F64::entry_elems(576, 64) == 576 && F64::rope_offset(512) == 4096);
static_assert(F64::uniform() && !F64::rope_scaled() && F64::admits(320, 64) && !F64::kDevice && Bf16::kDevice);

constexpr CacheFormat kBad = static_cast<CacheFormat>(9);

TEST(CacheFormat, TableMatchesTraitsAndDispatch) {
  ASSERT_EQ(kNumCacheFormats, 7);
  for (const CacheFormatInfo& i : kCacheFormatTable) {
    EXPECT_EQ(&cache_format_info(i.format), &i);
    EXPECT_EQ(cache_format_from_string(i.name), i.format);
    EXPECT_STREQ(to_string(i.format), i.name);
    dispatch_cache_format(i.format, [&](auto fmt) {
      using Tr = decltype(fmt);
      EXPECT_EQ(Tr::kFormat, i.format);
      EXPECT_EQ(Tr::entry_bytes(576, 64), i.entry_bytes(576, 64));
      EXPECT_EQ(Tr::kDType, cache_dtype(i.format));
      EXPECT_EQ(cache_entry_elems(i.format) * dtype_bytes(Tr::kDType), cache_entry_bytes(i.format));
    });
  }
  EXPECT_EQ(cache_format_from_string("auto"), CacheFormat::bf16);
  EXPECT_EQ(cache_format_from_string("fp8_e4m3"), CacheFormat::fp8);
  EXPECT_EQ(cache_format_from_string("float64"), CacheFormat::f64);
  EXPECT_EQ(device_cache_format_names(), "bf16, fp8, fp8_ds_mla, v4, v41, v41_fp4");
  EXPECT_THROW(cache_format_from_string("fp4"), Error);
  // ds_mla's named constants are the traits' values.
  EXPECT_EQ(ds_mla::kRopeOffset, 528);
  EXPECT_EQ(ds_mla::kEntryBytes, 656);
}

TEST(CacheFormat, BadValuesRejectedByHelpers) {
  EXPECT_FALSE(is_valid(kBad));
  EXPECT_STREQ(to_string(kBad), "?");
  EXPECT_NE(error_of([] { dispatch_cache_format(kBad, [](auto) { return 0; }); }).find("CacheFormat value 9"),
            std::string::npos);
  int calls = 0;
  visit_cache_format(kBad, [&](auto) { ++calls; });
  EXPECT_EQ(calls, 0);
  for (auto call : std::vector<std::function<void()>>{
           [] { cache_entry_bytes(kBad); }, [] { cache_entry_elems(kBad); }, [] { cache_dtype(kBad); },
           [] { cache_format_info(kBad); }, [] { allocate_cache(kBad, 1, 1, Device::cpu()); }}) {
    EXPECT_NE(error_of(call).find("9"), std::string::npos);
  }
}

// Every op that takes a cache: a descriptor with a bad format value is rejected and nothing written.
TEST(CacheFormat, BadValuesRejectedByOpsWritingNothing) {
  auto pc = test::pattern_cache(CacheFormat::bf16, 2, 4);
  KVCache bad = pc.cache;
  bad.format = kBad;
  EXPECT_NE(error_of([&] { validate_cache(bad); }).find("CacheFormat value 9"), std::string::npos);

  Tensor kv_c = test::random_tensor({3, 512}, DType::bf16), k_pe = test::random_tensor({3, 64}, DType::bf16);
  Tensor bt = test::int_tensor_2d({{0, 1}}), cu = test::int_tensor({0, 3});
  Tensor dst = test::poisoned({3, 576}, DType::bf16), raw = test::poisoned({3, 576}, DType::bf16);
  Tensor q = test::random_tensor({1, 1, 4, 576}, DType::bf16), out = test::poisoned({1, 1, 4, 512}, DType::bf16);
  Tensor sq = test::random_tensor({1, 4, 576}, DType::bf16), sout = test::poisoned({1, 4, 512}, DType::bf16);
  Tensor lens = test::int_tensor({3}), idx = test::int_tensor_2d({{0, 1, 2}});
  const std::vector<double> dst0 = test::to_doubles(dst), out0 = test::to_doubles(out), sout0 = test::to_doubles(sout);
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"write_cache", [&] { write_cache(kv_c, k_pe, test::int64_tensor({0, 1, 2}), bad); }},
      {"gather_cache", [&] { gather_cache(bad, dst, bt, cu, {}); }},
      {"cp_gather_cache", [&] { cp_gather_cache(bad, raw, bt, cu, {}); }},
      {"upconvert_ds_mla", [&] { upconvert_ds_mla(bad, dst, bt, test::int_tensor({0}), {}); }},
      {"mqa_decode", [&] { mqa_decode(q, bad, bt, lens, out, {}, 0.1); }},
      {"sparse_mqa", [&] { sparse_mqa(sq, bad, idx, {}, sout, {}, 0.1); }},
  };
  for (const auto& [name, call] : calls) EXPECT_NE(error_of(call).find("9"), std::string::npos) << name;
  EXPECT_EQ(test::untouched_except(pc, {}), "");
  for (const auto& [a, b] : {std::pair{test::to_doubles(dst), dst0}, std::pair{test::to_doubles(out), out0},
                             std::pair{test::to_doubles(sout), sout0}}) {
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(std::isnan(a[i]) && std::isnan(b[i]));
  }
}

TEST(CacheFormat, BadValuesRejectedByPlannerAndLayer) {
  PlannerConfig pc;
  pc.cache_format = kBad;
  EXPECT_NE(error_of([&] { pc.validate(); }).find("CacheFormat value 9"), std::string::npos);

  LayerOptions o;
  o.dims = ModelDims::deepseek_v2_lite();
  o.dims.num_heads = 2;
  Tensor w = test::random_tensor({2 * (128 + 128), 512}, DType::bf16);
  o.cache_format = kBad;
  EXPECT_NE(error_of([&] { MlaAttention layer(o, w); }).find("CacheFormat value 9"), std::string::npos);
  o.cache_format = CacheFormat::fp8_ds_mla;
  o.ds_scale = static_cast<DsMlaScale>(5);
  EXPECT_NE(error_of([&] { MlaAttention layer(o, w); }).find("DsMlaScale value 5"), std::string::npos);
}

// The DeepSeek-V4 records serve sparse_mqa's V4 options only: a layer or a plan over one is refused up front (the
// layer would otherwise write the cache before its attention op refused the format).
TEST(CacheFormat, V4RecordsRefusedByPlannerAndLayer) {
  for (const CacheFormat f : {CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4}) {
    PlannerConfig pc;
    pc.cache_format = f;
    EXPECT_NE(error_of([&] { pc.validate(); }).find("DeepSeek-V4 record"), std::string::npos) << to_string(f);
    LayerOptions o;
    o.dims = ModelDims::deepseek_v2_lite();
    o.dims.num_heads = 2;
    o.dims.kv_lora_rank = 448;  // the width a V4 record's latent has
    o.cache_format = f;
    Tensor w = test::random_tensor({2 * (128 + 128), 448}, DType::bf16);
    EXPECT_NE(error_of([&] { MlaAttention layer(o, w); }).find("DeepSeek-V4 record"), std::string::npos)
        << to_string(f);
  }
}

}  // namespace
}  // namespace mla

namespace mla::test {
namespace {

// Issue 14: an fp8_ds_mla cache is u8, so a view may place rows at any byte (row stride 657 here:
// odd starts). Readers and writers must load the fp32 scales and bf16 rope without assuming
// alignment (UBSan's alignment check in scripts/sanitize.sh fails on a typed misaligned load); the
// results equal those of the aligned cache.
TEST(CacheFormat, DsMlaRowsAtOddBytes) {
  const int64_t nb = 3, page = 5, slots = nb * page;
  Tensor wide = Tensor::zeros({nb, page, 657}, DType::u8);
  const KVCache odd{wide.view().slice(2, 1, 657), CacheFormat::fp8_ds_mla};
  CacheBuffer aligned = allocate_cache(CacheFormat::fp8_ds_mla, nb, page, Device::cpu());
  reseed(5);
  const Tensor kv_c = random_tensor({slots, 512}, DType::f32), k_pe = random_tensor({slots, 64}, DType::f32);
  std::vector<int64_t> s(static_cast<std::size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) s[i] = (i * 7) % slots;
  const Tensor slot_t = int64_tensor(s);
  write_cache(kv_c, k_pe, slot_t, odd);
  write_cache(kv_c, k_pe, slot_t, aligned.cache);
  for (int64_t i = 0; i < slots; ++i) ASSERT_EQ(decode_row(odd, i), decode_row(aligned.cache, i)) << "slot " << i;

  const Tensor table = int_tensor_2d({{2, 0, 1}}), cu = int_tensor({0, slots});
  Tensor g_odd = Tensor::empty({slots, 576}, DType::f32), g_al = Tensor::empty({slots, 576}, DType::f32);
  gather_cache(odd, g_odd, table, cu);
  gather_cache(aligned.cache, g_al, table, cu);
  EXPECT_EQ(to_doubles(g_odd), to_doubles(g_al));

  const Tensor q = random_tensor({1, 2, 4, 576}, DType::f32), lens = int_tensor({slots});
  Tensor o_odd = Tensor::empty({1, 2, 4, 512}, DType::f32), o_al = Tensor::empty({1, 2, 4, 512}, DType::f32);
  mqa_decode(q, odd, table, lens, o_odd, {}, 0.05);
  mqa_decode(q, aligned.cache, table, lens, o_al, {}, 0.05);
  EXPECT_EQ(to_doubles(o_odd), to_doubles(o_al));

  const Tensor sq = random_tensor({2, 4, 576}, DType::f32), idx = int_tensor_2d({{0, 3, 14, -1}, {7, 7, 1, 9}});
  Tensor s_odd = Tensor::empty({2, 4, 512}, DType::f32), s_al = Tensor::empty({2, 4, 512}, DType::f32);
  sparse_mqa(sq, odd, idx, {}, s_odd, {}, 0.05);
  sparse_mqa(sq, aligned.cache, idx, {}, s_al, {}, 0.05);
  EXPECT_EQ(to_doubles(s_odd), to_doubles(s_al));
}

}  // namespace
}  // namespace mla::test

namespace mla {
namespace {

// f64, the float64 oracle's cache: CPU only. CUDA entry points refuse it naming the formats they take;
// the device dispatch and the device-side visitor never instantiate a kernel for it.
TEST(CacheFormat, F64IsHostOnly) {
  const std::string takes = "bf16, fp8, fp8_ds_mla";
  std::string e = error_of([] { dispatch_device_cache_format(CacheFormat::f64, [](auto) { return 0; }); });
  EXPECT_NE(e.find("CPU-only"), std::string::npos) << e;
  EXPECT_NE(e.find(takes), std::string::npos) << e;
  int calls = 0;
  visit_cache_format(CacheFormat::f64, [&](auto) { ++calls; });
  EXPECT_EQ(calls, 0);
  dispatch_device_cache_format(CacheFormat::fp8, [&](auto fmt) { EXPECT_EQ(decltype(fmt)::kFormat, CacheFormat::fp8); });

  e = error_of([] { allocate_cache(CacheFormat::f64, 1, 4, Device::cuda(0)); });
  EXPECT_NE(e.find("CPU-only"), std::string::npos) << e;
  EXPECT_NE(e.find(takes), std::string::npos) << e;
  CacheBuffer cb = allocate_cache(CacheFormat::f64, 2, 4, Device::cpu(), 1.0f, 320, 64);
  EXPECT_EQ(cb.storage.dtype(), DType::f64);
  KVCache on_gpu = cb.cache;
  on_gpu.data = test::on_fake_cuda(on_gpu.data);
  e = error_of([&] { validate_cache(on_gpu, "op"); });
  EXPECT_NE(e.find("op: the f64 cache format is CPU-only"), std::string::npos) << e;
  EXPECT_NE(e.find(takes), std::string::npos) << e;

  LayerOptions o;
  o.dims = ModelDims::deepseek_v2_lite();
  o.dims.num_heads = 2;
  o.cache_format = CacheFormat::f64;
  o.device = Device::cuda(0);
  Tensor w = test::random_tensor({2 * (128 + 128), 512}, DType::bf16);
  e = error_of([&] { MlaAttention layer(o, w); });
  EXPECT_NE(e.find("CPU-only"), std::string::npos) << e;
  EXPECT_NE(e.find(takes), std::string::npos) << e;
}

// f64 rows hold every input dtype exactly: write then gather gives the inputs back bit for bit.
TEST(CacheFormat, F64StoresInputsExactly) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    CacheBuffer cb = allocate_cache(CacheFormat::f64, 2, 4, Device::cpu());
    std::memset(cb.storage.data(), 0xff, cb.storage.nbytes());
    Tensor kv_c = test::random_tensor({3, 512}, dt), k_pe = test::random_tensor({3, 64}, dt);
    write_cache(kv_c, k_pe, test::int64_tensor({5, -1, 2}), cb.cache);
    Tensor dst = test::poisoned({2, 576}, DType::f64);
    gather_cache(cb.cache, dst, test::int_tensor_2d({{0, 1}}), test::int_tensor({0, 2}), test::int_tensor({5}));
    // dst row 0 = slot 5 = token 0, dst row 1 = slot 6 (never written: NaN).
    const std::vector<double> kv = test::to_doubles(kv_c), pe = test::to_doubles(k_pe), got = test::to_doubles(dst);
    for (int i = 0; i < 576; ++i) {
      const double want = i < 512 ? kv[i] : pe[i - 512];
      ASSERT_EQ(got[i], want) << to_string(dt) << " column " << i;
      ASSERT_TRUE(std::isnan(got[576 + i]));
    }
    const std::vector<double> row2 = test::decode_row(cb.cache, 2);
    for (int i = 0; i < 576; ++i) ASSERT_EQ(row2[i], i < 512 ? kv[2 * 512 + i] : pe[2 * 64 + i - 512]);
  }
}

}  // namespace
}  // namespace mla
