// SPDX-License-Identifier: Apache-2.0
#pragma once
// The schedule of the fused quantising V up-projection (mla::up_project_quantized on CUDA,
// src/cuda/block/up_proj_quant.cu): how many token rows a CTA takes (the tile, one of the kernel's
// configurations) and across how many CTAs of a thread-block cluster the latent reduction is split. Pure
// host code (tests/unit/test_up_proj_schedule.cpp); the launcher asks it once per call with the device's SM
// count and whether the device has clusters (sm_90 and later).
//
// The work is units of (row tile, head, 128-column tile of V, split): `tile_rows` rows x 128 output columns
// over k_tiles / splits of the 32-wide latent steps. A split unit writes its fp32 partial tile into shared
// memory; its cluster sums the partials in rank order through distributed shared memory, so the result of
// a row depends on the split count (a different fp32 summation order, within the rule of docs/SEMANTICS.md
// §15), never on the values of the other rows.
//
// The model (docs/design/up_proj_quant.md): a decode-sized product is bound by the bytes each SM has to
// bring in, not by its flops. One unit streams
//   load   = k_span * (min(tile_rows, rows) + 128) * 2   bytes of o_lat and W_UV (bf16), k_span = 32 * ceil(k_tiles / splits)
//   mma    = 2 * tile_rows * 128 * k_span / kFlopsPerByte (mma.sync flops at the per-SM share of the DRAM stream)
//   reduce = min(tile_rows, rows) * 128 * 4                the fp32 partial rows a split unit reads from its cluster
// and the busiest SM takes ceil(units / sms) of them:
//   cost = ceil(units / sms) * (max(load, mma) + (splits > 1 ? reduce : 0)).
// The schedule is the candidate of least cost over tile_rows in {16, 64, 128} and splits in {1, 2, 4, 8}
// (at most max_splits and k_tiles); ties go to fewer splits, then fewer rows. On a device with the Hopper
// mainloop, the products where it was measured to win (hopper_fuses) take its 128-row tile unsplit instead. A decode-sized product thus
// fills the machine (b 1 h 16: 16 rows x 8 splits, 128 CTAs; b 64 h 16: 64 rows x 8 splits, 128 CTAs)
// while a large one keeps whole-latent 128-row tiles (no reduction, W_UV read once per 128 rows).
#include <cstdint>

namespace mla::up_proj {

inline constexpr int kTileRows[] = {16, 64, 128};   // the kernel's configurations (rows per CTA)
inline constexpr int kMaxSplits = 8;                // the portable cluster size
inline constexpr int kColumns = 128;                // output columns of a unit
inline constexpr int kStep = 32;                    // latent elements of one k tile
inline constexpr int64_t kFlopsPerByte = 128;       // mma.sync flops per DRAM byte an SM gets when all stream

struct Problem {
  int64_t rows = 0;       // tokens M (rows of o_lat)
  int64_t heads = 0;      // h
  int64_t col_tiles = 1;  // ceil(V / 128)
  int64_t k_tiles = 16;   // ceil(L / 32)
  int sms = 1;            // SMs of the device
  int max_splits = 1;     // 1 without thread-block clusters (before sm_90), else kMaxSplits
  bool hopper = false;    // the device runs the Hopper mainloop (sm_90a)
};

// Where the Hopper mainloop's 128-row tile, unsplit, beats cuBLAS's bmm + the quantize pass (nvidia-h200, one
// call: h 128 at 64 / 128 rows x0.936 / x0.902, at 32 rows x0.990; h 16 / 64 and fewer rows lose, more than 128
// rows not measured; docs/design/up_proj_quant.md §6): the schedule takes it there. The layer does not fuse on
// Hopper (Step::fused_rows: inside its step the fused call measured slower than the two passes, §7).
inline constexpr int64_t kHopperMinHeads = 128, kHopperMinRows = 64, kHopperMaxRows = 128;
inline bool hopper_fuses(int64_t rows, int64_t heads) {
  return heads >= kHopperMinHeads && rows >= kHopperMinRows && rows <= kHopperMaxRows;
}

struct Schedule {
  int tile_rows = 16;  // rows per CTA: 16, 64 or 128
  int splits = 1;      // CTAs (one cluster) sharing a unit's latent reduction: 1, 2, 4 or 8
  // The Hopper mainloop (sm_90a: wgmma from 128-byte-swizzled stages of kHopperStep latent columns; 64- or
  // 128-row tiles) instead of the mma.sync one. The epilogue, and so the bytes for exact sums, are the same.
  bool hopper = false;

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

inline constexpr int kHopperTileRows[] = {64, 128};  // the Hopper mainloop's configurations
inline constexpr int kHopperStep = 64;               // latent elements of one Hopper k tile

// The latent step of a schedule's mainloop, and its k tiles for a latent dimension L.
inline int step_of(const Schedule& s) { return s.hopper ? kHopperStep : kStep; }
inline int64_t k_tiles_of(const Schedule& s, int64_t L) { return (L + step_of(s) - 1) / step_of(s); }

// The latent steps of one split CTA: ceil(k_tiles / splits).
inline int64_t split_k_tiles(int64_t k_tiles, int splits) { return (k_tiles + splits - 1) / splits; }

// The model's cost of `s` for `p` (bytes of the busiest SM, see above).
inline int64_t cost(const Problem& p, const Schedule& s) {
  const int64_t m_tiles = (p.rows + s.tile_rows - 1) / s.tile_rows;
  const int64_t units = m_tiles * p.heads * p.col_tiles * s.splits;
  const int64_t sms = p.sms > 0 ? p.sms : 1;
  const int64_t rows = p.rows < s.tile_rows ? p.rows : s.tile_rows;
  const int64_t k_span = int64_t{kStep} * split_k_tiles(p.k_tiles, s.splits);
  const int64_t load = k_span * (rows + kColumns) * 2;
  const int64_t mma = 2 * int64_t{s.tile_rows} * kColumns * k_span / kFlopsPerByte;
  const int64_t reduce = s.splits > 1 ? rows * kColumns * 4 : 0;
  return (units + sms - 1) / sms * ((load > mma ? load : mma) + reduce);
}

// The least-cost schedule (ties: fewer splits, then fewer rows). No rows (padding only): one 16-row tile.
inline Schedule schedule(const Problem& p) {
  Schedule best;
  if (p.rows <= 0 || p.heads <= 0 || p.col_tiles <= 0 || p.k_tiles <= 0) return best;
  if (p.hopper && hopper_fuses(p.rows, p.heads)) return Schedule{128, 1, true};
  int64_t best_cost = -1;
  for (int splits = 1; splits <= kMaxSplits; splits *= 2) {
    if (splits > p.max_splits || splits > p.k_tiles) break;
    for (const int tile_rows : kTileRows) {
      const Schedule s{tile_rows, splits};
      const int64_t c = cost(p, s);
      if (best_cost < 0 || c < best_cost) best = s, best_cost = c;
    }
  }
  return best;
}

}  // namespace mla::up_proj
