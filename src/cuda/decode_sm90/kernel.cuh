#pragma once
// mqa_decode for sm_90a (variant "sm90"): absorbed MQA over a paged bf16 latent cache, TMA + mbarrier
// pipeline, wgmma, warp-specialised. docs/DECODE.md has the design, measurements and what was tried.
//
// Work: one CTA per (64-row query tile, KV split, request), the portable family's unit and workspace
// (the step plan's num_splits; combine: decode/kernel.cuh). Rows r = i * h_q + h of request b, padded
// to 64 (padding rows are computed and dropped). Keys of the split: whole 64-key tiles.
//
// Warp roles (384 threads, __launch_bounds__(384, 1), setmaxnreg):
//   warpgroup 0, producer (40 registers): warp 0 streams the KV tiles into kStages stages. Per tile it
//     reads the block table, announces the bytes on the stage's `full` mbarrier and issues one TMA box
//     (64 columns x min(page, 64) rows, 128-byte swizzle) per page run and 64-column panel: 9 boxes
//     for pages >= 64, 9 * 64 / page for smaller pages. Pages outside [0, num_blocks) and keys past the
//     split are not loaded; the stage's key mask (smem) says which keys were.
//   warpgroups 1 and 2, consumers c = 0, 1 (232 registers): Q was copied once into smem (swizzled).
//     Per tile:  S_c = Q K_c^T          wgmma m64n32k16 x 36, keys 32c..32c+31 of the tile
//                row max over both halves through smem (named barrier 1, 256 threads), online
//                softmax in the log2 domain, causal / validity mask per (row, key)
//                P_c -> smem (bf16, swizzled), fence.proxy.async, named barrier
//                O_c = alpha O_c + P V_c  wgmma m64n256k16 x 4, V_c = columns 256c..256c+255 of the
//                                       same smem tile (MN-major B: V is K's first 512 columns)
//                arrive on the stage's `empty` mbarrier.
//     Both consumers hold the same running max; each keeps its own partial row sum, added in the
//     epilogue. Keys that were not loaded are zero-filled in smem first (stale or NaN-poisoned rows
//     must not reach P V, where 0 * NaN = NaN).
//   Epilogue: rows normalised by 1/l, bf16 out + natural-log LSE, or fp32 partials O / l and partial
//   LSE for the combine kernel. A row with no visible key gets O = 0, LSE = -inf.
//
// Shared memory (Traits): Q 72 KiB + 2 KV stages x 72 KiB + P 8 KiB + 2.5 KiB tables/barriers
// = 226 KiB of the 227 available: one CTA per SM, pipeline depth 2.
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/decode_sm90/pipeline.cuh"

namespace mla::cuda::decode_sm90 {

// Q rows [row0, row0 + 64) of request g into the swizzled Q tile (zeros past the rows), by the 256
// consumer threads (ct = their index).
__device__ __forceinline__ void load_q(const MqaRowParams& rp, int64_t g, int row0, int m_rows, uint8_t* sQ, int ct) {
  using T = Traits;
  constexpr int kChunks = T::kDqk / 8;  // 72 chunks of 8 bf16 per row
  for (int c = ct; c < T::kBlockM * kChunks; c += T::kConsumerThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    uint8_t* dst = sQ + (ch / 8) * T::kPanelBytes + swz(r, ch % 8);
    const int row = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < m_rows) {
      const int i = row / rp.h_q, h = row % rp.h_q;
      const uint16_t* src = static_cast<const uint16_t*>(rp.q) + g * rp.q_stride_g + i * rp.q_stride_i +
                            h * rp.q_stride_h + ch * 8;  // bf16 q (supports() admits no other)
      if (rp.q_vec16) {
        v = *reinterpret_cast<const uint4*>(src);
      } else {
        uint16_t e[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) e[k] = src[k];
        v = make_uint4(e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                       e[6] | uint32_t(e[7]) << 16);
      }
    }
    *reinterpret_cast<uint4*>(dst) = v;
  }
}

__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ CUtensorMap kv_map, const DecodeSm90Params p) {
  using T = Traits;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + T::kOffBar);
  uint64_t* empty = full + T::kStages;
  const Unit u(p);
  if (!start_roles<Traits>(p, &kv_map, u, smem)) return;
  const int wg = ptx::warpgroup_index();

  // ---------------- consumers ----------------
  const MqaRowParams& rp = p.rows;
  const int c = wg - 1;                        // consumer index: key half of S, column half of O
  const int ct = threadIdx.x - 128;            // 0..255 over both consumer warpgroups
  const int w = ptx::warp_idx_in_warpgroup();  // rows 16w..16w+15 of every wgmma
  const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  uint8_t* sQ = smem + T::kOffQ;
  uint8_t* sP = smem + T::kOffP;
  float* sMax = reinterpret_cast<float*>(smem + T::kOffMax);
  float* sSum = reinterpret_cast<float*>(smem + T::kOffSum);
  const uint64_t* sMask = reinterpret_cast<const uint64_t*>(smem + T::kOffMask);

  load_q(rp, u.g, u.row0, u.m_rows, sQ, ct);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);

  // This thread's two rows (wgmma D layout): r_lo = 16w + g8, r_hi = r_lo + 8; largest visible key.
  const int r_lo = 16 * w + g8, r_hi = r_lo + 8;
  auto limit_of = [&](int r) {
    const int row = u.row0 + r;
    if (row >= u.m_rows) return -1;
    const int lim = p.causal ? u.seq_len - rp.s_q + row / rp.h_q : u.seq_len - 1;
    return lim < -1 ? -1 : lim;
  };
  const int lim_lo = limit_of(r_lo), lim_hi = limit_of(r_hi);

  float o[T::kDvHalf / 2];
#pragma unroll
  for (int i = 0; i < T::kDvHalf / 2; ++i) o[i] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int it = 0; it < u.n_tiles; ++it) {
    const int stage = it % T::kStages;
    const uint32_t parity = (it / T::kStages) & 1;
    uint8_t* sK = smem + T::kOffK + stage * T::kTileBytes;
    const int k0 = u.key_begin + it * T::kBlockN;
    ptx::mbar_wait(&full[stage], parity);
    const uint64_t mask = sMask[stage];
    if (mask != ~uint64_t(0)) {
      // Keys not loaded hold stale or poisoned bytes: zero them (all 576 columns) before any wgmma.
      for (int e = ct; e < T::kBlockN * (T::kDqk / 8); e += T::kConsumerThreads) {
        const int r = e / (T::kDqk / 8), ch = e % (T::kDqk / 8);
        if (!((mask >> r) & 1))
          *reinterpret_cast<uint4*>(sK + (ch / 8) * T::kPanelBytes + swz(r, ch % 8)) = make_uint4(0, 0, 0, 0);
      }
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    }

    // ---- S_c = Q K_c^T: 64 rows x 32 keys ----
    float s[T::kHalfN / 2];
    ptx::wgmma_fence_operand(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < T::kDqk / 16; ++ks) {
      const int off = (ks / 4) * T::kPanelBytes + (ks % 4) * 32;
      const uint64_t da = ptx::desc_sw128_k_major(sQ + off);
      const uint64_t db = ptx::desc_sw128_k_major(sK + off + c * T::kHalfN * 128);
      ptx::wgmma_bf16_ss<T::kHalfN>(s, da, db, ks > 0);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(s);

    // ---- mask, row max over both halves ----
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < T::kHalfN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kk = c * T::kHalfN + 8 * j + 2 * t4 + e, key = k0 + kk;
        const bool in = (mask >> kk) & 1;
        float& a = s[4 * j + e];
        float& b = s[4 * j + 2 + e];
        a = in && key <= lim_lo ? a * rp.scale_log2 : -INFINITY;
        b = in && key <= lim_hi ? b * rp.scale_log2 : -INFINITY;
        mx_lo = fmaxf(mx_lo, a);
        mx_hi = fmaxf(mx_hi, b);
      }
    }
    mx_lo = softmax::quad_max(mx_lo);
    mx_hi = softmax::quad_max(mx_hi);
    float* mx_buf = sMax + (it & 1) * 2 * T::kBlockM;
    if (t4 == 0) {
      mx_buf[c * T::kBlockM + r_lo] = mx_lo;
      mx_buf[c * T::kBlockM + r_hi] = mx_hi;
    }
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    const float new_lo = fmaxf(m_lo, fmaxf(mx_buf[r_lo], mx_buf[T::kBlockM + r_lo]));
    const float new_hi = fmaxf(m_hi, fmaxf(mx_buf[r_hi], mx_buf[T::kBlockM + r_hi]));
    const float alpha_lo = new_lo == -INFINITY ? 1.0f : softmax::exp2_approx(m_lo - new_lo);
    const float alpha_hi = new_hi == -INFINITY ? 1.0f : softmax::exp2_approx(m_hi - new_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    const float base_lo = new_lo == -INFINITY ? 0.0f : new_lo, base_hi = new_hi == -INFINITY ? 0.0f : new_hi;

    // ---- P_c = exp2(S - m) -> smem (bf16), row sums ----
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < T::kHalfN / 8; ++j) {
      const float p0 = softmax::exp2_approx(s[4 * j] - base_lo), p1 = softmax::exp2_approx(s[4 * j + 1] - base_lo);
      const float p2 = softmax::exp2_approx(s[4 * j + 2] - base_hi), p3 = softmax::exp2_approx(s[4 * j + 3] - base_hi);
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      const int chunk = c * (T::kHalfN / 8) + j, byte = 4 * t4;
      *reinterpret_cast<uint32_t*>(sP + swz(r_lo, chunk) + byte) = ptx::pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t*>(sP + swz(r_hi, chunk) + byte) = ptx::pack_bf16x2(p2, p3);
    }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
    for (int j = 0; j < T::kDvHalf / 8; ++j) {
      o[4 * j] *= alpha_lo;
      o[4 * j + 1] *= alpha_lo;
      o[4 * j + 2] *= alpha_hi;
      o[4 * j + 3] *= alpha_hi;
    }
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);

    // ---- O_c += P V_c: 64 rows x 256 columns, k = 64 keys ----
    ptx::wgmma_fence_operand(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < T::kBlockN / 16; ++ks) {
      const uint64_t da = ptx::desc_sw128_k_major(sP + ks * 32);
      const uint64_t db =
          ptx::desc_sw128_mn_major(sK + (c * T::kDvHalf / T::kPanelCols) * T::kPanelBytes + ks * 2048, T::kPanelBytes);
      ptx::wgmma_bf16_ss<T::kDvHalf, ptx::Major::K, ptx::Major::MN>(o, da, db, true);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
    ptx::mbar_arrive(&empty[stage]);
  }

  // ---- epilogue: l over both halves, normalise, write ----
  l_lo = softmax::quad_sum(l_lo);
  l_hi = softmax::quad_sum(l_hi);
  if (t4 == 0) {
    sSum[c * T::kBlockM + r_lo] = l_lo;
    sSum[c * T::kBlockM + r_hi] = l_hi;
  }
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  const float tot_lo = sSum[r_lo] + sSum[T::kBlockM + r_lo], tot_hi = sSum[r_hi] + sSum[T::kBlockM + r_hi];
  const bool split = p.num_splits > 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r_hi : r_lo, row = u.row0 + r;
    if (row >= u.m_rows) continue;
    const float l = half ? tot_hi : tot_lo, m = half ? m_hi : m_lo;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float lse = l > 0.0f ? (m + __log2f(l)) * softmax::kLn2 : -INFINITY;
    const int i = row / rp.h_q, h = row % rp.h_q;
    const int64_t ws_row = ((u.g * p.num_splits + u.split) * static_cast<int64_t>(u.m_rows)) + row;
    if (c == 0 && t4 == 0) {
      if (split) p.ws_lse[ws_row] = lse;
      else if (rp.lse) rp.lse[u.g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = lse;
    }
    if (split) {
      float* dst = p.ws_o + ws_row * T::kDv + c * T::kDvHalf;
#pragma unroll
      for (int j = 0; j < T::kDvHalf / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + 2 * t4) = make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i +
                      h * rp.out_stride_h + c * T::kDvHalf;  // bf16 out
#pragma unroll
      for (int j = 0; j < T::kDvHalf / 8; ++j) {
        const float a = o[4 * j + 2 * half] * inv, b = o[4 * j + 2 * half + 1] * inv;
        if (p.out_pairs) {
          *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) = ptx::pack_bf16x2(a, b);
        } else {
          dst[8 * j + 2 * t4] = dev::float_to_bf16(a);
          dst[8 * j + 2 * t4 + 1] = dev::float_to_bf16(b);
        }
      }
    }
  }
}

}  // namespace mla::cuda::decode_sm90
