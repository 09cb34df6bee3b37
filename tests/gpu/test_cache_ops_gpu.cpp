// SPDX-License-Identifier: Apache-2.0
// write_cache, gather_cache, cp_gather_cache and upconvert_ds_mla on CUDA against the CPU backend
// (reference precision). All four are exact: cache bytes, fp8 codes and ds_mla scales, gathered bf16
// bits and raw bytes must equal the CPU's byte for byte, over the whole (poisoned) cache storage and
// destination buffers, so a stray write or an unwritten row shows. Covered: every format, page sizes
// 1/16/64, strided and misaligned views (the element-wise kernel variants), zero-length requests,
// unaligned seq_starts, positions outside the block table, device-side garbage (slots and block ids
// outside the cache: skipped on the GPU), conversion edge values, and offsets beyond 2^32 bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "cache_gpu_util.h"
#include "cache_quant_check.h"
#include "core/numeric.h"

namespace mla {
namespace {

using test::CacheMirror;
using test::random_slots;
using test::GatherBatch;
using test::Mirror;

std::string name_of(CacheFormat f) { return to_string(f); }

Tensor slot_tensor(const std::vector<int64_t>& slots, bool i64) {
  if (i64) return test::int64_tensor(slots);
  return test::int_tensor(std::vector<int32_t>(slots.begin(), slots.end()));
}

// ---- write_cache ------------------------------------------------------------------------------

// (format, page, int64 slots, ds pow2 scales, misaligned views)
using WriteParam = std::tuple<CacheFormat, int64_t, bool, bool, bool>;
class WriteCacheGpu : public ::testing::TestWithParam<WriteParam> {};

TEST_P(WriteCacheGpu, MatchesCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, page, i64, pow2, misaligned] = GetParam();
  test::reseed(1000 + page);
  const int64_t T = 37, pad = 3, blocks = (2 * T) / page + 2;
  CacheMirror cm(format, blocks, page, 0.04f, misaligned ? 1 : 0);
  // kv_c: columns [0, 512) of a wider buffer (row stride 600, or 603 + 1 element offset when misaligned);
  // k_pe: columns [520, 584) of a q-like buffer. Values up to +-20 with scale 0.04 saturate some fp8 codes.
  const int64_t kv_w = misaligned ? 603 : 600;
  Mirror kv(test::random_tensor({T + pad, kv_w}, DType::bf16, Device::cpu(), -20, 20));
  Mirror pe(test::random_tensor({T + pad, 584}, DType::bf16, Device::cpu(), -20, 20));
  const TensorView kv_c = kv.host.view().slice(1, misaligned ? 1 : 0, misaligned ? 513 : 512);
  const TensorView k_pe = pe.host.view().slice(1, 520, 584);

  const std::vector<int64_t> slots = random_slots(T, cm.host.num_slots());
  // Device copy: every other skipped token carries a slot outside the cache instead of -1, which the
  // kernel must skip too (the CPU front end would reject it, so the oracle sees -1).
  std::vector<int64_t> dev_slots = slots;
  for (std::size_t i = 0, k = 0; i < dev_slots.size(); ++i)
    if (dev_slots[i] < 0 && (k++ % 2 == 1)) dev_slots[i] = cm.host.num_slots() + static_cast<int64_t>(i) * 1000;
  if (!i64)
    for (auto& s : dev_slots) s = std::min<int64_t>(s, std::numeric_limits<int32_t>::max());
  const DsMlaScale mode = pow2 ? DsMlaScale::pow2 : DsMlaScale::amax;

  write_cache(kv_c, k_pe, slot_tensor(slots, i64), cm.host, mode, test::reference_ctx());
  write_cache(kv.on_dev(kv_c), pe.on_dev(k_pe), slot_tensor(dev_slots, i64).to(Device::cuda(0)), cm.dev, mode);
  EXPECT_EQ(test::byte_diff(cm.dev_bytes_all(), cm.host_bytes_all()), "");
}

INSTANTIATE_TEST_SUITE_P(Formats, WriteCacheGpu,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8,
                                                              CacheFormat::fp8_ds_mla),
                                            ::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return name_of(std::get<0>(info.param)) + "_page" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_i64" : "_i32") +
                                  (std::get<3>(info.param) ? "_pow2" : "_amax") +
                                  (std::get<4>(info.param) ? "_misaligned" : "");
                         });

// f16 / f32 activations (vLLM's cache write takes every activation dtype; CUDA reads them element-wise in
// write_act_kernel): every format, the two dtypes alone and mixed (kv_c f32 with k_pe f16), strided rows at an
// odd element offset, values past bf16's precision and past e4m3's range; bytes equal to the CPU writer's.
TEST(WriteCacheGpuEdge, F16AndF32ActivationsMatchCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(4242);
  const int64_t T = 41, page = 16, blocks = (2 * T) / page + 2;
  for (CacheFormat format : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla})
    for (auto [kv_t, pe_t] : {std::pair{DType::f16, DType::f16}, std::pair{DType::f32, DType::f32},
                              std::pair{DType::f32, DType::f16}}) {
      SCOPED_TRACE(std::string(to_string(format)) + " kv_c " + to_string(kv_t) + " k_pe " + to_string(pe_t));
      CacheMirror cm(format, blocks, page, 0.04f);
      Mirror kv(test::random_tensor({T, 515}, kv_t, Device::cpu(), -30, 30));
      Mirror pe(test::random_tensor({T, 67}, pe_t, Device::cpu(), -30, 30));
      const TensorView kv_c = kv.host.view().slice(1, 3, 515), k_pe = pe.host.view().slice(1, 1, 65);
      const std::vector<int64_t> slots = random_slots(T, cm.host.num_slots());
      write_cache(kv_c, k_pe, slot_tensor(slots, true), cm.host, DsMlaScale::amax, test::reference_ctx());
      write_cache(kv.on_dev(kv_c), pe.on_dev(k_pe), slot_tensor(slots, true).to(Device::cuda(0)), cm.dev);
      const std::vector<uint8_t> got = cm.dev_bytes_all(), want = cm.host_bytes_all();
      EXPECT_EQ(test::byte_diff(got, want), "");
      // Where a record differs: the token, the byte of its row and the input there (latent column or rope).
      const int64_t es = static_cast<int64_t>(cm.host.data.element_size());
      const int64_t base = (static_cast<const uint8_t*>(cm.host.data.data) -
                            static_cast<const uint8_t*>(cm.host_storage.data()));
      const int64_t row_bytes = cache_entry_bytes(format, cm.host.d_qk);
      for (std::size_t t = 0; t < slots.size(); ++t) {
        if (slots[t] < 0) continue;
        const int64_t at = base + (slots[t] / page) * cm.host.data.stride[0] * es + (slots[t] % page) * cm.host.data.stride[1] * es;
        for (int64_t i = 0; i < row_bytes; ++i)
          if (got[static_cast<std::size_t>(at + i)] != want[static_cast<std::size_t>(at + i)]) {
            std::string g, w;
            for (int64_t k = i; k < std::min(i + 8, row_bytes); ++k) {
              g += " " + std::to_string(got[static_cast<std::size_t>(at + k)]);
              w += " " + std::to_string(want[static_cast<std::size_t>(at + k)]);
            }
            ADD_FAILURE() << "token " << t << " slot " << slots[t] << " row byte " << i << ": got" << g << " want" << w
                          << "; k_pe[t][0..1] = " << test::to_doubles(pe.host)[t * 67 + 1] << ", "
                          << test::to_doubles(pe.host)[t * 67 + 2];
            break;
          }
      }
    }
}

// Conversion edge values through both quantising formats: infinities, NaN of both signs, the
// saturation boundary (448, 464 = tie to 480 -> saturates, 480, 1e6), e4m3 subnormals and their ties,
// signed zeros; ds_mla tiles that are all zero, hold an infinity, hold NaN (ignored by amax), or are
// so small that amax / 448 is a float subnormal (FLT_MIN floor).
TEST(WriteCacheGpuEdge, ConversionEdgeValuesMatchCpuCodes) {
  MLA_SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> specials = {inf,     -inf,   nan,      -nan,     448.f,    -448.f,   464.f,   -464.f,
                                       465.f,   480.f,  1e6f,     0.f,      -0.f,     0x1p-9f,  0x1p-10f, 0x3p-10f,
                                       0x5p-10f, 0x1p-6f, 0x0.fp-6f, 0x1.1p-6f, 0x1.08p-6f, 1.0625f, 1.1875f, -3.5f};
  for (CacheFormat format : {CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    for (DsMlaScale mode : {DsMlaScale::amax, DsMlaScale::pow2}) {
      const int64_t T = 6;
      Tensor kv = Tensor::empty({T, 512}, DType::bf16), pe = test::random_tensor({T, 64}, DType::bf16);
      auto* k = static_cast<uint16_t*>(kv.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < 512; ++i) {
          float v = specials[static_cast<std::size_t>((i + 7 * t) % specials.size())] * (t == 1 ? 0.25f : 1.0f);
          const int tile = static_cast<int>(i / 128);
          if (t >= 2) {  // ds_mla tile cases, rows 2..5
            if (tile == 0) v = 0.0f;                                 // all-zero tile
            else if (tile == 1 && t == 2) v = std::isnan(v) ? 1.0f : v;  // inf in the tile
            else if (tile == 1) v = std::isinf(v) ? 2.0f : v;        // NaN ignored by amax
            else if (tile == 2) v = 1e-38f * static_cast<float>(i % 5);  // amax/448 below FLT_MIN
            else v = static_cast<float>(i % 9) * 0.37f * (t == 5 ? 1e-30f : 1.0f);
          }
          k[t * 512 + i] = num::float_to_bf16(v);
        }
      CacheMirror cm(format, 2, 4, 1.0f);
      const std::vector<int64_t> slots = {0, 3, 5, 6, 1, 2};
      write_cache(kv, pe, test::int64_tensor(slots), cm.host, mode, test::reference_ctx());
      write_cache(kv.to(Device::cuda(0)), pe.to(Device::cuda(0)), test::int64_tensor(slots, Device::cuda(0)), cm.dev,
                  mode);
      EXPECT_EQ(test::byte_diff(cm.dev_bytes_all(), cm.host_bytes_all()), "")
          << to_string(format) << (mode == DsMlaScale::pow2 ? " pow2" : " amax");
    }
  }
}

// Every bf16 bit pattern quantised with many scales (fp8: the per-tensor scale, tiny, huge and
// subnormal ones included; fp8_ds_mla: tile scales from data spanning 1e-20..1e20 plus the patterns).
// The codes must equal the CPU's for all of them.
// Signaling NaNs are left out of the ds_mla tiles: the CPU's std::fmax (glibc, IEEE 754-2008 maxNum)
// returns NaN for a signaling NaN and so restarts its running amax, while the GPU's fmaxf skips every
// NaN as the writer's contract says (reported to the CPU backend's owner). Quiet NaNs stay in.
TEST(WriteCacheGpuEdge, AllBf16PatternsManyScales) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(123);
  const int64_t T = 65536 / 512;
  Tensor kv = Tensor::empty({T, 512}, DType::bf16);
  auto* k = static_cast<uint16_t*>(kv.data());
  for (int64_t i = 0; i < 65536; ++i) k[i] = static_cast<uint16_t>((i * 40503) & 0xffff);  // a permutation
  Tensor pe = test::random_tensor({T, 64}, DType::bf16);
  std::vector<int64_t> slots(T);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<float> scales = {1.0f, 0.04f, 3.0f, 1.0f / 3.0f, 0.1f, 7.77e-3f, 0x1p-60f, 0x1.fffffep-61f, 0x1p60f,
                               0x1.000002p60f, 1e-30f, 1e30f, 1.17549435e-38f, 1e-40f, 448.0f, 0x1.fffffep0f};
  std::uniform_real_distribution<double> lg(-70, 70);
  for (int i = 0; i < 24; ++i) scales.push_back(static_cast<float>(std::exp2(lg(test::rng()))));
  const Tensor kv_d = kv.to(Device::cuda(0)), pe_d = pe.to(Device::cuda(0));
  const Tensor slots_h = test::int64_tensor(slots), slots_d = slots_h.to(Device::cuda(0));
  for (float scale : scales) {
    CacheMirror cm(CacheFormat::fp8, 2, T, scale);
    write_cache(kv, pe, slots_h, cm.host, DsMlaScale::amax, test::reference_ctx());
    write_cache(kv_d, pe_d, slots_d, cm.dev);
    EXPECT_EQ(test::byte_diff(cm.dev_bytes_all(), cm.host_bytes_all()), "") << "scale " << scale;
  }
  for (DsMlaScale mode : {DsMlaScale::amax, DsMlaScale::pow2}) {
    // Tile amax over a wide range (bf16 holds up to ~3e38); 3e-17 puts tile scales on both sides of
    // 2^-64, where the writer switches from the reciprocal to IEEE division (cuda/cache/quant.cuh).
    for (double gain : {1.0, 1e-20, 3e-17, 1e20}) {
      Tensor kv2 = Tensor::empty({T, 512}, DType::bf16);
      auto* k2 = static_cast<uint16_t*>(kv2.data());
      std::uniform_real_distribution<double> u(-1, 1);
      auto signaling_nan = [](uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0 && (b & 0x40) == 0; };
      for (int64_t i = 0; i < 65536; ++i)
        k2[i] = i % 7 == 0 && !signaling_nan(k[i]) ? k[i] : num::float_to_bf16(static_cast<float>(u(test::rng()) * gain));
      CacheMirror cm(CacheFormat::fp8_ds_mla, 2, T);
      write_cache(kv2, pe, slots_h, cm.host, mode, test::reference_ctx());
      write_cache(kv2.to(Device::cuda(0)), pe_d, slots_d, cm.dev, mode);
      EXPECT_EQ(test::byte_diff(cm.dev_bytes_all(), cm.host_bytes_all()), "")
          << (mode == DsMlaScale::pow2 ? "pow2" : "amax") << " gain " << gain;
    }
  }
}

// Rows 320 wide (latent 256, rope 64; valid for bf16 and fp8): the warp kernel's one-step latent.
TEST(WriteCacheGpuEdge, NarrowRowsMatchCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(321);
  for (CacheFormat format : {CacheFormat::bf16, CacheFormat::fp8}) {
    const int64_t T = 37, page = 16, blocks = 4;
    CacheBuffer hc = allocate_cache(format, blocks, page, Device::cpu(), 0.04f, 320);
    std::memset(hc.storage.data(), test::kCachePoison, hc.storage.nbytes());
    const Tensor dev_storage = hc.storage.to(Device::cuda(0));
    KVCache dc = hc.cache;
    dc.data = test::rebase(hc.cache.data, hc.storage, dev_storage);
    const Tensor kv = test::random_tensor({T, 256}, DType::bf16, Device::cpu(), -20, 20);
    const Tensor pe = test::random_tensor({T, 64}, DType::bf16, Device::cpu(), -20, 20);
    const std::vector<int64_t> slots = random_slots(T, blocks * page);
    write_cache(kv, pe, test::int64_tensor(slots), hc.cache, DsMlaScale::amax, test::reference_ctx());
    write_cache(kv.to(Device::cuda(0)), pe.to(Device::cuda(0)), test::int64_tensor(slots, Device::cuda(0)), dc);
    EXPECT_EQ(test::byte_diff(test::host_bytes(dev_storage), test::host_bytes(hc.storage)), "") << to_string(format);
  }
}

// The writers' reciprocal division (src/cuda/cache/quant.cuh, claim (a)): for every one of the 2^23
// scale significands and every bf16 significand of both signs, the quotient equals IEEE x / s bit for
// bit, at exponents that put x / s at the ends of [2^-12, 2^11) (clamped form: below kClamp = 2^10)
// and the scale at the ends of its range [2^-64, 2^100].
TEST(CacheQuantGpu, RecipDivisionExactForEveryScaleSignificand) {
  MLA_SKIP_WITHOUT_GPU();
  struct Case {
    int e_s, e_x;
    bool clamped;
  };
  const Case cases[] = {{0, 0, false},     {0, -11, false},   {0, 10, false},    {-64, -75, false}, {-64, -54, false},
                        {99, 88, false},   {99, 109, false},  {37, 30, false},   {0, 0, true},      {0, -11, true},
                        {0, 9, true},      {-64, -75, true},  {-64, -55, true},  {99, 88, true},    {99, 108, true},
                        {-20, -25, true}};
  for (const Case& c : cases) {
    const test::RecipCheck r = test::recip_div_exhaustive(c.e_s, c.e_x, c.clamped);
    EXPECT_EQ(r.checked, uint64_t{256} << 23);
    EXPECT_EQ(r.mismatches, 0u) << "e_s " << c.e_s << " e_x " << c.e_x << (c.clamped ? " clamped" : "")
                                << ": first s " << r.s << " x " << r.x;
  }
}

// Claims (b)-(d): e4m3 codes of every bf16 pattern (zeros, subnormals, infinities, NaNs, huge and tiny
// quotients) through the reciprocal division equal those of IEEE division, for scales at the range's
// ends, with all-ones and all-zeros significands, and 4096 random ones across the range.
TEST(CacheQuantGpu, RecipDivisionCodesMatchIeee) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(4242);
  std::vector<float> scales = {0x1p-64f, 0x1.000002p-64f, 0x1.fffffep-64f, 0x1p100f, 0x1.fffffep99f, 1.0f, 0x1.fffffep0f,
                               0.04f, 3.0f, 1.0f / 3.0f, 448.0f, 1.0f / 448.0f, 7.77e-3f, 1e-4f, 0x1p-14f, 1e30f};
  std::uniform_int_distribution<int> e(-64, 99);
  std::uniform_int_distribution<uint32_t> m(0, (1u << 23) - 1);
  for (int i = 0; i < 4096; ++i) scales.push_back(std::ldexp(1.0f + static_cast<float>(m(test::rng())) * 0x1p-23f, e(test::rng())));
  for (bool clamped : {true, false}) {
    const test::RecipCheck r = test::recip_div_codes(scales, clamped);
    if (clamped) EXPECT_EQ(r.checked, uint64_t{65536} * scales.size());
    else EXPECT_GT(r.checked, uint64_t{16384} * scales.size());  // the x a tile of each scale can hold (> 20000)
    EXPECT_EQ(r.mismatches, 0u) << (clamped ? "clamped" : "tile") << ": first s " << r.s << " x " << r.x;
  }
}

// ---- gathers ----------------------------------------------------------------------------------

// Requests with zero lengths, unaligned starts, and one request running past the table's last column.
GatherBatch make_batch(int64_t page, bool with_starts) {
  std::vector<int32_t> lens = {0, 5, static_cast<int32_t>(2 * page + 3), 1, 0, 37};
  std::vector<int32_t> starts(lens.size(), 0);
  if (with_starts) starts = {3, 0, static_cast<int32_t>(page - 1), static_cast<int32_t>(2 * page + 5), 7, 1};
  int64_t need = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) need = std::max<int64_t>(need, (starts[b] + lens[b] + page - 1) / page);
  return GatherBatch(lens, starts, page, std::max<int64_t>(need - 1, 1));  // the longest request overruns
}

// Host block table [B, width] as a view inside a wider [B, width + 3] buffer (row stride != width).
struct Table {
  Mirror m;
  TensorView host;
  explicit Table(const GatherBatch& g) : m({g.B(), g.width + 3}, DType::i32) {
    auto* p = static_cast<int32_t*>(m.host.data());
    for (int64_t b = 0; b < g.B(); ++b)
      for (int64_t j = 0; j < g.width + 3; ++j)
        p[b * (g.width + 3) + j] = j < g.width ? g.table[static_cast<std::size_t>(b * g.width + j)] : 0;
    m.sync();
    host = m.host.view().slice(1, 0, g.width);
  }
  TensorView dev() const { return m.on_dev(host); }
};

// A 1-D int32 vector as a stride-2 view.
struct StridedVec {
  Mirror m;
  TensorView host;
  explicit StridedVec(const std::vector<int32_t>& v) : m({static_cast<int64_t>(2 * v.size() + 1)}, DType::i32) {
    auto* p = static_cast<int32_t*>(m.host.data());
    for (std::size_t i = 0; i < 2 * v.size() + 1; ++i) p[i] = i % 2 == 0 && i / 2 < v.size() ? v[i / 2] : -999;
    m.sync();
    const int64_t shape[1] = {static_cast<int64_t>(v.size())}, stride[1] = {2};
    host = TensorView(m.host.data(), DType::i32, shape, stride);
  }
  TensorView dev() const { return m.on_dev(host); }
};

// Device-only garbage: two table entries of the first request with rows replaced by block ids
// outside the cache. Returns the dst rows (cu-relative) they feed, whose expected bytes are poison.
std::set<int64_t> corrupt_table(Table& table, const GatherBatch& g, const std::vector<int32_t>& row0) {
  std::set<int64_t> rows;
  int64_t b = 0;
  while (b < g.B() && g.lens[static_cast<std::size_t>(b)] < 2) ++b;
  const int64_t cols[2] = {g.column(b, 0), g.column(b, g.lens[static_cast<std::size_t>(b)] - 1)};
  Tensor bad = Tensor::empty({table.m.host.size(0), table.m.host.size(1)}, DType::i32);
  std::memcpy(bad.data(), table.m.host.data(), bad.nbytes());
  auto* p = static_cast<int32_t*>(bad.data());
  p[b * table.m.host.size(1) + cols[0]] = -3;
  if (cols[1] >= 0) p[b * table.m.host.size(1) + cols[1]] = static_cast<int32_t>(g.num_blocks + 11);
  for (int64_t i = 0; i < g.lens[static_cast<std::size_t>(b)]; ++i) {
    const int64_t c = g.column(b, i);
    if (c == cols[0] || c == cols[1]) rows.insert(row0[static_cast<std::size_t>(b)] + i);
  }
  table.m.dev = bad.to(Device::cuda(0));
  return rows;
}

// Expected device result: the CPU's dst with the rows fed by corrupted table entries left as they were.
std::vector<uint8_t> expected_with_skips(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& before,
                                         const std::set<int64_t>& rows, int64_t row_bytes) {
  std::vector<uint8_t> e = cpu;
  for (int64_t r : rows)
    std::copy(before.begin() + r * row_bytes, before.begin() + (r + 1) * row_bytes, e.begin() + r * row_bytes);
  return e;
}

// (format, page, seq_starts given)
using GatherParam = std::tuple<CacheFormat, int64_t, bool>;
class GatherGpu : public ::testing::TestWithParam<GatherParam> {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device present";
    const auto [format, page, with_starts] = GetParam();
    test::reseed(2000 + page + (with_starts ? 7 : 0));
    g = std::make_unique<GatherBatch>(make_batch(page, with_starts));
    cache = std::make_unique<CacheMirror>(format, g->num_blocks, page, 0.03f);
    cache->fill_slots(g->referenced_slots());
    // cu = [2, 2 + l0, ...]: two leading rows and four trailing rows belong to no request.
    cu = {2};
    for (int32_t l : g->lens) cu.push_back(cu.back() + l);
    tot = cu.back() + 4;
    table = std::make_unique<Table>(*g);
    starts = std::make_unique<StridedVec>(g->starts);
  }
  TensorView seq_starts_host() const { return std::get<2>(GetParam()) ? starts->host : TensorView{}; }
  TensorView seq_starts_dev() const { return std::get<2>(GetParam()) ? starts->dev() : TensorView{}; }

  std::unique_ptr<GatherBatch> g;
  std::unique_ptr<CacheMirror> cache;
  std::unique_ptr<Table> table;
  std::unique_ptr<StridedVec> starts;
  std::vector<int32_t> cu;
  int64_t tot = 0;
};

// Every destination dtype vLLM's gather takes (bf16, f16, f32): bf16 and f32 equal the CPU bit for bit
// (one rounding of the dequantised value); f16 within one f16 quantum (DESIGN.md §5 rule: the GPU forms
// code * scale in float before rounding to f16, the CPU in double).
TEST_P(GatherGpu, GatherCacheMatchesCpuBits) {
  MLA_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (int64_t d : {int64_t{576}, int64_t{512}}) {
      SCOPED_TRACE(std::string("dst ") + to_string(dt) + ", d = " + std::to_string(d));
      // dst [tot, d] inside a [tot, d + 8] buffer, NaN-poisoned.
      Mirror dst(test::poisoned({tot, d + 8}, dt));
      const TensorView dh = dst.host.view().slice(1, 0, d);
      const std::vector<uint8_t> before = test::host_bytes(dst.host);
      gather_cache(cache->host, dh, table->host, test::int_tensor(cu), seq_starts_host(), test::reference_ctx());
      std::vector<int32_t> row0(cu.begin(), cu.end() - 1);
      const std::set<int64_t> skipped = corrupt_table(*table, *g, row0);
      gather_cache(cache->dev, dst.on_dev(dh), table->dev(), test::int_tensor(cu, Device::cuda(0)), seq_starts_dev());
      const int64_t es = static_cast<int64_t>(dtype_size(dt));
      const auto want = expected_with_skips(test::host_bytes(dst.host), before, skipped, es * (d + 8));
      if (dt == DType::f16) {
        Tensor w = Tensor::empty({tot, d + 8}, dt);
        std::memcpy(w.data(), want.data(), want.size());
        EXPECT_EQ(test::check_close(test::to_doubles(dst.dev), test::to_doubles(w), dt, 0.0), "");
      } else {
        EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), want, static_cast<int>(es)), "");
      }
      table->m.sync();  // restore the valid table for the next width
    }
  }
}

TEST_P(GatherGpu, CpGatherCacheMatchesCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t entry = cache->host.data.size(2);
  const DType dt = cache->host.data.dtype;
  for (int64_t pad : {int64_t{16}, int64_t{1}}) {  // pad 1: dst rows misaligned for 16-byte stores (u8)
    if (pad == 1 && dt == DType::bf16) continue;
    Mirror dst({tot, entry + pad}, dt);
    std::memset(dst.host.data(), 0xC3, dst.host.nbytes());
    dst.sync();
    const TensorView dh = dst.host.view().slice(1, 0, entry);
    cp_gather_cache(cache->host, dh, table->host, test::int_tensor(cu), seq_starts_host(), test::reference_ctx());
    cp_gather_cache(cache->dev, dst.on_dev(dh), table->dev(), test::int_tensor(cu, Device::cuda(0)), seq_starts_dev());
    EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), test::host_bytes(dst.host)), "") << "pad " << pad;
  }
}

TEST_P(GatherGpu, UpconvertMatchesCpuBits) {
  MLA_SKIP_WITHOUT_GPU();
  if (cache->host.format != CacheFormat::fp8_ds_mla) GTEST_SKIP() << "upconvert reads fp8_ds_mla caches";
  // Workspace starts: request b at rows [ws[b], ws[b+1]); the last runs to the end of dst.
  std::vector<int32_t> ws(cu.begin(), cu.end() - 1);
  const int64_t rows = cu.back();  // the last request ends exactly at dst's end
  for (DType dt : {DType::bf16, DType::f32}) {
    Mirror dst(test::poisoned({rows, 576}, dt));
    upconvert_ds_mla(cache->host, dst.host, table->host, test::int_tensor(ws), seq_starts_host(), test::reference_ctx());
    upconvert_ds_mla(cache->dev, dst.dev, table->dev(), test::int_tensor(ws, Device::cuda(0)), seq_starts_dev());
    EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), test::host_bytes(dst.host), static_cast<int>(dtype_size(dt))),
              "")
        << to_string(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GatherGpu,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8,
                                                              CacheFormat::fp8_ds_mla),
                                            ::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return name_of(std::get<0>(info.param)) + "_page" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_starts" : "");
                         });

// Misaligned cache storage (1 element offset): the element-wise gather variants.
TEST(GatherGpuEdge, MisalignedCacheMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(77);
  for (CacheFormat format : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    GatherBatch g = make_batch(16, true);
    CacheMirror cm(format, g.num_blocks, 16, 0.5f, 1);
    cm.fill_slots(g.referenced_slots());
    Table table(g);
    std::vector<int32_t> cu = {0};
    for (int32_t l : g.lens) cu.push_back(cu.back() + l);
    const Tensor st = test::int_tensor(g.starts);
    for (DType dt : {DType::bf16, DType::f32}) {
      Mirror dst(test::poisoned({cu.back(), 576}, dt));
      gather_cache(cm.host, dst.host, table.host, test::int_tensor(cu), st, test::reference_ctx());
      gather_cache(cm.dev, dst.dev, table.dev(), test::int_tensor(cu, Device::cuda(0)), st.to(Device::cuda(0)));
      EXPECT_EQ(test::byte_diff(test::host_bytes(dst.dev), test::host_bytes(dst.host), static_cast<int>(dtype_size(dt))),
                "")
          << to_string(format) << " -> " << to_string(dt);
    }
  }
}

// Byte offsets past 2^32 in the cache and past 2^31 in the destination: tokens written by the GPU
// into the last block of a 4.6 GB fp8_ds_mla cache, read back by all three gathers into the tail of
// a 2.3 GB workspace, must equal the CPU's rows of the same tokens in a small cache.
TEST(CacheGpuLarge, OffsetsBeyond32Bits) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(99);
  const int64_t page = 64, blocks = 110000, T = page;
  ASSERT_GT(blocks * page * 656, int64_t{1} << 32);
  CacheBuffer big = allocate_cache(CacheFormat::fp8_ds_mla, blocks, page, Device::cuda(0));
  CacheBuffer small = allocate_cache(CacheFormat::fp8_ds_mla, 1, page, Device::cpu());
  Tensor kv = test::random_tensor({T, 512}, DType::bf16, Device::cpu(), -2, 2);
  Tensor pe = test::random_tensor({T, 64}, DType::bf16);
  std::vector<int64_t> small_slots(T), big_slots(T);
  std::iota(small_slots.begin(), small_slots.end(), 0);
  for (int64_t i = 0; i < T; ++i) big_slots[static_cast<std::size_t>(i)] = (blocks - 1) * page + i;
  write_cache(kv, pe, test::int64_tensor(small_slots), small.cache, DsMlaScale::amax, test::reference_ctx());
  write_cache(kv.to(Device::cuda(0)), pe.to(Device::cuda(0)), test::int64_tensor(big_slots, Device::cuda(0)),
              big.cache);

  const Tensor bt_small = test::int_tensor_2d({{0}});
  const Tensor bt_big = test::int_tensor_2d({{static_cast<int32_t>(blocks - 1)}}, Device::cuda(0));
  // cp_gather: raw rows.
  Tensor raw = Tensor::empty({T, 656}, DType::u8, Device::cuda(0));
  cp_gather_cache(big.cache, raw, bt_big, test::int_tensor({0, static_cast<int32_t>(T)}, Device::cuda(0)));
  EXPECT_EQ(test::byte_diff(test::host_bytes(raw), test::host_bytes(small.storage)), "");
  // upconvert into the last T rows of a workspace whose byte offsets pass 2^31.
  const int64_t rows = (int64_t{1} << 31) / (2 * 576) + 2 * T;
  Tensor ws_dev = Tensor::empty({rows, 576}, DType::bf16, Device::cuda(0));
  Tensor ws_ref = test::poisoned({T, 576}, DType::bf16);
  upconvert_ds_mla(small.cache, ws_ref, bt_small, test::int_tensor({0}), {}, test::reference_ctx());
  upconvert_ds_mla(big.cache, ws_dev, bt_big, test::int_tensor({static_cast<int32_t>(rows - T)}, Device::cuda(0)));
  Tensor tail_host = Tensor::empty({T, 576}, DType::bf16);
  copy(tail_host, ws_dev.view().slice(0, rows - T, rows));
  EXPECT_EQ(test::byte_diff(test::host_bytes(tail_host), test::host_bytes(ws_ref), 2), "");
  // gather_cache of the same rows (dequantised, bf16).
  Tensor g_dev = Tensor::empty({T, 576}, DType::bf16, Device::cuda(0));
  Tensor g_ref = test::poisoned({T, 576}, DType::bf16);
  gather_cache(small.cache, g_ref, bt_small, test::int_tensor({0, static_cast<int32_t>(T)}), {}, test::reference_ctx());
  gather_cache(big.cache, g_dev, bt_big, test::int_tensor({0, static_cast<int32_t>(T)}, Device::cuda(0)));
  EXPECT_EQ(test::byte_diff(test::host_bytes(g_dev), test::host_bytes(g_ref), 2), "");
}

}  // namespace
}  // namespace mla
