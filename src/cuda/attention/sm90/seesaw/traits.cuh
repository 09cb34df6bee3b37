// SPDX-License-Identifier: Apache-2.0
#pragma once
// The seesaw kernel's shared-memory plan and constants (seesaw/kernel.cuh; docs/design/attention_sm90.md
// "5. The seesaw kernel"): 64-row tiles, two stages, three release groups per stage.
#include "cuda/attention/sm90/common/traits.cuh"
#include "cuda/attention/sm90/seesaw/source_cross.cuh"

namespace mla::cuda::decode_sm90 {

struct SeesawTraits {
  using T = Traits;
  static constexpr int kStages = 2;  // stage s: the tiles of consumer s
  static constexpr int kQPanels = 8;  // Q columns 0..511 in smem; 512..575 (rope) in registers
  static constexpr int kGroups = 3;   // release groups of a stage: rope panel, owner's V half, other V half
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kQPanels * T::kPanelBytes;           // 65,536
  static constexpr int kOffP = kOffK + kStages * T::kTileBytes;     // P_c [64 rows][64 keys] bf16, 8 KiB each
  static constexpr int kOffM = kOffP + 2 * T::kPanelBytes;          // [2 consumers][64] fp32 published maxes
  static constexpr int kOffL = kOffM + 2 * T::kBlockM * 4;          // [2 consumers][64] fp32 row sums
  static constexpr int kOffMask = kOffL + 2 * T::kBlockM * 4;       // [kStages] u64 loaded keys
  static constexpr int kOffBar = kOffMask + kStages * 8;            // full[kStages][9], empty[kStages][3]
  static constexpr int kFullBarriers = kStages * T::kPanels;
  static constexpr int kEmptyBarriers = kStages * kGroups;
  static constexpr int kEmptyArrivals = 128;                        // one warpgroup releases a group
  static constexpr bool kSeesaw = true;  // register split key (source.cuh producer_regs)
  static constexpr int kPanelsPerFull = 1;                          // full[s][c]: panel c of stage s
  __host__ __device__ static constexpr bool mask_barrier(int i) { return i % T::kPanels == T::kPanels - 1; }
  static constexpr int kSmemBytes = kOffBar + (kFullBarriers + kEmptyBarriers) * 8 + 1024;
  static_assert(kOffK % 1024 == 0 && kOffP % 1024 == 0, "swizzled tiles are 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

  // Named barriers (1 is kConsumerBarrier); 8 + c: consumer c alone (128 threads).
  static constexpr int kBarM0 = 2, kBarM1 = 3, kBarP0 = 4, kBarP1 = 5;
  static constexpr int kBarRemote = 6;  // C1's remote P V issued
};

// sparse_mqa's small-T split (core/sparse_split.h) on the seesaw: Src's kernel built with the cluster merge, launched
// only when p.cluster_merge is set. Unsplit launches keep Src's own kernel, without the merge's code (its run-once
// merge code and its register pressure cost the large-T rows 4-10%).
template <class Src>
struct SplitKeys : Src {
  static constexpr bool kSplitMerged = true;
};

// Whether the kernels built for key source Src take p.cluster_merge (cluster_merge.cuh): the TMA source (mqa_decode.cu
// sets it) and SplitKeys (sparse_mqa.cu's small-T split); the others are not built with the merge (the crossover's
// registers would spill).
template <class Src>
inline constexpr bool kClusterMerged =
    (Src::kTma && !CrossoverSource<Src>) || requires { requires Src::kSplitMerged; };

}  // namespace mla::cuda::decode_sm90
