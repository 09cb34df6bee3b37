// SPDX-License-Identifier: Apache-2.0
#pragma once
// The converter kernel's constants (convert/kernel.cuh): roles, their registers, named barriers and the
// shared-memory plan. Sizes in bytes.
#include <cstdint>

#include "cuda/attention/sm90/common/traits.cuh"

namespace mla::cuda::decode_sm90 {

struct ConvertTraits {
  using T = Traits;
  // Roles by warpgroup, and their setmaxnreg budgets (112 + 232 + 160 = 504 of the 512 per thread-triple that
  // __launch_bounds__(384, 1) leaves; each a multiple of 8). The converter holds one tile's codes of its key half
  // (18 x 16 bytes = 72 registers) plus addresses; the S warpgroup O_L (128), S (32), P (16) and its softmax
  // state; the R warpgroup O_R (128) and a few addresses.
  static constexpr int kConverter = 0, kSWarpgroup = 1, kRWarpgroup = 2;
  static constexpr int kConverterRegs = 112, kSRegs = 232, kRRegs = 160;
  static_assert(kConverterRegs + kSRegs + kRRegs <= 504, "setmaxnreg budget");

  // Named barriers (id 0 is __syncthreads): kBarQ the S warpgroup's own (Q in shared memory), kBarP + s (S arrives,
  // R syncs: P and the rescale factors of stage s's tile are in shared memory; two ids so that S may publish the
  // next stage's before R synced this one), kBarEnd (S arrives, R syncs: the row sums and references).
  static constexpr int kBarQ = 1, kBarP = 2, kBarEnd = 4;

  // Shared memory: Q 64 x 576 bf16 as nine swizzled K-major panels (S reads all of it from shared memory); two
  // stages of one 64-key tile each (nine panels: eight latent panels, the rope panel, which holds P once S read
  // it); per stage the rows' rescale factors (fp32 [64]); the row sums and references for the epilogue; the
  // stages' loaded-key masks; the full and empty barriers.
  static constexpr int kStages = 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + T::kTileBytes;
  static constexpr int kOffA = kOffK + kStages * T::kTileBytes;  // [kStages][64] fp32
  static constexpr int kOffL = kOffA + kStages * T::kBlockM * 4;  // [64] sums, then [64] references
  static constexpr int kOffMask = kOffL + 2 * T::kBlockM * 4;     // [kStages] u64
  static constexpr int kOffBar = kOffMask + kStages * 8;          // full[kStages], empty[kStages]
  static constexpr int kBarriers = 2 * kStages;
  static constexpr int kSmemBytes = kOffBar + kBarriers * 8 + 1024;  // + slack to align the base to 1 KiB
  static_assert(kSmemBytes <= 232448, "shared memory per block");
  static_assert(kOffBar % 8 == 0, "mbarriers are 8-byte aligned");

  // Arrivals per phase: full, every converter thread (after its stores and proxy fence); empty, every thread of
  // the S and R warpgroups (after their products over the stage retired).
  static constexpr int kFullArrivals = 128, kEmptyArrivals = 256;

  // The converter's work split: thread t owns key t % 64 of the tile and half t / 64 of its columns (latent panels
  // 4h .. 4h + 3 and the rope panel's 16-byte chunks 4h .. 4h + 3), 18 raw 16-byte chunks of an fp8 row.
  static constexpr int kRawChunks = 4 * 4 + 2;
};

}  // namespace mla::cuda::decode_sm90
