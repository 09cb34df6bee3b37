// SPDX-License-Identifier: Apache-2.0
#pragma once
// mha_prefill tile sizes and shared-memory plan (bytes unless named otherwise).
#include <cstdint>

namespace mla::cuda::prefill {

struct Traits {
  static constexpr int kThreads = 128;  // 4 warps, 16 query rows each
  static constexpr int kBlockM = 64;    // query rows per CTA
  static constexpr int kBlockN = 64;    // keys per tile
  static constexpr int kMaxDqk = 192;   // d_nope + d_rope (DeepSeek: 128 + 64)
  static constexpr int kMaxDv = 128;
  // Padded row lengths in bf16 elements: row starts 16 bytes apart modulo 128 -> conflict-free ldmatrix.
  static constexpr int kKRow = kMaxDqk + 8;  // Q and K rows
  static constexpr int kVRow = kMaxDv + 8;
  static constexpr int kQBytes = kBlockM * kKRow * 2;       // 25,600
  static constexpr int kKStageBytes = kBlockN * kKRow * 2;  // 25,600
  static constexpr int kVStageBytes = kBlockN * kVRow * 2;  // 17,408
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + 2 * kKStageBytes;
  static constexpr int kSmem = kOffV + 2 * kVStageBytes;    // 111,616: two CTAs per SM

  static_assert(kKRow % 8 == 0 && kVRow % 8 == 0, "rows are filled in 16-byte chunks");
  static_assert((kKRow * 2 / 16) % 2 == 1 && (kVRow * 2 / 16) % 2 == 1, "odd 16-byte stride: no ldmatrix conflicts");
  static_assert(kThreads == 4 * 32 && kBlockM == 4 * 16, "one 16-row mma slab per warp");
  static_assert(2 * kSmem <= 227 * 1024, "two CTAs per SM");
};

}  // namespace mla::cuda::prefill
