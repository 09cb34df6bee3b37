// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tile sizes and the shared-memory plan of the latent-cache MQA engine (attention/portable/common/mqa_core.cuh),
// used by the portable decode and sparse launchers; its row limits bound the sm90 launchers too (mqa_launch.h).
// All sizes in bytes unless named otherwise.
#include <cstdint>

#include "mla/cache_format.h"

namespace mla::cuda::mqa {

// Rows the engine copies straight into its bf16 K tile: unscaled bf16 values in one run. Every other
// format is staged raw and converted (mqa_core.cuh, convert_key_row).
template <class Fmt>
constexpr bool direct_format() {
  return Fmt::uniform() && Fmt::kLatentDType == DType::bf16 && Fmt::kScale == CacheScale::none;
}

// Largest staged row over the formats, for d_qk <= kMaxDqk, rounded up to the 16-byte copies.
constexpr int staged_row_bytes(int max_dqk) {
  int64_t m = 0;
#define MLA_X(name, value)                                                                          \
  if (!direct_format<CacheFormatTraits<CacheFormat::name>>()) {                                     \
    const int64_t b = CacheFormatTraits<CacheFormat::name>::entry_bytes(max_dqk, 64);               \
    m = b > m ? b : m;                                                                              \
  }
  MLA_DEVICE_CACHE_FORMATS(MLA_X)
#undef MLA_X
  return static_cast<int>((m + 15) / 16 * 16);
}

struct Traits {
  static constexpr int kThreads = 256;  // 8 warps
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockM = 64;  // query rows per CTA: 4 row slabs of 16 (one mma M each)
  static constexpr int kBlockN = 32;  // keys per tile
  static constexpr int kMaxDqk = 576;
  static constexpr int kMaxDv = 512;
  static constexpr int kScaleTile = 128;  // value columns per scale (fp8_ds_mla tile)
  // Scale groups per key: 4 latent tiles + the rope columns 512..575 (ds_mla: scale 1).
  static constexpr int kScaleGroups = (kMaxDqk + kScaleTile - 1) / kScaleTile;
  static constexpr int kScaleStride = 8;  // floats per key in the scale table

  // bf16 elements per shared row of Q and K: 576 + 8 so that consecutive rows start 16 bytes apart
  // modulo 128 and the 8 row addresses of one ldmatrix hit 8 different bank groups.
  static constexpr int kRowElems = kMaxDqk + 8;
  static constexpr int kRowBytes = kRowElems * 2;
  static constexpr int kRawRowBytes = staged_row_bytes(kMaxDqk);  // 656: the ds_mla record (fp8: d_qk <= 576)
  static constexpr int kScoreStride = 40;   // floats per score row: float2 accesses of a half warp are conflict-free

  static constexpr int kQBytes = kBlockM * kRowBytes;         // 74,752
  static constexpr int kKStageBytes = kBlockN * kRowBytes;    // 37,376
  static constexpr int kRawStageBytes = kBlockN * kRawRowBytes;  // 20,992

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;                          // 2 stages (bf16 cache)
  static constexpr int kOffS = kOffK + 2 * kKStageBytes;                 // scores / probabilities [64][40] fp32
  static constexpr int kOffScale = kOffS + kBlockM * kScoreStride * 4;   // [32][8] fp32
  static constexpr int kOffTag = kOffScale + kBlockN * kScaleStride * 4; // [2][32] int32
  static constexpr int kOffRow = kOffTag + 2 * kBlockN * 4;              // alpha, 1/l: [2][64] fp32
  static constexpr int kOffFmt = kOffRow + 2 * kBlockM * 4;              // record rows' CacheFormat: [2][32] u8
  static constexpr int kOffRaw = kOffFmt + 2 * kBlockN;                  // 2 raw stages (staged caches only)
  static constexpr int kSmemBf16 = kOffRaw;                              // 161,600
  static constexpr int kSmemFp8 = kOffRaw + 2 * kRawStageBytes;          // 203,584

  static_assert(kOffK % 16 == 0 && kOffS % 16 == 0 && kOffRaw % 16 == 0 && kRowBytes % 16 == 0, "16B alignment");
  static_assert(kRawRowBytes % 16 == 0, "raw rows are filled with 16-byte cp.async");
  static_assert(kThreads == kBlockN * 8, "the tile loader gives each key row 8 threads");
  static_assert(kThreads == kBlockM * 4, "the softmax step gives each query row 4 threads");
  static_assert(kBlockN == 32, "the QK split (2 warps x 16 keys) and the PV k-steps assume 32 keys");
  static_assert(kSmemFp8 <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(kRawRowBytes == 656, "the shared-memory plan above was sized for the fp8_ds_mla record");
#define MLA_X(name, value)                                                                            \
  static_assert(CacheFormatTraits<CacheFormat::name>::entry_bytes(0, 0) <= kRawRowBytes &&           \
                    CacheFormatTraits<CacheFormat::name>::kDqk <= kMaxDqk,                            \
                "a staged record [body | scale slot] fits a raw row");
  MLA_RECORD_CACHE_FORMATS(MLA_X)
#undef MLA_X
};

}  // namespace mla::cuda::mqa
