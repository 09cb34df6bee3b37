// SPDX-License-Identifier: Apache-2.0
#pragma once
// The converter kernel: mqa_decode over an fp8 per-tensor or fp8_ds_mla cache, and sparse_mqa over fp8_ds_mla records,
// at 64-row tiles (h 64 = one tile per request or token at s_q 1, h 128 = two), with a whole warpgroup converting
// codes and two asymmetric consumers (docs/design/attention_sm90.md "The converter kernel"; the plan and its cycle
// model: docs/design/fp8_64row_plan.md design B).
//
// Roles (384 threads, __launch_bounds__(384, 1), one CTA per (row tile, split, request)):
//   warpgroup 0, the converter (136 registers): it loads a tile's codes into registers (through the block table or
//     the index row), waits for the stage's release, writes them into the stage's swizzled K-major panels (fp8:
//     the exact codes as f16 by F2FP; fp8_ds_mla: the pinned upconvert bf16(float(code) * s_g[key]), SEMANTICS 3.3,
//     the rope as it is), fences the proxy and arrives; then loads the next tile's codes and prefetches the rows of
//     the tile after it into L2. Both formats a warp per key (Fp8Warp, DsWarp): warp w owns keys 16w .. 16w + 15,
//     lane l the l-th 16 latent codes of each (and a share of their rope chunks, and fp8_ds_mla's scales), so that
//     one load instruction reads one row's contiguous bytes.
//   warpgroup 1, S (208): loads Q (64 x 576 bf16) into shared memory once per unit; per tile S = Q K^T (36 ss
//     m64n64k16 into one accumulator), the key mask and causal limits, the lazy maximum, P = 2^(S - ref), O_L *= a
//     and O_L += P V_L (rs m64n256k16 over the latent panels 0..3); P also goes into the stage's rope panel (read by
//     S only, so free once S retired) and the rows' factors a into shared memory, for R.
//   warpgroup 2, R (160): per tile O_R *= a and O_R += P V_R (ss: P from the rope panel, V_R = panels 4..7).
// fp8 per-tensor reads the exact codes with f16 products throughout — Q rewritten once per unit as f16 times a
// per-row power of two 2^e_r (q_to_f16), S times the cache scale and 2^-e_r before the softmax, P as f16 * 2^6 into
// both value products, O times the cache scale and 2^-6 in the epilogue. fp8_ds_mla (four groups of 128 latent
// columns, an fp32 scale each per key; bf16 rope) reads the upconvert, as bf16 rows: bf16 Q, P and products, O
// unscaled.
//
// Protocol, stage s = i % 2 for tile i, parity (i / 2) & 1:
//   full[s]   128 converter arrivals (after the tile's stores and the proxy fence). S waits it; R waits it too
//             (already complete when R gets there: R follows S's kBarP + s).
//   empty[s]  256 arrivals: S's threads once P V_L of the tile retired (seen when S of tile i + 1 was issued:
//             wgmma_wait_group<1>), R's once P V_R retired. The converter waits it (parity flipped) before it
//             writes the stage.
//   kBarP + s S arrives after writing P and the factors of tile i into stage s; R syncs. S can reach the same id
//             again only for tile i + 2, which needs stage s released by R first: arrivals never run ahead of syncs.
//   kBarEnd   S arrives after publishing the row sums and references; R syncs before its epilogue.
// Trace build (common/trace.cuh): events 0 / 3 / 4 / 5 / 6 as the other kernels; the "pair" kTracePair is tiles
// 2 kTracePair and + 1: S (consumer 0) steps 4 t + {0 full wait returned, 1 S retired, 2 P published, 3 P V_L issued}
// and 8 + t (fp8: the previous tile released), R (consumer 1) steps 2 t + {0 P synced, 1 products retired}, the
// converter's producer slots of stage s: group w {0 empty wait returned, 2 stored and arrived} of warp w < 3, group 0
// step 1 warp 3's arrival, groups 1 and 2 step 1 (fp8) warps 1 and 2 before the empty wait (SM cycles).
#include <cuda.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/stmatrix.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/tma_store.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/exact_codes.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/attention/sm90/convert/launch.h"
#include "cuda/attention/sm90/convert/records.cuh"
#include "cuda/attention/sm90/convert/traits.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

namespace convert {

using T = Traits;
using L = ConvertTraits;

// Shared-memory views of the plan (ConvertTraits).
struct Smem {
  uint8_t* base;
  __device__ __forceinline__ uint8_t* q() const { return base + L::kOffQ; }
  __device__ __forceinline__ uint8_t* stage(int s) const { return base + L::kOffK + s * T::kTileBytes; }
  __device__ __forceinline__ uint8_t* p_panel(int s) const { return stage(s) + 8 * T::kPanelBytes; }
  __device__ __forceinline__ float* factors(int s) const {
    return reinterpret_cast<float*>(base + L::kOffA) + s * T::kBlockM;
  }
  __device__ __forceinline__ float* q_scales() const { return reinterpret_cast<float*>(base + L::kOffQScale); }
  __device__ __forceinline__ float* sums() const { return reinterpret_cast<float*>(base + L::kOffL); }
  __device__ __forceinline__ float* refs() const { return sums() + T::kBlockM; }
  __device__ __forceinline__ float* out_factors() const { return sums() + 2 * T::kBlockM; }  // the sink's, per row
  // A persistent V4 CTA's unit state in Q's ninth panel (V4 Q takes eight; past the staged O rows' 66,560 bytes):
  // the unit's rows' sinks (log2 domain, [64] fp32) and the CTA's next unit with keys, both written by R at the
  // unit's start for S's epilogue.
  __device__ __forceinline__ float* v4_sinks() const {
    return reinterpret_cast<float*>(q() + T::kTileBytes - T::kBlockM * 4 - 16);
  }
  __device__ __forceinline__ int* v4_next() const { return reinterpret_cast<int*>(q() + T::kTileBytes - 16); }
  // v4 records: converter thread t's rope chunk i at rope_copy(t) + 2048 i (the scales' bytes).
  __device__ __forceinline__ uint8_t* rope_copy(int t) const { return base + L::kOffScale + 16 * t; }
  __device__ __forceinline__ uint32_t* mask_words(int s) const {
    return reinterpret_cast<uint32_t*>(base + L::kOffMask) + 2 * s;
  }
  __device__ __forceinline__ uint64_t mask(int s) const { return reinterpret_cast<const uint64_t*>(base + L::kOffMask)[s]; }
  // DeepSeek-V4 records: the converter's per-warp scale exponents of the tile in stage s, and stage s's reference r.
  __device__ __forceinline__ int* ref_red(int s) const { return reinterpret_cast<int*>(base + L::kOffRefRed) + 4 * s; }
  __device__ __forceinline__ int* stage_ref(int s) const { return reinterpret_cast<int*>(base + L::kOffRef) + s; }
  __device__ __forceinline__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + L::kOffBar) + s; }
  __device__ __forceinline__ uint64_t* empty(int s) const {
    return reinterpret_cast<uint64_t*>(base + L::kOffBar) + L::kStages + s;
  }
  // DeepSeek-V4: Q's eight TMA boxes have landed (one arrival with their bytes; phase 0 only).
  __device__ __forceinline__ uint64_t* q_full() const {
    return reinterpret_cast<uint64_t*>(base + L::kOffBar) + 2 * L::kStages;
  }
  // The N 16 tile's record ring (ConvertTraits::ring_offset): converter warp w's barriers and key mask, and key k's
  // record slot (kRec bytes a record).
  __device__ __forceinline__ uint64_t* ring_full(int w) const {
    return reinterpret_cast<uint64_t*>(base + L::kOffBar) + 2 * L::kStages + 1 + w;
  }
  // A persistent V4 CTA: the unit's Q converted by S and R (256 arrivals a unit; v4_q_convert_persistent).
  __device__ __forceinline__ uint64_t* q_ready() const {
    return reinterpret_cast<uint64_t*>(base + L::kOffBar) + 2 * L::kStages + 9;
  }
  __device__ __forceinline__ uint64_t* ring_empty(int w) const {
    return reinterpret_cast<uint64_t*>(base + L::kOffBar) + 2 * L::kStages + 5 + w;
  }
  __device__ __forceinline__ uint32_t* ring_valid(int w) const {
    return reinterpret_cast<uint32_t*>(base + L::kOffRingValid) + w;
  }
  // DeepSeek-V4's output rotation: the unit's token's cos / sin table (R's own).
  __device__ __forceinline__ float* rot() const { return reinterpret_cast<float*>(base + L::kOffRot); }
  // A persistent V4 CTA's per-warp loop state (ConvertTraits::kOffRoleState): slot w the converter warp w's unit, 4 + w
  // R's warp w's V4Phase. Written by lane 0, read by the warp past __syncwarp (volatile: never a register's copy).
  __device__ __forceinline__ volatile int* role_state(int slot) const {
    return reinterpret_cast<volatile int*>(base + L::kOffRoleState) + slot;
  }
  template <int kRec>
  __device__ __forceinline__ uint8_t* ring_key(int k) const {
    return q() + L::ring_offset(kRec) + L::ring_key_offset(kRec, k);
  }
};

// A consumer thread's place in the 64 x N wgmma D fragment: warp w of its warpgroup holds rows 16w .. 16w + 15; the
// thread rows r_lo = 16w + lane / 4 and r_hi = r_lo + 8, columns 8j + 2 t4, + 1 (j = 0 .. N / 8 - 1): d[4j], d[4j + 1]
// on r_lo, d[4j + 2], d[4j + 3] on r_hi.
struct Frag {
  int t4, r_lo, r_hi;
  __device__ __forceinline__ Frag() {
    const int lane = threadIdx.x & 31;
    t4 = lane & 3;
    r_lo = 16 * ptx::warp_idx_in_warpgroup() + (lane >> 2);
    r_hi = r_lo + 8;
  }
};

// The wgmma descriptor's 14-bit start-address field of smem plus compile-time byte offsets (128-byte swizzle, SBO
// 1024): K-major (LBO unused: 16) and MN-major (LBO: bytes between 64-column panels).
struct Desc {
  uint32_t base4;
  __device__ __forceinline__ explicit Desc(const uint8_t* smem) : base4((ptx::smem_addr(smem) >> 4) & 0x3FFFu) {}
  __device__ __forceinline__ uint64_t at(uint32_t off, uint32_t lbo) const {
    return uint64_t{(1024u >> 4) | (1u << 30)} << 32 | (base4 + (off >> 4) + ((lbo >> 4) << 16));
  }
  __device__ __forceinline__ uint64_t k(uint32_t off) const { return at(off, 16); }
  __device__ __forceinline__ uint64_t mn(uint32_t off) const { return at(off, T::kPanelBytes); }
};

// ---- the converter ----------------------------------------------------------------------------------------------

// Key j's row from its entry (RowsT::fetch: the block id or the index, read a tile earlier) and whether it is loaded;
// the cache base for a key that is not (never read).
template <class RowsT>
__device__ __forceinline__ const uint8_t* locate_row(const DecodeSm90Params& p, int j, int32_t entry, bool& valid) {
  int64_t o = 0;
  valid = RowsT::locate(p, j, entry, o);
  return p.gather.cache + (valid ? o : 0);
}

using records::shfl_ptr;
// A warp's sixteen rows, lane l's 16 bytes 16 l .. of each (row j from lane j's row_j): zeros for a key whose valid
// bit is clear (nothing read).
__device__ __forceinline__ void gather_latent(uint4 (&raw)[16], const uint8_t* row_j, uint32_t valid, int lane) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const uint8_t* b = shfl_ptr(row_j, j);
    raw[j] = (valid >> j) & 1u ? __ldg(reinterpret_cast<const uint4*>(b) + lane) : make_uint4(0, 0, 0, 0);
  }
}

// fp8 per-tensor a warp per key (as DsWarp below; an fp8 row: 512 latent e4m3 codes | 64 rope e4m3 codes at byte 512).
// Converter warp w owns keys 16 w .. 16 w + 15 of a tile, so that a warp's load instruction reads one row's 512
// contiguous code bytes (4 lines) instead of one 16-byte chunk of 32 rows (32 lines: the by-key layout's loads cost
// the L1 one tag lookup a thread and paced the converter). Lane l holds
//   raw[j]   key j's latent codes 16 l .. 16 l + 15, into the latent panel l / 4, row chunks 2 (l % 4), + 1 (exact
//            f16 by F2FP), the lanes of odd panels their hi chunk first (DsWarp's conflict-free order: the words are
//            swapped before the conversion, four selects a key);
//   rope[i]  key l / 4 + 8 i's rope codes 16 (l % 4) .., into the rope panel's chunks 2 (l % 4), + 1 of that key
//            (a quarter warp writes two consecutive keys' rows, whose swizzles differ in the chunk's low bit: eight
//            distinct chunks).
// `valid` (bit j: key j loaded) as DsWarp's; a key not loaded has zero codes, nothing read.
struct Fp8Warp {
  uint4 raw[16];
  uint4 rope[2];
  uint32_t valid;

  // row_j / v_j: lane j's (and j + 16's) key j of the warp, its row and whether it is loaded; stride: the cache's
  // row stride in bytes (consecutive rows of a page).
  __device__ __forceinline__ void load(const uint8_t* row_j, bool v_j, int64_t stride, int lane) {
    valid = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
    const uint8_t* row0 = shfl_ptr(row_j, 0);
    // The common case, every key loaded and the sixteen rows consecutive in one page: addresses from key 0's row, no
    // shuffle a load (a page of 16 keys or more, keys 16-aligned in it).
    if (__all_sync(0xffffffffu, row_j == row0 + (lane & 15) * stride) && valid == 0xffffu) {
      const uint8_t* at = row0 + 16 * lane;
#pragma unroll
      for (int j = 0; j < 16; ++j) raw[j] = __ldg(reinterpret_cast<const uint4*>(at + j * stride));
      const uint8_t* r = row0 + (lane >> 2) * stride + 512 + 16 * (lane & 3);
#pragma unroll
      for (int i = 0; i < 2; ++i) rope[i] = __ldg(reinterpret_cast<const uint4*>(r + 8 * i * stride));
      return;
    }
    gather_latent(raw, row_j, valid, lane);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = (lane >> 2) + 8 * i;
      const uint8_t* b = shfl_ptr(row_j, k) + 512;
      rope[i] = (valid >> k) & 1u ? __ldg(reinterpret_cast<const uint4*>(b) + (lane & 3)) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void store(uint8_t* stage, int w, int lane) const {
    const int o = (lane >> 2) & 1, c = 2 * (lane & 3);
    uint8_t* panel = stage + (lane >> 2) * T::kPanelBytes;
    const int c0 = c ^ o;  // the row chunk of the first store (an odd panel's lanes: hi first; the second c0 ^ 1)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint4& r = raw[j];
      uint4 first, second;
      e4m3x16_to_f16(o ? make_uint4(r.z, r.w, r.x, r.y) : r, first, second);
      *reinterpret_cast<uint4*>(panel + swz(16 * w + j, c0)) = first;
      *reinterpret_cast<uint4*>(panel + swz(16 * w + j, c0 ^ 1)) = second;
    }
    uint8_t* rope_panel = stage + 8 * T::kPanelBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint4 lo, hi;
      e4m3x16_to_f16(rope[i], lo, hi);
      const int key = 16 * w + (lane >> 2) + 8 * i;
      *reinterpret_cast<uint4*>(rope_panel + swz(key, c)) = lo;
      *reinterpret_cast<uint4*>(rope_panel + swz(key, c + 1)) = hi;
    }
  }
};

// fp8_ds_mla a warp per key (SEMANTICS 3.3: 656 bytes = 512 e4m3 codes | 4 fp32 scales at byte 512, one per 128
// codes | 64 bf16 rope values at byte 528). Converter warp w owns keys 16 w .. 16 w + 15 of a tile (key j of the warp:
// row 16 w + j of the stage), so that a warp's load instruction reads one record's contiguous bytes (its 512 codes:
// 4 lines) instead of one chunk of 32 records (32 lines). Lane l holds
//   raw[j]   key j's codes 16 l .. 16 l + 15 (its group l / 8), record bytes 16 l ..; into the latent panel l / 4,
//            row chunks 2 l, 2 l + 1 (columns 16 l .. 16 l + 15) as the pinned upconvert bf16(float(code) * s_g[key])
//            (SEMANTICS 3.3, the seesaw kernel's reading; NaN codes give NaN);
//   rope[i]  key l / 8 + 4 i's rope chunk l % 8 (record bytes 528 + 16 (l % 8), bf16 copied as it is) into the rope
//            panel's chunk l % 8 (a warp's load: 4 records' ropes, one line each);
//   scale    key l % 16's scales of groups 2 h, 2 h + 1 (h = l / 16); lane l takes its group's scale of key j from
//            lane j + 16 (l / 16) by two shuffles.
// Every lane holds `valid` (bit j: key j loaded); a key not loaded has zeros (codes, rope, scales) and its mask bit
// clear, nothing read. Lanes j and j + 16 locate key j (its entry, row pointer and validity); the others take it by
// shuffles. Bank conflicts: a 16-byte store is served per quarter warp; lanes 4 q .. 4 q + 3 of a quarter write one
// row of the same panel at chunks {2 l} or {2 l + 1}, so the lanes of odd panels (l / 4 odd) write their hi chunk
// first: the quarter's eight physical chunks are distinct (even and odd logical chunks stay apart under the XOR
// swizzle).
struct DsWarp {
  uint4 raw[16];
  uint4 rope[4];
  float2 scale;
  uint32_t valid;

  // row_j / v_j: lane j's (and j + 16's) key j of the warp, its record and whether it is loaded.
  __device__ __forceinline__ void load(const uint8_t* row_j, bool v_j, int lane) {
    valid = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
    scale = v_j ? __ldg(reinterpret_cast<const float2*>(row_j + 512) + (lane >> 4)) : make_float2(0.0f, 0.0f);
    gather_latent(raw, row_j, valid, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = (lane >> 3) + 4 * i;
      const uint8_t* b = shfl_ptr(row_j, k) + 528;
      rope[i] = (valid >> k) & 1u ? __ldg(reinterpret_cast<const uint4*>(b) + (lane & 7)) : make_uint4(0, 0, 0, 0);
    }
  }
  // Into the stage (rows 16 w .. 16 w + 15): the latent panels upconverted, the rope as it is.
  __device__ __forceinline__ void store(uint8_t* stage, int w, int lane) const {
    const bool odd = (lane >> 2) & 1;
    uint8_t* panel = stage + (lane >> 2) * T::kPanelBytes;
    const int c0 = (2 * lane + odd) & 7;
    const int g = lane >> 3, src = 16 * (g >> 1);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int key = 16 * w + j;
      const float sx = __shfl_sync(0xffffffffu, scale.x, src + j), sy = __shfl_sync(0xffffffffu, scale.y, src + j);
      const float sg = (g & 1) ? sy : sx;
      const uint4& r = raw[j];
      *reinterpret_cast<uint4*>(panel + swz(key, c0)) = e4m3x8_scaled_to_bf16(odd ? r.z : r.x, odd ? r.w : r.y, sg);
      *reinterpret_cast<uint4*>(panel + swz(key, c0 ^ 1)) = e4m3x8_scaled_to_bf16(odd ? r.x : r.z, odd ? r.y : r.w, sg);
    }
    uint8_t* rope_panel = stage + 8 * T::kPanelBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint4*>(rope_panel + swz(16 * w + (lane >> 3) + 4 * i, lane & 7)) = rope[i];
  }
};


// fp8 per-tensor a warp per key (Fp8Warp; lanes j and j + 16 locate key j). Ahead of the stores of tile i: tile
// i + 1's codes in registers (loaded right after tile i's stores), tile i + 2's rows in L2 (prefetched then; lanes j
// and j + 16 take alternate lines of key j's row) and tile i + 3's entry (the block id, RowsT::fetch) in a register,
// so that neither the codes' loads nor the prefetch waits for a read of the block table. The mask: warp w's 16 bits
// (keys 16 w ..) as one uint16 of the stage's 64-bit mask.
template <class RowsT>
__device__ __forceinline__ void converter_fp8(const DecodeSm90Params& p, const Unit& u, const Smem& sm) {
  constexpr int kRowBytes = static_cast<int>(CacheFormatTraits<CacheFormat::fp8>::entry_bytes(576, 64));
  constexpr int kLines = (kRowBytes + 112 + 127) / 128;  // prefetch_record_l2's lines of a row
  const int lane = threadIdx.x & 31, w = (threadIdx.x & 127) >> 5, j = lane & 15;
  auto key_of = [&](int tile) { return u.key_begin + tile * T::kBlockN + 16 * w + j; };
  auto entry = [&](int tile) { return RowsT::fetch(p, u, key_of(tile)); };  // kNoRow past the unit's keys
  Fp8Warp codes;
  auto load = [&](int tile, int32_t e) {
    bool v;
    const uint8_t* row = locate_row<RowsT>(p, key_of(tile), e, v);
    codes.load(row, v, p.gather.stride_row_bytes, lane);
  };
  auto prefetch = [&](int tile, int32_t e) {
    bool v;
    const uint8_t* row = locate_row<RowsT>(p, key_of(tile), e, v);
    if (!v) return;
#pragma unroll
    for (int l = lane >> 4; l < kLines; l += 2) ptx::prefetch_l2(row + (128 * l < kRowBytes ? 128 * l : kRowBytes - 1));
  };
  load(0, entry(0));
  int32_t e1 = entry(1), e2 = entry(2);  // the entries of tiles i + 1 and i + 2
  if (u.n_tiles > 1) prefetch(1, e1);
#pragma unroll 1
  for (int i = 0; i < u.n_tiles; ++i) {
    const int s = i & 1;
    // Trace build: warps 0..2 stamp groups 0..2 of the producer slots (empty returned, arrived), warp 3 group 0's
    // middle step (arrived), warps 1 and 2 their groups' middle step before the wait.
    [[maybe_unused]] const int tslot = trace_prod_slot(s, 0, w < 3 ? w : 0, i);
    if (w == 1 || w == 2) MLA_DECODE_TRACE_PROD(tslot, 1);
    ptx::mbar_wait(sm.empty(s), ((i >> 1) & 1) ^ 1);
    if (w < 3) MLA_DECODE_TRACE_PROD(tslot, 0);
    codes.store(sm.stage(s), w, lane);
    if (lane == 0) reinterpret_cast<uint16_t*>(sm.mask_words(s))[w] = static_cast<uint16_t>(codes.valid);
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(sm.full(s));
    MLA_DECODE_TRACE_PROD(tslot, w < 3 ? 2 : 1);
    if (i + 1 < u.n_tiles) load(i + 1, e1);
    if (i + 2 < u.n_tiles) prefetch(i + 2, e2);
    e1 = e2;
    e2 = entry(i + 3);
  }
}

// fp8_ds_mla a warp per key (DsWarp: warp w owns keys 16 w .. 16 w + 15 of each tile; lanes j and j + 16 locate key
// j). Ahead of the stores of tile i: tile i + 1's records in registers (loaded right after tile i's stores), tile
// i + 2's in L2 (prefetched then; lanes j and j + 16 take alternate lines of key j's record). The mask: warp w's 16
// bits (keys 16 w ..) as one uint16 of the stage's 64-bit mask.
template <class RowsT>
__device__ __forceinline__ void converter_ds(const DecodeSm90Params& p, const Unit& u, const Smem& sm) {
  constexpr int kRowBytes = static_cast<int>(CacheFormatTraits<CacheFormat::fp8_ds_mla>::entry_bytes(576, 64));
  constexpr int kLines = (kRowBytes + 112 + 127) / 128;  // 656 bytes: 6 lines at most
  const int lane = threadIdx.x & 31, w = (threadIdx.x & 127) >> 5, j = lane & 15;
  auto key_of = [&](int tile) { return u.key_begin + tile * T::kBlockN + 16 * w + j; };
  auto entry = [&](int tile) { return RowsT::fetch(p, u, key_of(tile)); };  // kNoRow past the unit's keys
  DsWarp codes;
  auto load = [&](int tile, int32_t e) {
    bool v;
    const uint8_t* row = locate_row<RowsT>(p, key_of(tile), e, v);
    codes.load(row, v, lane);
  };
  auto prefetch = [&](int tile, int32_t e) {
    bool v;
    const uint8_t* row = locate_row<RowsT>(p, key_of(tile), e, v);
    if (!v) return;
#pragma unroll
    for (int l = lane >> 4; l < kLines; l += 2) ptx::prefetch_l2(row + (128 * l < kRowBytes ? 128 * l : kRowBytes - 1));
  };
  // e1: the entry of tile i + 1, read for its prefetch. kEntryAhead (IndexedRows) keeps it for the loads of tile
  // i + 1, which then wait for no read of the index row; PagedRows reads the block id again where it is used
  // (keeping it spilled 12 bytes at 104 registers).
  constexpr bool kEntryAhead = !RowsT::kPaged;
  load(0, entry(0));
  int32_t e1 = entry(1);
  if (u.n_tiles > 1) prefetch(1, e1);
#pragma unroll 1
  for (int i = 0; i < u.n_tiles; ++i) {
    const int s = i & 1;
    ptx::mbar_wait(sm.empty(s), ((i >> 1) & 1) ^ 1);
    // Trace build: as converter_fp8.
    [[maybe_unused]] const int tslot = trace_prod_slot(s, 0, w < 3 ? w : 0, i);
    if (w < 3) MLA_DECODE_TRACE_PROD(tslot, 0);
    codes.store(sm.stage(s), w, lane);
    if (lane == 0) reinterpret_cast<uint16_t*>(sm.mask_words(s))[w] = static_cast<uint16_t>(codes.valid);
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(sm.full(s));
    MLA_DECODE_TRACE_PROD(tslot, w < 3 ? 2 : 1);
    if (i + 1 < u.n_tiles) {
      load(i + 1, kEntryAhead ? e1 : entry(i + 1));
      e1 = entry(i + 2);
      if (i + 2 < u.n_tiles) prefetch(i + 2, e1);
    }
  }
}

template <CacheFormat F, class RowsT>
__device__ __forceinline__ void converter(const DecodeSm90Params& p, const Unit& u, const Smem& sm) {
  if constexpr (F == CacheFormat::fp8_ds_mla) converter_ds<RowsT>(p, u, sm);
  else converter_fp8<RowsT>(p, u, sm);
}

// ---- the DeepSeek-V4 record converter ----------------------------------------------------------------------------

// A unit's keys over the two lists (DecodeSm90Params::extra): n_main tiles of the main list's entries, then n_extra
// of the extra list's; a tile never mixes them (the main list's last tile is padded by masked keys).
struct V4Tiles {
  records::List main, extra;
  int n_main, n_extra;
};
__device__ __forceinline__ int clamped_length(const int32_t* lengths, int64_t stride, int64_t g, int topk) {
  if (lengths == nullptr) return topk;
  const int len = lengths[g * stride];
  return len < 0 ? 0 : len > topk ? topk : len;
}
__device__ __forceinline__ V4Tiles v4_tiles(const DecodeSm90Params& p, int64_t g) {
  const DecodeSm90Params::Gather& m = p.gather;
  const DecodeSm90Params::Extra& e = p.extra;
  V4Tiles v;
  v.main = {m.indices + g * m.indices_stride, clamped_length(m.topk_length, m.topk_length_stride, g, m.topk)};
  if (e.indices != nullptr)
    v.extra = {e.indices + g * e.indices_stride, clamped_length(e.topk_length, e.topk_length_stride, g, e.topk)};
  else
    v.extra = {nullptr, 0};
  v.n_main = (v.main.len + T::kBlockN - 1) / T::kBlockN;
  v.n_extra = (v.extra.len + T::kBlockN - 1) / T::kBlockN;
  return v;
}

// Split `split` of `splits` of a unit's tiles (the small-T cluster split, core/sparse_split.h record_splits): tiles
// [split * per, min((split + 1) * per, n)) of the main-then-extra sequence, per = ceil(n / splits), so that split 0
// has a tile whenever the unit has one (it carries the sink); each list cut to its part of that range, its length
// clipped to the part (no index past it is read).
__device__ __forceinline__ V4Tiles v4_split(const V4Tiles& v, int split, int splits) {
  const int n = v.n_main + v.n_extra, per = (n + splits - 1) / splits;
  const int t0 = min(split * per, n), t1 = min(t0 + per, n);
  auto part = [](const records::List& l, int n_list, int a, int b, int& count) {
    a = min(max(a, 0), n_list);
    b = min(max(b, 0), n_list);
    count = b - a;
    return records::List{l.row == nullptr ? nullptr : l.row + static_cast<int64_t>(a) * T::kBlockN,
                         count == 0 ? 0 : min(l.len - a * T::kBlockN, count * T::kBlockN)};
  };
  V4Tiles w;
  w.main = part(v.main, v.n_main, t0, t1, w.n_main);
  w.extra = part(v.extra, v.n_extra, t0 - v.n_main, t1 - v.n_main, w.n_extra);
  return w;
}

// The reference of the tile in stage s (records.cuh): the largest of the converter threads' scale exponents e (the
// warp's maximum, then the four warps' through ref_red(s) and the converter's own barrier), never below the
// previous tile's r (the reference only grows) nor outside [kRefFloor, kRefCeil]. ref_red is per stage: a warp
// writes stage s's words again only for tile i + 2, past tile i + 1's barrier, which every warp reaches after it
// read tile i's.
__device__ __forceinline__ int next_reference(int e, int r, int s, const Smem& sm) {
  e = __reduce_max_sync(0xffffffffu, e);
  if ((threadIdx.x & 31) == 0) sm.ref_red(s)[(threadIdx.x & 127) >> 5] = e;
  ptx::named_barrier_sync(L::kBarConv, 128);
  const int4 v = *reinterpret_cast<const int4*>(sm.ref_red(s));
  const int m = max(max(r, max(max(v.x, v.y), max(v.z, v.w))), records::kRefFloor);
  return min(m, records::kRefCeil);
}

// Trace build: the DeepSeek-V4 converter's steps on tile 2 kTracePair + s, in stage s's nine producer slots
// (trace.cuh), stamped by lane 0 of warp 0: 0 the loop's top, 1 the tile's codes used (its exponent), 2 the reference
// agreed (the converter's barrier; EarlyFeed: the next tile's, after the arrival), 3 the stage's release seen, 4 the
// stores done, 5 the full arrival, 6 the feed's next() done (the next tile's loads and prefetch issued, or with
// RingFeed its records read out of the ring); and by warp 3: 7 its stores done, 8 its arrival. Warps 1 and 2 stamp
// their arrivals into the pair's consumer-1 steps the V4 kernels leave free (4 + 2 s + warp - 1). The stamps read the
// clock: ptxas may move them across independent instructions (a load's wait shows up before the top's stamp).
struct V4ConvTrace {
  enum Step { kTop, kLanded, kReference, kEmpty, kStored, kArrived, kIssued };
  int slot0 = -1, slot3 = -1, slot_arrival = -1;
  __device__ __forceinline__ V4ConvTrace(int s, int i, int warp) {
    const int slot = trace_prod_slot(s, 0, 0, i);
    if (warp == 0) slot0 = slot;
    if (warp == 3) slot3 = slot;
    if (slot >= 0 && (warp == 1 || warp == 2)) slot_arrival = kTracePairBase + kTracePairSteps + 4 + 2 * s + warp - 1;
  }
  __device__ __forceinline__ void stamp(Step k) const {
    MLA_DECODE_TRACE_PROD(slot0, static_cast<int>(k));
    if (k == kStored) MLA_DECODE_TRACE_PROD(slot3, 7);
    if (k == kArrived) {
      MLA_DECODE_TRACE_PROD(slot3, 8);
      MLA_DECODE_TRACE_PROD(slot_arrival, 0);
    }
  }
};

// Key j's record lines into L2 (the warp layout's lanes j and j + 16 take alternate lines).
template <CacheFormat F, class G>
__device__ __forceinline__ void prefetch_record(const G& geo, int32_t e, int lane) {
  constexpr int kBytes = static_cast<int>(CacheFormatTraits<F>::row_stride_bytes());
  constexpr int kLines = (kBytes + 112 + 127) / 128;
  const uint8_t *body, *slot;
  if (!records::locate<F>(geo, e, body, slot)) return;
#pragma unroll
  for (int ln = lane >> 4; ln < kLines; ln += 2) ptx::prefetch_l2(body + (128 * ln < kBytes ? 128 * ln : kBytes - 1));
}

// How a converter warp's records of each tile reach its registers (records.cuh Warp; warp w takes keys 16 w .. 16 w +
// 15). first() fills them with tile 0's; next(k), right after tile k's stores, with tile k + 1's.
//
// GlobalFeed: the warp loads them itself (lanes j and j + 16 read key j's index entry): tile k + 1's records by
// next(k) (the loads' issue is then on the converter's chain), tile k + 2's prefetched into L2 then, tile k + 3's
// entries in a register, so that neither the loads nor the prefetch wait for a read of the index row.
template <CacheFormat F, class G>
struct GlobalFeed {
  static constexpr bool kEarly = false;
  const G& geo;
  const records::List& l;
  int n_tiles, w, lane;
  int32_t e1 = 0, e2 = 0;
  __device__ __forceinline__ int32_t entry(int tile) const {
    return records::entry(l, tile * T::kBlockN + 16 * w + (lane & 15));
  }
  __device__ __forceinline__ void load(records::Warp<F>& codes, int32_t e) const {
    const uint8_t *body, *slot;
    const bool v = records::locate<F>(geo, e, body, slot);
    codes.load(body, slot, v, lane);
  }
  __device__ __forceinline__ void first(records::Warp<F>& codes) {
    load(codes, entry(0));
    e1 = entry(1);
    e2 = entry(2);
    if (n_tiles > 1) prefetch_record<F>(geo, e1, lane);
  }
  __device__ __forceinline__ void next(records::Warp<F>& codes, int k) {
    if (k + 1 < n_tiles) load(codes, e1);
    if (k + 2 < n_tiles) prefetch_record<F>(geo, e2, lane);
    e1 = e2;
    e2 = entry(k + 3);
  }
};

// EarlyFeed (v41_fp4 lists from global memory): the next tile's loads are issued during this tile's stores. All of a
// warp's global loads share one scoreboard in the SASS, so a wait for one load is a wait for every load issued
// before it; the schedule puts one such wait in a tile, at its first conversion: tile k + 1's entries are used
// (located, tile k + 2 prefetched into L2, tile k + 3's entries read), its scale slots and keys 0..7 loaded after
// tile k's first half of stores (refill(0)), keys 8..15 after the second (refill(1)); tile k + 1's reference is
// taken from the slots before refill(1) and agreed at tile k's end (the converter's barrier then overlaps S's
// products). Records.cuh Warp::store_refill: the halves unrolled, since a rolled loop's moves of the refilled
// registers made ptxas wait for the loads at the loop's back edge. v41 stays on GlobalFeed: its 16-byte code chunks
// (64 registers a tile) held across the refill spilled 190 bytes.
template <CacheFormat F, class G>
struct EarlyFeed : GlobalFeed<F, G> {  // its list, entries and entry(); not its load order
  using B = GlobalFeed<F, G>;
  using B::e1, B::e2, B::entry, B::geo, B::lane, B::n_tiles;
  static constexpr bool kEarly = true;
  const uint8_t* body_next = nullptr;  // lane j's (and j + 16's): key j of the next tile
  uint32_t valid_next = 0;             // bit j: the next tile's key j read
  __device__ __forceinline__ bool locate(int32_t e, const uint8_t*& body) const {
    const uint8_t* slot;
    return records::locate<F>(geo, e, body, slot);
  }
  // Tile 0's records and slots, waited for by the caller's first reference.
  __device__ __forceinline__ void first(records::Warp<F>& codes) {
    const uint8_t *body, *slot;
    const bool v = records::locate<F>(geo, entry(0), body, slot);
    codes.slot = records::Warp<F>::slot_words(body, v, lane);
    codes.load(body, slot, v, lane);
    e1 = entry(1);
    e2 = entry(2);
    if (n_tiles > 1) prefetch_record<F>(geo, e1, lane);
  }
  // Tile k + 1's records located, tile k + 2's prefetched into L2, tile k + 3's entries read.
  __device__ __forceinline__ void locate_next(int k) {
    bool v = false;
    if (k + 1 < n_tiles) v = locate(e1, body_next);
    valid_next = __ballot_sync(0xffffffffu, v) & 0xffffu;
    if (k + 2 < n_tiles) prefetch_record<F>(geo, e2, lane);
    e1 = e2;
    e2 = entry(k + 3);
  }
  // After half `half` of tile k's stores: tile k + 1's keys 8 half .. 8 half + 7 into codes' slots 8..15 (and with
  // the first half, its scale slots).
  __device__ __forceinline__ void refill(records::Warp<F>& codes, int half) const {
    if (half == 0) codes.slot = records::Warp<F>::slot_words(body_next, (valid_next >> (lane & 15)) & 1u, lane);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int key = 8 * half + jj;
      codes.template take<false>(8 + jj, records::shfl_ptr(body_next, key), (valid_next >> key) & 1u, lane);
    }
  }
};

// RingFeed (the N 16 tile): a loader warp (n16.cuh RingLoader) copies the records into the warp's ring slots
// (ConvertTraits::ring_offset) and publishes the tile's key mask; the converter warp waits ring_full(w), reads them
// into its registers and releases the slots on ring_empty(w), so that the loader issues the next tile's copies while
// this warp converts and stores: the gathers' issue leaves the converter's chain. `phase` carries ring_full(w)'s
// parity from one list to the next.
template <CacheFormat F>
struct RingFeed {
  static constexpr bool kEarly = false;
  static constexpr int kRec = static_cast<int>(CacheFormatTraits<F>::row_stride_bytes());  // the whole record
  int n_tiles, w, lane;
  const Smem& sm;
  uint32_t& phase;
  __device__ __forceinline__ void read(records::Warp<F>& codes) {
    ptx::mbar_wait(sm.ring_full(w), phase);
    phase ^= 1u;
    const uint32_t vb = *sm.ring_valid(w);
    const uint8_t* const base = sm.ring_key<kRec>(16 * w);  // key 16 w + j at a constant offset (j unrolled)
    codes.load_ring([&](int j) -> const uint8_t* { return base + L::ring_key_offset(kRec, j); }, vb, lane);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(sm.ring_empty(w));
  }
  __device__ __forceinline__ void first(records::Warp<F>& codes) { read(codes); }
  __device__ __forceinline__ void next(records::Warp<F>& codes, int k) {
    if (k + 1 < n_tiles) read(codes);
  }
};

// The converter over the n_tiles tiles of one list, the unit's tiles i0 .. i0 + n_tiles - 1 (stage i % 2), warp w
// taking keys 16 w .. 16 w + 15 of each tile (records.cuh Warp: coalesced record reads), fed by Feed (GlobalFeed or
// RingFeed). Each tile's reference r (next_reference) from the codes in registers, before the stage's release;
// published in stage_ref(s) with the stage. Returns the next tile index.
template <CacheFormat F, class Feed>
__device__ __forceinline__ int convert_list(Feed feed, int n_tiles, int i0, int& r, const Smem& sm) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x & 127) >> 5;
  records::Warp<F> codes;
  if (n_tiles == 0) return i0;
  if constexpr (F == CacheFormat::v4) codes.rope = sm.rope_copy(threadIdx.x & 127);
  feed.first(codes);
  if constexpr (Feed::kEarly) r = next_reference(codes.slot_exponent(), r, i0 & 1, sm);
#pragma unroll 1
  for (int k = 0; k < n_tiles; ++k) {
    const int i = i0 + k, s = i & 1;
    [[maybe_unused]] const V4ConvTrace tr(s, i, w);
    tr.stamp(V4ConvTrace::kTop);
    int e_next = 0;  // early path: the next tile's scale exponent
    if constexpr (Feed::kEarly) {
      ptx::mbar_wait(sm.empty(s), ((i >> 1) & 1) ^ 1);
      tr.stamp(V4ConvTrace::kEmpty);
      if (lane == 0) reinterpret_cast<uint16_t*>(sm.mask_words(s))[w] = static_cast<uint16_t>(codes.valid);
      // The next tile's entries are used after the first half, its slots' exponent taken after the second, each
      // before that half's loads are issued (EarlyFeed: a wait for one load is a wait for all).
      codes.store_refill(sm.stage(s), w, lane, r, [&](int half) {
        if (half == 0) feed.locate_next(k);
        else e_next = codes.slot_exponent();
        feed.refill(codes, half);
      });
      codes.valid = feed.valid_next;
      tr.stamp(V4ConvTrace::kStored);
    } else {
      const int e = codes.exponent();
      tr.stamp(V4ConvTrace::kLanded);
      r = next_reference(e, r, s, sm);
      tr.stamp(V4ConvTrace::kReference);
      ptx::mbar_wait(sm.empty(s), ((i >> 1) & 1) ^ 1);
      tr.stamp(V4ConvTrace::kEmpty);
      codes.store(sm.stage(s), w, lane, r);
      tr.stamp(V4ConvTrace::kStored);
      if (lane == 0) reinterpret_cast<uint16_t*>(sm.mask_words(s))[w] = static_cast<uint16_t>(codes.valid);
    }
    if (lane == 0 && w == 0) *sm.stage_ref(s) = r;
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(sm.full(s));
    tr.stamp(V4ConvTrace::kArrived);
    if constexpr (Feed::kEarly) {
      if (k + 1 < n_tiles) r = next_reference(e_next, r, s ^ 1, sm);
      tr.stamp(V4ConvTrace::kReference);
    } else {
      feed.next(codes, k);
    }
    tr.stamp(V4ConvTrace::kIssued);
  }
  return i0 + n_tiles;
}

// Every format a warp per 16 keys (records.cuh Warp; nvidia-h200, --grid v4, same call: x0.74-0.84 of the by-key
// layout over v41 + v41_fp4, x0.89-0.98 over v4). kRing: the records through the ring (RingFeed: the N 16 tile with a
// loader, which v4 does not take).
template <CacheFormat F, bool kRing, class G>
__device__ __forceinline__ int convert_records(const G& geo, const records::List& l, int n_tiles, int i0, int& r,
                                               uint32_t& ring_phase, const Smem& sm) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x & 127) >> 5;
  static_assert(!(kRing && F == CacheFormat::v4), "v4 records are not read through the ring");
  if constexpr (kRing) return convert_list<F>(RingFeed<F>{n_tiles, w, lane, sm, ring_phase}, n_tiles, i0, r, sm);
  else if constexpr (F == CacheFormat::v41_fp4)
    return convert_list<F>(EarlyFeed<F, G>{{geo, l, n_tiles, w, lane}}, n_tiles, i0, r, sm);
  else return convert_list<F>(GlobalFeed<F, G>{geo, l, n_tiles, w, lane}, n_tiles, i0, r, sm);
}

// Both lists' index rows into L2 at the unit's start (a line per converter thread), then the lists in order, one
// running reference over both (the first tile's: its largest scale exponent). The unit's tiles are the CTA's i0,
// i0 + 1, ... (stage i % 2; a persistent CTA's units follow each other in the stages); returns the next unit's i0.
template <CacheFormat FM, CacheFormat FE, bool kRing = false>
__device__ __forceinline__ int record_converter(const DecodeSm90Params& p, const V4Tiles& v, const Smem& sm,
                                                int i0 = 0) {
  const int t = threadIdx.x & 127;
  const int main_lines = (v.main.len + 31) / 32, extra_lines = (v.extra.len + 31) / 32;
  for (int ln = t; ln < main_lines + extra_lines; ln += 128)
    ptx::prefetch_l2(ln < main_lines ? v.main.row + 32 * ln : v.extra.row + 32 * (ln - main_lines));
  int r = records::kRefFloor;
  uint32_t ring_phase = 0;
  const int i = convert_records<FM, kRing>(p.gather, v.main, v.n_main, i0, r, ring_phase, sm);
  return convert_records<FE, kRing>(p.extra, v.extra, v.n_extra, i, r, ring_phase, sm);
}

// A DeepSeek-V4 unit without keys (never a split's partial: its split has none), by n threads (index t): out 0, lse
// the row's sink (or -inf without one); each element written by one thread, no barrier.
__device__ __forceinline__ void v4_empty_rows(const DecodeSm90Params& p, const Unit& u, int t, int n) {
  const MqaRowParams& rp = p.rows;
  const int rows = min(p.tile_rows, u.m_rows - u.row0);
  constexpr int kChunks = T::kDv / 8;  // 16-byte bf16 chunks a row
  for (int e = t; e < rows * kChunks; e += n) {
    const int row = u.row0 + e / kChunks, ch = e % kChunks, i = row / rp.h_q, h = row % rp.h_q;
    uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i + h * rp.out_stride_h +
                    ch * 8;  // bf16 out (supports_v4)
    for (int k = 0; k < 8; ++k) dst[k] = 0;
    if (ch == 0 && rp.lse != nullptr)
      rp.lse[u.g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] =
          p.sink != nullptr ? p.sink[static_cast<int64_t>(h) * p.sink_stride] : -INFINITY;
  }
}
__device__ __forceinline__ void v4_empty_unit(const DecodeSm90Params& p, const Unit& u) {
  v4_empty_rows(p, u, threadIdx.x, blockDim.x);
}

// The attention sink of a row (log2 domain: sink * log2 e) joins its running reference m and sum l as a key of value
// 0 (SEMANTICS §11.8): f is the factor of the row's O (O's reference moves to the new m). No key and no sink: no
// change (out 0, lse -inf); no key: out 0, lse = sink; a NaN sink: out and lse NaN.
__device__ __forceinline__ void fold_sink(float sink_log2, float& m, float& l, float& f) {
  f = 1.0f;
  if (sink_log2 != sink_log2) {
    l = sink_log2;
    return;
  }
  const float n = fmaxf(m, sink_log2);
  if (n == -INFINITY) return;
  f = m == -INFINITY ? 0.0f : softmax::exp2_approx(m - n);
  l = l * f + softmax::exp2_approx(sink_log2 - n);
  m = n;
}
__device__ __forceinline__ float sink_log2_of(const DecodeSm90Params& p, const Unit& u, int r) {
  const int row = u.row0 + r;
  if (p.sink == nullptr || row >= u.m_rows) return -INFINITY;
  return p.sink[static_cast<int64_t>(row % p.rows.h_q) * p.sink_stride] * 1.4426950408889634f;
}
// The rotated columns the sm90 V4 kernels take (sparse_mqa.cu declines more): the last 64, O_R's panel 7.
inline constexpr int kRotMaxDim = kConvertRotMaxDim;

// The output's rotation (p.rot, SparseOptions::out_rotation) on O_R by the R warpgroup (t: 0..127), after kBarEnd:
// the pairs' cos / sin into R's table (rotation_table), then each thread turns
// columns 256 + 8 j + 2 t4 and + 1 of rows r_lo (o[4 j], o[4 j + 1]) and r_hi (o[4 j + 2], o[4 j + 3]) for the j of
// the last kRotMaxDim columns: a rotated pair is the thread's own. The unit's token's position (one token per unit).
// The table both V4 tiles turn from: the pairs' cos / sin of the unit's token into R's own table (Smem::rot) by R's
// threads (t: 0..127), then R's own barrier: neither Q's buffer (a persistent CTA's next Q lands there) nor the
// converter's barrier (it may be converting the next unit). A persistent CTA's R threads all arrived on the next
// unit's q_ready (past their reads of this one's table) before any of them refills it.
static_assert(kRotMaxDim <= L::kRotFloats, "the rotation's table: a cosine and a sine per pair");
__device__ __forceinline__ const float* rotation_table(const DecodeSm90Params& p, const Unit& u, const Smem& sm, int t) {
  float* tab = sm.rot();
  p.rot.fill_table(p.rot.position(u.g), tab, t, 128);
  ptx::named_barrier_sync(L::kBarRot, 128);
  return tab;
}

__device__ __forceinline__ void rotate_o_r(const DecodeSm90Params& p, const Unit& u, const Smem& sm,
                                           float (&o)[T::kDvHalf / 2], int t, int t4) {
  if (!p.rot.on()) return;  // uniform
  const float* tab = rotation_table(p, u, sm, t);
#pragma unroll
  for (int j = (T::kDv - kRotMaxDim - T::kDvHalf) / 8; j < T::kDvHalf / 8; ++j) {
    const int i = p.rot.pair_of(T::kDvHalf + 8 * j + 2 * t4, T::kDv);
    if (i < 0) continue;
    const float c = tab[i], s = tab[p.rot.dim / 2 + i];
    dev::OutRotation::turn(c, s, o[4 * j], o[4 * j + 1]);
    dev::OutRotation::turn(c, s, o[4 * j + 2], o[4 * j + 3]);
  }
}

// O's rows r_lo (o[4 j], o[4 j + 1]) and r_hi (o[4 j + 2], o[4 j + 3]) times their factors.
__device__ __forceinline__ void scale_rows(float (&o)[T::kDvHalf / 2], float f_lo, float f_hi) {
#pragma unroll
  for (int j = 0; j < T::kDvHalf / 8; ++j) {
    o[4 * j] *= f_lo;
    o[4 * j + 1] *= f_lo;
    o[4 * j + 2] *= f_hi;
    o[4 * j + 3] *= f_hi;
  }
}

// The V4 kernel's output through shared memory, once both consumers are past their products (the stages are free):
// each consumer stores its O half as it stands (fp32, the rows' factors not applied) into stage(c), 64 rows of
// kOStride floats, then the 256 threads of S and R write whole rows of bf16 out in a rolled loop, O times f / l
// times 2^(r - 6) (f the sink's factor, l the row sum, r the last tile's reference), 16 bytes a store. The
// fragment's unrolled part is one 8-byte shared store a value pair; the scaling, the conversion and the global
// stores run in a loop whose body is fetched once (the epilogue runs once a CTA, at the pace of its instruction
// fetches). Taken when out is bf16 rows of 16-byte aligned starts and the unit is not a split's.
inline constexpr int kOStride = T::kDvHalf + 8;  // floats a staged row: four rows of a half warp in distinct banks
static_assert(T::kBlockM * kOStride * 4 <= T::kTileBytes, "a staged O half fits a stage");

__device__ __forceinline__ bool out_rows16(const DecodeSm90Params& p, const Unit& u) {
  return u.ws_slot < 0 && p.out_pairs == kOutRows16;  // the host's classification of out (launch_util.cuh)
}
// Rows r_lo (o[4 j], o[4 j + 1]) and r_hi (o[4 j + 2], o[4 j + 3]) of a D fragment, columns 8 j + 2 t4, + 1.
__device__ __forceinline__ void stage_o_half(const float (&o)[T::kDvHalf / 2], float* rows, const Frag& rw) {
#pragma unroll
  for (int j = 0; j < T::kDvHalf / 8; ++j) {
    *reinterpret_cast<float2*>(rows + rw.r_lo * kOStride + 8 * j + 2 * rw.t4) = make_float2(o[4 * j], o[4 * j + 1]);
    *reinterpret_cast<float2*>(rows + rw.r_hi * kOStride + 8 * j + 2 * rw.t4) =
        make_float2(o[4 * j + 2], o[4 * j + 3]);
  }
}
// Thread t (0..255) of S and R: the unit's LSEs (t < 64) and every t-th 8-column chunk of its rows; ref the unit's
// last tile's reference.
__device__ __forceinline__ void store_o_rows16(const DecodeSm90Params& p, const Unit& u, const Smem& sm, int t, int ref) {
  const MqaRowParams& rp = p.rows;
  const float* sums = sm.sums();
  const float* refs = sm.refs();
  const float* f = sm.out_factors();
  const float out_scale = exp2i(ref - 6);
  if (t < T::kBlockM && u.row0 + t < u.m_rows) store_row_lse(p, u, u.row0 + t, row_lse(refs[t], sums[t]));
  constexpr int kChunks = T::kDv / 8, kHalf = T::kDvHalf / 8;
#pragma unroll 1
  for (int k = t; k < T::kBlockM * kChunks; k += 256) {
    const int r = k / kChunks, ch = k % kChunks, row = u.row0 + r;
    if (row >= u.m_rows) break;  // k grows with the row
    const float l = sums[r];
    const float a = l == 0.0f ? 0.0f : f[r] * (out_scale / l);  // l == 0: no key; a NaN l propagates (§14.6a)
    const float* src = reinterpret_cast<const float*>(sm.stage(ch / kHalf)) + r * kOStride + 8 * (ch % kHalf);
    const float4 x = *reinterpret_cast<const float4*>(src), y = *reinterpret_cast<const float4*>(src + 4);
    uint4 v;
    v.x = ptx::pack_bf16x2(x.x * a, x.y * a);
    v.y = ptx::pack_bf16x2(x.z * a, x.w * a);
    v.z = ptx::pack_bf16x2(y.x * a, y.y * a);
    v.w = ptx::pack_bf16x2(y.z * a, y.w * a);
    const int i = row / rp.h_q, h = row % rp.h_q;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i +
                              h * rp.out_stride_h + 8 * ch) = v;
  }
}

// A persistent V4 CTA's output through Q's buffer (the stages hold the next unit's first tiles by then): once every
// product over Q retired, each consumer writes its O half as bf16 already scaled — O times f · out_scale / l in one
// multiply (write_rows_half's O · f, then · out_scale / l, within an fp32 rounding) — in Q's own layout (eight
// 128-byte-swizzled panels of 64 columns: S panels 0..3, R 4..7; store_p_f16's placement) and fences them for the
// async proxy; past the barrier, S's first thread stores the eight panels with eight TMA boxes of the out map (rows
// past h_q clipped by the copy engine) and, once the engine has read them, refills the buffer with the next unit's Q.
// Taken when out is bf16 rows of 16-byte aligned starts (out_rows16: the host then maps out as it maps q).
// The fragment's rows r_lo (o[4 j], o[4 j + 1]) and r_hi (o[4 j + 2], o[4 j + 3]) times inv_lo / inv_hi, as bf16 pairs
// into columns c * 256 + 8 j + 2 t4 of the staged panels by stmatrix (the wgmma D fragment is its layout): one x4
// a column-block pair j, j + 1 — matrices (rows of r_lo, j), (r_hi, j), (r_lo, j + 1), (r_hi, j + 1) — lane l giving
// row l % 8 of matrix l / 8, whose 16 bytes sit at chunk (j % 8 + l / 16) of its panel row (eight rows of a matrix in
// distinct 16-byte bank groups); fenced for the TMA stores.
__device__ __forceinline__ void stage_o_bf16(const float (&o)[T::kDvHalf / 2], float inv_lo, float inv_hi, uint8_t* q,
                                             int c, const Frag& rw) {
  const int lane = static_cast<int>(threadIdx.x & 31), row = (rw.r_lo & ~7) + 8 * ((lane >> 3) & 1) + (lane & 7);
  const int half = lane >> 4;
  uint8_t* base = q + 4 * c * T::kPanelBytes;
#pragma unroll
  for (int j = 0; j < T::kDvHalf / 8; j += 2) {
    const uint32_t r[4] = {ptx::pack_bf16x2(o[4 * j] * inv_lo, o[4 * j + 1] * inv_lo),
                           ptx::pack_bf16x2(o[4 * j + 2] * inv_hi, o[4 * j + 3] * inv_hi),
                           ptx::pack_bf16x2(o[4 * j + 4] * inv_lo, o[4 * j + 5] * inv_lo),
                           ptx::pack_bf16x2(o[4 * j + 6] * inv_hi, o[4 * j + 7] * inv_hi)};
    ptx::stmatrix_x4(base + (j / 8) * T::kPanelBytes + swz(row, j % 8 + half), r);
  }
  ptx::fence_proxy_async_smem();
}
// out_scale / l, 0 for a row without keys (l == 0); a NaN l propagates (SEMANTICS §14.6a): write_rows_half's factor.
__device__ __forceinline__ float out_inv(float l, float out_scale) { return l == 0.0f ? 0.0f : out_scale / l; }

// S's thread t (0..127), after both consumers staged their halves: the unit's LSEs (t < 64, from S's published
// references and sums); thread 0 stores the eight panels by TMA (o_map: out as {512, h_q, groups}, box {64, 64, 1})
// and waits until the copy engine has read them, so that the buffer is free for the next Q.
__device__ __forceinline__ void store_staged_rows(const CUtensorMap* o_map, const DecodeSm90Params& p, const Unit& u,
                                                  const Smem& sm, int t) {
  if (t < T::kBlockM && u.row0 + t < u.m_rows) store_row_lse(p, u, u.row0 + t, row_lse(sm.refs()[t], sm.sums()[t]));
  if (t != 0) return;
#pragma unroll
  for (int c = 0; c < 8; ++c)
    ptx::tma_store_3d(o_map, sm.q() + c * T::kPanelBytes, 64 * c, u.row0, static_cast<int32_t>(u.g));
  ptx::bulk_commit_group();
  ptx::bulk_wait_group_read<0>();
}

// ---- the consumers ----------------------------------------------------------------------------------------------

inline constexpr float kLazyLog2 = 8.0f;  // the lazy maximum's threshold (log2 domain; as the seesaw's)
__device__ __forceinline__ float next_ref(float ref, float mx) { return mx > ref + kLazyLog2 ? mx : ref; }
__device__ __forceinline__ float factor(float from, float to) {
  return to == -INFINITY || from == to ? 1.0f : softmax::exp2_approx(from - to);
}

// P's factor as f16 (fp8 and the records: SRole::store_p_f16 and the rs fragments): O carries it to the epilogue.
inline constexpr float kPF16 = 64.0f;

// O half *= f per row, skipped by the warp when every factor is 1 (the lazy maximum's common case). No product over
// o is in flight.
__device__ __forceinline__ void rescale(float (&o)[T::kDvHalf / 2], float f_lo, float f_hi) {
  ptx::wgmma_scale_rows_if<T::kDvHalf>(o, __any_sync(0xffffffffu, f_lo != 1.0f || f_hi != 1.0f), f_lo, f_hi);
}

// fp8 and DeepSeek-V4 records: the unit's Q panels (bf16, in shared memory; kPanels of them) as f16 times 2^e_r in
// place, e_r = q_row_exponent of row r (exact for every element within 2^28 of the row's largest |q|), and 2^-e_r
// into q_scales()[r] for S. Rows 0 .. kRows - 1 by kThreads threads (index t): kPerRow = kThreads / kRows threads
// per row, thread t taking row t / kPerRow and its share of the 8 kPanels chunks (of eight columns). Rows from `rows`
// on (past the unit's rows: zeros) only get their factor 1.
template <int kPanels, int kThreads = 128, int kRows = T::kBlockM>
__device__ __forceinline__ void q_to_f16(const Smem& sm, int t, int rows = kRows) {
  constexpr int kPerRow = kThreads / kRows, kShare = 8 * kPanels / kPerRow;
  static_assert(kPerRow == 2 || kPerRow == 4 || kPerRow == 16, "two, four or sixteen threads per row");
  const int row = t / kPerRow, k = t % kPerRow, c0 = kShare * k;
  const int n = row < rows ? kShare : 0;  // rows past the unit's: nothing to convert
  // Sixteen per row (the N 16 tile's 16 rows by 256 threads): thread k takes chunks k, k + 16, ..., so that each
  // eight threads sweep one panel row's eight 16-byte chunks at once (conflict-free). Two or four: consecutive
  // shares, the row's threads starting theirs at chunks 8 / kPerRow apart modulo 8 (a share of a multiple of 8
  // chunks otherwise starts every thread on the same 16-byte bank group: 2- or 4-way conflicts).
  constexpr bool kInterleave = kPerRow == 16;
  constexpr bool kRotate = !kInterleave && kShare % 8 == 0;
  static_assert(!kRotate || (kShare & (kShare - 1)) == 0, "a rotated share is a power of two");
  const int rot = (8 / kPerRow) * k;
  uint8_t* q = sm.q();
  auto at = [&](int i) {
    const int c = kInterleave ? k + kPerRow * i : kRotate ? c0 + ((i + rot) & (kShare - 1)) : c0 + i;
    return reinterpret_cast<uint4*>(q + (c >> 3) * T::kPanelBytes + swz(row, c & 7));
  };
  // The maximum's pass: two bf16 magnitudes a word, kept apart by a packed 16-bit max (non-negative bf16 values, inf
  // and NaN included, order as their bits), two instructions a word; then as fp32 bits.
  uint32_t m2 = 0;
#pragma unroll 4
  for (int i = 0; i < n; ++i) {
    const uint4 v = *at(i);
    m2 = __vmaxu2(m2, __vmaxu2(__vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu),
                               __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu)));
  }
  uint32_t amax = max(m2 << 16, m2 & 0xffff0000u);  // fp32 bits of max |q|
#pragma unroll
  for (int o = 1; o < kPerRow; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const int e = q_row_exponent(amax);
  const float f = exp2i(e);
#pragma unroll 4
  for (int i = 0; i < n; ++i) *at(i) = records::bf16x8_scaled_f16(*at(i), f);
  if (k == 0) sm.q_scales()[row] = exp2i(-e);
}

// Q's eight TMA boxes of unit u onto q_full, by one thread.
template <int kRows = T::kBlockM>
__device__ __forceinline__ void v4_q_issue(const CUtensorMap* q_map, const Unit& u, const Smem& sm) {
  ptx::mbar_arrive_expect_tx(sm.q_full(), 8u * kRows * 128u);
#pragma unroll
  for (int c = 0; c < 8; ++c)
    ptx::tma_load_3d(sm.q() + c * T::kPanelBytes, q_map, sm.q_full(), 64 * c, u.row0, static_cast<int32_t>(u.g));
}
// A persistent CTA's S and R convert each unit's Q in their own loops (two code locations): the hand-over to S's
// products is the q_ready mbarrier (phase `parity`, as q_full's) rather than kBarQ, whose bar.sync the sanitizers
// check per code location.
__device__ __forceinline__ void v4_q_convert_persistent(const Unit& u, const Smem& sm, int t, uint32_t parity) {
  ptx::mbar_wait(sm.q_full(), parity);
  q_to_f16<8, 256, T::kBlockM>(sm, t, u.m_rows - u.row0);
  ptx::fence_proxy_async_smem();
  ptx::mbar_arrive(sm.q_ready());
  ptx::mbar_wait(sm.q_ready(), parity);
}
// DeepSeek-V4: the unit's Q rows [row0, row0 + kRows) of token g (512 columns: eight panels of 64) into shared memory
// as f16 * 2^e_r, by the S and R warpgroups (t < 256: S's threads, then R's), both idle until Q is there. Thread 0
// issues eight TMA boxes of `q_map` (host side: launch_convert_v4_indexed; q as {512, h_q, tokens} bf16, box {64,
// kRows, 1}, 128-byte swizzle, which is store_q_chunk's layout), box c into panel c, their bytes on q_full; rows past
// h_q read as zeros (the copy engine's out-of-bounds fill). Every thread waits for the bytes, converts its share in
// place, and the products see it after the barrier. kRows: 64, or the N 16 tile's 16 (S^T reads no other row;
// rows 16.. of panel 0 are its scratch). Issued here rather than by the thread that initialises q_full, so that the
// converter's code (warpgroup 0) carries none of it.
template <int kRows = T::kBlockM>
__device__ __forceinline__ void v4_q_prologue(const CUtensorMap* q_map, const Unit& u, const Smem& sm, int t) {
  if (t == 0) v4_q_issue<kRows>(q_map, u, sm);
  ptx::mbar_wait(sm.q_full(), 0);
  q_to_f16<8, 256, kRows>(sm, t, u.m_rows - u.row0);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(L::kBarQ, 256);
}

// The S warpgroup: S, the softmax, P into the stage and O_L. Keeps its running references and row sums (summed over
// the quad after the loop) for the epilogue.
template <CacheFormat F>
struct SRole {
  static constexpr bool kBf16 = F == CacheFormat::fp8_ds_mla;  // a bf16 stage (the upconvert): bf16 products, bf16 P
  // A DeepSeek-V4 record cache: the stage holds f16 value * 2^-r_t (records.cuh; r_t the tile's reference, in
  // stage_ref), d_qk 512 (panels 0..7, K = V), P in its own panel (8); f16 products as fp8's, S times 2^r_t, O kept
  // relative to the current reference (a change of r folded into the factor a).
  static constexpr bool kRec = CacheFormatTraits<F>::kRecord;
  static constexpr int kSPanels = kRec ? 8 : T::kPanels;  // S's panels (fp8, kRec: f16 products)
  const DecodeSm90Params& p;
  const Unit& u;
  const Smem& sm;
  Frag rw;
  int lim_lo, lim_hi;
  float sc_lo, sc_hi;  // S to the log2 domain per row: the softmax scale (fp8: times the cache scale and 2^-e_r)
  float sq_lo, sq_hi;  // kRec: the softmax scale times 2^-e_r (sc = sq * 2^r_t per tile)
  int ref = 0;         // kRec: the reference O is relative to (the last tile's)
  float o[T::kDvHalf / 2];
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  __device__ __forceinline__ SRole(const DecodeSm90Params& p_, const Unit& u_, const Smem& sm_) : p(p_), u(u_), sm(sm_) {
    lim_lo = query_row_limit(p, u, u.row0 + rw.r_lo);
    lim_hi = query_row_limit(p, u, u.row0 + rw.r_hi);
    sc_lo = p.rows.scale_log2;
    sc_hi = p.rows.scale_log2;
    if constexpr (F == CacheFormat::fp8) {
      sc_lo *= p.gather.scale * sm.q_scales()[rw.r_lo];
      sc_hi *= p.gather.scale * sm.q_scales()[rw.r_hi];
    }
    sq_lo = sc_lo;
    sq_hi = sc_hi;
    if constexpr (kRec) {
      sq_lo *= sm.q_scales()[rw.r_lo];
      sq_hi *= sm.q_scales()[rw.r_hi];
    }
#pragma unroll
    for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  }

  // S in the log2 domain (sc_lo / sc_hi), keys not loaded or past a row's limit -inf; the rows' maxima. A tile clean
  // for the whole warp is only scaled.
  __device__ __forceinline__ void mask_max(float (&s)[32], uint64_t mask, int k0, float& mx_lo, float& mx_hi) const {
    mask_scale_max<true>(s, mask, k0, rw.t4, lim_lo, lim_hi, sc_lo, sc_hi, mx_lo, mx_hi);
  }

  // P V_L of the previous tile (the CTA's j - 1) retired: its stage is released by this warpgroup.
  __device__ __forceinline__ void release_previous(int i, int j) {
    if constexpr (kRec) return;  // released at the tile's end (run)
    if (i > 0) {
      ptx::wgmma_wait_group<1>();
      ptx::wgmma_fence_operand(o);
      ptx::mbar_arrive(sm.empty((j - 1) & 1));
      MLA_DECODE_TRACE_PAIR(0, 8 + (i & 1), i >> 1);
    }
  }

  // S of tile i over stage_off, retired: one accumulation over the panels (fp8: exact codes, unscaled, as f16;
  // fp8_ds_mla: the upconverted values and the rope, bf16; the records: f16 values * 2^-r_t).
  __device__ __forceinline__ void s_product(float (&sc)[32], const Desc& d, uint32_t stage_off, int i, int j) {
    ptx::wgmma_fence_operand(sc);
    ptx::wgmma_fence();
#pragma unroll
    for (int c = 0; c < kSPanels; ++c)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint32_t off = c * T::kPanelBytes + ks * 32;
        if constexpr (kBf16) ptx::wgmma_bf16_ss<T::kBlockN>(sc, d.k(L::kOffQ + off), d.k(stage_off + off), c > 0 || ks > 0);
        else ptx::wgmma_f16_ss<T::kBlockN>(sc, d.k(L::kOffQ + off), d.k(stage_off + off), c > 0 || ks > 0);
      }
    ptx::wgmma_commit_group();
    release_previous(i, j);
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(sc);
  }

  // The unit's tiles are the CTA's i0, i0 + 1, ... (stage j % 2, phase j / 2 % 2 for the CTA's tile j).
  __device__ __forceinline__ void run(int i0 = 0) {
    const Desc d(sm.base);
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int j = i0 + i, s = j & 1, k0 = u.key_begin + i * T::kBlockN;
      const uint32_t stage_off = static_cast<uint32_t>(L::kOffK + s * T::kTileBytes);
      ptx::mbar_wait(sm.full(s), (j >> 1) & 1);
      ptx::fence_proxy_async_smem();
      MLA_DECODE_TRACE_EVENT(4, 128, true);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1), i >> 1);
      float sc[32];
      s_product(sc, d, stage_off, i, j);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 1, i >> 1);
      // kRec: S times 2^r_t; O (relative to 2^ref) moves to 2^r_t: times 2^(ref - r_t) <= 1 with the factor a.
      float ra = 1.0f;
      if constexpr (kRec) {
        const int rt = *sm.stage_ref(s);
        const int dr = i == 0 ? 0 : ref - rt;
        ra = dr < -126 ? 0.0f : exp2i(dr);
        ref = rt;
        sc_lo = sq_lo * exp2i(rt);
        sc_hi = sq_hi * exp2i(rt);
      }
      float mx_lo, mx_hi;
      mask_max(sc, sm.mask(s), k0, mx_lo, mx_hi);
      const float n_lo = next_ref(m_lo, mx_lo), n_hi = next_ref(m_hi, mx_hi);
      const float a_lo = factor(m_lo, n_lo), a_hi = factor(m_hi, n_hi);
      const float ao_lo = a_lo * ra, ao_hi = a_hi * ra;  // O's factors (a alone unless kRec's reference moved)
      rescale(o, ao_lo, ao_hi);
      float sum_lo, sum_hi;
      exp2_rows(sc, n_lo, n_hi, sum_lo, sum_hi);
      l_lo = l_lo * a_lo + sum_lo;
      l_hi = l_hi * a_hi + sum_hi;
      m_lo = n_lo;
      m_hi = n_hi;
      // P and the factors for R: P into the rope panel (kRec: the P panel), which no one reads any more (S
      // retired), R's operand: f16 * 2^6 (fp8, kRec) or bf16 (fp8_ds_mla).
      if constexpr (kBf16) store_p_bf16(sm.p_panel(s), sc, rw.r_lo, rw.r_hi, rw.t4);
      else store_p_f16(sm.p_panel(s), sc, rw.r_lo, rw.r_hi, rw.t4);
      if (rw.t4 == 0) {
        sm.factors(s)[rw.r_lo] = ao_lo;
        sm.factors(s)[rw.r_hi] = ao_hi;
      }
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_arrive(L::kBarP + s, 256);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 2, i >> 1);
      // O_L += P V_L, P from registers; retired at the next tile (or after the loop). fp8, kRec: P * 2^6 as f16 (the
      // stage holds exact f16 codes, kRec f16 values * 2^-r), O carries 2^6 to the epilogue; fp8_ds_mla: P as bf16.
      uint32_t pa[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 4 * (2 * ks + (e >> 1)) + 2 * (e & 1);  // p_fragments_bf16's layout
          pa[ks][e] = kBf16 ? ptx::pack_bf16x2(sc[j], sc[j + 1]) : ptx::pack_f16x2(sc[j] * kPF16, sc[j + 1] * kPF16);
        }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) ptx::wgmma_fence_operand(pa[ks]);
      ptx::wgmma_fence_operand(o);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if constexpr (kBf16) ptx::wgmma_bf16_rs<T::kDvHalf, ptx::Major::MN>(o, pa[ks], d.mn(stage_off + ks * 2048), true);
        else ptx::wgmma_f16_rs<T::kDvHalf, ptx::Major::MN>(o, pa[ks], d.mn(stage_off + ks * 2048), true);
      }
      ptx::wgmma_commit_group();
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1) + 3, i >> 1);
      if constexpr (kRec) {
        // The records: P V_L retired and the stage released now, not once the next tile's S is issued. The converter
        // fills stage s again for tile j + 2 as soon as both roles are past it, and S has nothing to issue before tile
        // j + 1 is full (the converter sets the pace): held to the next S, the stage waited ~2,700 cycles a tile.
        ptx::wgmma_wait_group<0>();
        ptx::wgmma_fence_operand(o);
        ptx::mbar_arrive(sm.empty(s));
        MLA_DECODE_TRACE_PAIR(0, 8 + (i & 1), i >> 1);
      }
    }
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
    if (!kRec && u.n_tiles > 0) ptx::mbar_arrive(sm.empty((i0 + u.n_tiles - 1) & 1));
    MLA_DECODE_TRACE_EVENT(5, 128);
    l_lo = softmax::quad_sum(l_lo);
    l_hi = softmax::quad_sum(l_hi);
  }

  // P (a 64 x 64 D fragment, fp32) times 2^6 as f16 into the swizzled K-major panel (store_p's layout): the weights
  // below 2^-8 of a row's reference keep 11 significant bits down to 2^-24 (f16's normal range from 2^-14, shifted).
  static __device__ __forceinline__ void store_p_f16(uint8_t* sP, const float (&s)[32], int r_lo, int r_hi, int t4) {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      *reinterpret_cast<uint32_t*>(sP + swz(r_lo, jj) + 4 * t4) =
          ptx::pack_f16x2(s[4 * jj] * kPF16, s[4 * jj + 1] * kPF16);
      *reinterpret_cast<uint32_t*>(sP + swz(r_hi, jj) + 4 * t4) =
          ptx::pack_f16x2(s[4 * jj + 2] * kPF16, s[4 * jj + 3] * kPF16);
    }
  }
  // The same layout with P as bf16, unscaled (kBf16: R's operand for a bf16 stage).
  static __device__ __forceinline__ void store_p_bf16(uint8_t* sP, const float (&s)[32], int r_lo, int r_hi, int t4) {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      *reinterpret_cast<uint32_t*>(sP + swz(r_lo, jj) + 4 * t4) = ptx::pack_bf16x2(s[4 * jj], s[4 * jj + 1]);
      *reinterpret_cast<uint32_t*>(sP + swz(r_hi, jj) + 4 * t4) = ptx::pack_bf16x2(s[4 * jj + 2], s[4 * jj + 3]);
    }
  }
};

// The R warpgroup: O_R over every tile with S's P and factors: O_R += P V_R (ss; the P panel: f16 P * 2^6 for fp8
// and the records, whose factors carry the records' reference changes; bf16 P for fp8_ds_mla).
template <CacheFormat F>
struct RRole {
  static constexpr bool kBf16 = F == CacheFormat::fp8_ds_mla;
  static constexpr bool kRec = CacheFormatTraits<F>::kRecord;
  const Unit& u;
  const Smem& sm;
  Frag rw;
  float o[T::kDvHalf / 2];
  int last_ref = 0;  // kRec: the last tile's reference (read before its stage is released)

  __device__ __forceinline__ RRole(const Unit& u_, const Smem& sm_) : u(u_), sm(sm_) {
#pragma unroll
    for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  }
  // The unit's tiles are the CTA's i0, i0 + 1, ... (SRole::run).
  __device__ __forceinline__ void run(int i0 = 0) {
    const Desc d(sm.base);
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int j = i0 + i, s = j & 1;
      const uint32_t stage_off = static_cast<uint32_t>(L::kOffK + s * T::kTileBytes);
      const uint32_t p_off = stage_off + 8 * T::kPanelBytes;
      ptx::named_barrier_sync(L::kBarP + s, 256);
      MLA_DECODE_TRACE_PAIR(1, 2 * (i & 1), i >> 1);
      ptx::mbar_wait(sm.full(s), (j >> 1) & 1);
      ptx::fence_proxy_async_smem();
      rescale(o, sm.factors(s)[rw.r_lo], sm.factors(s)[rw.r_hi]);
      ptx::wgmma_fence_operand(o);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if constexpr (kBf16)
          ptx::wgmma_bf16_ss<T::kDvHalf, ptx::Major::K, ptx::Major::MN>(
              o, d.k(p_off + ks * 32), d.mn(stage_off + 4 * T::kPanelBytes + ks * 2048), true);
        else
          ptx::wgmma_f16_ss<T::kDvHalf, ptx::Major::K, ptx::Major::MN>(
              o, d.k(p_off + ks * 32), d.mn(stage_off + 4 * T::kPanelBytes + ks * 2048), true);
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(o);
      if constexpr (kRec) last_ref = *sm.stage_ref(s);  // the converter rewrites it once the stage is released
      ptx::mbar_arrive(sm.empty(s));
      MLA_DECODE_TRACE_PAIR(1, 2 * (i & 1) + 1, i >> 1);
    }
  }
};

}  // namespace convert

// The kernel (file comment). F: fp8 per-tensor (mqa_decode's paged rows) or fp8_ds_mla; RowsT: PagedRows (mqa_decode)
// or IndexedRows (sparse_mqa: a unit's request is a token).
// kSplit (p.cluster_merge, sparse_mqa.cu's small-T split; IndexedRows): p.num_splits CTAs per (row tile, token) as one
// cluster, rank k over its share of the token's tiles (Unit), O / l and the LSE into the stages (write_rows_half's
// partial), then cluster_merge_protocol; a token without keys: rank 0 writes it, no rank waits at a cluster barrier.
template <CacheFormat F, class RowsT, bool kSplit = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_convert_kernel(const __grid_constant__ CUtensorMap /*unused*/, const DecodeSm90Params p) {
  static_assert(F == CacheFormat::fp8 || F == CacheFormat::fp8_ds_mla, "code formats");
  static_assert(F != CacheFormat::fp8 || RowsT::kPaged, "fp8 per-tensor: mqa_decode only");
  static_assert(!kSplit || !RowsT::kPaged, "the small-T split: sparse_mqa");
  using L = ConvertTraits;
  using T = Traits;
  extern __shared__ uint8_t smem_raw[];
  const convert::Smem sm{aligned_smem(smem_raw)};
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  const Unit u(p, /*gather=*/!RowsT::kPaged);
  uint8_t* const partial = kSplit ? sm.stage(0) : nullptr;  // the split's O / l and LSE (ClusterMerge layout)
  if (kSplit ? u.seq_len == 0 : u.n_tiles == 0) {  // uniform over the CTA (kSplit: the cluster): nothing below runs
    if (!kSplit || u.split == 0) write_empty_unit(p, u, threadIdx.x, blockDim.x);
    return;
  }
  if constexpr (kSplit) {
    if (u.n_tiles == 0) {  // a rank past the token's tiles (never rank 0): LSE -inf, its O never read
      if (threadIdx.x < T::kBlockM)
        reinterpret_cast<float*>(partial + ClusterMerge::kPartialLse)[threadIdx.x] = -INFINITY;
      cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
      return;
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ptx::mbar_init(sm.full(s), L::kFullArrivals);
      ptx::mbar_init(sm.empty(s), L::kEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = ptx::warpgroup_index();
  // fp8: O carries 2^6 (P's f16 factor) and lacks the cache scale; fp8_ds_mla: the scales went into P_g.
  const float out_scale = F == CacheFormat::fp8 ? p.gather.scale / convert::kPF16 : 1.0f;
  if (wg == L::kConverter) {
    ptx::setmaxnreg_dec<L::kConverterRegs>();
    convert::converter<F, RowsT>(p, u, sm);
    if constexpr (kSplit) cluster_merge_pass();
    return;
  }
  const convert::Frag rw;
  if (wg == L::kRWarpgroup) {
    ptx::setmaxnreg_dec<L::kRRegs>();
    convert::RRole<F> r(u, sm);
    r.run();
    ptx::named_barrier_sync(L::kBarEnd, 256);
    const float* sums = sm.sums();
    const float* refs = sm.refs();
    write_rows_half(p, u, r.o, refs[rw.r_lo], refs[rw.r_hi], sums[rw.r_lo], sums[rw.r_hi], 1, rw.r_lo, rw.r_hi,
                    rw.t4, out_scale, partial);
    if constexpr (kSplit) cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
    return;
  }
  ptx::setmaxnreg_inc<L::kSRegs>();
  // Q of the unit's rows into shared memory (zeros past the request's rows), visible to this warpgroup's wgmma.
  load_q_panels_batched<T::kBlockM, 128>(p.rows, u.g, u.row0, u.m_rows, T::kPanelBytes, sm.q(),
                                         static_cast<int>(threadIdx.x & 127));
  if constexpr (F == CacheFormat::fp8) {
    ptx::named_barrier_sync(L::kBarQ, 128);
    convert::q_to_f16<T::kPanels>(sm, static_cast<int>(threadIdx.x & 127));
  }
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(L::kBarQ, 128);
  MLA_DECODE_TRACE_EVENT(3, 128);
  convert::SRole<F> sr(p, u, sm);
  sr.run();
  if (rw.t4 == 0) {
    sm.sums()[rw.r_lo] = sr.l_lo;
    sm.sums()[rw.r_hi] = sr.l_hi;
    sm.refs()[rw.r_lo] = sr.m_lo;
    sm.refs()[rw.r_hi] = sr.m_hi;
  }
  // Split: both consumers past their products before S overwrites the stages with its partial.
  if constexpr (kSplit) ptx::named_barrier_sync(L::kBarEnd, 256);
  else ptx::named_barrier_arrive(L::kBarEnd, 256);
  write_rows_half(p, u, sr.o, sr.m_lo, sr.m_hi, sr.l_lo, sr.l_hi, 0, rw.r_lo, rw.r_hi, rw.t4, out_scale, partial);
  if constexpr (kSplit) cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
  MLA_DECODE_TRACE_EVENT(6, 128);
}

namespace convert {

// The unit `b` of the DeepSeek-V4 schedule: its coordinates alone (token g, first row row0), no length loads.
__device__ __forceinline__ Unit v4_unit_at(const DecodeSm90Params& p, int b) {
  Unit u;
  const int g = b / p.m_tiles;
  u.row0 = (b - g * p.m_tiles) * p.tile_rows;
  u.g = g;
  return u;
}
// The unit `b` of the DeepSeek-V4 schedule (Unit: (row tile, token), the token's tiles over both lists) and its lists.
__device__ __forceinline__ Unit v4_unit(const DecodeSm90Params& p, int b, V4Tiles& v) {
  Unit u = v4_unit_at(p, b);  // Unit(p, true)'s uniform schedule at unit b, when p.num_splits is 1
  u.split = 0;
  u.ws_slot = -1;
  u.m_rows = p.rows.s_q * p.rows.h_q;
  v = v4_tiles(p, u.g);
  u.n_tiles = v.n_main + v.n_extra;
  u.key_begin = 0;
  u.seq_len = INT_MAX;  // no row limit: the index lists are the mask
  u.key_end = INT_MAX;
  return u;
}

// A persistent CTA's units: b, b + gridDim.x, ... below v4_units(p) = p.m_tiles * tokens (the unsplit schedule:
// num_splits 1; below 2^31: grid_for's bound on the unit count). Read from the parameters and gridDim whenever
// needed, so that no register holds them across a unit's tiles.
__device__ __forceinline__ int v4_units(const DecodeSm90Params& p) { return p.m_tiles * p.rows.groups; }
// Unit u's index (v4_unit's inverse): recomputed from u rather than kept in a register across its tiles.
__device__ __forceinline__ int v4_index(const DecodeSm90Params& p, const Unit& u) {
  return static_cast<int>(u.g) * p.m_tiles + u.row0 / T::kBlockM;
}
// A persistent S or R warpgroup's place in the CTA's sequences, one register across a unit's tiles: bits 0..1 the
// CTA's tile count modulo 4 (a tile's stage and its barriers' phase), bit 2 q_full's phase.
struct V4Phase {
  static __device__ __forceinline__ int tile(int ph) { return ph & 3; }
  static __device__ __forceinline__ uint32_t q(int ph) { return static_cast<uint32_t>(ph >> 2) & 1u; }
  static __device__ __forceinline__ int next(int ph, int n_tiles) { return ((ph + n_tiles) & 3) | ((ph ^ 4) & 4); }
};
// The first of the CTA's units from b on that has keys (v4_units(p) if none).
__device__ __forceinline__ int v4_with_keys(const DecodeSm90Params& p, int b) {
  for (; b < v4_units(p); b += static_cast<int>(gridDim.x)) {
    V4Tiles v;
    if (v4_unit(p, b, v).n_tiles > 0) break;
  }
  return b;
}

// The CTA's next unit with keys after u into Smem::v4_next (S reads it past kBarEnd) and its Q's eight boxes into L2
// (no shared memory, no barrier), so that S's copy of them at u's end, behind the epilogue, reads L2 rather than
// DRAM. By R's first thread at u's start, while R waits for u's first P.
__device__ __forceinline__ void v4_q_prefetch_next(const CUtensorMap* q_map, const DecodeSm90Params& p, const Unit& u,
                                                   const Smem& sm) {
  const int next = v4_with_keys(p, v4_index(p, u) + static_cast<int>(gridDim.x));
  *sm.v4_next() = next;
  if (next >= v4_units(p)) return;
  V4Tiles w;
  const Unit n = v4_unit(p, next, w);
#pragma unroll
  for (int c = 0; c < 8; ++c) ptx::tma_prefetch_l2_3d(q_map, 64 * c, n.row0, static_cast<int32_t>(n.g));
}

// Unit b's Q boxes (v4_q_issue) from its coordinates alone (no length loads), nothing when b is past the CTA's units.
__device__ __forceinline__ void v4_q_issue_unit(const CUtensorMap* q_map, const DecodeSm90Params& p, int b,
                                                const Smem& sm) {
  if (b < v4_units(p)) v4_q_issue(q_map, v4_unit_at(p, b), sm);
}

// The CTA's units for S or R (t: 0..255 over both): a unit without keys written at once (v4_empty_rows), one with
// keys handed to body(u); the next unit's index derived from u, not held across the body.
template <class Body>
__device__ __forceinline__ void v4_for_units(const DecodeSm90Params& p, int t, Body&& body) {
#pragma unroll 1
  for (int b = blockIdx.x; b < v4_units(p);) {
    V4Tiles v;
    const Unit u = v4_unit(p, b, v);
    if (u.n_tiles == 0) v4_empty_rows(p, u, t, 256);
    else body(u);
    b = v4_index(p, u) + static_cast<int>(gridDim.x);
  }
}

// The unsplit kernel's S warpgroup over its CTA's units (t: 0..127 S's, R's 128..255). Per unit with keys: Q (issued
// at the previous unit's end, read from L2: R put it there at that unit's start), the tiles, the sink, the row state
// for R, then O through Q's buffer (every product over Q retired; the stages hold the converter's next tiles by
// then) and the next unit's Q into the buffer once the rows are out. Outs other than 16-byte bf16 rows: the fragment
// path, the next Q issued as soon as every S warp's products retired.
template <CacheFormat FM>
__device__ __forceinline__ void v4_s_units(const CUtensorMap* q_map, const CUtensorMap* o_map, const DecodeSm90Params& p,
                                           const Smem& sm, int t) {
  const Frag rw;
  if (t == 0) v4_q_issue_unit(q_map, p, v4_with_keys(p, blockIdx.x), sm);  // the first unit's Q
  int ph = 0;  // V4Phase
  v4_for_units(p, t, [&](const Unit& u) {
    v4_q_convert_persistent(u, sm, t, V4Phase::q(ph));
    MLA_DECODE_TRACE_EVENT(3, 128);
    SRole<FM> sr(p, u, sm);
    sr.run(V4Phase::tile(ph));
    ph = V4Phase::next(ph, u.n_tiles);
    const bool staged = out_rows16(p, u);  // O through Q's buffer, the next Q after it; else Q's buffer refilled now
    if (!staged) {
      const int next = v4_with_keys(p, v4_index(p, u) + static_cast<int>(gridDim.x));
      if (next < v4_units(p)) {
        ptx::named_barrier_sync(L::kBarSDone, 128);
        if (t == 0) v4_q_issue_unit(q_map, p, next, sm);
      }
    }
    float f_lo, f_hi;  // the rows' sinks: R's, from the unit's start (past q_ready)
    fold_sink(sm.v4_sinks()[rw.r_lo], sr.m_lo, sr.l_lo, f_lo);
    fold_sink(sm.v4_sinks()[rw.r_hi], sr.m_hi, sr.l_hi, f_hi);
    if (rw.t4 == 0) {  // R reads them after kBarEnd; the next unit's are written past its q_ready, on which R's
      sm.sums()[rw.r_lo] = sr.l_lo;  // threads arrive after their reads
      sm.sums()[rw.r_hi] = sr.l_hi;
      sm.refs()[rw.r_lo] = sr.m_lo;
      sm.refs()[rw.r_hi] = sr.m_hi;
      sm.out_factors()[rw.r_lo] = f_lo;
      sm.out_factors()[rw.r_hi] = f_hi;
    }
    if (!staged) scale_rows(sr.o, f_lo, f_hi);
    const float out_scale = exp2i(sr.ref - 6);
    if (staged) {  // every product over Q retired (S's here, R's none): the buffer is O's
      ptx::named_barrier_sync(L::kBarEnd, 256);
      stage_o_bf16(sr.o, f_lo * out_inv(sr.l_lo, out_scale), f_hi * out_inv(sr.l_hi, out_scale), sm.q(), 0, rw);
      ptx::named_barrier_sync(L::kBarEnd, 256);
      store_staged_rows(o_map, p, u, sm, t);
      if (t == 0) v4_q_issue_unit(q_map, p, *sm.v4_next(), sm);  // R's, from the unit's start
    } else {
      ptx::named_barrier_arrive(L::kBarEnd, 256);
      write_rows_half(p, u, sr.o, sr.m_lo, sr.m_hi, sr.l_lo, sr.l_hi, 0, rw.r_lo, rw.r_hi, rw.t4, out_scale, nullptr);
    }
    MLA_DECODE_TRACE_EVENT(6, 128);
  });
}

// The unsplit kernel's R warpgroup over its CTA's units (t: 128..255), in step with S (v4_s_units). Its V4Phase lives
// in shared memory (Smem::role_state, per warp) and its fragment place is the role's own (RRole::rw), so that the loop
// holds as few of R's 160 registers as it can across the tiles.
template <CacheFormat FM>
__device__ __forceinline__ void v4_r_units(const CUtensorMap* q_map, const DecodeSm90Params& p, const Smem& sm, int t) {
  auto ph = [&]() -> volatile int& { return *sm.role_state(4 + ((t >> 5) & 3)); };
  if ((t & 31) == 0) ph() = 0;
  __syncwarp();
  v4_for_units(p, t, [&](const Unit& u) {
    // The rows' sinks for S's epilogue, handed over by q_ready (their loads in flight while Q lands).
    if (t - 128 < T::kBlockM) sm.v4_sinks()[t - 128] = sink_log2_of(p, u, t - 128);
    v4_q_convert_persistent(u, sm, t, V4Phase::q(ph()));
    if (t == 128) v4_q_prefetch_next(q_map, p, u, sm);
    RRole<FM> r(u, sm);
    const Frag& rw = r.rw;
    r.run(V4Phase::tile(ph()));
    const int next_ph = V4Phase::next(ph(), u.n_tiles);
    __syncwarp();
    if ((t & 31) == 0) ph() = next_ph;
    __syncwarp();
    ptx::named_barrier_sync(L::kBarEnd, 256);
    const float* sums = sm.sums();
    const float* refs = sm.refs();
    const float* f = sm.out_factors();
    const bool staged = out_rows16(p, u);
    if (!staged) scale_rows(r.o, f[rw.r_lo], f[rw.r_hi]);  // staged: with 1 / l (the rotation is per row)
    rotate_o_r(p, u, sm, r.o, t - 128, rw.t4);
    // O is relative to the last tile's reference 2^r and carries P's 2^6.
    const float out_scale = exp2i(r.last_ref - 6);
    if (staged) {  // through Q's buffer (v4_s_units)
      stage_o_bf16(r.o, f[rw.r_lo] * out_inv(sums[rw.r_lo], out_scale), f[rw.r_hi] * out_inv(sums[rw.r_hi], out_scale),
                   sm.q(), 1, rw);
      ptx::named_barrier_sync(L::kBarEnd, 256);  // S stores the panels
    } else {
      write_rows_half(p, u, r.o, refs[rw.r_lo], refs[rw.r_hi], sums[rw.r_lo], sums[rw.r_hi], 1, rw.r_lo, rw.r_hi,
                      rw.t4, out_scale, nullptr);
    }
  });
}

}  // namespace convert

// The DeepSeek-V4 64-row kernel's tensor maps (kernel parameters): q as {512, h_q, groups} bf16, box {64, 64, 1},
// 128-byte swizzle (Q's panels); out the same way (the persistent kernel's staged output, out_rows16; else unused).
struct V4Maps {
  CUtensorMap q;
  CUtensorMap o;
};

// The DeepSeek-V4 sparse_mqa kernel: the converter kernel's roles over record caches (records.cuh) on (row tile,
// token) units: Q 64 x 512 (f16 * 2^e_r per row), keys of the main list (format FM) then of the extra list (FE),
// K = V over all 512 columns (S over panels 0..7, O_L over 0..3, O_R over 4..7), f16 products over a stage of
// value * 2^-r (the converter's running reference), the sink folded in the epilogue, O times 2^(r - 6) there.
// Unsplit: persistent CTAs (the launcher's grid: at most one a SM), each over units blockIdx.x, + gridDim.x, ...; the
// stages, their barriers' phases and the named barriers run on across units (the CTA's tile count), so that the
// converter gathers a unit's first tiles while S and R finish the previous one, and Q lands during its epilogue;
// units without keys are written by S and R (out 0, lse the sink). kSplit (p.cluster_merge, sparse_mqa.cu's small-T
// split): one unit per CTA, p.num_splits CTAs per (row tile, token) as one cluster, rank k over its part of the
// token's tiles (v4_split), O / l and the LSE into the stages (write_rows_half's partial; rank 0 folds the sink),
// then cluster_merge_protocol; a token without keys: rank 0 writes it, no rank waits at a cluster barrier.
template <CacheFormat FM, CacheFormat FE, bool kSplit>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_convert_v4_kernel(const __grid_constant__ V4Maps maps, const DecodeSm90Params p) {
  static_assert(CacheFormatTraits<FM>::kRecord && CacheFormatTraits<FE>::kRecord, "DeepSeek-V4 record formats");
  using L = ConvertTraits;
  using T = Traits;
  extern __shared__ uint8_t smem_raw[];
  const convert::Smem sm{aligned_smem(smem_raw)};
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  if constexpr (!kSplit && convert_v4_persistent(FM)) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < L::kStages; ++s) {
        ptx::mbar_init(sm.full(s), L::kFullArrivals);
        ptx::mbar_init(sm.empty(s), L::kEmptyArrivals);
      }
      ptx::mbar_init(sm.q_full(), 1);
      ptx::mbar_init(sm.q_ready(), 256);
      ptx::fence_mbarrier_init();
    }
    __syncthreads();
    const int wg = ptx::warpgroup_index();
    if (wg == L::kConverter) {
      ptx::setmaxnreg_dec<L::kConverterRegs>();
      // The unit index through shared memory (convert::Smem::role_state): no register holds it across the tiles.
      volatile int* const next = sm.role_state(ptx::warp_idx_in_warpgroup());
      int i0 = 0;
#pragma unroll 1
      for (int b = convert::v4_with_keys(p, blockIdx.x); b < convert::v4_units(p);
           b = convert::v4_with_keys(p, *next + static_cast<int>(gridDim.x))) {
        convert::V4Tiles v;
        convert::v4_unit(p, b, v);
        __syncwarp();
        if ((threadIdx.x & 31) == 0) *next = b;
        __syncwarp();
        i0 = convert::record_converter<FM, FE>(p, v, sm, i0);
      }
      return;
    }
    // (Each role finds its first unit itself: a search before the roles take their registers made ptxas spill in
    // all three.)
    const int t = static_cast<int>(threadIdx.x) - 128;
    if (wg == L::kRWarpgroup) {
      ptx::setmaxnreg_dec<L::kRRegs>();
      convert::v4_r_units<FM>(&maps.q, p, sm, t);
      return;
    }
    ptx::setmaxnreg_inc<L::kSRegs>();
    convert::v4_s_units<FM>(&maps.q, &maps.o, p, sm, t);
    return;
  } else {
    Unit u(p, /*gather=*/true);
    const convert::V4Tiles whole = convert::v4_tiles(p, u.g);
    const convert::V4Tiles v = kSplit ? convert::v4_split(whole, u.split, p.num_splits) : whole;
    u.n_tiles = v.n_main + v.n_extra;
    u.key_begin = 0;
    u.seq_len = INT_MAX;  // no row limit: the index lists are the mask
    u.key_end = INT_MAX;
    if (whole.n_main + whole.n_extra == 0) {  // uniform over the cluster: out 0, lse the sink (or -inf)
      if (!kSplit || u.split == 0) convert::v4_empty_unit(p, u);
      return;
    }
    uint8_t* const partial = kSplit ? sm.stage(0) : nullptr;  // the split's O / l and LSE (ClusterMerge layout)
    if constexpr (kSplit) {
      if (u.n_tiles == 0) {  // a rank past the token's tiles (never rank 0): LSE -inf, its O never read
        if (threadIdx.x < T::kBlockM)
          reinterpret_cast<float*>(partial + ClusterMerge::kPartialLse)[threadIdx.x] = -INFINITY;
        cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
        return;
      }
    }
    if (threadIdx.x == 0) {
      for (int s = 0; s < L::kStages; ++s) {
        ptx::mbar_init(sm.full(s), L::kFullArrivals);
        ptx::mbar_init(sm.empty(s), L::kEmptyArrivals);
      }
      ptx::mbar_init(sm.q_full(), 1);
      ptx::fence_mbarrier_init();
    }
    __syncthreads();
    const int wg = ptx::warpgroup_index();
    if (wg == L::kConverter) {
      ptx::setmaxnreg_dec<L::kConverterRegs>();
      convert::record_converter<FM, FE>(p, v, sm);
      if constexpr (kSplit) cluster_merge_pass();
      return;
    }
    const convert::Frag rw;
    // S and R (threads 128 .. 383) load and convert Q before they take their registers: one copy of that code.
    convert::v4_q_prologue(&maps.q, u, sm, static_cast<int>(threadIdx.x) - 128);
    if (wg == L::kRWarpgroup) {
      ptx::setmaxnreg_dec<L::kRRegs>();
      convert::RRole<FM> r(u, sm);
      r.run();
      ptx::named_barrier_sync(L::kBarEnd, 256);
      if constexpr (!kSplit) {
        if (convert::out_rows16(p, u)) {  // the rotation first: it commutes with the rows' factors
          convert::rotate_o_r(p, u, sm, r.o, static_cast<int>(threadIdx.x) - 256, rw.t4);
          convert::stage_o_half(r.o, reinterpret_cast<float*>(sm.stage(1)), rw);
          ptx::named_barrier_sync(L::kBarEnd, 256);
          convert::store_o_rows16(p, u, sm, static_cast<int>(threadIdx.x) - 128, r.last_ref);
          return;
        }
      }
      const float* sums = sm.sums();
      const float* refs = sm.refs();
      const float* f = sm.out_factors();
      convert::scale_rows(r.o, f[rw.r_lo], f[rw.r_hi]);
      convert::rotate_o_r(p, u, sm, r.o, static_cast<int>(threadIdx.x) - 256, rw.t4);
      // O is relative to the last tile's reference 2^r and carries P's 2^6.
      write_rows_half(p, u, r.o, refs[rw.r_lo], refs[rw.r_hi], sums[rw.r_lo], sums[rw.r_hi], 1, rw.r_lo, rw.r_hi,
                      rw.t4, exp2i(r.last_ref - 6), partial);
      if constexpr (kSplit) cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
      return;
    }
    ptx::setmaxnreg_inc<L::kSRegs>();
    MLA_DECODE_TRACE_EVENT(3, 128);
    convert::SRole<FM> sr(p, u, sm);
    sr.run();
    float f_lo, f_hi;
    // Split: the sink joins rank 0's partial only (the merge sums the ranks' exponentials once).
    const bool with_sink = !kSplit || u.split == 0;
    convert::fold_sink(with_sink ? convert::sink_log2_of(p, u, rw.r_lo) : -INFINITY, sr.m_lo, sr.l_lo, f_lo);
    convert::fold_sink(with_sink ? convert::sink_log2_of(p, u, rw.r_hi) : -INFINITY, sr.m_hi, sr.l_hi, f_hi);
    if (rw.t4 == 0) {
      sm.sums()[rw.r_lo] = sr.l_lo;
      sm.sums()[rw.r_hi] = sr.l_hi;
      sm.refs()[rw.r_lo] = sr.m_lo;
      sm.refs()[rw.r_hi] = sr.m_hi;
      sm.out_factors()[rw.r_lo] = f_lo;
      sm.out_factors()[rw.r_hi] = f_hi;
    }
    // Split: both consumers past their products before either overwrites the stages with its partial.
    if constexpr (kSplit) {
      ptx::named_barrier_sync(L::kBarEnd, 256);
    } else if (convert::out_rows16(p, u)) {  // the same before O goes through the stages
      ptx::named_barrier_sync(L::kBarEnd, 256);
      convert::stage_o_half(sr.o, reinterpret_cast<float*>(sm.stage(0)), rw);
      ptx::named_barrier_sync(L::kBarEnd, 256);
      convert::store_o_rows16(p, u, sm, static_cast<int>(threadIdx.x) - 128, sr.ref);
      MLA_DECODE_TRACE_EVENT(6, 128);
      return;
    } else {
      ptx::named_barrier_arrive(L::kBarEnd, 256);
    }
    convert::scale_rows(sr.o, f_lo, f_hi);
    write_rows_half(p, u, sr.o, sr.m_lo, sr.m_hi, sr.l_lo, sr.l_hi, 0, rw.r_lo, rw.r_hi, rw.t4, exp2i(sr.ref - 6),
                    partial);
    if constexpr (kSplit) cluster_merge_protocol(p, u, partial, static_cast<int>(threadIdx.x) - 128, 256);
    MLA_DECODE_TRACE_EVENT(6, 128);
  }
}

}  // namespace mla::cuda::decode_sm90
