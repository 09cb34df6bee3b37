// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tile sizes shared by the sm90 decode kernels (small/kernel.cuh, seesaw/kernel.cuh; each has its own
// shared-memory plan next to it). Sizes in bytes.
#include <cstdint>

namespace mla::cuda::decode_sm90 {

struct Traits {
  static constexpr int kThreads = 384;  // warpgroup 0: producer; warpgroups 1, 2: consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockM = 64;    // query rows of one wgmma M (the 64-row tiles)
  static constexpr int kBlockN = 64;    // keys per KV tile
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr int kDvHalf = kDv / 2;  // output columns per consumer warpgroup (64-row tiles)

  // 128-byte-swizzled K-major panels (wgmma.cuh): 64 bf16 columns x rows, 128 bytes per row.
  static constexpr int kPanelCols = 64;
  static constexpr int kPanels = kDqk / kPanelCols;        // 9
  static constexpr int kPanelBytes = kBlockM * 128;        // 8192 (64 rows: Q, K and P tiles alike)
  static constexpr int kTileBytes = kPanels * kPanelBytes; // 73,728: one KV stage of 64 keys
};

}  // namespace mla::cuda::decode_sm90
