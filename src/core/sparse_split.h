// SPDX-License-Identifier: Apache-2.0
#pragma once
// The small-T split of the sm90 sparse decode (docs/design/attention_sm90.md "7. Schedules and the combine"). The
// sparse op has no
// workspace, so it cannot split a token's top-k over CTAs that write partials for a combine; instead the
// `splits` CTAs of one (row tile, token) are a thread-block cluster that merges (m, l, O) through distributed
// shared memory (src/cuda/attention/sm90/common/cluster_merge.cuh). Pure code, host only (tests/unit/
// test_sparse_split.cpp): the launcher asks it once per call with the device's SM count and a query of how
// many clusters of a size fit on the device at once.
//
// Why each rule (measured; docs/LAB.md, the small-T split):
//   - one wave: units * splits <= SMs. The raw kernel holds one CTA per SM; a second wave of clusters runs
//     after the first and doubles the time of what it was meant to shorten.
//   - every rank at least kMinTilesPerRank tiles: a rank pays a fixed prologue (barrier set-up, Q, the
//     first tile's index and row latency) and the merge; below two tiles that costs more than it splits.
//   - all clusters resident together: max_clusters(s) >= units (a cluster lives in one GPC, so 132 SMs do not
//     hold 16 clusters of 8 on every part).
//   - no split once the tokens fill the GPU by themselves (units * 2 > SMs).
//   - none in a batch-invariant launch (SparseOptions::batch_invariant): the split count follows the number of
//     tokens, so a token's result would depend on the batch.
#include <cstdint>

namespace mla::sparse_split {

inline constexpr int kMaxSplits = 8;        // the portable cluster size
inline constexpr int kMinTilesPerRank = 2;  // 64-key tiles per rank at least

// Splits of each token's top-k for `units` (row tiles x tokens) units of `tiles` 64-key tiles each on `sms`
// SMs: the largest s in {8, 4, 2} that satisfies the rules above, else 1 (one CTA per unit; always 1 when
// batch_invariant).
// max_clusters(s): clusters of s CTAs resident at once.
template <class MaxClusters>
int cluster_splits(int64_t units, int64_t tiles, int sms, MaxClusters&& max_clusters, bool batch_invariant = false) {
  if (batch_invariant || units <= 0 || tiles <= 0 || sms <= 0) return 1;
  for (int s = kMaxSplits; s >= 2; s /= 2)
    if (units * s <= sms && tiles >= int64_t{kMinTilesPerRank} * s && max_clusters(s) >= units) return s;
  return 1;
}

// The converter kernel's split (DeepSeek-V4 records on its N 16 and 64-row tiles, fp8_ds_mla records on its 64-row
// tile: attention/sm90/convert/): the same rules, at any cluster size 2..8 (a rank takes ceil(tiles / s) tiles, so
// the sizes between the powers of two shorten the longest rank: 10 tiles in 5 ranks of 2, where 4 ranks would take
// 3). `tiles`: a unit's 64-key tiles
// at most (the main list's, then the extra list's, each rounded up).
template <class MaxClusters>
int record_splits(int64_t units, int64_t tiles, int sms, MaxClusters&& max_clusters, bool batch_invariant = false) {
  if (batch_invariant || units <= 0 || tiles <= 0 || sms <= 0 || units * 2 > sms) return 1;
  for (int s = kMaxSplits; s >= 2; --s)
    if (units * s <= sms && tiles >= int64_t{kMinTilesPerRank} * s && max_clusters(s) >= units) return s;
  return 1;
}

}  // namespace mla::sparse_split
