// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DeepSeek-V4 kernel's N 16 tile (docs/design/v4_sm90_plan.md §6, "The N 16 tile in detail"): for units of at
// most 16 query rows, the products run with the keys as the wgmma's M and the heads as its N, so that no product and
// no softmax step runs on rows that do not exist (the 64-row tile pads 16 heads to 64).
//   S^T = K Q^T   m64n16k16 f16 ss x 32: A the stage (keys as M, K-major, as it stands), B Q's rows 0..15 (the
//                 first two swizzle atoms of each Q panel: K-major).
//   softmax       per head (a column of S^T) over the tile's 64 keys: the lanes of equal lane % 4 (xor 4, 8, 16),
//                 then the four warps through shared memory (one barrier per tile); the running reference and the
//                 lazy maximum per head as the 64-row tile's per row; the row sums stay per warp until the end.
//   P^T           f16 * 2^6 into the stage's P panel as [head][key] (16 rows of 128 bytes, 128-byte swizzle): the
//                 K-major B operand of the value product.
//   O^T += V^T P^T  m64n16k16 f16 ss, A the stage read MN-major (a panel's 64 columns as M), one block per panel:
//                 S the panels 0..3, R 4..7 (8 floats a block); with the record ring, S all eight.
// The record ring (both lists warp-layout records: v41, v41_fp4): the R warpgroup is the loader (RingLoader), which
// gathers each tile's records into Q's rows past 16 (which this tile leaves free) by cp.async, so that the converter
// warps (kernel.cuh RingFeed) read them from shared memory and no longer issue the gathers on their own chain (the
// design note §6, "Next: a loader role"); S then takes all eight panels' products and the whole epilogue. v4's
// records (their rope by the converter's own cp.async copies) keep R16Role and the converter's own loads.
// The converter, the stage, the protocol (full / empty / kBarP + s / kBarEnd) and the epilogue's sink are the
// 64-row tile's (kernel.cuh); a fragment's place: warp w of a warpgroup holds keys (or columns) 16 w + lane / 4 and
// + 8, heads 8 j + 2 (lane % 4) + e (j, e < 2): d[4 j + e] on the first, d[4 j + 2 + e] on the second.
#include <cstdint>

#include "cuda/attention/sm90/common/cluster_merge.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"

namespace mla::cuda::decode_sm90 {

namespace convert {

inline constexpr int kN16 = 16;  // heads per unit at most

// A thread's four heads: q = 2 j + e.
__device__ __forceinline__ int n16_head(int t4, int q) { return 8 * (q >> 1) + 2 * t4 + (q & 1); }

// Shared scratch of the N 16 roles: Q's panel 0 past its row 16 (rows 16..63 of Q are never read by S^T).
struct N16Scratch {
  float* base;
  __device__ __forceinline__ explicit N16Scratch(const Smem& sm) : base(reinterpret_cast<float*>(sm.q() + 16 * 128)) {}
  __device__ __forceinline__ float* max_red(int s) const { return base + 64 * s; }     // [2][4 warps][16]
  __device__ __forceinline__ float* sum_red() const { return base + 128; }             // [4 warps][16]
  static constexpr int kBytes = 192 * 4;
};
// The record ring (ConvertTraits::ring_offset) past Q's rows 0..15 and panel 0's scratch, for the warp layout's records.
static_assert(L::kRingFloor == kN16 * 128 + N16Scratch::kBytes, "the ring's floor is Q's rows and the scratch");
static_assert(L::ring_offset(static_cast<int>(CacheFormatTraits<CacheFormat::v41>::row_stride_bytes())) >= L::kRingFloor &&
                  L::ring_offset(static_cast<int>(CacheFormatTraits<CacheFormat::v41_fp4>::row_stride_bytes())) >=
                      L::kRingFloor,
              "the N 16 tile's record ring overlaps Q or the scratch");

// O^T's block (8 floats: columns 16 w + lane / 4, + 8 of one panel, the thread's four heads) times per-head factors.
__device__ __forceinline__ void n16_scale(float (&o)[8], const float (&f)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = q >> 1, e = q & 1;
    o[4 * j + e] *= f[q];
    o[4 * j + 2 + e] *= f[q];
  }
}

// The value product of panels [c0, c0 + kBlocks) into o[kBlocks][8]: A the stage's panel MN-major, B P^T (K-major).
template <int kBlocks>
__device__ __forceinline__ void n16_pv(float (&o)[kBlocks][8], const Desc& d, uint32_t stage_off, uint32_t p_off, int c0) {
#pragma unroll
  for (int c = 0; c < kBlocks; ++c) ptx::wgmma_fence_operand(o[c]);
  ptx::wgmma_fence();
#pragma unroll
  for (int c = 0; c < kBlocks; ++c)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ptx::wgmma_f16_ss<kN16, ptx::Major::MN, ptx::Major::K>(
          o[c], d.mn(stage_off + (c0 + c) * T::kPanelBytes + ks * 2048), d.k(p_off + ks * 32), true);
  ptx::wgmma_commit_group();
}

// The S warpgroup of the N 16 tile: S^T, the softmax per head, P^T and factors for R, O^T of panels 0..3; kAll (R is
// the record ring's loader): O^T of all eight panels, P^T for S alone.
template <CacheFormat F, bool kAll = false>
struct S16Role {
  static constexpr int kOwn = kAll ? 8 : 4;  // O^T's panels
  const DecodeSm90Params& p;
  const Unit& u;
  const Smem& sm;
  const N16Scratch scr;
  int w, lane, t4;
  float sq[4];                     // per head: the softmax scale (log2) times 2^-e_r
  float m[4], l[4];                // per head: the running reference and this warp's share of the sum
  int ref = 0;                     // the records' reference O is relative to
  float o[kOwn][8];

  __device__ __forceinline__ S16Role(const DecodeSm90Params& p_, const Unit& u_, const Smem& sm_)
      : p(p_), u(u_), sm(sm_), scr(sm_) {
    lane = threadIdx.x & 31;
    w = ptx::warp_idx_in_warpgroup();
    t4 = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      sq[q] = p.rows.scale_log2 * sm.q_scales()[n16_head(t4, q)];
      m[q] = -INFINITY;
      l[q] = 0.0f;
    }
#pragma unroll
    for (int c = 0; c < kOwn; ++c)
#pragma unroll
      for (int k = 0; k < 8; ++k) o[c][k] = 0.0f;
  }

  __device__ __forceinline__ void run() {
    const Desc d(sm.base);
    const int key_lo = 16 * w + (lane >> 2), key_hi = key_lo + 8;
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int s = i & 1;
      const uint32_t stage_off = static_cast<uint32_t>(L::kOffK + s * T::kTileBytes);
      const uint32_t p_off = stage_off + 8 * T::kPanelBytes;
      ptx::mbar_wait(sm.full(s), (i >> 1) & 1);
      MLA_DECODE_TRACE_EVENT(4, 128, true);
      MLA_DECODE_TRACE_PAIR(0, 4 * (i & 1), i >> 1);  // the 64-row S's step 0 / 4: the converter's steps print beside it
      ptx::fence_proxy_async_smem();
      // S^T over the eight panels; the previous tile's O^T product retires meanwhile and releases its stage.
      float st[8];
      ptx::wgmma_fence_operand(st);
      ptx::wgmma_fence();
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint32_t off = c * T::kPanelBytes + ks * 32;
          ptx::wgmma_f16_ss<kN16>(st, d.k(stage_off + off), d.k(L::kOffQ + off), c > 0 || ks > 0);
        }
      ptx::wgmma_commit_group();
      if (i > 0) {
        ptx::wgmma_wait_group<1>();
#pragma unroll
        for (int c = 0; c < kOwn; ++c) ptx::wgmma_fence_operand(o[c]);
        ptx::mbar_arrive(sm.empty((i - 1) & 1));
      }
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(st);
      // The records' reference of this tile: S times 2^r_t; O (relative to the previous one) times 2^(ref - r_t).
      const int rt = *sm.stage_ref(s);
      const int dr = i == 0 ? 0 : ref - rt;
      const float ra = dr < -126 ? 0.0f : exp2i(dr);
      ref = rt;
      const float sr = exp2i(rt);
      const uint64_t mask = sm.mask(s);
      const bool v_lo = (mask >> key_lo) & 1, v_hi = (mask >> key_hi) & 1;
      // Masked and scaled; the column maxima over the warp's 16 keys, then over the four warps.
      float mx[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = q >> 1, e = q & 1;
        const float sc = sq[q] * sr;
        st[4 * j + e] = v_lo ? st[4 * j + e] * sc : -INFINITY;
        st[4 * j + 2 + e] = v_hi ? st[4 * j + 2 + e] * sc : -INFINITY;
        float x = fmaxf(st[4 * j + e], st[4 * j + 2 + e]);
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
        mx[q] = x;
      }
      float* red = scr.max_red(s);
      if (lane < 4) {
#pragma unroll
        for (int q = 0; q < 4; ++q) red[16 * w + n16_head(t4, q)] = mx[q];
      }
      ptx::named_barrier_sync(L::kBarS16, 128);
      float ao[4], pf[8];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int h = n16_head(t4, q), j = q >> 1, e = q & 1;
        const float x = fmaxf(fmaxf(red[h], red[16 + h]), fmaxf(red[32 + h], red[48 + h]));
        const float n = next_ref(m[q], x);
        const float a = factor(m[q], n);
        const float base = n == -INFINITY ? 0.0f : n;
        pf[2 * q] = softmax::exp2_approx(st[4 * j + e] - base);
        pf[2 * q + 1] = softmax::exp2_approx(st[4 * j + 2 + e] - base);
        l[q] = l[q] * a + pf[2 * q] + pf[2 * q + 1];  // this thread's two keys; the warps' shares summed at the end
        m[q] = n;
        ao[q] = a * ra;
      }
      // P^T (f16 * 2^6) at [head][key] of the P panel (128-byte rows, chunk key / 8 swizzled by head % 8), and the
      // heads' factors for R.
      uint8_t* sp = sm.p_panel(s);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int h = n16_head(t4, q);
#pragma unroll
        for (int hk = 0; hk < 2; ++hk) {
          const int key = hk ? key_hi : key_lo;
          *reinterpret_cast<__half*>(sp + h * 128 + (((key >> 3) ^ (h & 7)) << 4) + 2 * (key & 7)) =
              __float2half_rn(pf[2 * q + hk] * kPF16);
        }
        if (!kAll && w == 0 && lane < 4) sm.factors(s)[h] = ao[q];
      }
      ptx::fence_proxy_async_smem();
      if constexpr (kAll) ptx::named_barrier_sync(L::kBarS16, 128);  // P^T whole before the products read it
      else ptx::named_barrier_sync(L::kBarP + s, 256);  // R's threads sync here too: P^T and the factors are there
      const bool any = __any_sync(0xffffffffu, ao[0] != 1.0f || ao[1] != 1.0f || ao[2] != 1.0f || ao[3] != 1.0f);
      if (any) {
#pragma unroll
        for (int c = 0; c < kOwn; ++c) n16_scale(o[c], ao);
      }
      n16_pv<kOwn>(o, d, stage_off, p_off, 0);
    }
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int c = 0; c < kOwn; ++c) ptx::wgmma_fence_operand(o[c]);
    MLA_DECODE_TRACE_EVENT(5, 128);
    if (u.n_tiles > 0) ptx::mbar_arrive(sm.empty((u.n_tiles - 1) & 1));
    // The heads' sums over the keys: the lanes of equal lane % 4, then the four warps.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x = l[q];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      l[q] = x;
    }
    float* red = scr.sum_red();
    if (lane < 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q) red[16 * w + n16_head(t4, q)] = l[q];
    }
    ptx::named_barrier_sync(L::kBarS16, 128);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int h = n16_head(t4, q);
      l[q] = (red[h] + red[16 + h]) + (red[32 + h] + red[48 + h]);
    }
  }
};

// The R warpgroup of the N 16 tile: O^T of panels 4..7 with S's P^T and factors.
struct R16Role {
  const Unit& u;
  const Smem& sm;
  int t4;
  float o[4][8];
  __device__ __forceinline__ R16Role(const Unit& u_, const Smem& sm_) : u(u_), sm(sm_) {
    t4 = threadIdx.x & 3;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int k = 0; k < 8; ++k) o[c][k] = 0.0f;
  }
  __device__ __forceinline__ void run() {
    const Desc d(sm.base);
#pragma unroll 1
    for (int i = 0; i < u.n_tiles; ++i) {
      const int s = i & 1;
      const uint32_t stage_off = static_cast<uint32_t>(L::kOffK + s * T::kTileBytes);
      const uint32_t p_off = stage_off + 8 * T::kPanelBytes;
      ptx::named_barrier_sync(L::kBarP + s, 256);
      ptx::mbar_wait(sm.full(s), (i >> 1) & 1);
      ptx::fence_proxy_async_smem();
      float f[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) f[q] = sm.factors(s)[n16_head(t4, q)];
      if (__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f || f[2] != 1.0f || f[3] != 1.0f)) {
#pragma unroll
        for (int c = 0; c < 4; ++c) n16_scale(o[c], f);
      }
      n16_pv<4>(o, d, stage_off, p_off, 4);
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int c = 0; c < 4; ++c) ptx::wgmma_fence_operand(o[c]);
      ptx::mbar_arrive(sm.empty(s));
    }
  }
};

// The record ring's loader: the R warpgroup of the N 16 tile when both lists are warp-layout records (kernel.cuh
// RingFeed). Loader warp w copies converter warp w's keys 16 w .. 16 w + 15 of each tile into their ring slots: once
// the converter warp released the previous tile's (ring_empty(w)), lane l copies 16-byte chunk l (and l + 32) of each
// valid key's record by cp.async, lane 0 publishes the tile's key mask (ring_valid(w)) and arrives on ring_full(w),
// and every lane's copies arrive there as they land (cp.async.mbarrier.arrive.noinc: 32 + 1 arrivals). Its stalls on
// the gathers' issue hold up no product and no store. Tiles i0 .. i1 - 1 of the unit (the main list's, then the
// extra list's), the entries read a tile ahead.
template <CacheFormat FM, CacheFormat FE>
struct RingLoader {
  const DecodeSm90Params& p;
  const V4Tiles& v;
  const Smem& sm;
  int w, lane;
  __device__ __forceinline__ int32_t entry(int i) const {
    const int key = 16 * w + (lane & 15);
    return i < v.n_main ? records::entry(v.main, i * T::kBlockN + key)
                        : records::entry(v.extra, (i - v.n_main) * T::kBlockN + key);
  }
  template <CacheFormat F, class G>
  __device__ __forceinline__ void issue(const G& geo, int32_t e, int i) const {
    constexpr int kRec = static_cast<int>(CacheFormatTraits<F>::row_stride_bytes());
    constexpr int kChunks = kRec / 16;
    static_assert(kRec % 16 == 0 && kChunks <= 64, "a record of at most 64 16-byte chunks");
    const uint8_t *body, *slot;
    const bool v_j = records::locate<F>(geo, e, body, slot);
    const uint32_t vb = __ballot_sync(0xffffffffu, v_j) & 0xffffu;
    if (i > 0) ptx::mbar_wait(sm.ring_empty(w), (i - 1) & 1);
    uint8_t* const base = sm.ring_key<kRec>(16 * w);  // key 16 w + j at a constant offset (j unrolled)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint8_t* b = shfl_ptr(body, j);
      if (!((vb >> j) & 1u)) continue;  // uniform
      uint8_t* d = base + L::ring_key_offset(kRec, j);
      if (lane < kChunks) ptx::cp_async_16(d + 16 * lane, b + 16 * lane);
      if (lane + 32 < kChunks) ptx::cp_async_16(d + 16 * (lane + 32), b + 16 * (lane + 32));
    }
    if (lane == 0) *sm.ring_valid(w) = vb;
    ptx::cp_async_arrive_mbarrier(sm.ring_full(w));
    if (lane == 0) ptx::mbar_arrive(sm.ring_full(w));
  }
  __device__ __forceinline__ void run(int i0, int i1) const {
    int32_t e = i0 < i1 ? entry(i0) : 0;
#pragma unroll 1
    for (int i = i0; i < i1; ++i) {
      const int32_t en = i + 1 < i1 ? entry(i + 1) : 0;
      if (i < v.n_main) issue<FM>(p.gather, e, i);
      else issue<FE>(p.extra, e, i);
      e = en;
    }
  }
};

// The output's rotation (p.rot) on R's O^T (panels 4..7), after kBarEnd: the pairs' cos / sin into R's table
// (rotation_table: R's threads t, then R's barrier), then panel 7 (the last kRotMaxDim columns):
// a thread holds columns col = 448 + 16 w + lane / 4 and col + 8 of its four heads, the pair partner col ^ 1 in
// lane ^ 4 (same heads), so each value is turned with its partner's by one shuffle (unconditional: every lane).
__device__ __forceinline__ void n16_rotate(const DecodeSm90Params& p, const Unit& u, const Smem& sm, float (&o)[4][8],
                                           int t, int w, int lane) {
  static_assert(kRotMaxDim == 64, "the rotated columns are panel 7");
  if (!p.rot.on()) return;  // uniform
  const float* tab = rotation_table(p, u, sm, t);
  const bool first = ((lane >> 2) & 1) == 0;   // an even column: the pair's first
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int i = p.rot.pair_of((448 + 16 * w + (lane >> 2) + 8 * hi) & ~1, T::kDv);
    const float c = i >= 0 ? tab[i] : 1.0f, s = i >= 0 ? tab[p.rot.dim / 2 + i] : 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = o[3][4 * j + 2 * hi + e];
        const float other = __shfl_xor_sync(0xffffffffu, v, 4);
        if (i >= 0) v = dev::OutRotation::turn_one(c, s, v, other, first);
      }
  }
}

// O^T of panels [c0, c0 + 4) over the heads' sums and factors into out (bf16): a thread writes columns 64 c + 16 w +
// lane / 4 and + 8 of its four heads (rows past the unit's skipped); LSE by S's warp 0 (write_lse).
__device__ __forceinline__ void n16_write(const DecodeSm90Params& p, const Unit& u, const float (&o)[4][8], int c0,
                                          const float (&scale)[4], int t4, int w, int lane) {
  const MqaRowParams& rp = p.rows;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int row = u.row0 + n16_head(t4, q);
    if (row >= u.m_rows) continue;
    const int i = row / rp.h_q, h = row % rp.h_q, j = q >> 1, e = q & 1;
    uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i + h * rp.out_stride_h;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = 64 * (c0 + c) + 16 * w + (lane >> 2);
      dst[col] = dev::float_to_bf16(o[c][4 * j + e] * scale[q]);
      dst[col + 8] = dev::float_to_bf16(o[c][4 * j + 2 + e] * scale[q]);
    }
  }
}

// The small-T cluster split's partial of a unit (cluster_merge.cuh): O / l of the 16 rows as fp32 [16][kRowFloats]
// at the start of stage 0, then the rows' natural-log LSE [16] (kN16Lse). Written once both consumers' products
// retired (stage 0 is free: the converter's last tile was consumed).
inline constexpr uint32_t kN16Lse = kN16 * ClusterMerge::kRowFloats * 4;
static_assert(kN16Lse + 4 * kN16 <= T::kTileBytes, "the partial fits in stage 0");

// O^T of panels [c0, c0 + 4) over the heads' sums and factors into the partial (the same values n16_write stores).
__device__ __forceinline__ void n16_store_partial(const Smem& sm, const float (&o)[4][8], int c0,
                                                  const float (&scale)[4], int t4, int w, int lane) {
  float* part = reinterpret_cast<float*>(sm.stage(0));
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int h = n16_head(t4, q), j = q >> 1, e = q & 1;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = 64 * (c0 + c) + 16 * w + (lane >> 2);
      part[h * ClusterMerge::kRowFloats + col] = o[c][4 * j + e] * scale[q];
      part[h * ClusterMerge::kRowFloats + col + 8] = o[c][4 * j + 2 + e] * scale[q];
    }
  }
}

}  // namespace convert

// The DeepSeek-V4 sparse_mqa kernel for units of at most 16 query rows (the N 16 tile, file comment): the V4 kernel's
// converter, Q and protocol; S16Role and R16Role for the products (warp-layout records: S16Role alone, R the
// RingLoader); one CTA per token or, kSplit (p.cluster_merge,
// the small-T split of sparse_mqa.cu), one cluster of p.num_splits CTAs per token: rank k takes its part of the
// token's tiles (v4_split), writes its partial (n16_store_partial; rank 0 also folds the sink) and merges its
// columns of every rank's partial (cluster_merge_protocol). A token without keys: rank 0 writes out 0 and lse the
// sink, the others nothing, and no rank waits at a cluster barrier (every rank of the cluster takes that path).
template <CacheFormat FM, CacheFormat FE, bool kSplit>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_convert_v4n16_kernel(const __grid_constant__ CUtensorMap q_map, const DecodeSm90Params p) {
  static_assert(CacheFormatTraits<FM>::kRecord && CacheFormatTraits<FE>::kRecord, "DeepSeek-V4 record formats");
  using L = ConvertTraits;
  using T = Traits;
  // Both lists warp-layout records: R loads the record ring (RingLoader), S takes all eight panels' products.
  constexpr bool kLoader = FM != CacheFormat::v4 && FE != CacheFormat::v4;
  extern __shared__ uint8_t smem_raw[];
  const convert::Smem sm{aligned_smem(smem_raw)};
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  Unit u(p, /*gather=*/true);
  const convert::V4Tiles whole = convert::v4_tiles(p, u.g);
  const convert::V4Tiles v = kSplit ? convert::v4_split(whole, u.split, p.num_splits) : whole;
  u.n_tiles = v.n_main + v.n_extra;
  u.key_begin = 0;
  u.seq_len = INT_MAX;
  u.key_end = INT_MAX;
  if (whole.n_main + whole.n_extra == 0) {
    if (!kSplit || u.split == 0) convert::v4_empty_unit(p, u);
    return;
  }
  if constexpr (kSplit) {
    if (u.n_tiles == 0) {  // a rank past the token's tiles (never rank 0): LSE -inf, its O never read
      if (threadIdx.x < convert::kN16)
        reinterpret_cast<float*>(sm.stage(0) + convert::kN16Lse)[threadIdx.x] = -INFINITY;
      cluster_merge_protocol(p, u, sm.stage(0), static_cast<int>(threadIdx.x) - 128, 256, convert::kN16Lse);
      return;
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ptx::mbar_init(sm.full(s), L::kFullArrivals);
      ptx::mbar_init(sm.empty(s), kLoader ? 128 : L::kEmptyArrivals);
    }
    ptx::mbar_init(sm.q_full(), 1);
    for (int w = 0; w < 4; ++w) {
      ptx::mbar_init(sm.ring_full(w), L::kRingFullArrivals);
      ptx::mbar_init(sm.ring_empty(w), 1);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = ptx::warpgroup_index();
  if (wg == L::kConverter) {
    ptx::setmaxnreg_dec<L::kConverterRegs>();
    MLA_DECODE_TRACE_EVENT(1, 0);
    convert::record_converter<FM, FE, kLoader>(p, v, sm);
    MLA_DECODE_TRACE_EVENT(2, 0);
    if constexpr (kSplit) cluster_merge_pass();
    return;
  }
  const int lane = threadIdx.x & 31, w = ptx::warp_idx_in_warpgroup(), t4 = lane & 3;
  const convert::RingLoader<FM, FE> loader{p, v, sm, w, lane};  // kLoader: R's role
  // The loader's first tile before Q: the records' round trip overlaps Q's.
  if constexpr (kLoader)
    if (wg == L::kRWarpgroup) loader.run(0, 1);
  // Q's rows 0..15 only: S^T reads no other (its B operand is the first two swizzle atoms of each panel), and rows
  // 16.. of panel 0 are S's scratch (N16Scratch).
  convert::v4_q_prologue<convert::kN16>(&q_map, u, sm, static_cast<int>(threadIdx.x) - 128);
  MLA_DECODE_TRACE_EVENT(3, 128);
  if constexpr (kLoader) {
    if (wg == L::kRWarpgroup) {
      ptx::setmaxnreg_dec<L::kRRegs>();
      loader.run(1, u.n_tiles);
      if constexpr (kSplit)
        cluster_merge_protocol(p, u, sm.stage(0), static_cast<int>(threadIdx.x) - 128, 256, convert::kN16Lse);
      return;
    }
  }
  if (wg == L::kRWarpgroup) {
    ptx::setmaxnreg_dec<L::kRRegs>();
    convert::R16Role r(u, sm);
    r.run();
    ptx::named_barrier_sync(L::kBarEnd, 256);
    float scale[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int h = convert::n16_head(t4, q);
      const float l = sm.sums()[h];
      // O is relative to the last tile's reference 2^r and carries P's 2^6; the sink's factor; 1 / l.
      scale[q] = l == 0.0f ? 0.0f : exp2i(*sm.stage_ref((u.n_tiles - 1) & 1) - 6) * sm.out_factors()[h] / l;
    }
    convert::n16_rotate(p, u, sm, r.o, static_cast<int>(threadIdx.x) - 256, w, lane);
    if constexpr (kSplit) {
      convert::n16_store_partial(sm, r.o, 4, scale, t4, w, lane);
      cluster_merge_protocol(p, u, sm.stage(0), static_cast<int>(threadIdx.x) - 128, 256, convert::kN16Lse);
    } else {
      convert::n16_write(p, u, r.o, 4, scale, t4, w, lane);
    }
    return;
  }
  ptx::setmaxnreg_inc<L::kSRegs>();
  convert::S16Role<FM, kLoader> sr(p, u, sm);
  sr.run();
  // kLoader: S holds all eight panels; its upper four as R's would be.
  float(&o_lo)[4][8] = *reinterpret_cast<float(*)[4][8]>(&sr.o[0][0]);
  [[maybe_unused]] float(&o_hi)[4][8] = *reinterpret_cast<float(*)[4][8]>(&sr.o[kLoader ? 4 : 0][0]);
  float scale[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int h = convert::n16_head(t4, q);
    float f;
    // Split: the sink joins rank 0's partial only (the merge sums the ranks' exponentials once).
    const float sink = !kSplit || u.split == 0 ? convert::sink_log2_of(p, u, h) : -INFINITY;
    convert::fold_sink(sink, sr.m[q], sr.l[q], f);
    if (w == 0 && lane < 4) {
      sm.sums()[h] = sr.l[q];
      sm.refs()[h] = sr.m[q];
      sm.out_factors()[h] = f;
      if (!kSplit && u.row0 + h < u.m_rows) store_row_lse(p, u, u.row0 + h, row_lse(sr.m[q], sr.l[q]));
    }
    scale[q] = sr.l[q] == 0.0f ? 0.0f : exp2i(sr.ref - 6) * f / sr.l[q];
  }
  if constexpr (kLoader) convert::n16_rotate(p, u, sm, o_hi, static_cast<int>(threadIdx.x) - 128, w, lane);
  if constexpr (kSplit) {
    // Both consumers past their products before either overwrites stage 0 with its partial.
    if constexpr (!kLoader) ptx::named_barrier_sync(L::kBarEnd, 256);
    convert::n16_store_partial(sm, o_lo, 0, scale, t4, w, lane);
    if constexpr (kLoader) convert::n16_store_partial(sm, o_hi, 4, scale, t4, w, lane);
    if (w == 0 && lane < 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        reinterpret_cast<float*>(sm.stage(0) + convert::kN16Lse)[convert::n16_head(t4, q)] = row_lse(sr.m[q], sr.l[q]);
    }
    cluster_merge_protocol(p, u, sm.stage(0), static_cast<int>(threadIdx.x) - 128, 256, convert::kN16Lse);
  } else {
    if constexpr (!kLoader) ptx::named_barrier_arrive(L::kBarEnd, 256);
    convert::n16_write(p, u, o_lo, 0, scale, t4, w, lane);
    if constexpr (kLoader) convert::n16_write(p, u, o_hi, 4, scale, t4, w, lane);
  }
  MLA_DECODE_TRACE_EVENT(6, 128);
}

}  // namespace mla::cuda::decode_sm90
