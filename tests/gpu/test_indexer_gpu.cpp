// SPDX-License-Identifier: Apache-2.0
// The lightning indexer on CUDA (docs/INDEXER.md) against the CPU backend and the float64 oracle:
//   cache write and gather: bytes equal to the CPU's (bf16 / f32 k, int32 / int64 slots, slot -1);
//   logits (every variant of indexer_logits): -inf positions exact, values within the fp8 rule
//     |got - ref| <= 2e-3 * sum_h |w| sum_d |q k| |s| (fp8 tensor-core sums keep ~14 bits) and vLLM's
//     calc_diff < 1e-5; s_q 1/2/3/4/5, pages 1/8/16/32/48/64/128/256, h 64/16/8/1, empty and ragged
//     rows, odd lengths, prefill ranges;
//   top-k: exactly the CPU's selection on the same logits (ties, NaN, +-inf, len <= k, k 1/7/2048,
//     rows of 100K); the pipeline's selection equals the oracle's up to near-ties;
//   an unaligned q falls back to portable; a block id outside the cache is never read (NaN logit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "gpu_test_util.h"
#include "mla/indexer.h"
#include "mla/variants.h"
#include "support/indexer_oracle.h"
#include "support/test_util.h"
#include "variant_test_util.h"

namespace mla {
namespace {

namespace ix = test::indexer;
using test::Mirror;

// dst (any float dtype, host) <- src values, rounded to dst's dtype.
void copy_convert(const Tensor& dst, const Tensor& src) {
  const std::vector<double> v = test::to_doubles(src);
  for (std::size_t i = 0; i < v.size(); ++i)
    num::store(static_cast<char*>(dst.data()) + i * dst.view().element_size(), dst.dtype(), v[i]);
}

IndexerKCache on_device(const IndexerKCache& host_cache, const Tensor& host_storage, const Tensor& dev_storage) {
  return IndexerKCache{test::rebase(host_cache.data, host_storage, dev_storage)};
}

TEST(IndexerCacheGpu, WriteAndGatherMatchCpu) {
  MLA_SKIP_WITHOUT_GPU();
  for (DType kt : {DType::bf16, DType::f32}) {
    for (DType st : {DType::i32, DType::i64}) {
      for (IndexerScale mode : {IndexerScale::ue8m0, IndexerScale::amax}) {
        SCOPED_TRACE(::testing::Message() << to_string(kt) << " " << to_string(st) << " mode " << static_cast<int>(mode));
        const int64_t page = 16, blocks = 9, T = 70;
        IndexerCacheBuffer hc = allocate_indexer_cache(blocks, page, Device::cpu());
        std::memset(hc.storage.data(), 0x5a, hc.storage.nbytes());
        Tensor dev_storage = hc.storage.to(Device::cuda(0));
        const IndexerKCache dc = on_device(hc.cache, hc.storage, dev_storage);
        // Rows of k with a row stride of 136 (padding); every third token skipped; a zero row; a huge row.
        Tensor kbuf = test::random_tensor({T, 136}, kt, Device::cpu(), -5, 5);
        const TensorView kh = kbuf.view().slice(1, 0, 128);
        fill(kh.select(0, 4), 0.0);
        fill(kh.select(0, 5), 1e6);
        std::vector<int64_t> slots;
        for (int64_t t = 0; t < T; ++t) slots.push_back(t % 3 == 2 ? -1 : (t * 7) % (blocks * page));
        Tensor sh = st == DType::i64 ? test::int64_tensor(slots) : test::int_tensor(std::vector<int32_t>(slots.begin(), slots.end()));
        Tensor kd = kbuf.to(Device::cuda(0));
        indexer_write_k(kh, sh, hc.cache, mode);
        indexer_write_k(test::rebase(kh, kbuf, kd), sh.to(Device::cuda(0)), dc, mode);
        ASSERT_EQ(test::byte_diff(test::host_bytes(dev_storage), test::host_bytes(hc.storage)), "");
        // Gather three requests (one empty) into a padded destination.
        Tensor bt = test::int_tensor_2d({{3, 1, 4, 0}, {8, 2, 6, 5}, {7, 0, 1, 2}});
        Tensor cu = test::int_tensor({2, 52, 52, 80});
        Tensor dkh = Tensor::empty({90, 144}, DType::u8), dsh = Tensor::empty({90}, DType::f32);
        std::memset(dkh.data(), 0x33, dkh.nbytes());
        fill(dsh, -1.0);
        Tensor dkd = dkh.to(Device::cuda(0)), dsd = dsh.to(Device::cuda(0));
        const TensorView dk_view = dkh.view().slice(1, 0, 128);
        indexer_gather_k(hc.cache, dk_view, dsh, bt, cu);
        indexer_gather_k(dc, test::rebase(dk_view, dkh, dkd), dsd, bt.to(Device::cuda(0)), cu.to(Device::cuda(0)));
        ASSERT_EQ(test::byte_diff(test::host_bytes(dkd), test::host_bytes(dkh)), "");
        ASSERT_EQ(test::byte_diff(test::host_bytes(dsd), test::host_bytes(dsh), 4), "");
      }
    }
  }
}

// The fp8 rule for logits: masks exact, values within 2e-3 of the magnitude bound, calc_diff < 1e-5.
void expect_logits_close(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& mag) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(ref[i])) {
      ASSERT_EQ(got[i], ref[i]) << "element " << i << ": masked positions are -inf";
      continue;
    }
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " = " << got[i] << ", oracle " << ref[i];
    ASSERT_LE(std::fabs(got[i] - ref[i]), 2e-3 * mag[i] + 1e-30)
        << "element " << i << ": got " << got[i] << ", oracle " << ref[i] << ", magnitude " << mag[i];
  }
  EXPECT_LT(ix::calc_diff(got, ref), 1e-5);
}

struct DecodeCase {
  std::vector<int32_t> lens;
  int64_t s_q, h, page;
};

class IndexerLogitsGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(IndexerLogitsGpu, DecodeMatchesOracle) {
  MLA_SKIP_WITHOUT_GPU();
  const std::string variant = GetParam();
  MLA_FORCE_VARIANT("indexer_logits", variant);
  const std::vector<DecodeCase> cases = {
      {{1000, 0, 64, 1}, 1, 64, 64},  {{300, 129, 7}, 2, 64, 16}, {{200, 2, 65}, 3, 64, 1},
      {{513, 130}, 5, 8, 64},         {{90, 91}, 1, 1, 16},       {{4100}, 1, 64, 64},
      // sm90_tma's page sizes: 8 (8 boxes per tile; 188 pages: the block-table window moves), 32, 128,
      // 256, 16 with G = 4 rows of 3; 48 (it declines: sm90 runs it); s_q 4 (two wgmma passes).
      {{777, 0, 1500, 64}, 1, 64, 8}, {{2049, 33}, 2, 64, 32},    {{700, 130, 1}, 4, 64, 128},
      {{300, 5}, 1, 64, 256},         {{333, 17}, 3, 64, 16},     {{250, 0}, 1, 16, 48},
  };
  uint64_t seed = 1;
  int ran = 0;
  std::string declined;
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "s_q " << c.s_q << " h " << c.h << " page " << c.page << " b " << c.lens.size());
    ix::DecodeProblem p = ix::make_decode_problem(c.lens, c.s_q, c.h, c.page, seed++, 0);
    p.width += 37;  // columns past every length: -inf
    const int64_t T = p.b * c.s_q;
    std::vector<double> ref, mag;
    ix::decode_oracle(p, ref, mag);
    Tensor cache_d = p.cache.storage.to(Device::cuda(0));
    Tensor lg = test::poisoned({T, p.width}, DType::f32, Device::cuda(0));
    // A case the forced variant declines (sm90: page 1 gives 132-byte blocks, not 16-byte aligned) is
    // skipped alone: the cases after it still run (a whole-test skip would hide the variant's later cases).
    try {
      indexer_logits_decode(p.q.to(Device::cuda(0)), p.weights.to(Device::cuda(0)),
                            on_device(p.cache.cache, p.cache.storage, cache_d), p.block_table.to(Device::cuda(0)),
                            p.seq_lens_t.to(Device::cuda(0)), c.s_q, lg);
    } catch (const VariantUnsupported& e) {
      declined += std::string(declined.empty() ? "" : "; ") + e.what();
      continue;
    }
    ++ran;
    test::expect_variant_ran("indexer_logits", variant);
    expect_logits_close(test::to_doubles(lg), ref, mag);
  }
  if (ran == 0) GTEST_SKIP() << declined;
  if (!declined.empty()) std::printf("[ declined ] %s\n", declined.c_str());
}

TEST_P(IndexerLogitsGpu, PrefillRaggedRanges) {
  MLA_SKIP_WITHOUT_GPU();
  const std::string variant = GetParam();
  MLA_FORCE_VARIANT("indexer_logits", variant);
  std::mt19937_64 g(21);
  for (int64_t h : {64, 5}) {
    const int64_t T = 13, Tk = 333;
    Tensor q = Tensor::empty({T, h, 128}, DType::fp8_e4m3), k = Tensor::empty({Tk, 128}, DType::fp8_e4m3);
    ix::fill_codes(static_cast<uint8_t*>(q.data()), T * h * 128, g);
    ix::fill_codes(static_cast<uint8_t*>(k.data()), Tk * 128, g);
    Tensor w = test::random_tensor({T, h}, DType::f32, Device::cpu(), -0.02, 0.02);
    Tensor s = test::random_tensor({Tk}, DType::f32, Device::cpu(), 1e-3, 4e-3);
    std::vector<int32_t> ks, ke;
    for (int64_t t = 0; t < T; ++t) {
      ks.push_back(static_cast<int32_t>((t * 37) % 200) - 10);
      ke.push_back(static_cast<int32_t>(ks.back() + (t * 53) % 190));
    }
    ke[3] = ks[3];  // an empty row
    ke[4] = Tk + 50;  // past the keys: clipped
    std::vector<double> ref(static_cast<std::size_t>(T * Tk), -std::numeric_limits<double>::infinity()), mag(ref.size(), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = std::max(ks[t], 0); j < std::min<int64_t>(ke[t], Tk); ++j) {
        const auto* qp = static_cast<const uint8_t*>(q.data()) + t * h * 128;
        const auto* wp = static_cast<const float*>(w.data()) + t * h;
        const auto* kp = static_cast<const uint8_t*>(k.data()) + j * 128;
        const float sj = static_cast<const float*>(s.data())[j];
        ref[static_cast<std::size_t>(t * Tk + j)] = ix::logit(qp, 128, wp, h, kp, sj);
        mag[static_cast<std::size_t>(t * Tk + j)] = ix::logit_magnitude(qp, 128, wp, h, kp, sj);
      }
    Tensor lg = test::poisoned({T, Tk}, DType::f32, Device::cuda(0));
    const Device d = Device::cuda(0);
    MLA_SKIP_IF_DECLINED(indexer_logits_prefill(q.to(d), w.to(d), k.to(d), s.to(d), test::int_tensor(ks, d),
                                                test::int_tensor(ke, d), lg));
    test::expect_variant_ran("indexer_logits", variant);
    expect_logits_close(test::to_doubles(lg), ref, mag);
  }
}

INSTANTIATE_TEST_SUITE_P(All, IndexerLogitsGpu, ::testing::ValuesIn(test::variants_of("indexer_logits")),
                         [](const auto& info) { return info.param; });

TEST(IndexerLogitsGpuEdge, UnalignedFallsBackAndBadBlocksAreNotRead) {
  MLA_SKIP_WITHOUT_GPU();
  ix::DecodeProblem p = ix::make_decode_problem({100, 50}, 1, 4, 16, 8);
  // q heads 136 bytes apart: sm90 declines, automatic selection runs portable.
  Tensor qpad = Tensor::empty({2, 4, 136}, DType::fp8_e4m3);
  std::memset(qpad.data(), 0, qpad.nbytes());
  for (int64_t i = 0; i < 8; ++i)
    std::memcpy(static_cast<uint8_t*>(qpad.data()) + i * 136, static_cast<uint8_t*>(p.q.data()) + i * 128, 128);
  Tensor qpad_d = qpad.to(Device::cuda(0));
  const TensorView qv = qpad_d.view().slice(2, 0, 128);
  Tensor cache_d = p.cache.storage.to(Device::cuda(0));
  const IndexerKCache dc = on_device(p.cache.cache, p.cache.storage, cache_d);
  Tensor lg = test::poisoned({2, p.width}, DType::f32, Device::cuda(0));
  indexer_logits_decode(qv, p.weights.to(Device::cuda(0)), dc, p.block_table.to(Device::cuda(0)),
                        p.seq_lens_t.to(Device::cuda(0)), 1, lg);
  EXPECT_EQ(last_variant("indexer_logits"), "portable");
  std::vector<double> ref, mag;
  ix::decode_oracle(p, ref, mag);
  expect_logits_close(test::to_doubles(lg), ref, mag);
  // A block id past the cache (request 1, block 2 covers positions 32..47): those logits are NaN on
  // every variant, the rest unchanged; memcheck sees no read outside the cache.
  std::vector<int32_t> bt = test::to_ints(p.block_table);
  bt[static_cast<std::size_t>(p.max_blocks + 2)] = 1 << 30;
  Tensor bt_d = test::int_tensor(bt, Device::cuda(0));
  const TensorView bt_view = bt_d.view().reshape({p.b, p.max_blocks});
  for (const std::string& v : test::variants_of("indexer_logits")) {
    if (!variant_runs_on_device("indexer_logits", v, 0)) continue;
    ForceVariant force("indexer_logits", v);
    Tensor lg2 = test::poisoned({2, p.width}, DType::f32, Device::cuda(0));
    indexer_logits_decode(p.q.to(Device::cuda(0)), p.weights.to(Device::cuda(0)), dc, bt_view,
                          p.seq_lens_t.to(Device::cuda(0)), 1, lg2);
    const std::vector<double> got = test::to_doubles(lg2);
    for (int64_t j = 0; j < p.width; ++j) {
      const double gv = got[static_cast<std::size_t>(p.width + j)];
      if (j >= 32 && j < 48) EXPECT_TRUE(std::isnan(gv)) << v << " position " << j;
      else if (j >= 50) EXPECT_EQ(gv, -std::numeric_limits<double>::infinity()) << v << " position " << j;
      else EXPECT_TRUE(std::isfinite(gv)) << v << " position " << j;
    }
  }
}

// Top-k on CUDA selects exactly what the CPU selects from the same logits.
TEST(IndexerTopkGpu, EqualsCpuOnSameLogits) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(31);
  const int64_t T = 9, N = 100000;
  Tensor lg = Tensor::empty({T, N}, DType::f32);
  float* v = static_cast<float*>(lg.data());
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < N; ++j) {
      const auto r = g() % 1000;
      float x;
      if (t == 0) x = static_cast<float>(static_cast<int>(g() % 50)) * 0.5f;                  // heavy ties
      else if (t == 1) x = 1000.0f + static_cast<float>(g() % 4096) * 0.0001f;                 // one exponent
      else x = std::ldexp(static_cast<float>(g() % 1000000) / 1e6f - 0.5f, static_cast<int>(g() % 20) - 10);
      v[t * N + j] = r < 5 ? special[r] : x;
    }
  const std::vector<int32_t> starts = {0, 10, 0, 500, 99990, 7, 0, 3, 0};
  const std::vector<int32_t> ends = {100000, 99000, 2048, 2000, 100000, 2055, 0, 70000, 4096};
  Tensor lg_d = lg.to(Device::cuda(0));
  for (int64_t K : {1, 7, 2048}) {
    SCOPED_TRACE(::testing::Message() << "k " << K);
    Tensor want = Tensor::empty({T, K}, DType::i32);
    indexer_topk(lg, test::int_tensor(starts), test::int_tensor(ends), want);
    Tensor got = test::poisoned({T, K}, DType::i32, Device::cuda(0));
    indexer_topk(lg_d, test::int_tensor(starts, Device::cuda(0)), test::int_tensor(ends, Device::cuda(0)), got);
    const std::vector<int32_t> gv = test::to_ints(got), wv = test::to_ints(want);
    for (int64_t t = 0; t < T; ++t)
      ASSERT_EQ(std::vector<int32_t>(gv.begin() + t * K, gv.begin() + (t + 1) * K),
                std::vector<int32_t>(wv.begin() + t * K, wv.begin() + (t + 1) * K))
          << "row " << t;
  }
  // Decode rows (causal ends from seq_lens), k = 2048.
  const int64_t s_q = 3, K = 2048;
  const std::vector<int32_t> lens = {100000, 2049, 1};
  Tensor want = Tensor::empty({T, K}, DType::i32), got = test::poisoned({T, K}, DType::i32, Device::cuda(0));
  indexer_topk_decode(lg, test::int_tensor(lens), s_q, want);
  indexer_topk_decode(lg_d, test::int_tensor(lens, Device::cuda(0)), s_q, got);
  EXPECT_EQ(test::to_ints(got), test::to_ints(want));
}

// The whole decode path on CUDA (logits, then top-k 2048) against the float64 oracle's selection.
TEST(IndexerTopkGpu, PipelineMatchesOracle) {
  MLA_SKIP_WITHOUT_GPU();
  ix::DecodeProblem p = ix::make_decode_problem({6000, 3000, 2100, 100}, 2, 64, 64, 55);
  const int64_t T = p.b * p.s_q, K = 2048;
  std::vector<double> ref, mag;
  ix::decode_oracle(p, ref, mag);
  const Device d = Device::cuda(0);
  Tensor cache_d = p.cache.storage.to(d);
  Tensor lg = Tensor::empty({T, p.width}, DType::f32, d), out = test::poisoned({T, K}, DType::i32, d);
  Tensor sl = p.seq_lens_t.to(d);
  indexer_logits_decode(p.q.to(d), p.weights.to(d), on_device(p.cache.cache, p.cache.storage, cache_d),
                        p.block_table.to(d), sl, p.s_q, lg);
  indexer_topk_decode(lg, sl, p.s_q, out);
  const std::vector<int32_t> got = test::to_ints(out);
  EXPECT_EQ(ix::check_decode_topk(p, ref, mag, got, K, 4e-3), "");
}

// indexer_prepare on CUDA (fp32 arithmetic) against the CPU's float64 reference: codes equal except a
// few neighbouring codes where fp32 crosses a rounding boundary, weights to fp32 rounding, k within
// fp32 sums (bf16 k_out: within bf16 rounding). bf16 and f32 inputs; a position outside the table
// gives NaN (never read).
TEST(IndexerPrepareGpu, MatchesCpuReference) {
  MLA_SKIP_WITHOUT_GPU();
  const Device d = Device::cuda(0);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool hadamard : {true, false}) {
      SCOPED_TRACE(::testing::Message() << to_string(dt) << " hadamard " << hadamard);
      ix::PrepareInputs in(37, 64);
      // Inputs rounded to dt on the host, so both backends see the same values.
      Tensor q(Tensor::empty({in.T, in.h, 128}, dt)), k(Tensor::empty({in.T, 128}, dt)), wr(Tensor::empty({in.T, in.h}, dt));
      copy_convert(q, in.q);
      copy_convert(k, in.k);
      copy_convert(wr, in.w_raw);
      Tensor codes = Tensor::empty({in.T, in.h, 128}, DType::fp8_e4m3), w = Tensor::empty({in.T, in.h}, DType::f32);
      Tensor kout = Tensor::empty({in.T, 128}, dt);
      indexer_prepare(q, k, wr, in.positions, in.cos_sin, in.ln_w, in.ln_b, codes, w, kout, 1e-6, hadamard,
                      test::reference_ctx());
      Tensor codes_d = test::poisoned({in.T, in.h, 128}, DType::u8, d), w_d = test::poisoned({in.T, in.h}, DType::f32, d);
      Tensor kout_d = test::poisoned({in.T, 128}, dt, d);
      indexer_prepare(q.to(d), k.to(d), wr.to(d), in.positions.to(d), in.cos_sin.to(d), in.ln_w.to(d), in.ln_b.to(d),
                      codes_d, w_d, kout_d, 1e-6, hadamard);
      const std::vector<uint8_t> cg = test::host_bytes(codes_d), cw = test::host_bytes(codes);
      int64_t mismatches = 0;
      for (std::size_t i = 0; i < cg.size(); ++i) {
        // 0x00 and 0x80 are both zero: a value the float64 sum puts at +0 and fp32 at a denormal -0 (or the reverse)
        // is the same code's value, not a neighbouring code.
        if (cg[i] == cw[i] || ((cg[i] | cw[i]) & 0x7f) == 0) continue;
        ++mismatches;
        ASSERT_EQ(std::abs(static_cast<int>(cg[i] & 0x7f) - static_cast<int>(cw[i] & 0x7f)), 1) << "code " << i;
      }
      EXPECT_LE(mismatches, static_cast<int64_t>(cg.size() / 500));
      const std::vector<double> wg = test::to_doubles(w_d), wc = test::to_doubles(w);
      for (std::size_t i = 0; i < wg.size(); ++i) ASSERT_NEAR(wg[i], wc[i], 1e-6 * std::fabs(wc[i])) << "weight " << i;
      const std::vector<double> kg = test::to_doubles(kout_d), kc = test::to_doubles(kout);
      for (std::size_t i = 0; i < kg.size(); ++i)  // bf16: the neighbouring value at most (2^-7 relative)
        ASSERT_NEAR(kg[i], kc[i], (dt == DType::bf16 ? std::fabs(kc[i]) / 128 : 0.0) + 1e-5) << "k " << i;
    }
  }
  // A position outside the table: that token's outputs are NaN, the others as before.
  ix::PrepareInputs in(3, 4);
  std::vector<int32_t> pos = test::to_ints(in.positions);
  pos[1] = static_cast<int32_t>(in.P) + 5;
  Tensor codes_d = Tensor::empty({3, 4, 128}, DType::u8, d), w_d = Tensor::empty({3, 4}, DType::f32, d);
  Tensor kout_d = Tensor::empty({3, 128}, DType::f32, d);
  indexer_prepare(in.q.to(d), in.k.to(d), in.w_raw.to(d), test::int_tensor(pos, d), in.cos_sin.to(d), in.ln_w.to(d),
                  in.ln_b.to(d), codes_d, w_d, kout_d);
  const std::vector<double> kg = test::to_doubles(kout_d), wg = test::to_doubles(w_d);
  EXPECT_TRUE(std::isnan(kg[128])) << "k of the token without a table row";
  EXPECT_TRUE(std::isfinite(kg[0]) && std::isfinite(kg[256]));
  EXPECT_TRUE(std::isfinite(wg[0]));
}

}  // namespace
}  // namespace mla
