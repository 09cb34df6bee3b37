// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-KV schedule of an sm90 mqa_decode launch: which of the kernels' three schedules runs and with how
// many splits. Pure host code with CPU tests (tests/unit/test_decode_schedule.cpp); the sm90 launcher
// (src/cuda/attention/sm90/mqa_decode.cu) gathers the facts (the device's SM count, how many clusters fit, the
// workspace it was given) and executes what this returns, deciding nothing itself (the balanced grid included).
//
//   uniform   one CTA per (split, row tile, request); with more than one split the partials go to the
//             workspace and the combine kernel merges them (no combine for one split).
//   balanced  the small kernel's cost-line schedule (core/decode_balance.h): `ctas` CTAs, each a window of
//             (request, key tile) positions; partials and the combine for the requests that a window cuts.
//   cluster   the seesaw kernel's 2..8 splits of a (request, row tile) as one thread-block cluster merging
//             through distributed shared memory: no workspace, no combine.
//
// The rules:
//   - the small kernel (bf16, up to 32 rows) takes the balanced schedule where it applies (small and medium
//     batches, balance::ctas_for) and the workspace holds it; but a batch whose host-known lengths are
//     near-uniform (the plan's whole_requests: one request per CTA is what the balanced schedule would run)
//     with one planned split runs uniform, without the combine launch that has nothing to merge.
//   - a small step on the small kernel (not batch-invariant): when the planned splits of the batch's row tiles fit
//     in one wave (decode_regime::small_step: batch x row tiles x splits <= SMs, each split at most 4 key tiles of the
//     host's length bound), it runs uniform with the planned splits and writes one partial per consumer warpgroup
//     (wg_partials: 2 x splits partials a request, straight from the accumulators) where the workspace holds them:
//     no balanced window scan, no exchange between the warpgroups; the combine merges the partials.
//   - the seesaw kernel over a bf16 cache merges its 2..8 splits in a cluster where all the grid's clusters are
//     resident at once (a second wave of clusters doubled the time).
//   - everything else runs uniform with the planned splits, fewer when the workspace holds fewer partials.
//   - batch-invariant launches (PlannerConfig::batch_invariant) run uniform with exactly the planned splits
//     (the combine merges them in split order): no balanced windows or clusters, whose shape follows the
//     batch, and no split count lowered for the workspace (the launcher refuses a workspace that is short).
//
// Under the uniform schedule split s of a request with `tiles` key tiles covers tiles [t0, t1) of
// split_range below: a function of the request's own length and the split count, whatever the batch.
#include <algorithm>
#include <cstdint>

#include "core/decode_balance.h"
#include "core/decode_regime.h"
#include "mla/cache.h"

namespace mla::decode_schedule {

enum class Kind { uniform, balanced, cluster };

inline constexpr int kMaxClusterSplits = 8;  // the portable cluster size

struct Facts {
  decode_regime::Regime regime;
  CacheFormat format = CacheFormat::bf16;
  int64_t batch = 0;          // requests
  int64_t rows = 0;           // query rows per request (s_q * h_q)
  int planned_splits = 1;     // the caller's split-KV count (>= 1)
  int sms = 0;                // the device's SM count
  int max_ws_splits = 1;      // the largest split count <= planned_splits whose partials the workspace holds
  // The workspace holds 2 x planned_splits partials (one per consumer warpgroup), and 2 x the small step's splits
  // (decode_regime::small_step_splits) where the problem makes one.
  bool ws_wg_partials = false;
  int64_t context_bound = 0;  // keys a request may hold (max_blocks x page_size); 0: unknown
  int64_t workspace_bytes = 0;  // bytes of the workspace the launch was given (0: none or misaligned)
  int max_clusters = 0;       // clusters of planned_splits seesaw CTAs resident at once on the device (0: none)
  bool whole_requests = false;  // the caller's host lengths: one request per CTA is the balanced answer
  bool batch_invariant = false;  // the schedule may depend on the request's shape and planned_splits only
};

struct Schedule {
  Kind kind = Kind::uniform;
  int splits = 1;   // KV splits per (request, row tile): uniform and cluster
  int ctas = 0;     // balanced: the grid
  bool combine = false;  // the combine kernel runs after the attention kernel
  bool wg_partials = false;  // uniform, small kernel: a partial per consumer warpgroup (the combine merges 2 x splits)
};

// The balanced schedule's CTA count for the facts' batch (0: it does not apply). choose() alone calls it: a
// launcher takes the count from the Schedule it returns.
inline int balanced_ctas(const Facts& f) {
  if (f.regime.kernel != decode_regime::Kernel::small) return 0;
  return balance::ctas_for(f.batch, f.rows, f.sms);
}

inline Schedule choose(const Facts& f) {
  Schedule s;
  const int planned = std::max(1, f.planned_splits);
  if (f.batch_invariant) {
    s.splits = planned;
    s.combine = planned > 1;
    return s;
  }
  if (f.regime.kernel == decode_regime::Kernel::small) {
    const int step = decode_regime::small_step_splits(f.batch, f.regime.m_tiles, planned, f.context_bound, f.sms);
    if (f.ws_wg_partials && step > 0) {
      s.splits = step;
      s.combine = true;
      s.wg_partials = true;
      return s;
    }
    const int ctas = balanced_ctas(f);
    const bool whole = f.whole_requests && planned == 1;
    if (ctas > 0 && !whole && balance::workspace_bytes(f.batch, f.rows, ctas) <= f.workspace_bytes) {
      s.kind = Kind::balanced;
      s.ctas = ctas;
      s.combine = true;
      return s;
    }
  } else if (f.regime.kernel == decode_regime::Kernel::seesaw && f.format == CacheFormat::bf16 && planned >= 2 &&
             planned <= kMaxClusterSplits && f.batch * f.regime.m_tiles <= f.max_clusters) {
    s.kind = Kind::cluster;
    s.splits = planned;
    return s;
  }
  s.splits = std::max(1, std::min(planned, f.max_ws_splits));
  s.combine = s.splits > 1;
  s.wg_partials = s.combine && f.regime.kernel == decode_regime::Kernel::small && f.ws_wg_partials &&
                  s.splits == planned;
  return s;
}

// Tiles [t0, t1) of split `split` of a request of `tiles` key tiles cut into `splits` equal ranges: the
// uniform schedule of the sm90 kernels (64-key tiles) and of the portable engine (its own tile size).
struct TileRange {
  int64_t t0, t1;
  friend bool operator==(const TileRange&, const TileRange&) = default;
};
inline constexpr TileRange split_range(int64_t tiles, int splits, int split) {
  const int64_t per = splits <= 0 ? tiles : (tiles + splits - 1) / splits;
  const int64_t t0 = std::min<int64_t>(split * per, tiles);
  return {t0, std::min<int64_t>(t0 + per, tiles)};
}

inline constexpr const char* to_string(Kind k) {
  return k == Kind::uniform ? "uniform" : k == Kind::balanced ? "balanced" : "cluster";
}

}  // namespace mla::decode_schedule
