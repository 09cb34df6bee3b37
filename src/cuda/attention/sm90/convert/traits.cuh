// SPDX-License-Identifier: Apache-2.0
#pragma once
// The converter kernel's constants (convert/kernel.cuh): roles, their registers, named barriers and the
// shared-memory plan. Sizes in bytes.
#include <cstdint>

#include "cuda/attention/sm90/common/traits.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

struct ConvertTraits {
  using T = Traits;
  // Roles by warpgroup, and their setmaxnreg budgets (504 of the 512 per thread-triple that __launch_bounds__(384, 1)
  // leaves; each a multiple of 8), the same for every format: the converter holds one tile's codes (fp8, a key half:
  // 18 x 16 bytes = 72 registers; fp8_ds_mla, a warp's 16 keys: a code chunk of each, 4 rope chunks and two scales
  // = 82; the records 14 or 16 code chunks a lane and their scales) plus addresses and the conversion's temporaries;
  // the S warpgroup O_L (128), S (32), P (16) and its softmax state; the R warpgroup O_R (128). ptxas -v: 0 spills at
  // 136 / 208 / 160 (the fp8 converter keeps two tiles' block ids ahead: 8 bytes spilled at 120 / 224; fp8_ds_mla's
  // upconverting converter spilled 36 bytes at 104; S at 192 serialised its products; R at 152 is below the
  // kernel's minimum).
  static constexpr int kConverter = 0, kSWarpgroup = 1, kRWarpgroup = 2;
  static constexpr int kConverterRegs = 136, kSRegs = 208, kRRegs = 160;

  // Named barriers (id 0 is __syncthreads): kBarQ the S warpgroup's own (Q in shared memory; DeepSeek-V4: S's and
  // R's, which load and convert Q together), kBarP + s (S arrives,
  // R syncs: P and the rescale factors of stage s's tile are in shared memory; two ids so that S may publish the
  // next stage's before R synced this one), kBarEnd (S arrives, R syncs: the row sums and references), kBarS16 the N 16
  // tile's S warpgroup's own (n16.cuh), kBarConv the converter's own
  // (DeepSeek-V4 records: its four warps' scale exponents of a tile, for the tile's reference), kBarSDone the S
  // warpgroup's own at a persistent V4 CTA's unit end (its products over Q retired before Q's buffer is refilled),
  // kBarRot the R warpgroup's own (the output rotation's table).
  static constexpr int kBarQ = 1, kBarP = 2, kBarEnd = 4, kBarS16 = 5, kBarConv = 6, kBarSDone = 7, kBarRot = 8;

  // Shared memory: Q 64 x 576 bf16 as nine swizzled K-major panels (S reads all of it from shared memory); two
  // stages of one 64-key tile each (nine panels: eight latent panels, the rope panel, which holds P once S read
  // it; DeepSeek-V4 records: eight panels of the 512 columns, the ninth only P); per stage the rows' rescale
  // factors (fp32 [64]); the row sums, references and (V4's sink) O factors for the epilogue; the v4 records' rope
  // copies; the stages' loaded-key masks; DeepSeek-V4 records' reference exponents (the
  // converter's per-warp maxima [kStages][4] and each stage's reference [kStages], int32); the full and empty
  // barriers, DeepSeek-V4's q_full (Q's TMA boxes landed), and the N 16 tile's record ring: per converter warp w
  // ring_full[w] (its records of a tile landed: the loader warp's 32 lanes' cp.async arrivals and lane 0's, which
  // publishes the tile's key mask in ring_valid[w]) and ring_empty[w] (the converter warp read them out).
  static constexpr int kStages = 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + T::kTileBytes;
  static constexpr int kOffA = kOffK + kStages * T::kTileBytes;  // [kStages][64] fp32
  static constexpr int kOffL = kOffA + kStages * T::kBlockM * 4;  // [64] sums, [64] references, [64] O factors
  // v4 records: the converter threads' rope copies (16-byte chunk i of thread t at (128 i + t) * 16).
  static constexpr int kRopeBytes = 4 * 128 * 16;
  static constexpr int kOffScale = kOffL + 3 * T::kBlockM * 4;
  static constexpr int kOffQScale = kOffScale + kRopeBytes;  // fp8: [64] 2^-e of each Q row
  static constexpr int kOffMask = kOffQScale + T::kBlockM * 4;    // [kStages] u64
  static constexpr int kOffRefRed = kOffMask + kStages * 8;       // [kStages][4] int32, 16-byte aligned
  static constexpr int kOffRef = kOffRefRed + kStages * 4 * 4;    // [kStages] int32
  static constexpr int kOffRingValid = kOffRef + kStages * 4;     // [4] u32, the ring's key masks
  // DeepSeek-V4's output rotation: the token's cos / sin table (fp32, kRotFloats: the widest rotation's pairs
  // twice), R's own.
  static constexpr int kRotFloats = 64;
  static constexpr int kOffRot = kOffRingValid + 4 * 4;
  // A persistent V4 CTA's loop state that must not hold a register across a unit's tiles, per warp ([8] int32): the
  // converter warps' unit index (0..3) and R's warps' V4Phase (4..7).
  static constexpr int kOffRoleState = kOffRot + kRotFloats * 4;
  static constexpr int kOffBar = kOffRoleState + 8 * 4;  // full[kStages], empty[kStages], q_full, ring_full[4], ring_empty[4], q_ready  // full[kStages], empty[kStages], q_full, ring_full[4], ring_empty[4]
  static constexpr int kBarriers = 2 * kStages + 1 + 8 + 1;  // ..., a persistent V4 CTA's q_ready
  static constexpr int kSmemBytes = kOffBar + kBarriers * 8 + 1024;  // + slack to align the base to 1 KiB
  static_assert(kSmemBytes <= 232448, "shared memory per block");
  static_assert(kOffBar % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kOffRefRed % 16 == 0, "the reference maxima are read as one int4");

  // The N 16 tile's record ring (convert/n16.cuh RingLoader, convert/kernel.cuh RingFeed): one tile's records in Q's
  // panels, which that tile fills to row 16 only: key k's record of rec_bytes at panel k / 8, byte ring_offset +
  // (k % 8) rec_bytes: the last 8 records' bytes of the panel (past panel 0's scratch: n16.cuh).
  static constexpr int ring_offset(int rec_bytes) { return T::kPanelBytes - 8 * rec_bytes; }
  // Key k's record from the ring's origin; additive over a warp's keys: key 16 w + j is key 16 w's plus key j's.
  static constexpr int ring_key_offset(int rec_bytes, int k) { return (k >> 3) * T::kPanelBytes + (k & 7) * rec_bytes; }
  static constexpr int kRingFloor = 16 * 128 + 192 * 4;  // Q's rows 0..15 and panel 0's scratch (n16.cuh)
  static constexpr int kRingFullArrivals = 33;  // the loader warp's 32 lanes' copies, and its lane 0's mask

  // Arrivals per phase: full, every converter thread (after its stores and proxy fence); empty, every thread of
  // the S and R warpgroups (after their products over the stage retired).
  static constexpr int kFullArrivals = 128, kEmptyArrivals = 256;
};

static_assert(ConvertTraits::kConverterRegs + ConvertTraits::kSRegs + ConvertTraits::kRRegs <= 504, "setmaxnreg budget");

}  // namespace mla::cuda::decode_sm90
