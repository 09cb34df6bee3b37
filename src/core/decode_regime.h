// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which sm90 attention kernel runs a decode or sparse problem, and how its rows are tiled: the rule the sm90
// launchers (src/cuda/attention/sm90/mqa_decode.cu, sparse_mqa.cu) execute. Pure host code with CPU tests
// (tests/unit/test_decode_regime.cpp); the design note (docs/design/attention_sm90.md) gives the measurements
// behind each threshold.
//
// The kernels (query rows per request m = s_q * h_q for mqa_decode, h_q for sparse_mqa, whose "requests" are
// tokens):
//   small   N-row tiles (N 8 / 16 / 32, the rows as wgmma N) over a bf16 cache: paged keys by TMA (mqa_decode)
//           or gathered rows (sparse_mqa); the balanced split-KV schedule for mqa_decode (core/decode_balance.h).
//   raw     N-row tiles over the code formats (fp8 per-tensor, fp8_ds_mla): the raw records staged in shared
//           memory and turned into wgmma operands by the consumers (exact codes).
//   seesaw  64-row tiles (m > 32; and padded small problems where it measured faster): two consumer
//           warpgroups splitting O by columns over a two-stage pipeline, with a key source per format.
//   convert 64-row tiles over the code formats (fp8 per-tensor: mqa_decode; fp8_ds_mla: mqa_decode and sparse_mqa)
//           and DeepSeek-V4's record caches (sparse_mqa with V4 options): a whole warpgroup converts the codes into a
//           stage (fp8: exact f16; fp8_ds_mla: the pinned bf16 upconvert; the records: f16 against a reference), an
//           S warpgroup and a second O warpgroup consume it (asymmetric registers).
//   fp8c    64-row tiles over an fp8 per-tensor cache (mqa_decode) with e4m3 products: Q and P rounded to e4m3, V^T
//           written by a transposer warpgroup (the fp8-compute bound, docs/SEMANTICS.md); only when the call asks
//           for fp8 compute.
//
// The rules:
//   - sparse_mqa with DeepSeek-V4 options (sink, extra cache, whole-row values) over record caches takes the
//     converter kernel (the only sm90 kernel that reads records, two lists and a sink); its one CTA per (row tile,
//     token) makes it batch-invariant as it stands.
//   - m <= 8 / 16 / 32 takes an N 8 / 16 / 32 tile, m > 32 ceil(m / 64) seesaw tiles.
//   - The code formats take the raw kernel up to 32 rows. Above: fp8 per-tensor (mqa_decode) the converter kernel
//     (nvidia-h200, b 128 s_k 4096: h 128 0.388 against the seesaw's 0.494 ms, h 64 0.216 against 0.244 ms, one
//     run). fp8_ds_mla (mqa_decode and sparse_mqa) takes the converter kernel at 33..64 rows (one row tile), reading
//     the seesaw's upconvert through fp8's chain (docs/design/fp8_64row_plan.md design E; nvidia-h200, h 64: dense
//     b 128 s_k 4096 0.247 against the seesaw's 0.270 ms, sparse T 128 topk 2048 0.139 against 0.153 ms; few tokens
//     through its own small-T split: T 8 / 32 35.6 / 71.6 us against the seesaw's split 39.1 / 89.9). Above 64 rows
//     the seesaw kernel (h 128: the converter converts each key once per row tile, and measured 1.03-1.05x slower),
//     except a sparse call the converter's small-T split splits (Problem::convert_splits: T 8 / 32 at h 128 48.8 /
//     96.1 us against the seesaw's 130 / 130). Every batch-invariant launch takes the seesaw kernel.
//   - With fp8 compute asked for, fp8 per-tensor mqa_decode above 32 rows takes the fp8-compute kernel; below, the
//     raw kernel's exact codes (its N 8 / 16 / 32 tiles are memory-bound: e4m3 products would not pay).
//   - A bf16 cache at 17..32 rows per request runs one padded seesaw tile: its stream is memory-bound at half
//     its rows, and it outran the N 32 small kernel 1.1..2x on every bf16 row measured.
//   - mqa_decode over a bf16 cache (not batch-invariant), any row count: a small step (small_step_splits: the
//     splits of every request's row tiles fit in one wave of CTAs and each split has at most kSmallStepTiles key
//     tiles, at the planned count or the one nearest it) takes the small kernel, which runs it as uniform splits with
//     a partial per consumer warpgroup (core/decode_schedule.h). nvidia-h200, graph-replayed: b 4 s_k 1024 h 16
//     17.8 against the seesaw's 20.8 us, b 1 s_k 640 h 128 23.9 against 31.1, b 1 s_k 8192 h 64 35.2 against 37.3.
//   - mqa_decode over a bf16 cache at 9..16 rows runs one padded seesaw tile for small batches with short
//     contexts (b <= kRows16SeesawBatch, context bound <= kRows16SeesawKeys): there the seesaw tile's uniform
//     split-KV schedule beat the small kernel's balanced one; larger batches and long contexts (where the
//     balanced schedule streams above copy speed) keep the small kernel. Sparse keeps the small kernel.
//   - Batch-invariant launches (PlannerConfig::batch_invariant) choose by the row count alone: the 9..16-row
//     promotion, which reads the batch and the context bound, is off, so those rows keep the small kernel
//     (the kernel of every batch larger than kRows16SeesawBatch).
//   - The seesaw kernel's stage 1 over a bf16 paged cache completes each panel on its own barrier when a
//     request has more than 16 rows (the h 64 / 128 rows), one barrier per V half otherwise.
#include <algorithm>
#include <cstdint>

#include "core/decode_balance.h"
#include "mla/cache.h"
#include "mla/plan.h"

namespace mla::decode_regime {

enum class Kernel { small, raw, seesaw, convert, fp8c };

inline constexpr int kSeesawRows = 64;               // rows of a seesaw tile
inline constexpr int64_t kRows16SeesawBatch = 16;    // mqa_decode, bf16, 9..16 rows: seesaw tile up to this batch
inline constexpr int64_t kRows16SeesawKeys = 16384;  // ... and up to this context bound (max_blocks * page_size)

struct Problem {
  CacheFormat format = CacheFormat::bf16;
  int64_t rows = 0;           // query rows per request: s_q * h_q (mqa_decode), h_q (sparse_mqa)
  int64_t batch = 0;          // requests (mqa_decode) or tokens (sparse_mqa)
  int64_t context_bound = 0;  // mqa_decode: max_blocks * page_size (the keys a request can have); sparse: unused
  bool sparse = false;
  bool batch_invariant = false;  // the kernel may depend on the request's shape only (not batch, context_bound)
  bool v4 = false;               // sparse_mqa with DeepSeek-V4 options (SparseOptions::any())
  bool fp8_compute = false;      // mqa_decode's fp8_compute: e4m3 products allowed (the fp8-compute bound)
  // sparse_mqa over fp8_ds_mla: the converter kernel's small-T split (core/sparse_split.h record_splits) splits this
  // call's units (the launcher asks the device: few tokens).
  bool convert_splits = false;
  int planned_splits = 0;  // mqa_decode: the call's split-KV count (0: unknown)
  int sms = 0;             // the device's SM count (0: unknown)
};

struct Regime {
  Kernel kernel = Kernel::small;
  int tile_rows = 8;   // 8, 16, 32 (small / raw) or 64 (seesaw)
  int m_tiles = 1;     // row tiles per request
  bool stage1_panels = false;  // seesaw over a bf16 paged cache: stage 1 completes per panel
};

inline constexpr int64_t kSmallStepTiles = 4;  // key tiles (64 keys) per split of a small step: two a warpgroup

// A small step of the row-stationary kernel: `batch` requests of `m_tiles` row tiles, each cut into `planned` splits
// of at most kSmallStepTiles key tiles of the length bound, fill at most one wave of `sms` CTAs.
inline constexpr bool small_step(int64_t batch, int64_t m_tiles, int planned, int64_t context_bound, int sms) {
  if (planned < 2 || context_bound <= 0 || sms <= 0) return false;
  const int64_t tiles = balance::tiles_of(context_bound);
  return (tiles + planned - 1) / planned <= kSmallStepTiles && batch * m_tiles * planned <= sms;
}

// The splits of the small step the problem makes, or 0 when it makes none: the planned splits when they make one;
// else, when the planned splits leave a split more than kSmallStepTiles key tiles or fill more than one wave, the
// count nearest them that makes one — at least ceil(tiles / kSmallStepTiles), at most the wave's
// sms / (batch x m_tiles) and kDecodeMaxSplits. The planner's split rule balances waves of 64-row CTAs; a small
// step's CTA is one split of one row tile, so its count is the step's own (nvidia-h200, graph-replayed: b 8 s_k 640
// h 128 on 4 splits 25.7 against the seesaw's 5 at 31.6 us; b 1 s_k 8192 h 64 on 32 splits 34.7 against 40.1).
inline constexpr int small_step_splits(int64_t batch, int64_t m_tiles, int planned, int64_t context_bound, int sms) {
  if (small_step(batch, m_tiles, planned, context_bound, sms)) return planned;
  if (planned < 2 || context_bound <= 0 || sms <= 0 || batch <= 0 || m_tiles <= 0) return 0;
  const int64_t tiles = balance::tiles_of(context_bound);
  const int64_t lo = (tiles + kSmallStepTiles - 1) / kSmallStepTiles;
  const int64_t hi = std::min<int64_t>(sms / (batch * m_tiles), kDecodeMaxSplits);
  const int64_t s = std::max<int64_t>(lo, std::min<int64_t>(planned, hi));
  return s <= hi && small_step(batch, m_tiles, static_cast<int>(s), context_bound, sms) ? static_cast<int>(s) : 0;
}

inline constexpr bool is_code_format(CacheFormat f) { return f == CacheFormat::fp8 || f == CacheFormat::fp8_ds_mla; }
inline constexpr bool is_record_format(CacheFormat f) {
  return f == CacheFormat::v4 || f == CacheFormat::v41 || f == CacheFormat::v41_fp4;
}

// Whether kernel k can run problem p at all (nullptr), else why not: what a forced variant may run. The small
// kernel reads bf16 caches at any row count (row tiles of 32 above 32 rows), the raw kernel the code formats up to
// 32 rows; the seesaw kernel every format at any row count (sparse_mqa: bf16 and fp8_ds_mla only, for all three
// kernels).
inline constexpr const char* supports(const Problem& p, Kernel k) {
  if (p.v4) {
    if (k != Kernel::convert) return "DeepSeek-V4 options (sink, extra cache, whole-row values): the converter kernel only";
    if (!p.sparse || !is_record_format(p.format))
      return "DeepSeek-V4 options on sm90: sparse_mqa over record caches (v4, v41, v41_fp4) only";
    return nullptr;
  }
  if (p.sparse && p.format == CacheFormat::fp8) return "sparse_mqa over an fp8 per-tensor cache: portable engine only";
  const bool codes = is_code_format(p.format);
  if (!codes && p.format != CacheFormat::bf16) return "bf16, fp8 and fp8_ds_mla caches only";
  switch (k) {
    case Kernel::small:  // above 32 rows: ceil(rows / 32) row tiles of 32, uniform split-KV (a forced variant)
      return codes ? "the small kernel reads bf16 caches (the code formats take the raw kernel)" : nullptr;
    case Kernel::raw:
      if (!codes) return "the raw kernel reads fp8 and fp8_ds_mla caches";
      return p.rows <= 32 ? nullptr : "the raw kernel takes at most 32 query rows per request";
    case Kernel::seesaw: return nullptr;
    case Kernel::convert:
      if (!codes) return "the converter kernel reads fp8 and fp8_ds_mla caches";
      if (p.batch_invariant) return "the converter kernel is not part of the batch-invariant rule";
      return nullptr;
    case Kernel::fp8c:
      if (!p.fp8_compute) return "the fp8-compute kernel runs only when fp8 compute is asked for (mqa_decode's fp8_compute)";
      if (p.format != CacheFormat::fp8 || p.sparse) return "the fp8-compute kernel reads fp8 per-tensor caches (mqa_decode)";
      if (p.batch_invariant) return "the fp8-compute kernel is not part of the batch-invariant rule";
      return nullptr;
  }
  return "unknown kernel";
}

// The tiling of problem p on kernel k (which supports it): N 8 / 16 / 32 tiles on the small and raw kernels, 64-row
// tiles (padded below 64) on the seesaw and converter kernels.
inline constexpr Regime tile_for(const Problem& p, Kernel k) {
  Regime r;
  const int64_t m = p.rows < 1 ? 1 : p.rows;
  r.kernel = k;
  r.tile_rows = k == Kernel::seesaw || k == Kernel::convert || k == Kernel::fp8c ? kSeesawRows : m <= 8 ? 8 : m <= 16 ? 16 : 32;
  r.m_tiles = static_cast<int>((m + r.tile_rows - 1) / r.tile_rows);
  r.stage1_panels = k == Kernel::seesaw && !p.sparse && p.format == CacheFormat::bf16 && m > 16;
  return r;
}

// The splits of the small step problem p makes on the small kernel's row tiles (0: none): the launcher's schedule,
// the regime rule and the workspace size take the same count.
inline constexpr int small_step_splits(const Problem& p) {
  return small_step_splits(p.batch, tile_for(p, Kernel::small).m_tiles, p.planned_splits, p.context_bound, p.sms);
}

// The kernel the rules above choose for problem p (rows >= 1; formats outside bf16 / fp8 / fp8_ds_mla are the
// launcher's to refuse).
inline constexpr Kernel preferred(const Problem& p) {
  if (p.v4) return Kernel::convert;
  const int64_t m = p.rows < 1 ? 1 : p.rows;
  if (!p.sparse && p.format == CacheFormat::bf16 && !p.batch_invariant && small_step_splits(p) > 0)
    return Kernel::small;  // a small step: uniform splits, a partial per consumer warpgroup (decode_schedule.h)
  if (m > 32) {
    if (!p.batch_invariant) {
      if (p.format == CacheFormat::fp8 && !p.sparse) return p.fp8_compute ? Kernel::fp8c : Kernel::convert;
      if (p.format == CacheFormat::fp8_ds_mla && (m <= 64 || p.convert_splits)) return Kernel::convert;
    }
    return Kernel::seesaw;
  }
  if (is_code_format(p.format)) return Kernel::raw;
  const bool small_batch = !p.batch_invariant && p.batch <= kRows16SeesawBatch && p.context_bound <= kRows16SeesawKeys;
  if (!p.sparse && (m > 16 || (m > 8 && small_batch)))
    return Kernel::seesaw;  // one padded 64-row tile
  return Kernel::small;
}

// The regime of problem p: its preferred kernel and that kernel's tiling.
inline constexpr Regime choose(const Problem& p) { return tile_for(p, preferred(p)); }

inline constexpr const char* to_string(Kernel k) {
  return k == Kernel::small    ? "small"
         : k == Kernel::raw    ? "raw"
         : k == Kernel::seesaw ? "seesaw"
         : k == Kernel::fp8c   ? "fp8c"
                               : "convert";
}

}  // namespace mla::decode_regime
