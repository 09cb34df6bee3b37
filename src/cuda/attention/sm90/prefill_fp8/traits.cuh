// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tile sizes and shared-memory plan of the sm90 fp8 mha_prefill (kernel.cuh). Sizes in bytes. Every tile is a
// set of 128-byte-swizzled panels of 128 e4m3 columns x 128 rows (16 KiB; wgmma.cuh, TMA b128).
#include <cstdint>

namespace mla::cuda::prefill_sm90_fp8 {

struct Traits {
  static constexpr int kThreads = 384;         // warpgroup 0: producer; warpgroups 1, 2: consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockM = 128;          // query rows per CTA (64 per consumer warpgroup)
  static constexpr int kBlockN = 128;          // keys per K / V tile
  static constexpr int kDqk = 192, kDv = 128;
  static constexpr int kPanelCols = 128;                   // e4m3 columns of one 128-byte swizzled row
  static constexpr int kPanelBytes = 128 * 128;            // 128 rows x 128 bytes
  // Q and K rows are 192 codes: panel 0 holds columns 0..127, panel 1 columns 128..191 and 64 zero columns
  // (the TMA box runs past the tensor's 192 columns; those bytes read as zeros and are never multiplied).
  static constexpr int kQKPanels = 2;
  static constexpr int kKSteps = kDqk / 32;                // 6 k32 steps of S: 4 in panel 0, 2 in panel 1
  static constexpr int kQBytes = kQKPanels * kPanelBytes;  // 32,768
  static constexpr int kKBytes = kQKPanels * kPanelBytes;  // 32,768 per stage
  static constexpr int kVBytes = kPanelBytes;              // 16,384 per stage: V^T, 128 dv rows x 128 keys
  static constexpr int kStages = 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  static constexpr int kOffBar = kOffV + kStages * kVBytes;  // 131,072: q_full, q_empty, k_full[2], v_full[2], k_empty[2], v_empty[2]
  static constexpr int kBarriers = 2 + 4 * kStages;
  static constexpr int kSmemBytes = kOffBar + kBarriers * 8 + 1024;  // + slack to align the base to 1024

  // Register split (setmaxnreg): 24 * 128 + 2 * 240 * 128 = 65,536 = the SM's register file.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static_assert(kOffK % 1024 == 0 && kOffV % 1024 == 0 && kPanelBytes % 1024 == 0, "swizzled tiles 1024-aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(kProducerRegs * 128 + 2 * kConsumerRegs * 128 <= 65536, "register file");
};

// Position of key k (0..15, relative to a 16-aligned group) in V^T's columns: the order in which one thread's
// S accumulators of a k32 step are the e4m3 register-A fragment of P V (kernel.cuh, Consumer::to_pa). Position
// 4t + i holds key 2t + i (i < 2) or 8 + 2t + i - 2 (i >= 2), within each half of 16 of the k32 step.
__host__ __device__ constexpr int vt_position(int k) {
  return k < 8 ? 4 * (k / 2) + (k % 2) : 4 * ((k - 8) / 2) + 2 + (k - 8) % 2;
}

}  // namespace mla::cuda::prefill_sm90_fp8
