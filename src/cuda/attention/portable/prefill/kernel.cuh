// SPDX-License-Identifier: Apache-2.0
#pragma once
// mha_prefill: varlen multi-head attention over up-projected K/V (docs/SEMANTICS.md §9-10, ops.h).
//
// Algorithm (FlashAttention-2, bf16 mma.sync m16n8k16 with fp32 accumulation):
//   One CTA per (64-query tile, head, request); heavy causal tiles are launched first. K rows are
//   [k_nope | k_pe] (k_pe's head stride may be 0), matching q's [nope | rope] columns. Per 64-key tile:
//   S = Q K^T in registers (warp w: query rows 16w..16w+15, all 64 keys), mask (key >= sk, or causal
//   bottom-right: key > sk - sq + i), online softmax in the log2 domain with quad shuffles, P rounded
//   to bf16 straight from the S accumulators into A fragments (no shared-memory round trip), O += P V
//   with V fetched by ldmatrix.trans. Epilogue: O / l as bf16, LSE (natural log) into lse[h, t].
//   Rows with no visible key (sk = 0, or sq > sk under the causal rule) give out 0, lse -inf.
//   cu_seqlens values are clamped to the tensors, so no value makes the kernel read or write outside
//   q, k, v or out.
// Warp roles: all 4 warps load (cp.async, 16-byte chunks; element copies for unaligned views) and each
// computes its own 16 query rows; no inter-warp exchange besides the tile barriers.
// Shared memory: Q 25 KiB + K 2 x 25 KiB + V 2 x 17 KiB = 109 KiB -> two CTAs per SM; pipeline depth 2
// (the next K/V tile is copied while the current one is computed).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/prefill_params.h"
#include "cuda/attention/portable/prefill/traits.cuh"

namespace mla::cuda::prefill {

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// Copies `rows` rows (the rest of the 64-row tile zero-filled) of width d_a + d_b into a padded shared
// tile: column c < d_a from a_row(r)[c], d_a <= c < d_a + d_b from b_row(r)[c - d_a], zeros after.
// With vec, d_a and d_b are multiples of 8 and every row is 16-byte aligned (cp.async); otherwise
// element copies. Columns past round_up(d_a + d_b, 8) are never written (they stay zero from the init).
template <int kRowElems, class RowA, class RowB>
__device__ __forceinline__ void load_tile(uint16_t* dst, int rows, int d_a, int d_b, bool vec, RowA a_row,
                                          RowB b_row) {
  constexpr int kChunks = kRowElems / 8;
  const int d = d_a + d_b;
  for (int c = threadIdx.x; c < Traits::kBlockM * kChunks; c += Traits::kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint16_t* out = dst + r * kRowElems + col;
    if (r >= rows) {
      *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
      continue;
    }
    if (col >= d) continue;
    if (vec) {
      ptx::cp_async_16(out, col < d_a ? a_row(r) + col : b_row(r) + (col - d_a));
    } else {
      for (int e = 0; e < 8; ++e) {
        const int cc = col + e;
        out[e] = cc < d_a ? a_row(r)[cc] : cc < d ? b_row(r)[cc - d_a] : uint16_t(0);
      }
    }
  }
}

__global__ void __launch_bounds__(Traits::kThreads) mha_prefill_kernel(const PrefillParams p) {
  using T = Traits;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem + T::kOffQ);
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem + T::kOffK);
  uint16_t* sV = reinterpret_cast<uint16_t*>(smem + T::kOffV);

  const int64_t x = blockIdx.x;
  const int qt = p.q_tiles - 1 - static_cast<int>(x % p.q_tiles);  // largest causal tiles first
  const int h = static_cast<int>((x / p.q_tiles) % p.heads);
  const int64_t b = x / (static_cast<int64_t>(p.q_tiles) * p.heads);
  const int64_t q_start = clamp64(p.cu_q[b * p.cu_q_stride], 0, p.total_q);
  const int64_t q_end = clamp64(p.cu_q[(b + 1) * p.cu_q_stride], q_start, p.total_q);
  const int64_t k_start = clamp64(p.cu_k[b * p.cu_k_stride], 0, p.total_k);
  const int64_t k_end = clamp64(p.cu_k[(b + 1) * p.cu_k_stride], k_start, p.total_k);
  const int sq = static_cast<int>(q_end - q_start), sk = static_cast<int>(k_end - k_start);
  const int m0 = qt * T::kBlockM;
  if (m0 >= sq) return;
  const int m_rows = min(T::kBlockM, sq - m0);
  // Keys any row of this tile may see: causal rows see up to sk - sq + i (largest for the last row).
  const int n_end = p.causal ? static_cast<int>(clamp64(int64_t(sk) - sq + m0 + m_rows, 0, sk)) : sk;
  const int n_tiles = (n_end + T::kBlockN - 1) / T::kBlockN;
  const int d_qk = p.d_nope + p.d_rope;
  const bool vec = p.vec16 != 0;

  for (int c = threadIdx.x; c < 2 * (T::kKStageBytes + T::kVStageBytes) / 16; c += T::kThreads)
    reinterpret_cast<uint4*>(smem + T::kOffK)[c] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  const uint16_t* q_base = p.q + (q_start + m0) * p.q_stride_t + h * p.q_stride_h;
  load_tile<T::kKRow>(
      sQ, m_rows, d_qk, 0, vec, [&](int r) { return q_base + r * p.q_stride_t; },
      [&](int r) { return q_base + r * p.q_stride_t + d_qk; });
  auto load_kv = [&](int tile, int stage) {
    const int n0 = tile * T::kBlockN;
    const int rows = min(T::kBlockN, n_end - n0);
    const uint16_t* kn = p.k_nope + (k_start + n0) * p.kn_stride_t + h * p.kn_stride_h;
    const uint16_t* kp = p.k_pe + (k_start + n0) * p.kp_stride_t + h * p.kp_stride_h;
    const uint16_t* vv = p.v + (k_start + n0) * p.v_stride_t + h * p.v_stride_h;
    load_tile<T::kKRow>(
        sK + stage * T::kBlockN * T::kKRow, rows, p.d_nope, p.d_rope, vec,
        [&](int r) { return kn + r * p.kn_stride_t; }, [&](int r) { return kp + r * p.kp_stride_t; });
    load_tile<T::kVRow>(
        sV + stage * T::kBlockN * T::kVRow, rows, p.d_v, 0, vec, [&](int r) { return vv + r * p.v_stride_t; },
        [&](int r) { return vv + r * p.v_stride_t + p.d_v; });
  };
  if (n_tiles > 0) load_kv(0, 0);
  ptx::cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  // This thread's two rows (fragment rows g and g + 8 of the warp's slab) and their last visible key.
  int limit[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + 16 * warp + g8 + 8 * hf;
    limit[hf] = i >= sq ? -1 : p.causal ? min(sk - sq + i, sk - 1) : sk - 1;
  }
  softmax::RowState st[2];
  float acc_o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc_o[j][0] = acc_o[j][1] = acc_o[j][2] = acc_o[j][3] = 0.0f;
  const int ks_total = (d_qk + 15) / 16;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_tiles) {
      load_kv(it + 1, stage ^ 1);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* k_tile = sK + stage * T::kBlockN * T::kKRow;
    const uint16_t* v_tile = sV + stage * T::kBlockN * T::kVRow;

    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const uint16_t* a_ptr = sQ + (16 * warp + (lane & 15)) * T::kKRow + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < T::kMaxDqk / 16; ++ks) {
      if (ks >= ks_total) break;
      uint32_t a[4];
      ptx::ldmatrix_x4(a, a_ptr + ks * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bf[4];
        ptx::ldmatrix_x4(bf, k_tile + (16 * np + (lane & 7) + (lane >> 4) * 8) * T::kKRow + ks * 16 +
                                 ((lane >> 3) & 1) * 8);
        ptx::mma_bf16_16816(s[2 * np], a, bf[0], bf[1]);
        ptx::mma_bf16_16816(s[2 * np + 1], a, bf[2], bf[3]);
      }
    }

    // Mask, scale into the log2 domain, online softmax per row (4 lanes share a row).
    const int n0 = it * T::kBlockN;
    float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + 8 * j + 2 * t4 + (e & 1), hf = e >> 1;
        s[j][e] = key <= limit[hf] ? s[j][e] * p.scale_log2 : -INFINITY;
        bmax[hf] = fmaxf(bmax[hf], s[j][e]);
      }
    float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      alpha[hf] = st[hf].rescale(softmax::quad_max(bmax[hf]));
      base[hf] = st[hf].base();
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1;
        s[j][e] = s[j][e] == -INFINITY ? 0.0f : softmax::exp2_approx(s[j][e] - base[hf]);
        sum[hf] += s[j][e];
      }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) st[hf].sum += softmax::quad_sum(sum[hf]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc_o[j][0] *= alpha[0];
      acc_o[j][1] *= alpha[0];
      acc_o[j][2] *= alpha[1];
      acc_o[j][3] *= alpha[1];
    }

    // O += P V: the S accumulators of keys 16kk..16kk+15 are exactly the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      a[0] = ptx::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      a[1] = ptx::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      a[2] = ptx::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = ptx::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < T::kMaxDv / 16; ++np) {
        if (16 * np >= p.d_v) break;
        uint32_t bf[4];
        ptx::ldmatrix_x4_trans(
            bf, v_tile + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * T::kVRow + 16 * np + (lane >> 4) * 8);
        ptx::mma_bf16_16816(acc_o[2 * np], a, bf[0], bf[1]);
        ptx::mma_bf16_16816(acc_o[2 * np + 1], a, bf[2], bf[3]);
      }
    }
    __syncthreads();
  }
  ptx::cp_async_wait<0>();

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + 16 * warp + g8 + 8 * hf;
    if (i >= sq) continue;
    const float inv = st[hf].inv_sum();
    uint16_t* dst = p.out + (q_start + i) * p.out_stride_t + h * p.out_stride_h;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * j + 2 * t4;
      if (col < p.d_v) dst[col] = dev::float_to_bf16(acc_o[j][2 * hf] * inv);
      if (col + 1 < p.d_v) dst[col + 1] = dev::float_to_bf16(acc_o[j][2 * hf + 1] * inv);
    }
    if (p.lse && t4 == 0) p.lse[h * p.lse_stride_h + (q_start + i) * p.lse_stride_t] = st[hf].lse();
  }
}

}  // namespace mla::cuda::prefill
