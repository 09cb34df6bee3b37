// SPDX-License-Identifier: Apache-2.0
// CUDA mqa_decode against the CPU backend's float64 reference (DESIGN.md §5), every kernel variant
// (sm90_small, sm90_raw, sm90_seesaw, portable): every cache format, page sizes 1/16/32/64/128/256, h in {1..128},
// s_q 1..8, empty requests and lengths on / beside page boundaries, split-KV and the no-split fallback, strided /
// unaligned views, d_qk 320, narrow d_v, and garbage metadata that must not make the kernel read outside the cache
// or the block table. sm90_seesaw and sm90_convert read fp8_ds_mla rows as their bf16 upconvert (their oracle then
// reads test::upconverted_cache); every variant reads fp8 rows as exact codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_gpu_util.h"
#include "cuda/cuda_ops.h"
#include "runtime/device_api.h"
#include "mla/plan.h"
#include "unit/attention_test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

using test::PagedBatch;

constexpr double kScale = 0.0722;  // 1/sqrt(192)

// Whether the mqa_decode variant that ran last reads `format`'s rows as their bf16 upconvert (the sm90 seesaw
// kernel's fp8_ds_mla records: test::ran_upconverted; fp8 per-tensor rows are exact codes everywhere, as the oracle
// reads them); the float64 oracle then reads test::upconverted_cache, as the sparse tests do.
bool reads_upconverted(CacheFormat format, int64_t /*rows*/) { return test::ran_upconverted("mqa_decode", format); }

struct DecodeRun {
  Tensor out, lse;  // GPU results (bf16 out, fp32 lse)
  Tensor ref_out, ref_lse;  // CPU float64 oracle (f64 out, fp32 lse)
};

// Runs the oracle on the host cache and the CUDA op on a device copy; outputs are NaN-poisoned first.
// `use_workspace`: pass mqa_decode_workspace_bytes of scratch (false: none, for sizes that need none).
// `act`: the GPU's q / out dtype (q_host holds bf16 values, passed converted: attention_gpu_util.h).
DecodeRun run_decode(const Tensor& q_host, const Tensor& cache_storage, const KVCache& cache,
                     const Tensor& block_table, const Tensor& seq_lens, int64_t dv, bool causal,
                     bool use_workspace = true, DType act = DType::bf16) {
  const int64_t b = q_host.size(0), s_q = q_host.size(1), h = q_host.size(2);
  const Device gpu = Device::cuda(0);
  DecodeRun r;
  test::DeviceCache dc = test::to_device(cache_storage, cache);
  Tensor q = test::converted(q_host, act).to(gpu), bt = block_table.to(gpu), sl = seq_lens.to(gpu);
  r.out = test::poisoned({b, s_q, h, dv}, act, gpu);
  r.lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
  Tensor ws;
  const std::size_t need = mqa_decode_workspace_bytes(b, s_q, h, block_table.size(1) * cache.page_size(), gpu);
  if (use_workspace && need > 0) ws = Tensor::empty({static_cast<int64_t>(need)}, DType::u8, gpu);
  mqa_decode(q, dc.cache, bt, sl, r.out, r.lse, kScale, causal, ws.view(), Context{});
  cuda_rt::synchronize(0);
  // The oracle reads what the variant that ran reads (reads_upconverted).
  r.ref_out = test::poisoned({b, s_q, h, dv}, DType::f64);
  r.ref_lse = test::poisoned({b, s_q, h}, DType::f32);
  if (reads_upconverted(cache.format, s_q * h)) {
    const CacheBuffer up = test::upconverted_cache(cache);
    mqa_decode(q_host, up.cache, block_table, seq_lens, r.ref_out, r.ref_lse, kScale, causal, {}, test::reference_ctx());
  } else {
    mqa_decode(q_host, cache, block_table, seq_lens, r.ref_out, r.ref_lse, kScale, causal, {}, test::reference_ctx());
  }
  return r;
}

using SweepParam = std::tuple<CacheFormat, int64_t /*page*/, int64_t /*h*/, int64_t /*s_q*/, std::string /*variant*/>;
class DecodeGpuSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(DecodeGpuSweep, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, page, h, s_q, variant] = GetParam();
  MLA_FORCE_VARIANT("mqa_decode", variant);
  test::reseed(static_cast<uint64_t>(page * 1000 + h * 10 + s_q) + static_cast<uint64_t>(format) * 100000 + 7);
  const std::vector<int32_t> lens = test::boundary_lens(page, test::rng());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  PagedBatch pb = test::paged_batch(format, page, lens, (max_len + page - 1) / page + 1);
  Tensor q = test::random_tensor({static_cast<int64_t>(lens.size()), s_q, h, 576}, DType::bf16);
  DecodeRun r;
  MLA_SKIP_IF_DECLINED(r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true));
  test::expect_variant_ran("mqa_decode", variant);
  test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, "sweep");
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_page" + std::to_string(std::get<1>(info.param)) + "_h" +
         std::to_string(std::get<2>(info.param)) + "_sq" + std::to_string(std::get<3>(info.param)) + "_" +
         std::get<4>(info.param);
}

INSTANTIATE_TEST_SUITE_P(All, DecodeGpuSweep,
                         ::testing::Combine(::testing::ValuesIn(test::kDeviceFormats), ::testing::Values(1, 16, 64),
                                            ::testing::Values(1, 8, 16, 32, 64, 128), ::testing::Values(1, 2, 4),
                                            ::testing::ValuesIn(test::variants_of("mqa_decode"))),
                         sweep_name);

// Every page size (the sm90 kernels over bf16 load 64-key tiles as TMA boxes of min(page, 64) rows: one box per
// panel for pages >= 64, 64 / page boxes below) with s_q = 8 (causal limits differ per query row), a head
// count that is not a multiple of 8 (24 rows: the swapped kernel), 16 and 128 heads (64-row tiles).
INSTANTIATE_TEST_SUITE_P(Pages, DecodeGpuSweep,
                         ::testing::Combine(::testing::ValuesIn(test::kDeviceFormats),
                                            ::testing::Values(1, 16, 32, 64, 128, 256), ::testing::Values(3, 16, 128),
                                            ::testing::Values(8), ::testing::ValuesIn(test::variants_of("mqa_decode"))),
                         sweep_name);

// fp8 caches at page 128 (two 64-key tiles per page; the sm90 kernels' paged row sources) with s_q 1..4.
INSTANTIATE_TEST_SUITE_P(Fp8Page128, DecodeGpuSweep,
                         ::testing::Combine(::testing::Values(CacheFormat::fp8, CacheFormat::fp8_ds_mla), ::testing::Values(128),
                                            ::testing::Values(1, 16, 128), ::testing::Values(1, 2, 4),
                                            ::testing::ValuesIn(test::variants_of("mqa_decode"))),
                         sweep_name);

// Logits whose row maxima jump across 64-key tiles by more and by less than the lazy maximum's threshold
// (unit/attention_test_util.h logit_jump_scale: the sm90 kernels move a row's reference maximum only past
// tau = 8 in log2 units, so with the sweeps' small logits their O rescaling after the first tile never ran).
// bf16 and fp8_ds_mla rows (their magnitudes scale per row), the small, raw and seesaw kernels (16..256 rows
// per request), lengths that end in every phase of the pattern, NaN-poisoned pages past them.
using JumpParam = std::tuple<CacheFormat, int64_t /*h*/, int64_t /*s_q*/, std::string /*variant*/>;
class DecodeGpuLogitJumps : public ::testing::TestWithParam<JumpParam> {};

TEST_P(DecodeGpuLogitJumps, MatchesFloat64Oracle) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [format, h, s_q, variant] = GetParam();
  MLA_FORCE_VARIANT("mqa_decode", variant);
  test::reseed(static_cast<uint64_t>(h * 10 + s_q) + static_cast<uint64_t>(format) * 1000 + 17);
  const std::vector<int32_t> lens = {1500, 0, 65, 700, 1, 200};
  const int64_t page = 64;
  PagedBatch pb = test::paged_batch(format, page, lens, 1500 / page + 2);
  ASSERT_TRUE(test::scale_to_logit_jumps(pb));
  Tensor q = test::random_tensor({static_cast<int64_t>(lens.size()), s_q, h, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
  DecodeRun r;
  MLA_SKIP_IF_DECLINED(r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true));
  test::expect_variant_ran("mqa_decode", variant);
  test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, "logit jumps");
}

INSTANTIATE_TEST_SUITE_P(All, DecodeGpuLogitJumps,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8_ds_mla),
                                            ::testing::Values(16, 64, 128), ::testing::Values(1, 2),
                                            ::testing::ValuesIn(test::variants_of("mqa_decode"))),
                         [](const ::testing::TestParamInfo<JumpParam>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_sq" +
                                  std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
                         });

// Every variant on the explicit split counts of one long request pair, s_q 1..8 (split boundaries in
// whole 64-key tiles, the combine kernel merging partials that end mid-tile).
TEST(DecodeGpu, EveryVariantEverySqWithSplits) {
  MLA_SKIP_WITHOUT_GPU();
  for (const std::string& variant : test::variants_of("mqa_decode")) {
    if (!variant_runs_on_device("mqa_decode", variant, 0)) continue;
    ForceVariant force("mqa_decode", variant);
    int ran = 0;
    for (int64_t s_q = 1; s_q <= 8; ++s_q) {
      test::reseed(static_cast<uint64_t>(s_q) + 900);
      const std::vector<int32_t> lens = {1500, 77, 0, 1023};
      PagedBatch pb = test::paged_batch(CacheFormat::bf16, 32, lens, 48);
      Tensor q = test::random_tensor({4, s_q, 12, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
      DecodeRun r;
      try {
        r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true);
      } catch (const VariantUnsupported&) {
        continue;  // e.g. the small kernel past 32 rows, the raw kernel over a bf16 cache
      }
      ++ran;
      EXPECT_EQ(last_variant("mqa_decode"), variant);
      test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, variant + " s_q " + std::to_string(s_q));
    }
    // Every kernel that reads bf16 caches runs some of these s_q (the raw, converter and fp8-compute kernels read only
    // the code formats).
    if (variant != "sm90_raw" && variant != "sm90_convert" && variant != "sm90_fp8c") EXPECT_GT(ran, 0) << variant;
  }
}

// The sm90 balanced schedule with several segments per CTA (total cost well above one position per CTA):
// varlen requests with empty ones, split and unsplit requests, the query reloaded per segment, N 16 / 32
// (one and two epilogue exchange rounds) and 24 rows (h 3, s_q 8); NaN-poisoned pages past every length.
TEST(DecodeGpu, BalancedManySegments) {
  MLA_SKIP_WITHOUT_GPU();
  for (const auto& [h, s_q, page] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 1, 64}, {16, 2, 16}, {3, 8, 64}}) {
    test::reseed(static_cast<uint64_t>(h * 100 + s_q * 10 + page));
    std::vector<int32_t> lens(100);
    std::uniform_int_distribution<int32_t> u(1, 2000);
    for (std::size_t i = 0; i < lens.size(); ++i) lens[i] = i % 7 == 3 ? 0 : u(test::rng());
    PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, lens, 2000 / page + 2);
    Tensor q = test::random_tensor({100, s_q, h, 576}, DType::bf16);
    DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true);
    test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse,
                                 "h " + std::to_string(h) + " s_q " + std::to_string(s_q) + " [" +
                                     last_variant("mqa_decode") + "]");
  }
}

// Long contexts with few CTAs: many KV splits merged by the combine kernel; peaky attention (large q).
TEST(DecodeGpu, LongContextManySplits) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(11);
  const std::vector<int32_t> lens = {4096, 3001};
  for (CacheFormat f : test::kDeviceFormats) {
    PagedBatch pb = test::paged_batch(f, 64, lens, 65);
    Tensor q = test::random_tensor({2, 1, 16, 576}, DType::bf16, Device::cpu(), -4.0, 4.0);
    DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true);
    test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, to_string(f));
  }
}

// f16 / f32 q and out, every format, split and unsplit requests (the combine kernel writes the
// activation type too).
TEST(DecodeGpu, F16AndF32Activations) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(16);
  const std::vector<int32_t> lens = {0, 1, 17, 300, 1500};
  for (DType act : {DType::f16, DType::f32}) {
    for (CacheFormat f : test::kDeviceFormats) {
      PagedBatch pb = test::paged_batch(f, 16, lens, 95);
      Tensor q = test::random_tensor({5, 2, 16, 576}, DType::bf16);
      DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true, true, act);
      test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse,
                                   std::string(to_string(f)) + " " + to_string(act));
    }
  }
}

// Without a workspace the launcher runs one split per request (the kernel writes out / lse itself):
// same results as the split path.
TEST(DecodeGpu, NoWorkspaceFallbackMatchesSplitPath) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(12);
  const std::vector<int32_t> lens = {900, 0, 33, 1500};
  const int64_t b = 4, s_q = 2, h = 16, page = 16;
  PagedBatch pb = test::paged_batch(CacheFormat::fp8_ds_mla, page, lens, 95);
  Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16);
  DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true);
  test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, "split path");
  ASSERT_GT(mqa_decode_workspace_bytes(b, s_q, h, 95 * page, Device::cuda(0)), 0u) << "this size should split";

  // The front end insists on the workspace it sized; the backend entry point is where the fallback lives.
  const Device gpu = Device::cuda(0);
  test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
  Tensor qd = q.to(gpu), bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
  Tensor out = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu), lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
  const int splits = decode_num_splits(b, s_q, h, 95 * page, multiprocessor_count(gpu));
  ASSERT_GT(splits, 1);
  cuda::mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, {}, Context{}, splits, false, false);
  test::expect_attention_close(out, r.ref_out, lse, r.ref_lse, "no workspace");
  // A workspace one byte short of two splits also falls back.
  Tensor small = Tensor::empty({64}, DType::u8, gpu);
  fill(out.view(), NAN);
  cuda::mqa_decode(qd, dc.cache, bt, sl, out, {}, kScale, true, small.view(), Context{}, splits, false, false);
  test::expect_attention_close(out, r.ref_out, {}, {}, "tiny workspace");
}

// Twice as many CTAs as SMs: splitting cannot shorten the launch, so no workspace is needed at all.
TEST(DecodeGpu, LargeBatchNeedsNoWorkspace) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(13);
  const int64_t sms = cuda_rt::device_info(0).sm_count, b = 2 * sms, h = 32;
  EXPECT_EQ(mqa_decode_workspace_bytes(b, 1, h, 1 << 20, Device::cuda(0)), 0u);
  std::vector<int32_t> lens(static_cast<std::size_t>(b));
  std::uniform_int_distribution<int32_t> u(0, 80);
  for (auto& l : lens) l = u(test::rng());
  PagedBatch pb = test::paged_batch(CacheFormat::bf16, 16, lens, 6);
  Tensor q = test::random_tensor({b, 1, h, 576}, DType::bf16);
  DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true, false);
  test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, "large batch");
}

// A one-split call needs no workspace even where mqa_decode_workspace_bytes asks for the balanced
// schedule's partials (small batch, <= 32 query rows): without one the sm90 kernel runs the split
// schedule with one split; the result is the same within the rule (the Python op passes none).
TEST(DecodeGpu, OneSplitRunsWithoutTheBalancedWorkspace) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(29);
  const std::vector<int32_t> lens = {100, 128, 0, 64};  // <= 256 keys: the default policy's one split
  const int64_t b = static_cast<int64_t>(lens.size()), h = 16, s_q = 2, page = 64, max_blocks = 2;
  EXPECT_GT(mqa_decode_workspace_bytes(b, s_q, h, max_blocks * page, Device::cuda(0)), 0u);
  PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, lens, max_blocks);
  Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16);
  DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 512, true, false);
  test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, "one split, no workspace");
}

// Non-causal multi-token queries see the whole context; d_v < 512 (a partial 128-column tile) keeps the
// first columns; a head count that is not a multiple of anything.
TEST(DecodeGpu, NonCausalNarrowValues) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(14);
  const std::vector<int32_t> lens = {5, 70, 129, 0};
  for (CacheFormat f : test::kDeviceFormats) {
    PagedBatch pb = test::paged_batch(f, 16, lens, 10);
    Tensor q = test::random_tensor({4, 3, 5, 576}, DType::bf16);
    DecodeRun r = run_decode(q, pb.cb.storage, pb.cb.cache, pb.block_table, pb.seq_lens, 201, false);
    test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, std::string("non-causal ") + to_string(f));
  }
}

// Strided everything: q and out inside head- and column-padded storage (q rows not 16-byte aligned, so
// the element-copy path runs), lse through a transposed view, and the cache as one layer of a two-layer
// allocation with padded rows (bf16 / fp8 rows unaligned; fp8_ds_mla rows aligned but strided).
TEST(DecodeGpu, StridedAndUnalignedViews) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(15);
  const int64_t b = 3, s_q = 2, h = 6, page = 16, nb = 16, max_blocks = 10, d = 576, dv = 512;
  const std::vector<int32_t> lens = {40, 0, 150};  // 3 + 0 + 10 pages of the 16
  for (CacheFormat f : test::kDeviceFormats) {
    const int64_t entry = cache_entry_elems(f), pad = f == CacheFormat::fp8_ds_mla ? 16 : 5;
    Tensor storage = Tensor::empty({nb, 2, page, entry + pad}, cache_dtype(f));
    std::memset(storage.data(), 0xff, storage.nbytes());
    KVCache cache{storage.view().select(1, 1).slice(2, 0, entry), f, f == CacheFormat::fp8 ? 0.005f : 1.0f};
    validate_cache(cache);
    std::vector<std::vector<int32_t>> table(b);
    int32_t next = 0;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = 0; j < max_blocks; ++j) {
        const int64_t used = (lens[r] + page - 1) / page;
        table[r].push_back(j < used ? next++ : -1);
      }
    for (int64_t r = 0; r < b; ++r)
      for (int64_t pos = 0; pos < lens[r]; ++pos) test::randomize_row(cache, table[r][pos / page] * page + pos % page);
    Tensor bt = test::int_tensor_2d(table), sl = test::int_tensor(lens);

    Tensor q_store = test::random_tensor({b, s_q, h + 1, d + 5}, DType::bf16);
    TensorView q_view = q_store.view().slice(2, 1, h + 1).slice(3, 2, d + 2);
    Tensor q_host = Tensor::empty({b, s_q, h, d}, DType::bf16);
    copy(q_host.view(), q_view);
    const Device gpu = Device::cuda(0);
    test::DeviceCache dc = test::to_device(storage, cache);
    Tensor q_dev = q_store.to(gpu);
    TensorView qd = q_dev.view().slice(2, 1, h + 1).slice(3, 2, d + 2);
    Tensor out_store = test::poisoned({b, s_q, h, dv + 8}, DType::bf16, gpu);
    Tensor lse_store = test::poisoned({b, h, s_q}, DType::f32, gpu);
    TensorView out = out_store.view().slice(3, 0, dv), lse = lse_store.view().transpose(1, 2);
    Tensor btd = bt.to(gpu), sld = sl.to(gpu);
    const std::size_t need = mqa_decode_workspace_bytes(b, s_q, h, max_blocks * page, gpu);
    Tensor ws = need ? Tensor::empty({static_cast<int64_t>(need)}, DType::u8, gpu) : Tensor();
    mqa_decode(qd, dc.cache, btd, sld, out, lse, kScale, true, ws.view(), Context{});
    Tensor ref_out = test::poisoned({b, s_q, h, dv}, DType::f64), ref_lse = test::poisoned({b, s_q, h}, DType::f32);
    const bool upconverted = reads_upconverted(f, s_q * h);
    const CacheBuffer up = upconverted ? test::upconverted_cache(cache) : CacheBuffer{};
    mqa_decode(q_host, upconverted ? up.cache : cache, bt, sl, ref_out, ref_lse, kScale, true, {}, test::reference_ctx());
    const test::HostView out_h = test::to_host(out_store, out), lse_h = test::to_host(lse_store, lse);
    test::expect_attention_close(out_h.view, ref_out, lse_h.view, ref_lse, std::string("strided ") + to_string(f));
  }
}

// The generic latent width L = 256 (d_qk 320) for the formats that allow it.
TEST(DecodeGpu, LatentWidth256) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(16);
  const int64_t b = 2, s_q = 2, h = 20, page = 8, nb = 40, d = 320;
  const std::vector<int32_t> lens = {150, 9};
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    CacheBuffer cb = allocate_cache(f, nb, page, Device::cpu(), f == CacheFormat::fp8 ? 0.01f : 1.0f, d, 64);
    std::memset(cb.storage.data(), 0xff, cb.storage.nbytes());
    std::vector<std::vector<int32_t>> table = {{}, {}};
    for (int32_t j = 0; j < 20; ++j) table[0].push_back(39 - j);
    for (int32_t j = 0; j < 20; ++j) table[1].push_back(j < 2 ? j : -1);
    for (int64_t r = 0; r < b; ++r)
      for (int64_t pos = 0; pos < lens[r]; ++pos) test::randomize_row(cb.cache, table[r][pos / page] * page + pos % page);
    Tensor q = test::random_tensor({b, s_q, h, d}, DType::bf16);
    DecodeRun r =
        run_decode(q, cb.storage, cb.cache, test::int_tensor_2d(table), test::int_tensor(lens), 256, true);
    test::expect_attention_close(r.out, r.ref_out, r.lse, r.ref_lse, std::string("d_qk 320 ") + to_string(f));
  }
}

// One CTA per request streaming long contexts (no workspace: one split each, the uniform schedule): the
// sm90 small kernel's two stages cycle ~30 times per CTA; N 8 / 16 / 32 rows (h 3 x s_q 8: 24 rows), pages
// 64 and 16 (several TMA boxes per panel), lengths ending mid-tile (the last tile's zero-fill),
// NaN-poisoned pages past every length. The code formats: the raw kernel up to 32 rows (exact codes), the seesaw
// kernel at 64 / 128 heads (fp8_ds_mla through its bf16 upconvert, fp8 as exact codes); pages 1 / 16 / 64 / 128,
// against the float64 oracle on what the kernel reads. bf16 at 128 heads and at 64 heads x s_q 2: the TMA seesaw
// kernel's pairs (63, 34 and 1 tiles: odd and even counts, both barrier parities many times over).
TEST(DecodeGpu, SmallKernelLongStreams) {
  MLA_SKIP_WITHOUT_GPU();
  if (!variant_runs_on_device("mqa_decode", "sm90_seesaw", 0)) GTEST_SKIP() << "the sm90 kernels do not run here";
  const Device gpu = Device::cuda(0);
  using Case = std::tuple<CacheFormat, int64_t, int64_t, int64_t>;
  const CacheFormat bf = CacheFormat::bf16, ds = CacheFormat::fp8_ds_mla, f8 = CacheFormat::fp8;
  for (const auto& [f, h, s_q, page] :
       std::vector<Case>{{bf, 8, 1, 64}, {bf, 16, 1, 16}, {bf, 16, 2, 64}, {bf, 3, 8, 64}, {bf, 128, 1, 64}, {bf, 64, 2, 16},
                         {ds, 8, 1, 64}, {ds, 16, 1, 16},
                         {ds, 16, 2, 128}, {ds, 3, 8, 64}, {ds, 16, 1, 1}, {ds, 128, 1, 64}, {ds, 64, 2, 16},
                         {f8, 8, 1, 16}, {f8, 16, 1, 64}, {f8, 32, 1, 16}, {f8, 128, 1, 1}}) {
    test::reseed(static_cast<uint64_t>(h * 1000 + s_q * 10 + page) + static_cast<uint64_t>(f) * 100000);
    const std::vector<int32_t> lens = {4001, 2113, 64};
    const int64_t b = static_cast<int64_t>(lens.size());
    PagedBatch pb = test::paged_batch(f, page, lens, 4096 / page + 2);
    Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16, Device::cpu(), -3.0, 3.0);
    Tensor ref_out = test::poisoned({b, s_q, h, 512}, DType::f64), ref_lse = test::poisoned({b, s_q, h}, DType::f32);
    const bool upconverted = f == ds && test::sm90_ds_upconverts(h * s_q);
    const CacheBuffer up = upconverted ? test::upconverted_cache(pb.cb.cache) : CacheBuffer{};
    mqa_decode(q, upconverted ? up.cache : pb.cb.cache, pb.block_table, pb.seq_lens, ref_out, ref_lse, kScale, true, {},
               test::reference_ctx());
    test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
    Tensor qd = q.to(gpu), bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
    Tensor out = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu), lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
    cuda::mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, {}, Context{}, 1, false, false);
    EXPECT_EQ(last_variant("mqa_decode").rfind("sm90_", 0), 0u) << last_variant("mqa_decode");
    test::expect_attention_close(out, ref_out, lse, ref_lse,
                                 std::string(to_string(f)) + " h " + std::to_string(h) + " s_q " + std::to_string(s_q) +
                                     " page " + std::to_string(page));
  }
}

// Device metadata is not validated (it is not host-readable): seq_len beyond the table, negative
// lengths and block ids outside the cache must still keep every read inside the cache and the table
// (run under compute-sanitizer memcheck). Out-of-range pages are skipped; lengths are clamped.
TEST(DecodeGpu, GarbageMetadataStaysInBounds) {
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : test::kDeviceFormats) {
    SCOPED_TRACE(to_string(f));
    test::reseed(17);
    const int64_t b = 4, h = 16, page = 16, nb = 8, max_blocks = 3;
    CacheBuffer cb = allocate_cache(f, nb, page, Device::cpu());
    for (int64_t s = 0; s < nb * page; ++s) test::randomize_row(cb.cache, s);
    const std::vector<std::vector<int32_t>> table = {{0, 1, 2}, {7, 1000000, -5}, {3, 4, 5}, {-1, -1, -1}};
    const std::vector<int32_t> lens = {1 << 30, 40, -7, 48};
    const Device gpu = Device::cuda(0);
    test::DeviceCache dc = test::to_device(cb.storage, cb.cache);
    Tensor q = test::random_tensor({b, 1, h, 576}, DType::bf16, gpu);
    Tensor bt = test::int_tensor_2d(table, gpu), sl = test::int_tensor(lens, gpu);
    Tensor out = test::poisoned({b, 1, h, 512}, DType::bf16, gpu), lse = test::poisoned({b, 1, h}, DType::f32, gpu);
    const std::size_t need = mqa_decode_workspace_bytes(b, 1, h, max_blocks * page, gpu);
    Tensor ws = need ? Tensor::empty({static_cast<int64_t>(need)}, DType::u8, gpu) : Tensor();
    ASSERT_NO_THROW(mqa_decode(q, dc.cache, bt, sl, out, lse, kScale, true, ws.view(), Context{}));
    ASSERT_NO_THROW(cuda_rt::synchronize(0));
    const std::vector<double> o = test::to_doubles(out), l = test::to_doubles(lse);
    for (double x : o) ASSERT_TRUE(std::isfinite(x));
    // Request 2 (negative length) and 3 (no valid page) see no key; request 0 sees its whole table.
    for (int64_t hh = 0; hh < h; ++hh) {
      EXPECT_EQ(l[2 * h + hh], -INFINITY);
      EXPECT_EQ(l[3 * h + hh], -INFINITY);
      EXPECT_TRUE(std::isfinite(l[hh]));
    }
  }
}

}  // namespace
}  // namespace mla
