// SPDX-License-Identifier: Apache-2.0
#pragma once
// The code-format kernel's shared-memory plan and constants (raw/kernel.cuh; docs/design/attention_sm90.md
// "4. The code-format kernel"), N query rows per CTA over e4m3-coded rows of format F.
#include "mla/cache_format.h"
#include "cuda/attention/sm90/common/cluster_merge.cuh"
#include "cuda/attention/sm90/common/traits.cuh"

namespace mla::cuda::decode_sm90 {

// A staged query row: 576 bf16 columns (RawTraits::kQSlot, raw/parts.cuh stage_q).
inline constexpr int kStagedQRowBytes = 576 * 2;

// kPP: ping-pong (raw/kernel.cuh header, "Ping-pong"): tiles alternate between the consumer warpgroups for S and
// the softmax, and both multiply every tile's P^T by their half of V. N 32 always (O^T of all 512 columns is 128
// registers per thread there, too many beside S); N 16 for sparse_mqa's indexed rows (RawTraitsFor below). Else
// the warpgroups alternate whole tiles (each all of O).
template <int N, CacheFormat F, bool kPP = N == 32>
struct RawTraits {
  static_assert(N == 8 || N == 16 || N == 32, "rows per CTA: 8, 16 or 32");
  static_assert(kPP == (N == 32) || N == 16, "ping-pong at N 32 always, optional at N 16, never at N 8");
  static constexpr bool kPingPong = kPP;
  static_assert(F == CacheFormat::fp8 || F == CacheFormat::fp8_ds_mla, "e4m3-coded rows");
  using T = Traits;
  static constexpr int N_ = N;
  static constexpr bool kDs = F == CacheFormat::fp8_ds_mla;
  static constexpr int kRecordBytes = static_cast<int>(CacheFormatTraits<F>::entry_bytes(576, 64));  // 656 / 576
  static constexpr int kChunks = kRecordBytes / 16;
  static constexpr int kStride = 672;  // >= the record, = 32 mod 128 (the bank analysis above)
  static constexpr int kSlotBytes = T::kBlockN * kStride;
  // Alternate tiles: tile it in slot it % 4, consumer c owns slots c, c + 2 (two tiles held, two loading). Ping-pong:
  // a slot is held by both warpgroups, the owner's S to the other's P.V; N 32 has room for three (Q's panels are
  // 36 KiB there).
  static constexpr int kSlots = N == 32 ? 3 : 4;
  static constexpr int kGroups = kDs ? 4 : 1;  // P^T panels of a tile (one per scale group)
  static constexpr int kQPanelBytes = N * 128;
  static constexpr int kPBytes = N * 128 < 1024 ? 1024 : N * 128;
  static constexpr int kOffQ = 0;
  static constexpr int kOffRing = T::kPanels * kQPanelBytes;
  static constexpr int kOffP = kOffRing + kSlots * kSlotBytes;
  // P^T: one buffer per consumer warpgroup (the tiles it owns), kGroups panels each
  static constexpr int kOffRed = kOffP + 2 * kGroups * kPBytes;  // [2 wg][4 warps][N] fp32
  // [2 wg][m, l][N] fp32 (ping-pong: [wg][0][N] the running maximum a flagged tile of warpgroup wg publishes)
  static constexpr int kOffML = kOffRed + 2 * 4 * N * 4;
  static constexpr int kOffLim = kOffML + 2 * 2 * N * 4;         // [N] int32
  static constexpr int kOffAmax = kOffLim + 32 * 4;              // [N] u32: max |q| per row (fp32 bits)
  static constexpr int kOffQf = kOffAmax + 32 * 4;               // [N] fp32: 2^-e per row (q_row_exponent)
  // [2 tile parity][2 wg][4 warps] u8: lazy-max overflow flags. A warpgroup's flags of its k-th tile sit in buffer
  // k % 2: the next write to that buffer (tile k + 2) comes after the flag barrier of tile k + 1, which every warp
  // passes only after reading tile k's flags (one buffer: a warp could rewrite its flag while another still read it).
  // Ping-pong: the other warpgroup reads them too (after pfull), before it publishes tile k + 1, which the owner
  // waits for before its tile k + 2.
  static constexpr int kOffOver = kOffQf + 32 * 4;
  static constexpr int kOffMask = kOffOver + 32;                 // [kSlots] u64 (four u16 parts)
  // full[kSlots], empty[kSlots], qfull, ping-pong: pfull[2] (warpgroup c's P^T of its latest tile, 128 arrivals)
  static constexpr int kOffBar = kOffMask + kSlots * 8;
  static constexpr int kSmemBytes = kOffBar + (2 * kSlots + 3) * 8 + 1024;
  // Q's raw bf16 rows [N][576] are staged in ring slot kQSlot by the producer, so the consumers' prologue reads
  // shared memory only; the consumers that use the slot (consumer 1 when tiles alternate, both in ping-pong) release
  // it on empty[kQSlot] after the prologue, one phase before the slot's first tile (produce_raw's parity for that
  // slot is shifted).
  static constexpr int kQSlot = kSlots - 1;
  static constexpr int kQRowBytes = kStagedQRowBytes;
  static constexpr int kStageRows = 8;  // tile_io.cuh small_epilogue: 8 rows per round, both warpgroups' (ring slot 1)
  static constexpr int kXBytes = 2 * kStageRows * ClusterMerge::kRowFloats * 4;
  static constexpr int kFullArrivals = 128 + 4;  // one cp.async arrival per producer lane + one mask arrival per warp
  static constexpr int kEmptyArrivals = kPingPong ? 256 : 128;  // the consumer threads that read a slot
  static constexpr int kProducerRegs = kPingPong ? 40 : 56;  // ping-pong: the consumers need 232 (O half, S, the other's A operand)
  static_assert(kOffRing % 1024 == 0 && kOffP % 1024 == 0, "swizzled panels are 1024-byte aligned");
  static_assert(kStride % 128 == 32 && kStride >= kRecordBytes, "slot rows");
  static_assert(kPingPong || kXBytes <= kSlotBytes, "the epilogue staging fits in ring slot 1");
  static_assert(N * kQRowBytes <= kSlotBytes && (kPingPong || kQSlot % 2 == 1), "Q's staging fits in a slot it reads");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// The raw kernel's traits for a row locator (source.cuh): ping-pong at N 32, and at N 16 for sparse_mqa's indexed
// rows only. At N 16 the ping-pong measured faster than alternating tiles on the gathered sparse rows and slower or
// even on the paged rows of mqa_decode (docs/design/attention_sm90.md "4. The code-format kernel").
template <int N, CacheFormat F, class Rows>
using RawTraitsFor = RawTraits<N, F, N == 32 || (N == 16 && !Rows::kPaged)>;

}  // namespace mla::cuda::decode_sm90
