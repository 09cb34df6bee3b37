// SPDX-License-Identifier: Apache-2.0
#pragma once
// The raw-codes kernel's parts (raw/kernel.cuh has the algorithm, warp roles and shared-memory budget): its
// shared-memory layout (RawTraits), the code conversions the consumers build wgmma operands with, the query
// prologue (row maxima, the permuted f16 / bf16 Q panels) and the producer that copies raw rows into the ring.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/attention/sm90/common/exact_codes.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/raw/traits.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

// ---- exact e4m3 -> bf16 pairs (times 2^-120) ----
// The pair's two bytes and their sign-replicated bytes as two 16-bit halves (PRMT selector `sel`); shifted by 4,
// the code's bits 0..6 sit at bf16 bits 4..10 and its sign at bit 15: masked, that is the bf16 of code * 2^-120
// (the biases differ by 120; e4m3 subnormals land on bf16 subnormals). NaN codes come out finite (the V operand:
// a masked key's NaN must not reach O through P = 0).
__device__ __forceinline__ uint32_t raw_pair(uint32_t a, uint32_t b, uint32_t sel) {
  return (prmt(a, b, sel) << 4) & 0x87f087f0u;
}
// Bit 7 of a byte set where the byte is a NaN code (bits 0..6 all set).
__device__ __forceinline__ uint32_t nan_bytes(uint32_t w) { return (w & 0x7f7f7f7fu) + 0x01010101u; }
// Selector of bytes x (from a) and y (from b, 4 + y) with their sign replications.
__host__ __device__ constexpr uint32_t raw_sel(uint32_t x, uint32_t y) {
  return x | (x | 8u) << 4 | y << 8 | (y | 8u) << 12;
}

// Chunk words of a thread's two keys (wl: key_lo, wh: key_hi; word i = k-step 4 j + i) as the A fragment of four
// k-steps: f16 pairs, exact, NaN codes to NaN (a NaN key's scores come out NaN).
__device__ __forceinline__ void e4m3_chunk_to_a(const uint32_t (&wl)[4], const uint32_t (&wh)[4], uint32_t (&aj)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    aj[4 * i] = e4m3x2_lo_to_f16x2(wl[i]);
    aj[4 * i + 1] = e4m3x2_lo_to_f16x2(wh[i]);
    aj[4 * i + 2] = e4m3x2_hi_to_f16x2(wl[i]);
    aj[4 * i + 3] = e4m3x2_hi_to_f16x2(wh[i]);
  }
}

// Staged query row r (< N) of the unit: raw bf16, 576 columns, kQRowBytes apart in ring slot kQSlot (zeros past the
// unit's rows).
__device__ __forceinline__ const uint16_t* staged_q_row(const uint8_t* stage, int r) {
  return reinterpret_cast<const uint16_t*>(stage + r * kStagedQRowBytes);
}

// Query rows [0, N) of the unit (staged: staged_q_row) into Q's nine K-major swizzled panels in the consumers'
// permuted column order, each row times 2^e (q_row_exponent of sAmax[r], the rows' max |q| bits; sQf[r] = 2^-e for
// the scores), by the 256 consumer threads (index ct): f16 where K comes as e4m3 codes (the latent, fp8's rope),
// bf16 for fp8_ds_mla's bf16 rope (exact: a power of two). Panel column k = 16 ks + cc of k-step ks holds
// d = base(ks) + 16 q + 2 h + e for cc = 8 h + 2 q + e (the A fragment's byte order, raw/kernel.cuh's header): latent
// and fp8 rope ks = 4 j + i: base = 64 j + 4 i; fp8_ds_mla's bf16 rope ks = 32 + s: base = 512 + 32 (s / 2) + 4 (s % 2)
// with 8 q instead of 16 q (bf16 pairs: a thread's 16-byte load holds two k-steps).
template <int N, bool kDs>
__device__ __forceinline__ void store_q_permuted(const uint8_t* stage, uint8_t* sQ, const uint32_t* sAmax, float* sQf,
                                                 int ct) {
  constexpr int kItems = N * 36 * 2;  // (row, k-step, half) chunks of 8 columns
  for (int e = ct; e < kItems; e += Traits::kConsumerThreads) {
    const int r = e / 72, ks = (e % 72) >> 1, h = e & 1;
    uint32_t v[4];
    const int ex = q_row_exponent(sAmax[r]);
    if (e % 72 == 0) sQf[r] = exp2i(-ex);
    const uint16_t* src = staged_q_row(stage, r);
    const bool rope16 = kDs && ks >= 32;
    int base, step;
    if (rope16) {
      base = 512 + 32 * ((ks - 32) >> 1) + 4 * ((ks - 32) & 1);
      step = 8;
    } else {
      base = 64 * (ks >> 2) + 4 * (ks & 3);
      step = 16;
    }
    const float f = exp2i(ex);
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const uint32_t pair = *reinterpret_cast<const uint32_t*>(src + base + step * qq + 2 * h);
      const float x0 = __uint_as_float(pair << 16) * f, x1 = __uint_as_float(pair & 0xffff0000u) * f;
      v[qq] = rope16 ? ptx::pack_bf16x2(x0, x1) : ptx::pack_f16x2(x0, x1);
    }
    *reinterpret_cast<uint4*>(sQ + (ks >> 2) * (N * 128) + swz(r, 2 * (ks & 3) + h)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// sAmax[r] = the fp32 bits of max |q| over staged query row r (0 for the zero rows past the unit's); sAmax zeroed and
// published by a consumer barrier before, read after the next one.
template <int N>
__device__ __forceinline__ void q_row_amax(const uint8_t* stage, uint32_t* sAmax, int ct) {
  for (int e = ct; e < N * 72; e += Traits::kConsumerThreads) {  // (row, 8 columns)
    const int r = e / 72;
    const uint4 x = *reinterpret_cast<const uint4*>(stage + r * kStagedQRowBytes + 16 * (e % 72));
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // |q| as fp32 bits: ordered like the values
      const uint32_t lo = (w[i] << 16) & 0x7fffffffu, hi = w[i] & 0x7fff0000u;
      m = max(m, max(lo, hi));
    }
    atomicMax(&sAmax[r], m);
  }
}

// The producer warpgroup's first job (thread pt of 128): the unit's N query rows into ring slot kQSlot (staged_q_row),
// zeros past its rows, completing on qfull (128 arrivals). 16-byte cp.async where the rows allow it (rp.q_vec16),
// else loads and stores (a plain arrival then releases them).
template <class L>
__device__ __forceinline__ void stage_q(const DecodeSm90Params& p, const Unit& u, uint8_t* stage, uint64_t* qfull, int pt) {
  constexpr int kChunks = L::kQRowBytes / 16;
  const MqaRowParams& rp = p.rows;
  if (rp.q_vec16) {
    for (int e = pt; e < L::N_ * kChunks; e += 128) {
      const int r = e / kChunks, ch = e % kChunks, row = u.row0 + r;
      const bool ok = row < u.m_rows;
      ptx::cp_async_16_zfill(stage + r * L::kQRowBytes + 16 * ch, ok ? q_row_ptr(rp, u.g, row, 8 * ch) : rp.q,
                             ok ? 16u : 0u);
    }
    ptx::cp_async_arrive_mbarrier(qfull);
  } else {
    for (int e = pt; e < L::N_ * kChunks; e += 128) {
      const int r = e / kChunks, ch = e % kChunks, row = u.row0 + r;
      const uint4 v = row < u.m_rows ? load_q_chunk(rp, u.g, row, ch) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(stage + r * L::kQRowBytes + 16 * ch) = v;
    }
    ptx::fence_proxy_async_smem();  // the slot's next writer may be a TMA copy (produce_raw)
    ptx::mbar_arrive(qfull);
  }
}

// Producer warp `warp` (0..3): rows 16 warp .. + 15 of every tile. Each lane locates one row (two lanes per row,
// lane / 2); the copies go eight lanes per row, four rows per instruction (row 4 q + lane / 8 of group q), round i
// covering the row's bytes in the i-th global 128-byte line it touches: the copy of a line lands in shared memory
// in one wavefront. (Two lanes per row, each instruction touched 16 lines and cost 16 wavefronts, ~55% of the
// kernel's shared-memory wavefronts; eight lanes at the row's own offsets still straddled two lines per row and
// instruction.)
//
// Paged rows with p.gather.raw_tma (page_size % 16 == 0): a warp whose 16 rows are all loaded and start a 16-row
// group of one page takes them with one TMA box instead (lane 0; `map` = [num_blocks][page_size][record / 4] int32,
// boxes of 168 x 16 x 1: the box's 168 words are the 672-byte slot row, the words past the record zero-filled as out
// of the tensor's bounds), its bytes announced on the full barrier with expect_tx; the cp.async arrivals stay.
template <class L, class Rows>
__device__ __forceinline__ void produce_raw(const DecodeSm90Params& p, const Unit& u, uint8_t* smem,
                                            const CUtensorMap* map, int warp, int lane) {
  const int r = 16 * warp + (lane >> 1), l8 = lane & 7, q8 = lane >> 3;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kSlots;
  uint16_t* masks = reinterpret_cast<uint16_t*>(smem + L::kOffMask);  // [slot][warp]
  const uint8_t* cache = p.gather.cache;
  // The key's global read (index / block id) two tiles ahead of its copies, its offset one tile ahead: neither
  // read's latency sits in front of a tile's copies (sparse: ~740 of the producer's 2570 ncu samples did).
  constexpr int kB = Traits::kBlockN;
  constexpr int kRounds = (L::kRecordBytes + 112 + 127) / 128;  // lines a 16-byte-aligned row can touch
  const int j0 = u.key_begin + r;
  int64_t off = 0;
  int32_t raw = Rows::fetch(p, u, j0);  // this tile's block id (paged) / index (sparse)
  bool ok = Rows::locate(p, j0, raw, off);
  int32_t raw_next = Rows::fetch(p, u, j0 + kB);
  static_assert(16 * L::kStride % 128 == 0 && L::kSlotBytes % 128 == 0, "TMA boxes land 128-byte aligned");
  for (int it = 0; it < u.n_tiles; ++it) {
    const int s = it % L::kSlots;
    const int32_t raw_next2 = Rows::fetch(p, u, j0 + (it + 2) * kB);
    int64_t off_next = 0;
    const bool ok_next = Rows::locate(p, j0 + (it + 1) * kB, raw_next, off_next);
    // Keys not loaded: -1, zero-filled with nothing read (the ignore-src predicate) from the cache's first row.
    const int64_t src_off = ok ? off : -1;
    // Slot kQSlot's empty barrier has one phase more: Q's release by the consumers' prologue (stage_q).
    ptx::mbar_wait(&empty[s], ((it / L::kSlots) & 1) ^ (s == L::kQSlot ? 0 : 1));
    uint8_t* slot = smem + L::kOffRing + s * L::kSlotBytes + 16 * warp * L::kStride;
    bool by_tma = false;
    if constexpr (Rows::kPaged) {
      if (p.gather.raw_tma) {  // uniform
        uint32_t page, prow;  // of the warp's first row, 16 warp (the same value in every lane)
        fast_divmod(static_cast<uint32_t>(u.key_begin + 16 * warp + it * kB), p.gather.page_div, page, prow);
        // prow % 16 == 0 and page_size % 16 == 0 put the warp's 16 rows in one page.
        by_tma = __all_sync(0xffffffffu, ok) && (prow & 15u) == 0;
        if (by_tma && lane == 0) {
          ptx::mbar_expect_tx(&full[s], 16 * L::kStride);
          ptx::fence_proxy_async_smem();
          ptx::tma_load_3d(slot, map, &full[s], 0, static_cast<int32_t>(prow), raw);
        }
      }
    }
    if (!by_tma) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int rq = 4 * q + q8;                                     // row in this warp's 16
        const int64_t o = __shfl_sync(0xffffffffu, src_off, 2 * rq);  // its locating lane
        const uint8_t* src = o >= 0 ? cache + o : cache;
        // Round i copies the row's bytes inside global line i from the row's first line: one line per
        // instruction and row (a round at the row's own 128-byte offsets straddled two lines when the row is not
        // line-aligned, as fp8_ds_mla's 656-byte and every other fp8 576-byte row are). The lane's byte of the
        // row in round i is rel + 128 i (rel in [-112, 112]): round 0 copies where rel >= 0, round i >= 1 where
        // rel < kRecordBytes - 128 i; both addresses are one base plus an immediate per round, the zero fill a
        // predicate (ncu: the per-round 64-bit offsets and src-size arithmetic were ~400 instructions per warp and
        // tile, a third of each scheduler's issue slots).
        const int rel = 16 * l8 - static_cast<int>(reinterpret_cast<uintptr_t>(src) & 127);
        const uint8_t* s0 = src + rel;
        uint8_t* d0 = slot + rq * L::kStride + rel;
        const bool zero = o < 0;
#pragma unroll
        for (int i = 0; i < kRounds; ++i)
          if (i == 0 ? rel >= 0 : rel < L::kRecordBytes - 128 * i)
            ptx::cp_async_16_or_zero(d0 + 128 * i, s0 + 128 * i, zero);
      }
    }
    uint32_t m = __ballot_sync(0xffffffffu, ok) & 0x55555555u;  // even lanes: rows 16 warp + lane / 2
    m = (m | m >> 1) & 0x33333333u;
    m = (m | m >> 2) & 0x0f0f0f0fu;
    m = (m | m >> 4) & 0x00ff00ffu;
    m = (m | m >> 8) & 0x0000ffffu;
    if (lane == 0) {
      masks[4 * s + warp] = static_cast<uint16_t>(m);
      ptx::mbar_arrive(&full[s]);  // releases the mask part
    }
    ptx::cp_async_arrive_mbarrier(&full[s]);
    ok = ok_next;
    off = off_next;
    raw = raw_next;
    raw_next = raw_next2;
  }
}

}  // namespace mla::cuda::decode_sm90
