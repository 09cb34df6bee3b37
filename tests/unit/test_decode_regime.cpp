// SPDX-License-Identifier: Apache-2.0
// The sm90 regime rule (src/core/decode_regime.h): which kernel runs a decode or sparse problem and how its rows
// are tiled, for every format, row count, batch and context bound the rule distinguishes.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/decode_regime.h"

namespace mla {
namespace {

using decode_regime::choose;
using decode_regime::Regime;
using decode_regime::supports;
using decode_regime::tile_for;
using decode_regime::to_string;
using decode_regime::Kernel;
using decode_regime::Problem;

Problem dense(CacheFormat f, int64_t rows, int64_t b = 128, int64_t bound = 8192) {
  return {.format = f, .rows = rows, .batch = b, .context_bound = bound};
}
Problem sparse(CacheFormat f, int64_t h, int64_t t = 128) { return {.format = f, .rows = h, .batch = t, .sparse = true}; }

TEST(DecodeRegime, RowTilesFollowTheRowCount) {
  for (CacheFormat f : {CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    EXPECT_EQ(choose(dense(f, 1)).tile_rows, 8);
    EXPECT_EQ(choose(dense(f, 8)).tile_rows, 8);
    EXPECT_EQ(choose(dense(f, 9)).tile_rows, 16);
    EXPECT_EQ(choose(dense(f, 16)).tile_rows, 16);
    EXPECT_EQ(choose(dense(f, 17)).tile_rows, 32);
    EXPECT_EQ(choose(dense(f, 32)).tile_rows, 32);
    for (int64_t m : {1, 8, 16, 32}) {
      EXPECT_EQ(choose(dense(f, m)).kernel, Kernel::raw) << m;
      EXPECT_EQ(choose(dense(f, m)).m_tiles, 1);
    }
    EXPECT_EQ(choose(dense(f, 33)).kernel, Kernel::convert);
    EXPECT_EQ(choose(dense(f, 33)).m_tiles, 1);
    EXPECT_EQ(choose(dense(f, 64)).m_tiles, 1);
    EXPECT_EQ(choose(dense(f, 65)).m_tiles, 2);
    EXPECT_EQ(choose(dense(f, 128)).m_tiles, 2);  // h 128: the crossover's even tile count
    EXPECT_EQ(choose(dense(f, 256)).m_tiles, 4);  // s_q 2 h 128
    EXPECT_EQ(choose(dense(f, 1024)).tile_rows, 64);
    EXPECT_FALSE(choose(dense(f, 128)).stage1_panels);  // the code formats have no TMA stage
  }
}

TEST(DecodeRegime, Bf16DenseRowsOnTheSeesawTile) {
  const CacheFormat bf = CacheFormat::bf16;
  EXPECT_EQ(choose(dense(bf, 8)).kernel, Kernel::small);  // 8 rows: the N 8 tile at every batch
  EXPECT_EQ(choose(dense(bf, 8, 4, 1024)).kernel, Kernel::small);
  // 17..32 rows: one padded seesaw tile at every batch and context.
  for (int64_t m : {17, 24, 32})
    for (int64_t b : {1, 128})
      for (int64_t bound : {int64_t{1024}, int64_t{1} << 20}) {
        const auto r = choose(dense(bf, m, b, bound));
        EXPECT_EQ(r.kernel, Kernel::seesaw);
        EXPECT_EQ(r.tile_rows, 64);
        EXPECT_EQ(r.m_tiles, 1);
        EXPECT_TRUE(r.stage1_panels);  // more than 16 rows
      }
  // 9..16 rows: the seesaw tile for small batches with short contexts only.
  const auto small_batch = choose(dense(bf, 16, 4, 1024));
  EXPECT_EQ(small_batch.kernel, Kernel::seesaw);
  EXPECT_EQ(small_batch.tile_rows, 64);
  EXPECT_FALSE(small_batch.stage1_panels);  // 16 rows: one barrier per V half
  EXPECT_EQ(choose(dense(bf, 16, 16, 16384)).kernel, Kernel::seesaw);
  EXPECT_EQ(choose(dense(bf, 16, 17, 16384)).kernel, Kernel::small);
  EXPECT_EQ(choose(dense(bf, 16, 16, 16385)).kernel, Kernel::small);
  EXPECT_EQ(choose(dense(bf, 16, 8, int64_t{1} << 20)).kernel, Kernel::small);  // long contexts: balanced schedule
  EXPECT_EQ(choose(dense(bf, 16, 128, 4096)).tile_rows, 16);
  // More than 32 rows.
  EXPECT_EQ(choose(dense(bf, 64)).kernel, Kernel::seesaw);
  EXPECT_TRUE(choose(dense(bf, 128)).stage1_panels);
  EXPECT_EQ(choose(dense(bf, 128)).m_tiles, 2);
}

TEST(DecodeRegime, SparseRows) {
  for (int64_t h : {1, 8, 16, 32}) {
    EXPECT_EQ(choose(sparse(CacheFormat::bf16, h)).kernel, Kernel::small) << h;
    EXPECT_EQ(choose(sparse(CacheFormat::bf16, h, 1)).kernel, Kernel::small) << h;  // no padded tile for tokens
    EXPECT_EQ(choose(sparse(CacheFormat::fp8_ds_mla, h)).kernel, Kernel::raw) << h;
  }
  EXPECT_EQ(choose(sparse(CacheFormat::bf16, 32)).tile_rows, 32);
  for (int64_t h : {33, 64, 100, 128}) {
    const auto r = choose(sparse(CacheFormat::bf16, h));
    EXPECT_EQ(r.kernel, Kernel::seesaw);
    EXPECT_FALSE(r.stage1_panels);  // gathered rows: no paged TMA stage
    EXPECT_EQ(choose(sparse(CacheFormat::fp8_ds_mla, h)).kernel, h <= 64 ? Kernel::convert : Kernel::seesaw) << h;
  }
  EXPECT_EQ(choose(sparse(CacheFormat::fp8_ds_mla, 128)).m_tiles, 2);
}

// The converter kernel: the code formats (sparse: fp8_ds_mla), 64-row tiles; the rule takes it above 32 rows for fp8
// per-tensor (mqa_decode), and for fp8_ds_mla at 33..64 rows and above where its small-T split splits the call, never
// for a batch-invariant launch (the seesaw kernel's).
TEST(DecodeRegime, ConverterKernelReadsTheCodeFormats) {
  EXPECT_EQ(supports(dense(CacheFormat::fp8, 128), Kernel::convert), nullptr);
  EXPECT_EQ(supports(dense(CacheFormat::fp8, 8), Kernel::convert), nullptr);  // one padded tile
  EXPECT_EQ(supports(dense(CacheFormat::fp8_ds_mla, 128), Kernel::convert), nullptr);
  EXPECT_EQ(supports(sparse(CacheFormat::fp8_ds_mla, 64), Kernel::convert), nullptr);
  EXPECT_NE(supports(dense(CacheFormat::bf16, 128), Kernel::convert), nullptr);
  EXPECT_NE(supports(sparse(CacheFormat::bf16, 128), Kernel::convert), nullptr);
  EXPECT_NE(supports(sparse(CacheFormat::fp8, 128), Kernel::convert), nullptr);
  Problem inv = dense(CacheFormat::fp8, 128);
  inv.batch_invariant = true;
  EXPECT_NE(supports(inv, Kernel::convert), nullptr);
  const Regime r = tile_for(dense(CacheFormat::fp8, 128), Kernel::convert);
  EXPECT_EQ(r.tile_rows, 64);
  EXPECT_EQ(r.m_tiles, 2);
  EXPECT_FALSE(r.stage1_panels);
  for (int64_t m : {1, 16, 32, 33, 64, 128, 256}) {
    EXPECT_EQ(choose(dense(CacheFormat::fp8, m)).kernel, m > 32 ? Kernel::convert : Kernel::raw) << m;
    EXPECT_EQ(choose(inv).kernel, Kernel::seesaw);
    const Kernel ds = m <= 32 ? Kernel::raw : m <= 64 ? Kernel::convert : Kernel::seesaw;  // one row tile converts
    EXPECT_EQ(choose(dense(CacheFormat::fp8_ds_mla, m)).kernel, ds) << m;
    EXPECT_EQ(choose(sparse(CacheFormat::fp8_ds_mla, m)).kernel, ds) << m;
    Problem ds_inv = sparse(CacheFormat::fp8_ds_mla, m);
    ds_inv.batch_invariant = true;
    EXPECT_NE(choose(ds_inv).kernel, Kernel::convert) << m;
    Problem ds_split = sparse(CacheFormat::fp8_ds_mla, m, 8);  // the converter's small-T split splits it
    ds_split.convert_splits = true;
    EXPECT_EQ(choose(ds_split).kernel, m > 32 ? Kernel::convert : Kernel::raw) << m;
    ds_split.batch_invariant = true;
    EXPECT_NE(choose(ds_split).kernel, Kernel::convert) << m;
  }
  EXPECT_EQ(choose(dense(CacheFormat::fp8, 128)).m_tiles, 2);
  EXPECT_STREQ(to_string(Kernel::convert), "convert");
}

// The fp8-compute kernel: fp8 per-tensor mqa_decode only, and only when the call asks for fp8 compute; then the rule
// takes it above 32 rows (not batch-invariant), the raw kernel below.
TEST(DecodeRegime, Fp8ComputeKernelOnlyWhenAsked) {
  Problem asked = dense(CacheFormat::fp8, 128);
  asked.fp8_compute = true;
  EXPECT_EQ(supports(asked, Kernel::fp8c), nullptr);
  EXPECT_NE(supports(dense(CacheFormat::fp8, 128), Kernel::fp8c), nullptr);
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    Problem other = dense(f, 128);
    other.fp8_compute = true;
    EXPECT_NE(supports(other, Kernel::fp8c), nullptr) << to_string(f);
    EXPECT_NE(choose(other).kernel, Kernel::fp8c) << to_string(f);
  }
  Problem sp = sparse(CacheFormat::fp8, 128);
  sp.fp8_compute = true;
  EXPECT_NE(supports(sp, Kernel::fp8c), nullptr);
  Problem inv = asked;
  inv.batch_invariant = true;
  EXPECT_NE(supports(inv, Kernel::fp8c), nullptr);
  EXPECT_EQ(choose(inv).kernel, Kernel::seesaw);
  for (int64_t m : {1, 16, 32, 33, 64, 128, 256}) {
    Problem a = dense(CacheFormat::fp8, m);
    a.fp8_compute = true;
    EXPECT_EQ(choose(a).kernel, m > 32 ? Kernel::fp8c : Kernel::raw) << m;
    EXPECT_EQ(choose(dense(CacheFormat::fp8, m)).kernel, m > 32 ? Kernel::convert : Kernel::raw) << m;
  }
  const Regime r = tile_for(asked, Kernel::fp8c);
  EXPECT_EQ(r.tile_rows, 64);
  EXPECT_EQ(r.m_tiles, 2);
  EXPECT_STREQ(to_string(Kernel::fp8c), "fp8c");
}

// sparse_mqa with DeepSeek-V4 options: the converter kernel over record caches only, at any head count and batch,
// batch-invariant launches included (one CTA per row tile and token); every other kernel declines.
TEST(DecodeRegime, DeepSeekV4OptionsTakeTheConverter) {
  for (CacheFormat f : {CacheFormat::v4, CacheFormat::v41, CacheFormat::v41_fp4})
    for (int64_t m : {1, 16, 64, 72, 128})
      for (bool inv : {false, true}) {
        Problem p = sparse(f, m);
        p.v4 = true;
        p.batch_invariant = inv;
        const Regime r = choose(p);
        EXPECT_EQ(r.kernel, Kernel::convert) << m;
        EXPECT_EQ(r.tile_rows, 64);
        EXPECT_EQ(r.m_tiles, (m + 63) / 64);
        EXPECT_EQ(supports(p, Kernel::convert), nullptr);
        for (Kernel k : {Kernel::small, Kernel::raw, Kernel::seesaw}) EXPECT_NE(supports(p, k), nullptr);
      }
  Problem bf = sparse(CacheFormat::bf16, 64);
  bf.v4 = true;  // V4 options over a bf16 or V3.2 cache: no sm90 kernel (the portable engine)
  EXPECT_NE(supports(bf, Kernel::convert), nullptr);
  Problem dense_v4 = dense(CacheFormat::v4, 64);
  dense_v4.v4 = true;
  EXPECT_NE(supports(dense_v4, Kernel::convert), nullptr);
  EXPECT_TRUE(decode_regime::is_record_format(CacheFormat::v41_fp4));
  EXPECT_FALSE(decode_regime::is_record_format(CacheFormat::fp8_ds_mla));
}

// A small step over a bf16 cache (mqa_decode, not batch-invariant) takes the small kernel at any row count: the
// planned splits of every row tile fit in one wave and each split has at most 4 key tiles.
TEST(DecodeRegime, SmallStepsTakeTheSmallKernel) {
  auto step = [](int64_t rows, int64_t b, int64_t keys, int splits) {
    Problem p = dense(CacheFormat::bf16, rows, b, keys);
    p.planned_splits = splits;
    p.sms = 132;
    return p;
  };
  EXPECT_EQ(choose(step(16, 4, 1024, 8)).kernel, Kernel::small);  // the 9..16-row seesaw promotion yields
  const Regime h128 = choose(step(128, 1, 640, 5));                // 4 row tiles x 5 splits
  EXPECT_EQ(h128.kernel, Kernel::small);
  EXPECT_EQ(h128.tile_rows, 32);
  EXPECT_EQ(h128.m_tiles, 4);
  EXPECT_EQ(choose(step(64, 1, 8192, 32)).kernel, Kernel::small);   // 2 x 32 CTAs, 4 tiles a split
  EXPECT_EQ(choose(step(128, 8, 640, 5)).kernel, Kernel::small);    // 160 CTAs planned: the step's 4 splits
  EXPECT_EQ(choose(step(64, 1, 8192, 16)).kernel, Kernel::small);   // 8 tiles a split planned: the step's 32
  EXPECT_EQ(choose(step(96, 4, 4096, 16)).kernel, Kernel::seesaw);  // s_q 6 h 16: >= 16 splits of 12 row tiles
  EXPECT_EQ(choose(step(64, 8, 8192, 16)).kernel, Kernel::seesaw);  // >= 32 splits of 16 row tiles
  EXPECT_EQ(choose(step(16, 4, 1024, 1)).kernel, Kernel::seesaw);   // one split: no small step
  Problem inv = step(16, 4, 1024, 8);
  inv.batch_invariant = true;
  EXPECT_EQ(choose(inv).kernel, Kernel::small);  // by the row count alone (16 rows)
  EXPECT_EQ(choose([&] { Problem q = step(128, 1, 640, 5); q.batch_invariant = true; return q; }()).kernel,
            Kernel::seesaw);
  Problem fp8 = step(128, 1, 640, 5);
  fp8.format = CacheFormat::fp8;
  EXPECT_EQ(choose(fp8).kernel, Kernel::convert);  // code formats: their own kernels
  Problem sparse = step(128, 1, 640, 5);
  sparse.sparse = true;
  EXPECT_EQ(choose(sparse).kernel, Kernel::seesaw);
  EXPECT_FALSE(decode_regime::small_step(4, 1, 8, 1024, 0));  // SM count unknown
}

// The small step's splits: the planned ones when they make a step, else the count nearest them that does (at least
// ceil(tiles / 4), at most one wave), else none.
TEST(DecodeRegime, SmallStepSplitsTakeTheCountNearestThePlannedOne) {
  using decode_regime::small_step_splits;
  EXPECT_EQ(small_step_splits(4, 1, 8, 1024, 132), 8);     // planned: 32 CTAs of 2 tiles
  EXPECT_EQ(small_step_splits(8, 4, 5, 640, 132), 4);      // 160 CTAs planned: the wave's 4 (3 tiles a split)
  EXPECT_EQ(small_step_splits(8, 4, 2, 640, 132), 3);      // 5 tiles a split planned: ceil(10 / 4)
  EXPECT_EQ(small_step_splits(1, 2, 16, 8192, 132), 32);   // 8 tiles a split planned: ceil(128 / 4)
  EXPECT_EQ(small_step_splits(1, 2, 64, 8192, 132), 64);   // planned (2 tiles a split, 128 CTAs)
  EXPECT_EQ(small_step_splits(8, 2, 16, 8192, 132), 0);    // 32 splits of 16 row tiles: four waves
  EXPECT_EQ(small_step_splits(1, 1, 8, 1 << 20, 132), 0);  // 4096 splits: past kDecodeMaxSplits
  EXPECT_EQ(small_step_splits(1, 1, 1, 8192, 132), 0);     // one split planned: no step
  EXPECT_EQ(small_step_splits(1, 1, 8, 8192, 0), 0);       // SM count unknown
  for (int64_t b = 1; b <= 16; ++b)
    for (int64_t m_tiles : {1, 2, 4})
      for (int planned : {2, 5, 8, 16, 64})
        for (int64_t keys : {64, 640, 1024, 4096, 8192, 16384}) {
          const int s = small_step_splits(b, m_tiles, planned, keys, 132);
          if (s == 0) continue;
          EXPECT_TRUE(decode_regime::small_step(b, m_tiles, s, keys, 132)) << b << " " << m_tiles << " " << keys;
          EXPECT_LE(s, kDecodeMaxSplits);
        }
}

// The small kernel is forceable above 32 rows (row tiles of 32 over the heads); the rules never choose it there.
TEST(DecodeRegime, SmallKernelForcedAbove32RowsTakesRowTilesOf32) {
  for (int64_t m : {33, 64, 128, 256}) {
    const Problem p = dense(CacheFormat::bf16, m, 1, 640);
    EXPECT_EQ(supports(p, Kernel::small), nullptr) << m;
    EXPECT_NE(choose(p).kernel, Kernel::small) << m;
    const Regime r = tile_for(p, Kernel::small);
    EXPECT_EQ(r.tile_rows, 32) << m;
    EXPECT_EQ(r.m_tiles, (m + 31) / 32) << m;
    EXPECT_NE(supports(dense(CacheFormat::fp8, m), Kernel::small), nullptr) << m;  // code formats: the raw kernel
  }
}

TEST(DecodeRegime, DegenerateRowCountsTakeTheSmallestTile) {
  EXPECT_EQ(choose(dense(CacheFormat::bf16, 0)).tile_rows, 8);
  EXPECT_EQ(choose(dense(CacheFormat::bf16, -5)).m_tiles, 1);
  EXPECT_EQ(choose(dense(CacheFormat::fp8, int64_t{1} << 30)).m_tiles, 1 << 24);
}

}  // namespace
}  // namespace mla
