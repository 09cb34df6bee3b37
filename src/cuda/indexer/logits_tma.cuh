// SPDX-License-Identifier: Apache-2.0
#pragma once
// Paged decode indexer logits, bandwidth kernel (variant "sm90_tma" of indexer_logits; docs/INDEXER.md §4).
//
// Algorithm. As logits_sm90.cuh: a CTA owns G query rows of one request (G <= 4 of its s_q rows, which
// share keys) and a chunk of key columns [c0, c1); per tile of 64 keys one fp8 wgmma per row computes
//   D[key][head] = sum_d K[key][d] * Q_row[head][d]       (m64 n64 k32 x 4; A = keys, B = the row's q)
// and logit[key] = sum_h w[h] * relu_nan(D[key][h] * k_scale[key]) (32 FMAs per thread, two quad
// shuffles). What changes is how the keys arrive: whole pages by the copy engine.
//
// Warp roles (160 threads): warps 0-3 = one consumer warpgroup (wgmma + epilogue + stores); warp 4 =
// the producer. Per tile the producer's lane j (j < 64 / rows) brings sub-page j of the tile: ONE TMA box
// {128 B, rows, 1} of the codes (3-D tensor map {128, page_size, num_blocks}, 128B swizzle: it lands in
// exactly the K-major layout the wgmma descriptor reads) and ONE bulk copy of its `rows` fp32 scales,
// both completing on the stage's `full` mbarrier; rows = 64 for page_size a multiple of 64 (one box per
// tile), rows = page_size for pages of 8, 16, 32 (64 / page_size boxes). Block ids come from a window of
// 32 block-table entries held one per lane (refreshed every 32 pages). A sub-page past the rows' union
// range is not loaded (its keys are masked); a block id outside the cache is not read: the producer
// writes NaN scales instead (so those logits are NaN, as the other variants give).
// Ring: kStages stages of {8 KiB codes, 256 B scales}; full[s] (1 arrival + tx bytes), empty[s] (128
// consumer arrivals after the wgmma wait and the scale reads).
//
// Shared memory (1024-byte aligned): q panels G x 8 KiB (swizzled, heads >= h zero) | key ring
// kStages x 8 KiB | scale ring kStages x 256 B | weights G x 256 B | 2 x kStages mbarriers.
// G = 1: 49.6 KiB + slack (4 CTAs / SM: 20 tiles, 169 KB of cache bytes in flight per SM).
#include <cuda.h>

#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/indexer/logits_common.cuh"

namespace mla::cuda::indexer {

template <int G>
struct TmaTraits {
  static constexpr int kConsumers = 128;
  static constexpr int kThreads = kConsumers + 32;
  static constexpr int kTileKeys = 64;
  static constexpr int kTileBytes = 64 * 128;
  static constexpr int kStages = 5;
  static constexpr int kMinBlocks = G == 1 ? 4 : (G == 2 ? 3 : 2);  // smem: 4 / 3 / 2 CTAs per SM fit
  static constexpr int kOffK = G * kTileBytes;
  static constexpr int kOffSc = kOffK + kStages * kTileBytes;
  static constexpr int kOffW = kOffSc + kStages * 64 * 4;
  static constexpr int kOffBar = kOffW + G * 64 * 4;
  static constexpr int kBytes = kOffBar + 2 * kStages * 8;
  static constexpr int kSmemBytes = kBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

template <int G>
__global__ void __launch_bounds__(TmaTraits<G>::kThreads, TmaTraits<G>::kMinBlocks)
    logits_tma_kernel(const __grid_constant__ CUtensorMap kmap, const LogitsParams p, int64_t chunk_keys,
                      int64_t num_groups, int64_t groups_per_req) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: sm_90a only (the fat build compiles this file for every target)
  using Tr = TmaTraits<G>;
  constexpr int S = Tr::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* q_s = smem;
  uint8_t* k_s = smem + Tr::kOffK;
  float* sc_s = reinterpret_cast<float*>(smem + Tr::kOffSc);
  float* w_s = reinterpret_cast<float*>(smem + Tr::kOffW);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Tr::kOffBar);
  uint64_t* empty = full + S;
  const int tid = threadIdx.x, lane = tid % 32, warp = __shfl_sync(0xffffffffu, tid / 32, 0);

  // Which rows and columns (paged decode only).
  const int64_t group = static_cast<int64_t>(blockIdx.x) % num_groups;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) / num_groups;
  const int64_t req = group / groups_per_req, gi = group % groups_per_req;
  const int64_t row0 = req * p.s_q + gi * G;
  const int nrows = static_cast<int>(p.s_q - gi * G < G ? p.s_q - gi * G : G);
  const int64_t c0 = chunk * chunk_keys, c1 = c0 + chunk_keys < p.n_cols ? c0 + chunk_keys : p.n_cols;
  // Decode rows see [0, hi): only the ends matter (int32: positions < 2^31, seq_lens are int32).
  int32_t hi[G];
  int64_t ulo = c1, uhi = c0;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    int64_t l = c0, h = c0;
    if (g < nrows) {
      row_range(p, row0 + g, l, h);
      l = l < c0 ? c0 : l;
      h = h > c1 ? c1 : h;
      if (h > l) {
        ulo = l < ulo ? l : ulo;
        uhi = h > uhi ? h : uhi;
      }
    }
    hi[g] = static_cast<int32_t>(h);
  }
  // Tiles cover [t_begin, t_end) (64-key tiles from c0, the last clipped to c1); the rest is -inf.
  int64_t t_begin, t_end;
  tile_span(p, row0, nrows, c0, c1, ulo, uhi, tid, Tr::kThreads, t_begin, t_end);
  static_assert(Tr::kTileKeys == 64, "tile_span's tiles");
  if (t_end <= t_begin) return;  // uniform over the CTA
  const float ninf = -__int_as_float(0x7f800000);

  const int ps = p.cache.page_size;
  const int rows = ps >= Tr::kTileKeys ? Tr::kTileKeys : ps;  // keys per box
  const int subs = Tr::kTileKeys / rows;                      // boxes per tile (1, 2, 4 or 8)
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], Tr::kConsumers);
    }
    ptx::fence_mbarrier_init();
  }
  // With pages < 64 keys a tile's sub-pages past the rows' range are never loaded: zero the ring once so
  // that no stage is read uninitialised.
  if (subs > 1) {
    for (int c = tid; c < S * (Tr::kTileBytes + 256) / 16; c += Tr::kThreads)
      reinterpret_cast<uint4*>(k_s)[c] = make_uint4(0, 0, 0, 0);
    ptx::fence_proxy_async_smem();
  }
  __syncthreads();  // barriers initialised, ring zeroed: the producer starts while the consumers load q
  const int64_t ntiles = (t_end - t_begin + Tr::kTileKeys - 1) / Tr::kTileKeys;
  if (warp == 4) {
    // ---- producer ----
    const int32_t* bt = p.block_table + req * p.bt_row;
    if (lane == 0) ptx::tma_prefetch_descriptor(&kmap);
    int64_t wbase = -1;  // window: lane l holds the block id of page wbase + l
    int32_t wblk = 0;
    const uint32_t box_bytes = static_cast<uint32_t>(rows) * 128, sc_bytes = static_cast<uint32_t>(rows) * 4;
#pragma unroll 1
    for (int64_t it = 0; it < ntiles; ++it) {
      const int s = static_cast<int>(it % S);
      const int64_t col0 = t_begin + it * Tr::kTileKeys;
      const int64_t page0 = col0 / ps;
      if (wbase < 0 || page0 + subs > wbase + 32) {  // warp-uniform
        wbase = page0;
        const int64_t pg = wbase + lane;
        wblk = pg * ps < uhi ? bt[pg] : 0;  // pg < max_blocks: uhi <= max_blocks * page_size
      }
      const int j = lane < subs ? lane : 0;
      const int32_t blk = __shfl_sync(0xffffffffu, wblk, static_cast<int>(page0 - wbase) + j);
      const bool want = lane < subs && (page0 + lane) * ps < uhi;
      const bool valid = want && blk >= 0 && blk < p.cache.num_blocks;
      const uint32_t bad = __ballot_sync(0xffffffffu, want && !valid);
      const uint32_t total = __reduce_add_sync(0xffffffffu, valid ? box_bytes + sc_bytes : 0u);
      if (it >= S) ptx::mbar_wait(&empty[s], static_cast<uint32_t>((it / S) & 1) ^ 1u);
      if (bad != 0) {
        for (int i = lane; i < Tr::kTileKeys; i += 32)
          if ((bad >> (i / rows)) & 1u) sc_s[s * 64 + i] = __int_as_float(0x7fc00000);
      }
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive_expect_tx(&full[s], total);
      __syncwarp();
      if (valid) {
        const int32_t o0 = static_cast<int32_t>(col0 % ps);  // 0 for pages of 8 / 16 / 32
        ptx::tma_load_3d(k_s + s * Tr::kTileBytes + lane * rows * 128, &kmap, &full[s], 0, o0, blk,
                         ptx::L2Hint::evict_first);
        ptx::bulk_load(sc_s + s * 64 + lane * rows, scale_ptr(p.cache, blk, o0), sc_bytes, &full[s],
                       ptx::L2Hint::evict_first);
      }
    }
    return;
  }

  // ---- consumers: warps 0-3 ----
  // q panels (swizzled like the TMA boxes, heads >= h zero) and weights, then a barrier of the 128.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    for (int c = tid; c < 64 * 8; c += Tr::kConsumers) {
      const int head = c >> 3, cc = c & 7;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (g < nrows && head < p.h)
        v = __ldg(reinterpret_cast<const uint4*>(p.q + (row0 + g) * p.q_row + head * p.q_head + cc * 16));
      *reinterpret_cast<uint4*>(q_s + g * Tr::kTileBytes + head * 128 + ((cc ^ (head & 7)) << 4)) = v;
    }
    if (tid < 64) w_s[g * 64 + tid] = g < nrows && tid < p.h ? p.w[(row0 + g) * p.w_row + tid * p.w_head] : 0.0f;
  }
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(1, Tr::kConsumers);
  const uint64_t desc_q0 = ptx::desc_sw128_k_major(q_s);
  const int g4 = lane >> 2, t4 = lane & 3;
  const int r0 = warp * 16 + g4, r1 = r0 + 8;
  // Weights of this thread's 16 heads (8j + 2t4, +1) in registers for G <= 2.
  constexpr bool kWReg = G <= 2;
  float2 wr[kWReg ? G : 1][8];
#pragma unroll
  for (int g = 0; g < (kWReg ? G : 1); ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) wr[g][j] = *reinterpret_cast<const float2*>(w_s + g * 64 + 8 * j + 2 * t4);
  // Rows in passes of kPass (G = 4: two passes over the same stage, 64 accumulators live, not 128).
  constexpr int kPass = G < 2 ? G : 2;
  float acc[kPass][32] = {};
#pragma unroll 1
  for (int64_t it = 0; it < ntiles; ++it) {
    const int s = static_cast<int>(it % S);
    ptx::mbar_wait(&full[s], static_cast<uint32_t>((it / S) & 1));
    const float s0 = sc_s[s * 64 + r0], s1 = sc_s[s * 64 + r1];
    const uint64_t desc_k = ptx::desc_sw128_k_major(k_s + s * Tr::kTileBytes);
    const int64_t col0 = t_begin + it * Tr::kTileKeys;
#pragma unroll
    for (int g0 = 0; g0 < G; g0 += kPass) {
#pragma unroll
      for (int g = 0; g < kPass; ++g) ptx::wgmma_fence_operand(acc[g]);
      ptx::wgmma_fence();
#pragma unroll
      for (int g = 0; g < kPass; ++g) {
        const uint64_t desc_q = ptx::desc_advance(desc_q0, (g0 + g) * Tr::kTileBytes);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          ptx::wgmma_e4m3_ss<64>(acc[g], ptx::desc_advance(desc_k, ks * 32), ptx::desc_advance(desc_q, ks * 32),
                                 ks > 0);
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int g = 0; g < kPass; ++g) ptx::wgmma_fence_operand(acc[g]);
      if (g0 + kPass == G) ptx::mbar_arrive(&empty[s]);  // the stage is free once its last product is read

#pragma unroll
      for (int gg = 0; gg < kPass; ++gg) {
        const int g = g0 + gg;
        const float2 lg = quad_logits(acc[gg], s0, s1, [&](int j) {
          return kWReg ? wr[kWReg ? g : 0][j] : *reinterpret_cast<const float2*>(w_s + g * 64 + 8 * j + 2 * t4);
        });
        if (t4 == g % 4 && g < nrows) {  // lane g % 4 of the quad writes row g
          float* out = p.logits + (row0 + g) * p.out_row;
          const int64_t ca = col0 + r0, cb = col0 + r1;
          if (ca < t_end) out[ca] = ca < hi[g] ? lg.x : ninf;
          if (cb < t_end) out[cb] = cb < hi[g] ? lg.y : ninf;
        }
      }
    }
  }
#endif
}

}  // namespace mla::cuda::indexer
