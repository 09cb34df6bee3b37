#pragma once
// Tile sizes and the shared-memory plan of the sm90 decode kernel (kernel.cuh). Sizes in bytes.
#include <cstdint>

namespace mla::cuda::decode_sm90 {

struct Traits {
  static constexpr int kThreads = 384;  // warpgroup 0: producer; warpgroups 1, 2: consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockM = 64;    // query rows per CTA (one wgmma M)
  static constexpr int kBlockN = 64;    // keys per KV tile
  static constexpr int kHalfN = kBlockN / 2;  // keys of S per consumer warpgroup
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr int kDvHalf = kDv / 2;     // output columns per consumer warpgroup
  static constexpr int kStages = 2;
  static constexpr int kEmptyArrivals = kConsumerThreads;  // both consumer warpgroups release a stage

  // 128-byte-swizzled K-major panels (wgmma.cuh): 64 bf16 columns x rows, 128 bytes per row.
  static constexpr int kPanelCols = 64;
  static constexpr int kPanels = kDqk / kPanelCols;        // 9
  static constexpr int kPanelBytes = kBlockM * 128;        // 8192 (64 rows: Q, K and P tiles alike)
  static constexpr int kTileBytes = kPanels * kPanelBytes; // 73,728: Q tile, one KV stage

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;                 // kStages KV tiles
  static constexpr int kOffP = kOffK + kStages * kTileBytes;       // P [64 rows][64 keys] bf16, one panel
  static constexpr int kOffMax = kOffP + kPanelBytes;              // [2 parity][2 warpgroups][64] fp32
  static constexpr int kOffSum = kOffMax + 2 * 2 * kBlockM * 4;    // [2 warpgroups][64] fp32
  static constexpr int kOffMask = kOffSum + 2 * kBlockM * 4;       // [kStages] u64: loaded keys of the stage
  static constexpr int kOffBar = kOffMask + kStages * 8;           // full[kStages], empty[kStages]
  static constexpr int kSmemUsed = kOffBar + 2 * kStages * 8;      // 230,960
  static constexpr int kSmemBytes = kSmemUsed + 1024;              // + slack to align the base to 1024

  static_assert(kOffK % 1024 == 0 && kOffP % 1024 == 0, "swizzled tiles are 1024-byte aligned");
  static_assert(kOffMask % 8 == 0 && kOffBar % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

}  // namespace mla::cuda::decode_sm90
