// SPDX-License-Identifier: Apache-2.0
#pragma once
// Latent-cache MQA engine shared by mqa_decode (portable/decode/) and sparse_mqa (portable/sparse/).
//
// Algorithm (FlashAttention-2 style online softmax over key tiles, bf16 tensor cores via mma.sync):
//   A CTA owns up to 64 query rows of one group (decode: (i, h) rows of one request; sparse: the heads
//   of one token) and one key range. All its rows attend the same keys (MQA), so every key tile is read
//   from the cache once per CTA. Per tile of 32 keys:
//     load   8 threads per key row copy the cache row with 16-byte cp.async into a staging buffer
//            (bf16: straight into the padded K tile; fp8 / fp8_ds_mla: raw bytes, then converted).
//            Keys outside the range, past seq_len, with invalid indices or block ids are never read:
//            their shared row is zero-filled (finite, so 0-probability keys add exactly 0) and tagged -1.
//     QK     S[64 x 32] = Q K^T, warp w: rows 16*(w%4), keys 16*(w/4). The k loop runs in groups of 128
//            columns; each group's partial sum is multiplied by that key's scale for the group before it
//            is added (bf16: 1, fp8: the per-tensor scale, fp8_ds_mla: the tile scale, rope: 1). The mma
//            therefore sees the *raw* e4m3 codes, which bf16 holds exactly: no rounding of K.
//     softmax 4 threads per row: mask (tag < 0 or tag > the row's limit), running max / sum in the
//            log2 domain, P written back over S, the rescale factor of the row published to smem.
//     PV     O[64 x 512] = alpha * O + P V, warp w: rows 16*(w%4), columns 256*(w/4) (128 fp32
//            accumulators per thread). P (fp32 in smem) is multiplied by the key's scale for the
//            column tile and rounded to bf16 for the mma: the only rounding beyond fp32 (relative 2^-9
//            per probability).
//   The next tile's copy is in flight while the current one is computed (two stages).
//   Epilogue: rows are normalised by 1/l and written in the activation type (bf16 / f16 / f32) with their
//   natural-log LSE, or, for a
//   split-KV unit, as fp32 partials O / l with the partial LSE for a combine kernel. A row that saw no
//   visible key gets O = 0, LSE = -inf.
//
// Warp roles: all 8 warps load, all compute QK (4 row slabs x 2 key halves), all run softmax (4 threads
// per row), all compute PV (4 row slabs x 2 column halves). Barriers: 4 per tile (5 with conversion).
// Shared memory (Traits): Q 73 KiB, K 2 x 36.5 KiB, S 10 KiB, small tables; + 41 KiB raw staging for fp8
// caches: 158 KiB (bf16) / 199 KiB (fp8) -> one CTA per SM; pipeline depth 2 (fp8 caches: two raw stages,
// one converted K tile).
// Measured: ~6 us per 32-key tile per CTA whatever the format or head count, i.e. latency-bound (8 warps per
// SM, 5 barriers per tile): 10-20% of the copy ceiling (docs/design/attention_portable.md "Performance").
//
// The key source (decode: paged positions through the block table; sparse: top-k rows) is a policy:
//   struct Keys {
//     using Params = ...;                   // has `MqaRowParams rows; MqaCacheParams cache;`
//     __device__ Keys(const Params&, int64_t unit);
//     int64_t group;                        // group of the CTA's rows
//     int key_begin, key_end;               // key range of this unit
//     float* ws_o; float* ws_lse; int64_t ws_row0;  // split partials (ws_o == nullptr: final output)
//     __device__ int row_limit(int i) const;        // largest visible tag for query i, -1: none
//     __device__ int64_t row_offset(int key, int& tag) const;  // byte offset of the key's cache row,
//   };                                                         // -1 = invalid; tag >= 0 when valid
// Optional members (sparse_mqa's DeepSeek-V4 inputs; a policy without them compiles as before):
//     __device__ const uint8_t* row_pointer(int key, int& tag) const;  // replaces row_offset: the row's
//                               address (keys of two caches of one format), nullptr = invalid
//     __device__ float sink_log2(int head) const;  // the head's attention sink in the log2 domain (-inf:
//                               none), folded into the row's softmax state in the epilogue
//     __device__ mqa::RecordRow record_row(int key, int& tag) const;  // block-scaled record caches
//                               (cp.record): the row's body and scale-slot addresses, its format and
//                               whether 16-byte copies are legal; main and extra caches may differ in format
//
// Block-scaled records (v4, v41, v41_fp4; mla/cache_format.h): each key row is staged as [body | scale slot]
// (the record's own byte order; v4's slot copied from its page's scale region) with its format noted per row,
// then dequantised into the K tile as bf16(code * scale), which is exact (e4m3 or e2m1 codes times a power of
// two or an e4m3 scale carry at most 6 significant bits; the writers' scales keep every product inside bf16's
// range), so the scale table stays 1 and the mma sees the values themselves. A tile may hold rows of two
// formats (a main and an extra cache): the conversion dispatches per row.
template <class Keys>
concept KeysWithRowPointer = requires(const Keys& k, int key, int& tag) { k.row_pointer(key, tag); };
template <class Keys>
concept KeysWithSink = requires(const Keys& k, int head) { k.sink_log2(head); };
// Keys whose output rows are turned pairwise before the store (sparse_mqa's out_rotation, cuda/common/rotation.cuh):
// out_rotation() the rotation, out_position() the unit's position (one token per unit).
template <class Keys>
concept KeysWithRotation = requires(const Keys& k) {
  k.out_rotation();
  k.out_position();
};
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/numeric.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/mqa_traits.cuh"
#include "cuda/common/rotation.cuh"
#include "cuda/common/softmax.cuh"

namespace mla::cuda::mqa {

// Where a key row of a block-scaled record cache lives (Keys::record_row): body == nullptr for an invalid
// key (format then names any record format, the zero-filled row converts to zeros).
struct RecordRow {
  const uint8_t* body;  // [codes | rope]
  const uint8_t* slot;  // the scale slot (inside the row, or in the page's scale region)
  CacheFormat format;
  bool vec;  // body (and, without page scales, the whole record) 16-byte aligned: cp.async copies
};
template <class Keys>
concept KeysWithRecords = requires(const Keys& k, int key, int& tag) { k.record_row(key, tag); };

// Query tile: rows [row0, row0 + 64) of group g into sQ (zero rows / columns past the data). The
// tensor cores take bf16: f16 / f32 queries are rounded to bf16 here (to nearest even), the one input
// rounding of the non-bf16 activation types.
template <class Act>
__device__ __forceinline__ void load_q_tile(const MqaRowParams& rp, int64_t g, int row0, int m_rows, uint16_t* sQ) {
  using T = Traits;
  constexpr int kChunks = T::kRowElems / 8;  // 73 chunks of 8 bf16 per padded row
  for (int c = threadIdx.x; c < T::kBlockM * kChunks; c += T::kThreads) {
    const int r = c / kChunks, ch = c % kChunks, col = ch * 8;
    uint16_t* dst = sQ + r * T::kRowElems + col;
    const int row = row0 + r;
    const int valid = row < m_rows ? min(8, rp.d_qk - col) : 0;
    if (valid <= 0) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const int i = row / rp.h_q, h = row % rp.h_q;
    const auto* src = static_cast<const typename Act::Storage*>(rp.q) + g * rp.q_stride_g + i * rp.q_stride_i +
                      h * rp.q_stride_h + col;
    if constexpr (std::is_same_v<Act, Bf16>) {
      if (valid == 8 && rp.q_vec16) {
        ptx::cp_async_16(dst, src);
        continue;
      }
      for (int e = 0; e < 8; ++e) dst[e] = e < valid ? src[e] : uint16_t(0);
    } else {
      for (int e = 0; e < 8; ++e) dst[e] = e < valid ? dev::float_to_bf16(Act::to_float(src[e])) : uint16_t(0);
    }
  }
}

// Record caches: key row r of the tile staged as [body | scale slot] (the record's byte order, offsets from
// the format's traits) and its format noted for the conversion. Invalid keys: zeros, tag -1.
template <class Keys>
__device__ __forceinline__ void load_record_key_tile(const Keys& keys, const MqaCacheParams& cp, int k0, int stage,
                                                     uint8_t* smem) {
  using T = Traits;
  const int r = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int key = k0 + r;
  int tag = -1;
  RecordRow src{nullptr, nullptr, cp.format, false};
  if (key < keys.key_end) src = keys.record_row(key, tag);
  uint8_t* dst = smem + T::kOffRaw + stage * T::kRawStageBytes + r * T::kRawRowBytes;
  bool copied = false;
  if (src.body) {
    visit_record_cache_format(src.format, [&](auto fmt) {
      using Fmt = decltype(fmt);
      constexpr int kBody = static_cast<int>(Fmt::scale_offset(Fmt::kDqk - Fmt::kDrope));
      constexpr int kSlot = Fmt::kScaleSlot;
      // Without page scales the record is one run [body | slot]; with them the body, then the slot apart.
      constexpr int kRun = Fmt::kPageScales ? kBody : kBody + kSlot;
      static_assert(kRun % 16 == 0, "16-byte copies of the record's run");
      if (src.vec) {
        for (int c = sub; c < kRun / 16; c += 8) ptx::cp_async_16(dst + 16 * c, src.body + 16 * c);
      } else {
        for (int e = sub; e < kRun; e += 8) dst[e] = src.body[e];
      }
      if constexpr (Fmt::kPageScales)
        for (int e = sub; e < kSlot; e += 8) dst[kBody + e] = src.slot[e];
      copied = true;
    });
  }
  if (!copied) {
    for (int c = sub; c < T::kRawRowBytes / 16; c += 8) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    tag = -1;
  }
  if (sub == 0) {
    reinterpret_cast<int*>(smem + T::kOffTag)[stage * T::kBlockN + r] = tag;
    smem[T::kOffFmt + stage * T::kBlockN + r] = static_cast<uint8_t>(src.format);
  }
}

// Copies one key tile (keys [k0, k0 + 32)) into stage `stage`: bf16 rows straight into the K tile,
// fp8 rows into the raw staging buffer. Thread layout: 8 threads per key row.
template <class Keys>
__device__ __forceinline__ void load_key_tile(const Keys& keys, const MqaCacheParams& cp, int k0, int stage,
                                              uint8_t* smem) {
  if constexpr (KeysWithRecords<Keys>) {
    if (cp.record) return load_record_key_tile(keys, cp, k0, stage, smem);
  }
  using T = Traits;
  const int r = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int key = k0 + r;
  int tag = -1;
  const uint8_t* src;
  bool valid;
  if constexpr (KeysWithRowPointer<Keys>) {
    src = key < keys.key_end ? keys.row_pointer(key, tag) : nullptr;
    valid = src != nullptr;
  } else {
    const int64_t off = key < keys.key_end ? keys.row_offset(key, tag) : int64_t(-1);
    valid = off >= 0;
    src = cp.data + off;
  }
  const bool raw = !cp.direct;
  uint8_t* dst = raw ? smem + T::kOffRaw + stage * T::kRawStageBytes + r * T::kRawRowBytes
                     : smem + T::kOffK + stage * T::kKStageBytes + r * T::kRowBytes;
  if (valid) {
    if (cp.vec16) {
      for (int c = sub; c < cp.row_bytes / 16; c += 8) ptx::cp_async_16(dst + 16 * c, src + 16 * c);
    } else if (cp.elem_bytes == 2) {
      for (int e = sub; e < cp.row_bytes / 2; e += 8)
        reinterpret_cast<uint16_t*>(dst)[e] = reinterpret_cast<const uint16_t*>(src)[e];
    } else {
      for (int e = sub; e < cp.row_bytes; e += 8) dst[e] = src[e];
    }
  } else {
    const int bytes = raw ? T::kRawRowBytes : T::kRowBytes;
    for (int c = sub; c < bytes / 16; c += 8) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    tag = -1;
  }
  if (sub == 0) reinterpret_cast<int*>(smem + T::kOffTag)[stage * T::kBlockN + r] = tag;
}

// Eight e4m3 codes -> eight bf16 (exact: every e4m3 value is a bf16 value).
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 codes) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? codes.x : codes.y;
    const float2 f = dev::e4m3x2_to_float2(static_cast<uint16_t>(word >> (16 * (i & 1))));
    w[i] = ptx::pack_bf16x2(f.x, f.y);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Staged row -> bf16 K tile row r for the format Fmt (mla/cache_format.h). The mma takes the raw codes
// (every e4m3 value is a bf16 value); scales are applied per 128-column group through the scale table.
//   uniform formats (fp8): d_qk codes in one run; the per-tensor scale was written by the prologue.
//   split formats (fp8_ds_mla): latent codes, then per-tile fp32 scales (copied into the key's scale
//   row; the rope group gets 1), then the rope (bf16 copied, or codes converted).
template <class Fmt>
__device__ __forceinline__ void convert_key_row(const uint8_t* raw, int d_qk, int sub, uint16_t* dst, float* sc) {
  using T = Traits;
  static_assert(Fmt::kLatentDType == DType::fp8_e4m3, "staged rows hold e4m3 latent codes (bf16 rows go direct)");
  if constexpr (Fmt::uniform()) {
    // Per-tensor fp8: d_qk codes; the staged bytes past d_qk are stale and must not leak into the tile.
    for (int ch = sub; ch * 8 < d_qk; ch += 8) {
      uint2 codes = *reinterpret_cast<const uint2*>(raw + 8 * ch);
      const int valid = d_qk - 8 * ch;
      if (valid < 8) {
        const uint64_t keep = (uint64_t(1) << (8 * valid)) - 1;
        const uint64_t all = (static_cast<uint64_t>(codes.y) << 32 | codes.x) & keep;
        codes = make_uint2(static_cast<uint32_t>(all), static_cast<uint32_t>(all >> 32));
      }
      *reinterpret_cast<uint4*>(dst + 8 * ch) = e4m3x8_to_bf16x8(codes);
    }
  } else {
    static_assert(Fmt::kDqk > 0, "a split row layout has fixed dims");
    constexpr int kLatent = Fmt::kDqk - Fmt::kDrope, kChunks = Fmt::kDqk / 8, kTiles = Fmt::num_tiles(kLatent);
    constexpr int kRope = Fmt::rope_offset(kLatent), kScales = Fmt::scale_offset(kLatent);
    static_assert(kLatent % 8 == 0 && Fmt::kDrope % 8 == 0 && kRope % 16 == 0 && kScales % 16 == 0,
                  "16-byte chunks of the staged row");
    static_assert(Fmt::kScale != CacheScale::per_tile || (Fmt::kTile == T::kScaleTile && kLatent % Fmt::kTile == 0),
                  "tile scales map onto the engine's 128-column scale groups");
    static_assert(Fmt::kDqk <= T::kMaxDqk && kTiles < T::kScaleStride, "the engine's tiles");
    for (int ch = sub; ch < kChunks; ch += 8) {
      const int col = 8 * ch;
      uint4 v;
      if (col < kLatent) v = e4m3x8_to_bf16x8(*reinterpret_cast<const uint2*>(raw + col));
      else if constexpr (Fmt::kRopeDType == DType::bf16) v = *reinterpret_cast<const uint4*>(raw + kRope + 2 * (col - kLatent));
      else v = e4m3x8_to_bf16x8(*reinterpret_cast<const uint2*>(raw + kRope + (col - kLatent)));
      *reinterpret_cast<uint4*>(dst + col) = v;
    }
    if constexpr (Fmt::kScale == CacheScale::per_tile) {
      // A zero-filled (invalid) row reads scales 0: harmless, its probabilities are 0.
      if (sub == 0) {
        const float* s = reinterpret_cast<const float*>(raw + kScales);
        if constexpr (kTiles == 4) {  // fp8_ds_mla: one 16-byte shared load
          const float4 s4 = *reinterpret_cast<const float4*>(s);
          sc[0] = s4.x;
          sc[1] = s4.y;
          sc[2] = s4.z;
          sc[3] = s4.w;
        } else {
#pragma unroll
          for (int t = 0; t < kTiles; ++t) sc[t] = s[t];
        }
        sc[kTiles] = 1.0f;  // rope columns (unscaled)
      }
    }
  }
}

// Staged record [body | scale slot] -> bf16 K tile row: every coded column as bf16(code * its block's scale)
// (exact, see the header comment), v4's bf16 rope copied. 8 threads per row, 8 columns per chunk.
template <class Fmt>
__device__ __forceinline__ void convert_record_row(const uint8_t* raw, int sub, uint16_t* dst) {
  constexpr int kLatent = Fmt::kDqk - Fmt::kDrope;
  constexpr int kCoded = static_cast<int>(Fmt::coded_cols(kLatent));
  constexpr int kScales = static_cast<int>(Fmt::scale_offset(kLatent));
  constexpr int kRope = static_cast<int>(Fmt::rope_offset(kLatent));
  static_assert(Fmt::kTile % 8 == 0 && kLatent % 8 == 0 && Fmt::kDqk % 8 == 0, "8-column chunks in one block");
  static_assert(Fmt::kRopeCoded || kRope % 16 == 0, "16-byte rope chunks");
  for (int ch = sub; ch < Fmt::kDqk / 8; ch += 8) {
    const int col = 8 * ch;
    uint4 v;
    if (col < kCoded) {
      const uint8_t sb = raw[kScales + col / Fmt::kTile];
      const float s = Fmt::kScale == CacheScale::ue8m0 ? num::ue8m0_to_float(sb) : dev::e4m3_to_float(sb);
      float x[8];
      if constexpr (Fmt::kCode == CacheCode::e2m1) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + Fmt::code_offset(col));  // code k at bits 4k
#pragma unroll
        for (int k = 0; k < 8; ++k) x[k] = num::e2m1_value(w >> (4 * k) & 0xfu);
      } else {
        const uint2 c = *reinterpret_cast<const uint2*>(raw + Fmt::code_offset(col));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = dev::e4m3x2_to_float2(static_cast<uint16_t>((i < 2 ? c.x : c.y) >> (16 * (i & 1))));
          x[2 * i] = f.x;
          x[2 * i + 1] = f.y;
        }
      }
      v = make_uint4(ptx::pack_bf16x2(x[0] * s, x[1] * s), ptx::pack_bf16x2(x[2] * s, x[3] * s),
                     ptx::pack_bf16x2(x[4] * s, x[5] * s), ptx::pack_bf16x2(x[6] * s, x[7] * s));
    } else {
      v = *reinterpret_cast<const uint4*>(raw + kRope + 2 * (col - kLatent));
    }
    *reinterpret_cast<uint4*>(dst + col) = v;
  }
}

// Staged formats: raw stage -> bf16 K tile (stage 0 buffer) and the per-key scales.
__device__ __forceinline__ void convert_key_tile(const MqaCacheParams& cp, int d_qk, int stage, uint8_t* smem) {
  using T = Traits;
  const int r = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const uint8_t* raw = smem + T::kOffRaw + stage * T::kRawStageBytes + r * T::kRawRowBytes;
  uint16_t* dst = reinterpret_cast<uint16_t*>(smem + T::kOffK) + r * T::kRowElems;
  if (cp.record) {  // per row: a tile may hold rows of a main and an extra cache of different formats
    const auto f = static_cast<CacheFormat>(smem[T::kOffFmt + stage * T::kBlockN + r]);
    visit_record_cache_format(f, [&](auto fmt) { convert_record_row<decltype(fmt)>(raw, sub, dst); });
    return;
  }
  float* sc = reinterpret_cast<float*>(smem + T::kOffScale) + r * T::kScaleStride;
  visit_cache_format(cp.format, [&](auto fmt) {
    using Fmt = decltype(fmt);
    if constexpr (!direct_format<Fmt>()) convert_key_row<Fmt>(raw, d_qk, sub, dst, sc);
  });
}

template <class Keys, class Act>
__global__ void __launch_bounds__(Traits::kThreads, 1) mqa_attention_kernel(const typename Keys::Params p) {
  using T = Traits;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem + T::kOffQ);
  float* sS = reinterpret_cast<float*>(smem + T::kOffS);
  float* sScale = reinterpret_cast<float*>(smem + T::kOffScale);
  const int* sTag = reinterpret_cast<const int*>(smem + T::kOffTag);
  float* sAlpha = reinterpret_cast<float*>(smem + T::kOffRow);
  float* sInvL = sAlpha + T::kBlockM;

  const MqaRowParams& rp = p.rows;
  const MqaCacheParams& cp = p.cache;
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g8 = lane >> 2, t4 = lane & 3;  // mma fragment coordinates
  const int m_rows = rp.s_q * rp.h_q;
  const int m_tiles = (m_rows + T::kBlockM - 1) / T::kBlockM;
  const int row0 = static_cast<int>(blockIdx.x % m_tiles) * T::kBlockM;
  const Keys keys(p, static_cast<int64_t>(blockIdx.x / m_tiles));
  const int64_t g = keys.group;
  const bool converted = !cp.direct;

  // ---- prologue: zero K (its padding columns must be finite zeros), scales, Q, first key tile ----
  for (int c = tid; c < 2 * T::kKStageBytes / 16; c += T::kThreads)
    reinterpret_cast<uint4*>(smem + T::kOffK)[c] = make_uint4(0, 0, 0, 0);
  // Per-tensor (or no) scale for every key and group; per-tile formats overwrite theirs per tile.
  for (int c = tid; c < T::kBlockN * T::kScaleStride; c += T::kThreads) sScale[c] = cp.scale;
  __syncthreads();  // zero fill before cp.async writes into the same rows
  load_q_tile<Act>(rp, g, row0, m_rows, sQ);
  const int n_keys = keys.key_end > keys.key_begin ? keys.key_end - keys.key_begin : 0;
  const int n_tiles = (n_keys + T::kBlockN - 1) / T::kBlockN;
  if (n_tiles > 0) load_key_tile(keys, cp, keys.key_begin, 0, smem);
  ptx::cp_async_commit();

  // Softmax ownership: thread -> row tid/4, keys 8*(tid%4) .. +8 of each tile.
  const int sm_row = tid >> 2, sm_q = tid & 3;
  const int sm_limit = row0 + sm_row < m_rows ? keys.row_limit((row0 + sm_row) / rp.h_q) : -1;
  softmax::RowState st;

  const int wm = warp & 3, wn = warp >> 2;
  float acc_o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc_o[j][0] = acc_o[j][1] = acc_o[j][2] = acc_o[j][3] = 0.0f;
  const int ks_total = (rp.d_qk + 15) / 16;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_tiles) {
      load_key_tile(keys, cp, keys.key_begin + (it + 1) * T::kBlockN, stage ^ 1, smem);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    if (converted) {
      convert_key_tile(cp, rp.d_qk, stage, smem);
      __syncthreads();
    }
    const uint16_t* sK = reinterpret_cast<const uint16_t*>(smem + T::kOffK) + (converted ? 0 : stage) * T::kBlockN * T::kRowElems;

    // ---- S = Q K^T, scaled per key and column group ----
    {
      float acc[2][4] = {};
      const uint16_t* a_ptr = sQ + (16 * wm + (lane & 15)) * T::kRowElems + (lane >> 4) * 8;
      const uint16_t* b_ptr = sK + (16 * wn + (lane & 7) + (lane >> 4) * 8) * T::kRowElems + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int grp = 0; grp < T::kScaleGroups; ++grp) {
        float part[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const int ks = grp * 8 + kk;
          if (ks * 16 < T::kMaxDqk && ks < ks_total) {
            uint32_t a[4], b[4];
            ptx::ldmatrix_x4(a, a_ptr + ks * 16);
            ptx::ldmatrix_x4(b, b_ptr + ks * 16);
            ptx::mma_bf16_16816(part[0], a, b[0], b[1]);
            ptx::mma_bf16_16816(part[1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int key = 16 * wn + 8 * nt + 2 * t4;
          const float s0 = sScale[key * T::kScaleStride + grp], s1 = sScale[(key + 1) * T::kScaleStride + grp];
          acc[nt][0] += s0 * part[nt][0];
          acc[nt][1] += s1 * part[nt][1];
          acc[nt][2] += s0 * part[nt][2];
          acc[nt][3] += s1 * part[nt][3];
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = 16 * wn + 8 * nt + 2 * t4, row = 16 * wm + g8;
        *reinterpret_cast<float2*>(sS + row * T::kScoreStride + key) =
            make_float2(acc[nt][0] * rp.scale_log2, acc[nt][1] * rp.scale_log2);
        *reinterpret_cast<float2*>(sS + (row + 8) * T::kScoreStride + key) =
            make_float2(acc[nt][2] * rp.scale_log2, acc[nt][3] * rp.scale_log2);
      }
    }
    __syncthreads();

    // ---- online softmax, 4 threads per row ----
    {
      float* srow = sS + sm_row * T::kScoreStride + 8 * sm_q;
      const int* tags = sTag + stage * T::kBlockN + 8 * sm_q;
      const float4 lo = *reinterpret_cast<const float4*>(srow), hi = *reinterpret_cast<const float4*>(srow + 4);
      float s[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      bool vis[8];
      float bmax = -INFINITY;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        vis[e] = tags[e] >= 0 && tags[e] <= sm_limit;
        if (vis[e]) bmax = fmaxf(bmax, s[e]);
      }
      bmax = softmax::quad_max(bmax);
      const float alpha = st.rescale(bmax);
      const float base = st.base();
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        s[e] = vis[e] ? softmax::exp2_approx(s[e] - base) : 0.0f;
        sum += s[e];
      }
      st.sum += softmax::quad_sum(sum);
      *reinterpret_cast<float4*>(srow) = make_float4(s[0], s[1], s[2], s[3]);
      *reinterpret_cast<float4*>(srow + 4) = make_float4(s[4], s[5], s[6], s[7]);
      if (sm_q == 0) sAlpha[sm_row] = alpha;
    }
    __syncthreads();

    // ---- O = alpha * O + P V over this warp's 16 rows x 256 columns ----
    {
      const int row = 16 * wm + g8;
      const float a_lo = sAlpha[row], a_hi = sAlpha[row + 8];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        acc_o[j][0] *= a_lo;
        acc_o[j][1] *= a_lo;
        acc_o[j][2] *= a_hi;
        acc_o[j][3] *= a_hi;
      }
#pragma unroll
      for (int tt = 0; tt < 2; ++tt) {
        const int tile = 2 * wn + tt;  // 128-column scale tile
        if (tile * T::kScaleTile >= rp.d_v) continue;
        uint32_t a[2][4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int k0 = 16 * kk + 2 * t4, k1 = k0 + 8;
          const float c00 = sScale[k0 * T::kScaleStride + tile], c01 = sScale[(k0 + 1) * T::kScaleStride + tile];
          const float c10 = sScale[k1 * T::kScaleStride + tile], c11 = sScale[(k1 + 1) * T::kScaleStride + tile];
          const float2 p00 = *reinterpret_cast<const float2*>(sS + row * T::kScoreStride + k0);
          const float2 p10 = *reinterpret_cast<const float2*>(sS + (row + 8) * T::kScoreStride + k0);
          const float2 p01 = *reinterpret_cast<const float2*>(sS + row * T::kScoreStride + k1);
          const float2 p11 = *reinterpret_cast<const float2*>(sS + (row + 8) * T::kScoreStride + k1);
          a[kk][0] = ptx::pack_bf16x2(p00.x * c00, p00.y * c01);
          a[kk][1] = ptx::pack_bf16x2(p10.x * c00, p10.y * c01);
          a[kk][2] = ptx::pack_bf16x2(p01.x * c10, p01.y * c11);
          a[kk][3] = ptx::pack_bf16x2(p11.x * c10, p11.y * c11);
        }
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          const int col0 = tile * T::kScaleTile + 16 * np;
          if (col0 >= rp.d_v) continue;
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            uint32_t b[4];
            ptx::ldmatrix_x4_trans(
                b, sK + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * T::kRowElems + col0 + (lane >> 4) * 8);
            ptx::mma_bf16_16816(acc_o[tt * 16 + 2 * np], a[kk], b[0], b[1]);
            ptx::mma_bf16_16816(acc_o[tt * 16 + 2 * np + 1], a[kk], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }
  ptx::cp_async_wait<0>();  // a unit without tiles still committed the Q copy

  // ---- epilogue ----
  if (sm_q == 0) {
    const int row = row0 + sm_row;
    float inv_l = st.inv_sum(), row_lse = st.lse();
    if constexpr (KeysWithSink<Keys>) {
      // The sink joins the row as a key of value 0 (softmax::fold_sink); the accumulators keep their scale.
      if (row < m_rows) softmax::fold_sink(st, keys.sink_log2(row % rp.h_q), inv_l, row_lse);
    }
    sInvL[sm_row] = inv_l;
    if (row < m_rows) {
      if (keys.ws_o) {
        keys.ws_lse[keys.ws_row0 + row] = row_lse;
      } else if (rp.lse) {
        const int i = row / rp.h_q, h = row % rp.h_q;
        rp.lse[g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = row_lse;
      }
    }
  }
  __syncthreads();
  if constexpr (KeysWithRotation<Keys>) {
    // A thread's columns come in pairs (col, col + 1), col even: a rotated pair is the thread's own. Linear, so
    // the unnormalised accumulators are turned (their row's 1 / l follows).
    // The pairs' cos / sin once per CTA into sS (free after the loop), then read by every thread.
    const dev::OutRotation& rot = keys.out_rotation();
    if (rot.on()) {  // uniform
      rot.fill_table(keys.out_position(), sS, tid, T::kThreads);
      __syncthreads();
      const int half_dim = rot.dim / 2;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int i = rot.pair_of(256 * wn + 8 * j + 2 * t4, rp.d_v);
        if (i < 0) continue;
        const float c = sS[i], s = sS[half_dim + i];
#pragma unroll
        for (int half = 0; half < 2; ++half) dev::OutRotation::turn(c, s, acc_o[j][2 * half], acc_o[j][2 * half + 1]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int lrow = 16 * wm + g8 + 8 * half, row = row0 + lrow;
    if (row >= m_rows) continue;
    const float inv = sInvL[lrow];
    const int i = row / rp.h_q, h = row % rp.h_q;
    if (keys.ws_o) {
      float* dst = keys.ws_o + (keys.ws_row0 + row) * int64_t(T::kMaxDv);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = 256 * wn + 8 * j + 2 * t4;
        if (col < rp.d_v)
          *reinterpret_cast<float2*>(dst + col) = make_float2(acc_o[j][2 * half] * inv, acc_o[j][2 * half + 1] * inv);
      }
    } else {
      auto* dst = static_cast<typename Act::Storage*>(rp.out) + g * rp.out_stride_g + i * rp.out_stride_i +
                  h * rp.out_stride_h;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = 256 * wn + 8 * j + 2 * t4;
        if (col < rp.d_v) dst[col] = Act::from_float(acc_o[j][2 * half] * inv);
        if (col + 1 < rp.d_v) dst[col + 1] = Act::from_float(acc_o[j][2 * half + 1] * inv);
      }
    }
  }
}

}  // namespace mla::cuda::mqa
