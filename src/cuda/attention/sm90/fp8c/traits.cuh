// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fp8-compute kernel's constants (fp8c/kernel.cuh): roles, their registers, named barriers, mbarriers and the
// shared-memory plan. Sizes in bytes.
#include <cstdint>

#include "cuda/attention/sm90/common/traits.cuh"
#include "cuda/attention/sm90/fp8c/transpose.cuh"

namespace mla::cuda::decode_sm90 {

struct Fp8cTraits {
  using T = Traits;
  // Roles by warpgroup and their setmaxnreg budgets (504 of the 512 per thread-triple of __launch_bounds__(384, 1)):
  // the loader (TMA ring, V^T_L: 8 ldmatrix in flight a warp), S (O_L 128, S 32, P 8 and the softmax state), R (O_R
  // 128 and its V^T_R half's 8 ldmatrix).
  static constexpr int kLoader = 0, kSWarpgroup = 1, kRWarpgroup = 2;
  static constexpr int kLoaderRegs = 64, kSRegs = 240, kRRegs = 200;

  // Named barriers (id 0 is __syncthreads): kBarQ S's and R's (Q quantized), kBarP + b (S arrives, R syncs: P and the
  // rows' factors of the tile in buffer b are in shared memory), kBarEnd (S arrives, R syncs: row sums and maxima),
  // kBarR R's own (its V^T half written by all its threads before its products read it).
  static constexpr int kBarQ = 1, kBarP = 2, kBarEnd = 4, kBarR = 5;

  // An e4m3 row of 576 codes as 128-byte panels: four of the latent columns, the fifth the rope's 64 and 64 zeros.
  static constexpr int kPanels = 5;
  static constexpr int kStages = 2;
  static constexpr int kStageBytes = kPanels * T::kPanelBytes;  // 40 KiB: a 64-key tile of codes (TMA)
  static constexpr int kPBytes = T::kBlockM * T::kBlockN;       // P e4m3 [64 rows][64 key positions]

  // Shared memory: Q e4m3 (five panels), two stages of raw codes, two V^T buffers, two P panels; the rows' factors per
  // P buffer,
  // the row sums and maxima for R's epilogue, 2^-e_r per row, the stages' loaded-key masks, 16 zero bytes (the
  // transposer's stand-in for keys not loaded), the mbarriers.
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kStageBytes;
  static constexpr int kOffVt = kOffK + kStages * kStageBytes;
  static constexpr int kOffP = kOffVt + 2 * fp8c::VtLayout::kBytes;
  static constexpr int kOffA = kOffP + 2 * kPBytes;               // [2][64] fp32
  static constexpr int kOffL = kOffA + 2 * T::kBlockM * 4;        // [64] sums, [64] maxima (the log2 domain)
  static constexpr int kOffQScale = kOffL + 2 * T::kBlockM * 4;   // [64] 2^-e_r
  static constexpr int kOffMask = kOffQScale + T::kBlockM * 4;    // [kStages] u64
  static constexpr int kOffZero = kOffMask + kStages * 8;         // 16 bytes
  // full[kStages] (the TMA's bytes), empty[kStages] (S and the transposer done with the raw codes), vt_full[2],
  // vt_empty[2].
  static constexpr int kOffBar = kOffZero + 16;
  static constexpr int kBarriers = 2 * kStages + 4;
  static constexpr int kSmemBytes = kOffBar + kBarriers * 8 + 1024;  // + slack to align the base to 1 KiB

  static constexpr int kEmptyArrivals = 384;    // S's threads (their S retired), the loader's and R's (V^T halves written)
  static constexpr int kVtFullArrivals = 128;   // the loader's threads, after their V^T_L stores and the proxy fence
  static constexpr int kVtEmptyArrivals = 256;  // S's and R's threads, their value products retired

  static_assert(kOffK % 1024 == 0 && kOffVt % 1024 == 0, "128-byte-swizzled panels are 1 KiB aligned");
  static_assert(kOffBar % 8 == 0 && kOffZero % 16 == 0, "alignment");
  static_assert(kSmemBytes <= 232448, "shared memory per block");
  static_assert(kLoaderRegs + kSRegs + kRRegs <= 504, "setmaxnreg budget");
};

}  // namespace mla::cuda::decode_sm90
