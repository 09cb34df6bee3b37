// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tile sizes and shared-memory plan of the sm90 mha_prefill (kernel.cuh). Sizes in bytes unless named
// otherwise. Every tile is a set of 128-byte-swizzled panels of 64 bf16 columns (wgmma.cuh, TMA b128).
#include <cstdint>

namespace mla::cuda::prefill_sm90 {

struct Traits {
  static constexpr int kThreads = 384;         // warpgroup 0: producer; warpgroups 1, 2: consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockM = 128;          // query rows per CTA (64 per consumer warpgroup)
  static constexpr int kBlockN = 128;          // keys per K / V tile
  static constexpr int kDNope = 128, kDRope = 64, kDqk = kDNope + kDRope, kDv = 128;
  static constexpr int kPanelCols = 64;                      // bf16 columns of one 128-byte swizzled row
  static constexpr int kPanelBytes = 128 * 128;              // 128 rows x 128 bytes (Q, K, V panels alike)
  static constexpr int kQKPanels = kDqk / kPanelCols;        // 3: [nope 0..63][nope 64..127][rope]
  static constexpr int kVPanels = kDv / kPanelCols;          // 2
  static constexpr int kQBytes = kQKPanels * kPanelBytes;    // 49,152
  static constexpr int kKBytes = kQKPanels * kPanelBytes;    // 49,152 per stage
  static constexpr int kVBytes = kVPanels * kPanelBytes;     // 32,768 per stage
  static constexpr int kStages = 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  static constexpr int kOffBar = kOffV + kStages * kVBytes;  // 212,992: q_full, q_empty, k_full[2], v_full[2], k_empty[2], v_empty[2]
  static constexpr int kBarriers = 2 + 4 * kStages;
  static constexpr int kSmemBytes = kOffBar + kBarriers * 8 + 1024;  // + slack to align the base to 1024

  // Register split (setmaxnreg): 24 * 128 + 2 * 240 * 128 = 65,536 = the SM's register file.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static_assert(kOffK % 1024 == 0 && kOffV % 1024 == 0 && kPanelBytes % 1024 == 0, "swizzled tiles 1024-aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(kProducerRegs * 128 + 2 * kConsumerRegs * 128 <= 65536, "register file");
};

}  // namespace mla::cuda::prefill_sm90
