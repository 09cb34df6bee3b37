// SPDX-License-Identifier: Apache-2.0
#pragma once
// Indexer logits on Hopper tensor cores (variant "sm90" of indexer_logits; docs/INDEXER.md §3).
//
// Algorithm. A CTA owns G query rows (decode: G rows of one request; prefill: G consecutive rows) and
// one chunk of key columns [c0, c1). Per tile of 64 keys, one fp8 wgmma per row computes
//   D[key][head] = sum_d K[key][d] * Q_row[head][d]       (m64 n64 k32 x 4; A = keys, B = the row's q)
// (keys as M put the head reduction inside a thread: each thread holds 16 heads of 2 keys), then
//   logit[key] = sum_h w[h] * relu_nan(D[key][h] * k_scale[key])
// as 32 FMAs per thread and two quad shuffles. Lane t of each quad writes row t's two keys.
// Columns of the chunk outside every row's range, and keys outside a row's own range, are -inf.
//
// Warp roles: none; the 4 warps (one warpgroup) all issue cp.async copies of future tiles, then all
// run the wgmma and the epilogue of the current tile. Pipeline: kStages-deep cp.async ring (issue tile
// i + kStages - 1 after the barrier of tile i; wait_group<kStages - 2> before it).
//
// Shared memory (1024-byte aligned, 128B-swizzled K-major tiles: 16-byte chunk c of row r at
// r * 128 + ((c ^ (r % 8)) * 16)):
//   q panels    G x [64 heads][128 B]      8 KiB each (heads >= h zero)
//   key tiles   kStages x [64 keys][128 B] 8 KiB each (keys outside the loaded range zero)
//   scales      kStages x 64 fp32          (NaN for a key whose block is outside the cache)
//   weights     G x 64 fp32                (heads >= h zero)
// G = 1: 58.5 KiB (3 CTAs / SM); G = 4: 83 KiB (2 CTAs / SM).
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/indexer/logits_common.cuh"

namespace mla::cuda::indexer {

struct Sm90Traits {
  static constexpr int kThreads = 128;
  static constexpr int kTileKeys = 64;
  static constexpr int kStages = 6;
  static constexpr int kTileBytes = 64 * 128;
  static constexpr int smem_bytes(int G) {
    return (G + kStages) * kTileBytes + kStages * 64 * 4 + G * 64 * 4 + 1024;  // + alignment slack
  }
};

// 16-byte chunk cc of row r of a swizzled [rows][128 B] tile.
__device__ __forceinline__ uint8_t* swz(uint8_t* tile, int r, int cc) {
  return tile + r * 128 + ((cc ^ (r & 7)) << 4);
}

template <int G>
__global__ void __launch_bounds__(Sm90Traits::kThreads) logits_sm90_kernel(const LogitsParams p, int64_t chunk_keys,
                                                                           int64_t num_groups, int64_t groups_per_req) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: sm_90a only (the fat build compiles this file for every target)
  using Tr = Sm90Traits;
  constexpr int S = Tr::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* q_s = smem;
  uint8_t* k_s = smem + G * Tr::kTileBytes;
  float* sc_s = reinterpret_cast<float*>(smem + (G + S) * Tr::kTileBytes);
  float* w_s = sc_s + S * 64;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // Which rows and columns.
  const int64_t group = static_cast<int64_t>(blockIdx.x) % num_groups;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) / num_groups;
  int64_t row0, req = 0;
  int nrows;
  if (p.paged) {
    req = group / groups_per_req;
    const int64_t gi = group % groups_per_req;
    row0 = req * p.s_q + gi * G;
    nrows = static_cast<int>(p.s_q - gi * G < G ? p.s_q - gi * G : G);
  } else {
    row0 = group * G;
    nrows = static_cast<int>(p.num_rows - row0 < G ? p.num_rows - row0 : G);
  }
  const int64_t c0 = chunk * chunk_keys, c1 = c0 + chunk_keys < p.n_cols ? c0 + chunk_keys : p.n_cols;
  int64_t lo[G], hi[G];
  int64_t ulo = c1, uhi = c0;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    lo[g] = hi[g] = c0;
    if (g < nrows) {
      row_range(p, row0 + g, lo[g], hi[g]);
      lo[g] = lo[g] < c0 ? c0 : lo[g];
      hi[g] = hi[g] > c1 ? c1 : hi[g];
      if (hi[g] > lo[g]) {
        ulo = lo[g] < ulo ? lo[g] : ulo;
        uhi = hi[g] > uhi ? hi[g] : uhi;
      }
    }
  }
  // Tiles cover [t_begin, t_end) (64-key tiles from c0, the last clipped to c1); the rest is -inf.
  int64_t t_begin, t_end;
  tile_span(p, row0, nrows, c0, c1, ulo, uhi, tid, Tr::kThreads, t_begin, t_end);
  static_assert(Tr::kTileKeys == 64, "tile_span's tiles");
  if (t_end <= t_begin) return;
  const float ninf = -__int_as_float(0x7f800000);

  // q panels and weights.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    for (int c = tid; c < 64 * 8; c += Tr::kThreads) {
      const int head = c >> 3, cc = c & 7;
      uint8_t* dst = swz(q_s + g * Tr::kTileBytes, head, cc);
      if (g < nrows && head < p.h) ptx::cp_async_16(dst, p.q + (row0 + g) * p.q_row + head * p.q_head + cc * 16);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    if (tid < 64) w_s[g * 64 + tid] = g < nrows && tid < p.h ? p.w[(row0 + g) * p.w_row + tid * p.w_head] : 0.0f;
  }
  ptx::cp_async_commit();

  const int64_t ntiles = (t_end - t_begin + Tr::kTileKeys - 1) / Tr::kTileKeys;
  // Keys [ulo, uhi) are loaded; the other rows of a tile are zero (their logits are masked).
  auto issue_tile = [&](int64_t it) {
    const int stage = static_cast<int>(it % S);
    uint8_t* tile = k_s + stage * Tr::kTileBytes;
    const int64_t col0 = t_begin + it * Tr::kTileKeys;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int c = tid + m * Tr::kThreads, r = c >> 3, cc = c & 7;
      const int64_t j = col0 + r;
      uint8_t* dst = swz(tile, r, cc);
      const KeyAddr a = j >= ulo && j < uhi ? key_addr(p, req, j) : KeyAddr{nullptr, nullptr};
      if (a.codes != nullptr) ptx::cp_async_16(dst, a.codes + cc * 16);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      if (cc == 0) {
        float* sdst = sc_s + stage * 64 + r;
        if (a.scale != nullptr) ptx::cp_async_4(sdst, a.scale);
        else *sdst = j >= ulo && j < uhi ? __int_as_float(0x7fc00000) : 0.0f;  // NaN: block outside the cache
      }
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ntiles) issue_tile(s);
    ptx::cp_async_commit();
  }

  const uint64_t desc_q0 = ptx::desc_sw128_k_major(q_s);
  const int g4 = lane >> 2, t4 = lane & 3;
  const int r0 = warp * 16 + g4, r1 = r0 + 8;
  float acc[G][32] = {};
#pragma unroll 1
  for (int64_t it = 0; it < ntiles; ++it) {
    ptx::cp_async_wait<S - 2>();
    ptx::fence_proxy_async_smem();
    __syncthreads();
    if (it + S - 1 < ntiles) issue_tile(it + S - 1);
    ptx::cp_async_commit();
    const int stage = static_cast<int>(it % S);
    const uint64_t desc_k = ptx::desc_sw128_k_major(k_s + stage * Tr::kTileBytes);
#pragma unroll
    for (int g = 0; g < G; ++g) ptx::wgmma_fence_operand(acc[g]);
    ptx::wgmma_fence();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const uint64_t desc_q = ptx::desc_advance(desc_q0, g * Tr::kTileBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        ptx::wgmma_e4m3_ss<64>(acc[g], ptx::desc_advance(desc_k, ks * 32), ptx::desc_advance(desc_q, ks * 32), ks > 0);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int g = 0; g < G; ++g) ptx::wgmma_fence_operand(acc[g]);

    const float s0 = sc_s[stage * 64 + r0], s1 = sc_s[stage * 64 + r1];
    const int64_t col0 = t_begin + it * Tr::kTileKeys;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float2 lg = quad_logits(
          acc[g], s0, s1, [&](int j) { return *reinterpret_cast<const float2*>(w_s + g * 64 + 8 * j + 2 * t4); });
      if (t4 == g % 4 && g < nrows) {
        float* out = p.logits + (row0 + g) * p.out_row;
        const int64_t ca = col0 + r0, cb = col0 + r1;
        if (ca < t_end) out[ca] = ca >= lo[g] && ca < hi[g] ? lg.x : ninf;
        if (cb < t_end) out[cb] = cb >= lo[g] && cb < hi[g] ? lg.y : ninf;
      }
    }
  }
  ptx::cp_async_wait<0>();
#endif
}

}  // namespace mla::cuda::indexer
