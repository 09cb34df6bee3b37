// SPDX-License-Identifier: Apache-2.0
#pragma once
// The row-stationary kernel's shared-memory plan and constants (small/kernel.cuh; docs/design/attention_sm90.md
// "3. The row-stationary kernel"), N query rows per CTA.
#include "core/decode_balance.h"
#include "cuda/attention/sm90/common/cluster_merge.cuh"
#include "cuda/attention/sm90/common/traits.cuh"

namespace mla::cuda::decode_sm90 {

template <int N>
struct SmallTraits {
  static_assert(N == 8 || N == 16 || N == 32, "rows per CTA: 8, 16 or 32");
  using T = Traits;
  static constexpr int kQPanelBytes = N * 128;
  static constexpr int kPBytes = N * 128 < 1024 ? 1024 : N * 128;  // one P^T panel, 1024-aligned
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = T::kPanels * kQPanelBytes;  // multiple of 1024
  static constexpr int kStages = 2;                        // stage c feeds consumer warpgroup c
  static constexpr int kOffP = kOffK + kStages * T::kTileBytes;
  static constexpr int kOffRed = kOffP + 2 * kPBytes;       // [2 wg][4 warps][N] fp32
  static constexpr int kOffML = kOffRed + 2 * 4 * N * 4;    // [2 wg][m, l][N] fp32
  static constexpr int kOffMask = kOffML + 2 * 2 * N * 4;   // [2] u64
  static constexpr int kOffBar = kOffMask + kStages * 8;    // full[2], empty[2]
  // Epilogue staging of O (tile_io.cuh small_epilogue): 8 rows of fp32 per round and warpgroup.
  static constexpr int kStageRows = 8;
  static constexpr int kXBytes = 2 * kStageRows * ClusterMerge::kRowFloats * 4;
  static constexpr int kEmptyArrivals = 128;                // one warpgroup releases a stage
  static constexpr int kFullBarriers = kStages, kEmptyBarriers = kStages;
  static constexpr bool kSeesaw = false;  // register split key (source.cuh producer_regs)
  static constexpr bool kWgPartials = true;  // may run under p.wg_partials (a partial per consumer warpgroup)
  static constexpr int kPanelsPerFull = T::kPanels;  // one full barrier per stage, carrying the key mask too
  __host__ __device__ static constexpr bool mask_barrier(int) { return true; }
  static constexpr int kOffLim = kOffBar + 2 * kStages * 8;  // [N] int32: each query row's largest visible key
  // The key source's own region after the common plan: for the paged source (mqa_decode: several units per CTA under the balanced schedule) the epilogue
  // exchange X and the schedule window. Single-unit sources (sparse_mqa) exchange through the drained
  // KV stage 1 instead (nothing refills it after the unit's last tile).
  static constexpr int kOffQBar = kOffLim + 32 * 4;  // u64: the query rows' TMA (p.q_tma), one phase
  static constexpr int kOffExtra = kOffQBar + 16;
  static constexpr int kSmemBytes = kOffExtra + 1024;
  static constexpr int kOffX = kOffExtra;
  static constexpr int kOffSched = kOffX + kXBytes;  // balance::Window, then 32 int64 of scan scratch
  static constexpr int kPagedExtraBytes = kXBytes + 64 + 32 * 8;
  template <class Src>
  static constexpr int smem_bytes() {
    if constexpr (Src::kTma) return kSmemBytes + kPagedExtraBytes;
    else return kSmemBytes;
  }
  static_assert(kOffK % 1024 == 0 && kOffP % 1024 == 0, "swizzled tiles are 1024-byte aligned");
  static_assert(sizeof(balance::Window) <= 64 && kOffX % 16 == 0, "schedule slot");
  static_assert(kXBytes <= T::kTileBytes, "single-unit sources exchange O^T through KV stage 1");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

}  // namespace mla::cuda::decode_sm90
