// SPDX-License-Identifier: Apache-2.0
// The DeepSeek-V4 block-scaled records (v4, v41, v41_fp4; SEMANTICS §3.5) on CUDA against the CPU backend:
// write_cache must produce the CPU writer's bytes (codes, scale bytes, v4's page scale region, padding) over
// the whole poisoned cache storage, and gather_cache / upconvert_ds_mla / cp_gather_cache the CPU's values bit
// for bit (bf16 and f32 destinations; f16 within the DESIGN.md §5 rule). Inputs: random rows of magnitudes
// 2^-30 .. 2^30, rows of zeros (and -0), huge values up to bf16's largest, bf16 subnormals, infinities and
// NaNs inside blocks, values placed on the e2m1 rounding ties; slot -1 and device-side slots outside the cache
// (skipped); page sizes 1, 3, 64, 256; aligned views (the vector kernels) and views one byte off (byte-wise);
// bf16, f16 and f32 activations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "cache_gpu_util.h"
#include "core/numeric.h"

namespace mla {
namespace {

using test::CacheMirror;
using test::GatherBatch;
using test::Mirror;
using test::random_slots;

constexpr int kDqk = 512, kLatent = 448, kRope = 64;

// Token t's 512 row values (latent then rope) as floats, by kind t % 8:
//   0 zeros of both signs; 1 huge (up to 3.3e38, bf16's range); 2 bf16 subnormals and tiny normals;
//   3 an infinity in some blocks; 4 NaNs of both signs in some blocks; 5 one magnitude per 16-column block,
//   2^-40 .. 2^40; 6 multiples of amax / 12 (e2m1 ties: x / s on 0.25, 0.75, 1.25, ... when s = amax / 6);
//   7 uniform random at a random magnitude 2^-30 .. 2^30.
std::vector<float> row_values(int64_t t) {
  std::vector<float> v(kDqk);
  auto u = [](double lo, double hi) { return static_cast<float>(test::uniform(lo, hi)); };
  const double m = std::ldexp(1.0, static_cast<int>(test::uniform(-30, 31)));
  for (int i = 0; i < kDqk; ++i) {
    switch (t % 8) {
      case 0: v[i] = i % 3 == 0 ? -0.0f : 0.0f; break;
      case 1: v[i] = u(-3.3e38, 3.3e38); break;
      case 2: v[i] = i % 5 == 0 ? u(-1e-37, 1e-37) : u(-1e-39, 1e-39); break;
      case 3: v[i] = (i % 97 == 5) ? (i % 2 ? -INFINITY : INFINITY) : u(-m, m); break;
      case 4: v[i] = (i % 89 == 7) ? (i % 2 ? -NAN : NAN) : u(-m, m); break;
      case 5: v[i] = u(-1, 1) * static_cast<float>(std::ldexp(1.0, (i / 16) % 81 - 40)); break;
      case 6: v[i] = static_cast<float>(std::floor(test::uniform(-12, 13)) / 12.0 * m); break;
      default: v[i] = u(-m, m); break;
    }
  }
  return v;
}

// kv_c [T, 448] and k_pe [T, 64] of dtype `dt` as column slices of wider buffers (rows 16-byte aligned);
// `offset` 1 shifts every row by one element (no 16-byte vector access is legal then).
struct Inputs {
  static constexpr int64_t kW = kLatent + 8, kRw = kRope + 8;
  Mirror kv, pe;
  TensorView kv_c, k_pe;
  Inputs(int64_t t, DType dt, int64_t offset)
      : kv(Tensor::empty({t, kW}, dt)), pe(Tensor::empty({t, kRw}, dt)) {
    Tensor kvf = Tensor::empty({t, kW}, DType::f32), pef = Tensor::empty({t, kRw}, DType::f32);
    auto* a = static_cast<float*>(kvf.data());
    auto* b = static_cast<float*>(pef.data());
    for (int64_t r = 0; r < t; ++r) {
      const std::vector<float> v = row_values(r);
      for (int64_t i = 0; i < kW; ++i) a[r * kW + i] = i >= offset && i - offset < kLatent ? v[i - offset] : 7.0f;
      for (int64_t i = 0; i < kRw; ++i) b[r * kRw + i] = i >= offset && i - offset < kRope ? v[kLatent + i - offset] : 7.0f;
    }
    // Each value rounded to dt once (bf16 / f16: to nearest even, as an input would be).
    const auto es = static_cast<int64_t>(dtype_size(dt));
    for (int64_t i = 0; i < t * kW; ++i) num::store(static_cast<char*>(kv.host.data()) + i * es, dt, a[i]);
    for (int64_t i = 0; i < t * kRw; ++i) num::store(static_cast<char*>(pe.host.data()) + i * es, dt, b[i]);
    kv.sync();
    pe.sync();
    kv_c = kv.host.view().slice(1, offset, offset + kLatent);
    k_pe = pe.host.view().slice(1, offset, offset + kRope);
  }
};

// ---- write_cache ----------------------------------------------------------------------------------------

// (format, page, int64 slots, misaligned)
using RecordWriteParam = std::tuple<CacheFormat, int64_t, bool, bool>;
class RecordWriteGpu : public ::testing::TestWithParam<RecordWriteParam> {};

void check_write(CacheFormat format, int64_t page, bool i64, bool misaligned, DType act, const std::string& what) {
  const int64_t T = 45, blocks = (2 * T) / page + 2;
  CacheMirror cm(format, blocks, page, 1.0f, misaligned ? 1 : 0, kDqk);
  Inputs in(T, act, misaligned ? 1 : 0);
  const std::vector<int64_t> slots = random_slots(T, cm.host.num_slots());
  // Device copy: every other skipped token carries a slot outside the cache instead of -1 (skipped too).
  std::vector<int64_t> dev_slots = slots;
  for (std::size_t i = 0, k = 0; i < dev_slots.size(); ++i)
    if (dev_slots[i] < 0 && (k++ % 2 == 1)) dev_slots[i] = cm.host.num_slots() + static_cast<int64_t>(i) * 1000;
  if (!i64)
    for (auto& s : dev_slots) s = std::min<int64_t>(s, std::numeric_limits<int32_t>::max());
  auto slot_tensor = [&](const std::vector<int64_t>& s) {
    return i64 ? test::int64_tensor(s) : test::int_tensor(std::vector<int32_t>(s.begin(), s.end()));
  };
  write_cache(in.kv_c, in.k_pe, slot_tensor(slots), cm.host, DsMlaScale::amax, test::reference_ctx());
  write_cache(in.kv.on_dev(in.kv_c), in.pe.on_dev(in.k_pe), slot_tensor(dev_slots).to(Device::cuda(0)), cm.dev);
  const std::vector<uint8_t> got = cm.dev_bytes_all(), want = cm.host_bytes_all();
  EXPECT_EQ(test::byte_diff(got, want), "") << what;
  if (got == want) return;
  // Which token and row byte first differ (bodies and slots are found through the CPU's view).
  const auto* base = static_cast<const uint8_t*>(cm.host_storage.data());
  for (std::size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    const int64_t blk = slots[t] / page, r = slots[t] % page;
    const int64_t page_at = static_cast<const uint8_t*>(cm.host.data.data) - base + blk * cm.host.data.stride[0];
    dispatch_record_cache_format(format, [&](auto fmt) {
      using Fmt = decltype(fmt);
      const int64_t body = page_at + Fmt::body_offset(r, cm.host.data.stride[1]);
      const int64_t slot = page_at + Fmt::slot_offset(page, r, cm.host.data.stride[1]);
      for (int64_t i = 0; i < Fmt::scale_offset(kLatent); ++i)
        if (got[body + i] != want[body + i]) {
          ADD_FAILURE() << what << ": token " << t << " (kind " << t % 8 << ") body byte " << i << ": got "
                        << int(got[body + i]) << " want " << int(want[body + i]);
          return;
        }
      for (int64_t i = 0; i < Fmt::kScaleSlot; ++i)
        if (got[slot + i] != want[slot + i]) {
          ADD_FAILURE() << what << ": token " << t << " (kind " << t % 8 << ") scale byte " << i << ": got "
                        << int(got[slot + i]) << " want " << int(want[slot + i]);
          return;
        }
    });
  }
}

TEST_P(RecordWriteGpu, MatchesCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, page, i64, misaligned] = GetParam();
  test::reseed(5000 + static_cast<uint64_t>(page) * 7 + static_cast<uint64_t>(format));
  check_write(format, page, i64, misaligned, DType::bf16, "bf16 inputs");
}

INSTANTIATE_TEST_SUITE_P(Records, RecordWriteGpu,
                         ::testing::Combine(::testing::Values(CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4),
                                            ::testing::Values(int64_t{1}, int64_t{3}, int64_t{64}, int64_t{256}),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_i64" : "_i32") +
                                  (std::get<3>(info.param) ? "_misaligned" : "");
                         });

// f16 and f32 activations (element-wise loads; v4's rope rounded to bf16 from them).
TEST(RecordWriteGpuEdge, F16AndF32ActivationsMatchCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(5500);
  for (CacheFormat f : {CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4})
    for (DType act : {DType::f16, DType::f32})
      check_write(f, 16, true, false, act, std::string(to_string(f)) + " " + to_string(act) + " inputs");
}

// ---- gathers ---------------------------------------------------------------------------------------------

GatherBatch make_batch(int64_t page, bool with_starts) {
  std::vector<int32_t> lens = {0, 5, static_cast<int32_t>(2 * page + 3), 1, 0, 37};
  std::vector<int32_t> starts(lens.size(), 0);
  if (with_starts) starts = {3, 0, static_cast<int32_t>(page - 1), static_cast<int32_t>(2 * page + 5), 7, 1};
  int64_t need = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) need = std::max<int64_t>(need, (starts[b] + lens[b] + page - 1) / page);
  return GatherBatch(lens, starts, page, std::max<int64_t>(need - 1, 1));  // the longest request overruns the table
}

Tensor table_tensor(const GatherBatch& g) {
  std::vector<std::vector<int32_t>> rows;
  for (int64_t b = 0; b < g.B(); ++b)
    rows.emplace_back(g.table.begin() + b * g.width, g.table.begin() + (b + 1) * g.width);
  return test::int_tensor_2d(rows);
}

// (format, page, seq_starts given, misaligned cache)
using RecordGatherParam = std::tuple<CacheFormat, int64_t, bool, bool>;
class RecordGatherGpu : public ::testing::TestWithParam<RecordGatherParam> {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device present";
    const auto [format, page, with_starts, misaligned] = GetParam();
    test::reseed(6000 + static_cast<uint64_t>(page) + (with_starts ? 7 : 0) + static_cast<uint64_t>(format) * 31);
    g = std::make_unique<GatherBatch>(make_batch(page, with_starts));
    cache = std::make_unique<CacheMirror>(format, g->num_blocks, page, 1.0f, misaligned ? 1 : 0, kDqk);
    cache->fill_slots(g->referenced_slots(), -40, 40);  // unreferenced blocks stay poisoned (NaN)
    cu = {2};
    for (int32_t l : g->lens) cu.push_back(cu.back() + l);
    tot = cu.back() + 4;
    table = table_tensor(*g);
    starts = test::int_tensor(g->starts);
  }
  TensorView starts_host() const { return std::get<2>(GetParam()) ? starts.view() : TensorView{}; }

  std::unique_ptr<GatherBatch> g;
  std::unique_ptr<CacheMirror> cache;
  Tensor table, starts;
  std::vector<int32_t> cu;
  int64_t tot = 0;
};

void expect_same(const Mirror& dst, DType dt, const std::string& what) {
  if (dt == DType::f16) {
    EXPECT_EQ(test::check_close(test::to_doubles(dst.dev), test::to_doubles(dst.host), dt, 0.0), "") << what;
  } else {
    EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), test::host_bytes(dst.host), static_cast<int>(dtype_size(dt))),
              "")
        << what;
  }
}

TEST_P(RecordGatherGpu, GatherCacheMatchesCpuBits) {
  MLA_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const Tensor td = table.to(gpu), sd = starts.to(gpu);
  const TensorView sdv = std::get<2>(GetParam()) ? sd.view() : TensorView{};
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int64_t d : {int64_t{kDqk}, int64_t{kLatent}}) {
      const std::string what = std::string("dst ") + to_string(dt) + ", d = " + std::to_string(d);
      Mirror dst(test::poisoned({tot, d + 8}, dt));  // rows past a request's end and outside the table stay NaN
      const TensorView dh = dst.host.view().slice(1, 0, d);
      gather_cache(cache->host, dh, table, test::int_tensor(cu), starts_host(), test::reference_ctx());
      gather_cache(cache->dev, dst.on_dev(dh), td, test::int_tensor(cu, gpu), sdv);
      expect_same(dst, dt, what);
    }
}

TEST_P(RecordGatherGpu, UpconvertMatchesCpuBits) {
  MLA_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const Tensor td = table.to(gpu), sd = starts.to(gpu);
  const TensorView sdv = std::get<2>(GetParam()) ? sd.view() : TensorView{};
  std::vector<int32_t> ws(cu.begin(), cu.end() - 1);
  const int64_t rows = cu.back();
  for (DType dt : {DType::bf16, DType::f32}) {
    Mirror dst(test::poisoned({rows, kDqk}, dt));
    upconvert_ds_mla(cache->host, dst.host, table, test::int_tensor(ws), starts_host(), test::reference_ctx());
    upconvert_ds_mla(cache->dev, dst.dev, td, test::int_tensor(ws, gpu), sdv);
    expect_same(dst, dt, std::string("upconvert to ") + to_string(dt));
  }
}

// Raw records (v41, v41_fp4: a row is one run of bytes; v4 is refused by the front end).
TEST_P(RecordGatherGpu, CpGatherCacheMatchesCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  if (page_row_bytes(cache->host.format) != 0) GTEST_SKIP() << "v4 rows are not one run of bytes";
  const Device gpu = Device::cuda(0);
  const Tensor td = table.to(gpu), sd = starts.to(gpu);
  const TensorView sdv = std::get<2>(GetParam()) ? sd.view() : TensorView{};
  const int64_t entry = cache->host.data.size(2);
  for (int64_t pad : {int64_t{16}, int64_t{1}}) {
    Mirror dst({tot, entry + pad}, DType::u8);
    std::memset(dst.host.data(), 0xC3, dst.host.nbytes());
    dst.sync();
    const TensorView dh = dst.host.view().slice(1, 0, entry);
    cp_gather_cache(cache->host, dh, table, test::int_tensor(cu), starts_host(), test::reference_ctx());
    cp_gather_cache(cache->dev, dst.on_dev(dh), td, test::int_tensor(cu, gpu), sdv);
    EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), test::host_bytes(dst.host)), "") << "pad " << pad;
  }
}

INSTANTIATE_TEST_SUITE_P(Records, RecordGatherGpu,
                         ::testing::Combine(::testing::Values(CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4),
                                            ::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}, int64_t{256}),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_starts" : "") +
                                  (std::get<3>(info.param) ? "_misaligned" : "");
                         });

// Written on the GPU, read back by the GPU's gather: the same values as the CPU's write + gather of the
// same inputs (the two halves composed, edge-value rows included).
TEST(RecordGpuRoundTrip, GpuWriteThenGatherEqualsCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(6600);
  const Device gpu = Device::cuda(0);
  for (CacheFormat f : {CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4}) {
    const int64_t T = 40, page = 64;
    CacheMirror cm(f, 1, page, 1.0f, 0, kDqk);
    Inputs in(T, DType::bf16, 0);
    std::vector<int64_t> slots(static_cast<std::size_t>(T));
    std::iota(slots.begin(), slots.end(), 0);
    write_cache(in.kv_c, in.k_pe, test::int64_tensor(slots), cm.host, DsMlaScale::amax, test::reference_ctx());
    write_cache(in.kv.on_dev(in.kv_c), in.pe.on_dev(in.k_pe), test::int64_tensor(slots, gpu), cm.dev);
    const Tensor table = test::int_tensor_2d({{0}});
    const std::vector<int32_t> cu = {0, static_cast<int32_t>(T)};
    Mirror dst(test::poisoned({T, kDqk}, DType::f32));
    gather_cache(cm.host, dst.host, table, test::int_tensor(cu), TensorView{}, test::reference_ctx());
    gather_cache(cm.dev, dst.dev, table.to(gpu), test::int_tensor(cu, gpu), TensorView{});
    expect_same(dst, DType::f32, to_string(f));
  }
}

// Ops that do not read records refuse a CUDA record cache by name before writing anything.
TEST(RecordGpuRefusals, OtherOpsRefuseCudaRecordCaches) {
  MLA_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const CacheBuffer v41 = allocate_cache(CacheFormat::v41, 2, 4, gpu, 1.0f, kDqk, kRope);
  const Tensor q = test::random_tensor({1, 1, 2, kDqk}, DType::bf16, gpu), bt = test::int_tensor_2d({{0}}).to(gpu),
               sl = test::int_tensor({3}, gpu);
  Tensor out = test::poisoned({1, 1, 2, kLatent}, DType::bf16, gpu);
  std::string e;
  try {
    mqa_decode(q.view(), v41.cache, bt.view(), sl.view(), out.view(), {}, 0.1, true, {});
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("mqa_decode: the v41 cache format (DeepSeek-V4 records)"), std::string::npos) << e;
  const Tensor q3 = test::random_tensor({1, 2, kDqk}, DType::bf16, gpu), idx = test::int_tensor_2d({{0, 1}}).to(gpu);
  Tensor o3 = test::poisoned({1, 2, kLatent}, DType::bf16, gpu);
  e.clear();
  try {
    sparse_mqa(q3.view(), v41.cache, idx.view(), {}, o3.view(), {}, 0.1);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("needs SparseOptions::values_include_rope"), std::string::npos) << e;
  const std::vector<double> o = test::to_doubles(o3.view());
  EXPECT_TRUE(std::isnan(o[0]));  // nothing written
}

}  // namespace
}  // namespace mla
