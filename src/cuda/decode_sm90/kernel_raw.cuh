#pragma once
// sm90 attention over e4m3-coded rows (fp8 per-tensor rows of mqa_decode, fp8_ds_mla records of mqa_decode and
// sparse_mqa) for N = 8 / 16 / 32 query rows, with no bf16 stage: the raw rows go into a ring of shared-memory slots
// and the consumers build wgmma's A operand in registers straight from the codes (docs/DECODE.md "Raw-codes
// kernel"). The staged sources (source_staged.cuh) convert every code to bf16 in shared memory first (four
// producer warps, a 72 KiB stage per tile, the stage cycle and the conversion rate were the limits); here the
// copies only move bytes, run two tiles ahead per consumer, and the conversion is spread over 8 consumer warps.
// Its parts (shared-memory layout RawTraits, code conversions, Q prologue, producer): raw_parts.cuh.
//
//   S^T[64 keys x N] = K Q^T     36 x wgmma m64nNk16, A = K from registers (codes -> f16; fp8_ds_mla's rope bf16),
//                                B = Q (smem, d permuted, f16 / bf16)
//   O^T[512 x N]    += V^T P^T    8 blocks x 4 x wgmma m64nNk16 (fp8 f16, fp8_ds_mla bf16), A = V^T from registers,
//                                B = P^T (smem)
//
// Numerics: exact codes. S: one F2FP turns two e4m3 codes into an exact f16 pair (NaN codes into NaN), Q is
// stored as f16 times a per-row power of two 2^e that puts the row's largest |q| in [2^14, 2^15) (exact for
// every element within 2^28 of it; q_row_exponent), fp8_ds_mla's bf16 rope against Q's rope as bf16 times the
// same 2^e; 2^-e comes back on S with the softmax scale. V, fp8: f16 through F2FP as well, P^T f16 times 2^7
// (weights <= 2^8 under the lazy maximum), 2^-7 back on O; a tile holding a loaded key that some valid row must
// not see turns NaN codes into 448 first (`clean`: NaN * (P = 0) would poison that row; a row that sees the key
// is NaN through its score). V, fp8_ds_mla: bf16 exactly as code * 2^-120 (PRMT sign mode, shift, mask: three
// integer ops per pair, NaN codes finite), P^T bf16 times 2^56 and the key's scale of the group (exact powers of
// two keep every product away from fp32 subnormals), 2^64 back on O. fp8: S and O times the cache scale;
// fp8_ds_mla: group g's S accumulator is folded into the scores with the key's scale as soon as its chunks
// retire (+ the rope's accumulator), and one P^T panel per group (a value block of 64 rows lies inside one
// group). This is the portable engine's reading of fp8_ds_mla (codes exact, scales in fp32), not the bf16
// upconvert of the 32+-row kernels. Softmax: the lazy maximum (docs/DECODE.md), exact step on flagged tiles.
//
// Layouts (bank-conflict-free, derived in docs/DECODE.md "Raw-codes kernel"):
//   ring slot: 64 rows of kStride = 672 bytes (a record, then padding; 672 = 32 mod 128 bytes);
//   A row rho = 16 w + g (+ 8) of a tile holds key 16 w + sigma(g) (+ 8), sigma = 0 2 4 6 1 3 5 7 (warp w, g = lane / 4);
//   S: thread t4 = lane % 4 reads bytes 64 j + 16 t4 .. + 15 of its two keys (one 16-byte load each), i.e. k-steps
//   4j .. 4j + 3, byte 4 i + e -> k-step 4 j + i, column (2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9)[e]; Q's columns are
//   stored in that permuted order (store_q_permuted); the bf16 rope of fp8_ds_mla the same way in pairs;
//   V: value block mb, A row 16 w + g + 8 h holds value column 128 (mb / 2) + 32 w + 4 g + 2 (mb % 2) + h, so a
//   thread's four columns of a scale group are one 4-byte word per key; P^T column rho holds key rho's weight.
//
// Warp roles: warpgroup 0 produces, each warp 16 rows of a tile (paged rows with p.gather.raw_tma: one TMA box
// when all 16 are loaded and start a 16-row group of one page, bytes by expect_tx; otherwise eight lanes per row,
// one global line per cp.async and row, zero-filled for keys not loaded), completion by cp.async.mbarrier.arrive
// on the slot's full barrier, the slot's 64-bit key mask by one arrival per warp; consumer warpgroups c = 0, 1 take
// alternate tiles (tile it in slot it % 4: consumer c uses slots c and c + 2) with their own online softmax
// (kernel_small.cuh's), release a slot after their last load from it.
// Epilogue: tile_io.cuh small_epilogue, warpgroup 1's O^T exchanged through ring slot 1 (drained: one unit).
//
// Split by d (N 32, RawTraits::kSplit): O^T of all 512 columns would be 128 registers per thread beside S, so
// both consumer warpgroups take every tile (tile it in slot it % 3) and split d: warpgroup c computes S over
// its half of the k-steps (split_scores: the rope's k-steps 32 + 2c, 33 + 2c, then chunks 4c .. 4c + 3; for
// fp8_ds_mla exactly scale groups 2c and 2c + 1), the partial scores go through shared memory (double-buffered
// by tile parity: one 256-thread barrier per tile), and both run the same softmax on the same sums (addition
// commutes, so every lazy-maximum decision agrees) and store the P^T panels of their own value groups 2c,
// 2c + 1, whose O^T (value blocks 4c .. 4c + 3, 64 registers) they alone hold; the slot is released when both
// have read it (256 arrivals). Epilogue: tile_io.cuh split_epilogue, no merge (both hold the same m and l).
// At N 16 the same split measured 14-21% slower than alternate tiles (both warpgroups reach the softmax
// together, with no tensor work beside it), so N 8 / 16 alternate.
//
// Shared memory (N 16, fp8_ds_mla): Q 18 KiB + 4 slots x 42 KiB + P^T 2 x 4 x 2 KiB + tables = 203 KiB.
// N 32 (fp8_ds_mla): Q 36 KiB + 3 slots x 42 KiB + P^T 2 x 2 x 4 KiB + score exchange 2 x 2 x 8 KiB + tables
// = 213 KiB.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/decode_sm90/pipeline.cuh"
#include "cuda/decode_sm90/raw_parts.cuh"
#include "cuda/decode_sm90/source.cuh"
#include "cuda/decode_sm90/tile_io.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {


// The whole d of a tile's scores (sv: this thread's elements of S^T, before the softmax scale): chunks j = 0 .. 8
// (j 8: the rope), raw loads kAhead chunks ahead, A double-buffered; fp8_ds_mla's scale groups in two accumulators
// in turn, each folded into sv with the keys' scales as soon as its chunks retire, the bf16 rope in a third (sc_lo /
// sc_hi get all four scales: P^T's panels).
template <int N, class L>
__device__ __forceinline__ void whole_scores(float (&sv)[N / 2], float (&sc_lo)[L::kGroupsWg],
                                             float (&sc_hi)[L::kGroupsWg], const uint8_t* row_lo,
                                             const uint8_t* row_hi, uint64_t dQ, int t4) {
  static_assert(!L::kSplit, "whole d: N 8 / 16 (sc_lo / sc_hi hold all four groups)");
  constexpr bool kDs = L::kDs;
  // S accumulators: fp8_ds_mla two for the scale groups in turn (group g in buffer g % 2, folded into the scores
  // with its scale as soon as its chunks retire) + the rope's; fp8 one.
  constexpr int kAcc = kDs ? 3 : 1;
  uint32_t a[2][16];
  float sacc[kAcc][N / 2];
  // [buffer][lo, hi]: chunk j's 16 bytes of each key, loaded kAhead chunks ahead (LDS latency)
  constexpr int kAhead = 2;
  // fp8_ds_mla: sv (+)= scale of group g x its accumulator (buffer g % 2), the scales of this thread's two keys.
  auto fold = [&](int g, float s_lo, float s_hi) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float t = ((i & 2) ? s_hi : s_lo) * sacc[g & 1][i];
      sv[i] = g == 0 ? t : sv[i] + t;
    }
  };
  uint4 x[kAhead + 1][2];
  uint4 xr[2];    // fp8_ds_mla rope: the second 16 bytes (elements 32 + 8 t4 ..) of each key
  auto load_chunk = [&](int j, uint4 (&dst)[2]) {
    const int o16 = j < 8 ? 64 * j + 16 * t4 : (kDs ? 528 + 16 * t4 : 512 + 16 * t4);
    dst[0] = *reinterpret_cast<const uint4*>(row_lo + o16);
    dst[1] = *reinterpret_cast<const uint4*>(row_hi + o16);
  };
#pragma unroll
  for (int j = 0; j < kAhead; ++j) load_chunk(j, x[j]);
#pragma unroll
  for (int j = 0; j < 9; ++j) {
    if (j + kAhead <= 8) load_chunk(j + kAhead, x[(j + kAhead) % (kAhead + 1)]);
    if (kDs && j == 7) {  // the rope's second half one chunk ahead only (registers)
      xr[0] = *reinterpret_cast<const uint4*>(row_lo + 592 + 16 * t4);
      xr[1] = *reinterpret_cast<const uint4*>(row_hi + 592 + 16 * t4);
    }
    const int g_done = j / 2 - 2;  // fp8_ds_mla, even j >= 4: group j / 2 - 2 retires with chunk j - 2
    float f_lo = 0.0f, f_hi = 0.0f;
    if (kDs && j >= 4 && j % 2 == 0) {  // its scales, read before the wait (which orders memory)
      f_lo = *reinterpret_cast<const float*>(row_lo + 512 + 4 * g_done);
      f_hi = *reinterpret_cast<const float*>(row_hi + 512 + 4 * g_done);
    }
    if (j >= 2) ptx::wgmma_wait_group<1>();  // chunk j - 2's products retired: its A buffer is free
    if (kDs && j >= 4 && j % 2 == 0) {       // and group g_done's accumulator is final: fold it, free its buffer
      ptx::wgmma_fence_operand(sacc[g_done & 1]);
      fold(g_done, f_lo, f_hi);
    }
    uint32_t(&aj)[16] = a[j & 1];
    ptx::wgmma_fence_operand(aj);
    const uint4& xl = x[j % (kAhead + 1)][0];
    const uint4& xh = x[j % (kAhead + 1)][1];
    const uint32_t wl[4] = {xl.x, xl.y, xl.z, xl.w}, wh[4] = {xh.x, xh.y, xh.z, xh.w};
    if (kDs && j == 8) {  // bf16 rope: the words are the A pairs (k-steps 32, 33 from x, 34, 35 from xr)
      const uint32_t rl[4] = {xr[0].x, xr[0].y, xr[0].z, xr[0].w}, rh[4] = {xr[1].x, xr[1].y, xr[1].z, xr[1].w};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        aj[4 * i] = wl[2 * i];
        aj[4 * i + 1] = wh[2 * i];
        aj[4 * i + 2] = wl[2 * i + 1];
        aj[4 * i + 3] = wh[2 * i + 1];
        aj[8 + 4 * i] = rl[2 * i];
        aj[8 + 4 * i + 1] = rh[2 * i];
        aj[8 + 4 * i + 2] = rl[2 * i + 1];
        aj[8 + 4 * i + 3] = rh[2 * i + 1];
      }
    } else {
      e4m3_chunk_to_a(wl, wh, aj);
    }
    const int acc = kDs ? (j < 8 ? (j / 2) & 1 : 2) : 0;
#pragma unroll
    for (int k = 0; k < kAcc; ++k) ptx::wgmma_fence_operand(sacc[k]);
    ptx::wgmma_fence_operand(aj);
    ptx::wgmma_fence();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ks = 4 * j + i;
      const uint32_t ai[4] = {aj[4 * i], aj[4 * i + 1], aj[4 * i + 2], aj[4 * i + 3]};
      const bool accumulate = kDs ? (j < 8 ? (j % 2 != 0 || i > 0) : i > 0) : ks > 0;
      const uint64_t dq = ptx::desc_advance(dQ, (ks >> 2) * L::kQPanelBytes + (ks & 3) * 32);
      if (kDs && j == 8) ptx::wgmma_bf16_rs<N>(sacc[acc], ai, dq, accumulate);
      else ptx::wgmma_f16_rs<N>(sacc[acc], ai, dq, accumulate);
    }
    ptx::wgmma_commit_group();
  }
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int k = 0; k < kAcc; ++k) ptx::wgmma_fence_operand(sacc[k]);
  ptx::wgmma_fence_operand(a[0]);
  ptx::wgmma_fence_operand(a[1]);

  // the last group and the rope (fp8_ds_mla)
  if constexpr (kDs) {  // all four scales again, for P^T (held across S they spilled; fold read groups 0..2)
    const float4 a4 = *reinterpret_cast<const float4*>(row_lo + 512), b4 = *reinterpret_cast<const float4*>(row_hi + 512);
    sc_lo[0] = a4.x; sc_lo[1] = a4.y; sc_lo[2] = a4.z; sc_lo[3] = a4.w;
    sc_hi[0] = b4.x; sc_hi[1] = b4.y; sc_hi[2] = b4.z; sc_hi[3] = b4.w;
    fold(3, sc_lo[3], sc_hi[3]);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sv[i] += sacc[2][i];
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sv[i] = sacc[0][i];
  }
}

// Split by d: warpgroup c's partial scores of a tile (sv: this thread's elements of S^T, before the softmax scale).
// Its half of the rope's k-steps (32 + 2c, 33 + 2c) first, straight into sv, then chunks 4c .. 4c + 3 (k-steps
// 16c .. 16c + 15): fp8 into sv as well; fp8_ds_mla scale groups 2c and 2c + 1 into their own accumulators, folded
// into sv with the keys' scales once all retired (sc_lo / sc_hi get those two scales: P^T's panels too). Raw loads
// two ahead and A double-buffered as in whole_scores.
template <int N, class L>
__device__ __forceinline__ void split_scores(float (&sv)[N / 2], float (&sc_lo)[L::kGroupsWg],
                                             float (&sc_hi)[L::kGroupsWg], const uint8_t* row_lo,
                                             const uint8_t* row_hi, uint64_t dQ, int c, int t4) {
  constexpr bool kDs = L::kDs;
  uint32_t a[2][16];
  float sacc[2][N / 2];  // fp8_ds_mla's two scale groups (fp8: unused)
  // Load k: 0 the rope's half (fp8_ds_mla: 16 bf16 bytes at 528 + 64 c; fp8: the chunk of codes, words 2c, 2c + 1
  // used), 1..4 chunk 4c + k - 1.
  auto load = [&](int k, uint4 (&dst)[2]) {
    const int o16 = k == 0 ? (kDs ? 528 + 64 * c : 512) + 16 * t4 : 64 * (4 * c + k - 1) + 16 * t4;
    dst[0] = *reinterpret_cast<const uint4*>(row_lo + o16);
    dst[1] = *reinterpret_cast<const uint4*>(row_hi + o16);
  };
  uint4 x[3][2];
  load(0, x[0]);
  load(1, x[1]);
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    if (k + 2 <= 4) load(k + 2, x[(k + 2) % 3]);
    if (k >= 2) ptx::wgmma_wait_group<1>();  // load k - 2's products retired: its A buffer is free
    uint32_t(&aj)[16] = a[k & 1];
    ptx::wgmma_fence_operand(aj);
    const uint4& xl = x[k % 3][0];
    const uint4& xh = x[k % 3][1];
    const uint32_t wl[4] = {xl.x, xl.y, xl.z, xl.w}, wh[4] = {xh.x, xh.y, xh.z, xh.w};
    if (k == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (kDs) {  // bf16 pairs: the words are the A pairs
          aj[4 * i] = wl[2 * i];
          aj[4 * i + 1] = wh[2 * i];
          aj[4 * i + 2] = wl[2 * i + 1];
          aj[4 * i + 3] = wh[2 * i + 1];
        } else {  // word 2c + i of each key: k-step 32 + 2c + i
          const uint32_t l = c ? wl[2 + i] : wl[i], h = c ? wh[2 + i] : wh[i];
          aj[4 * i] = e4m3x2_lo_to_f16x2(l);
          aj[4 * i + 1] = e4m3x2_lo_to_f16x2(h);
          aj[4 * i + 2] = e4m3x2_hi_to_f16x2(l);
          aj[4 * i + 3] = e4m3x2_hi_to_f16x2(h);
        }
      }
    } else {
      e4m3_chunk_to_a(wl, wh, aj);
    }
    ptx::wgmma_fence_operand(sv);
    ptx::wgmma_fence_operand(sacc[0]);
    ptx::wgmma_fence_operand(sacc[1]);
    ptx::wgmma_fence_operand(aj);
    ptx::wgmma_fence();
    if (k == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t ai[4] = {aj[4 * i], aj[4 * i + 1], aj[4 * i + 2], aj[4 * i + 3]};
        const uint64_t dq = ptx::desc_advance(dQ, 8 * L::kQPanelBytes + (2 * c + i) * 32);  // k-step 32 + 2c + i
        if constexpr (kDs) ptx::wgmma_bf16_rs<N>(sv, ai, dq, i > 0);
        else ptx::wgmma_f16_rs<N>(sv, ai, dq, i > 0);
      }
    } else {
      const int j = 4 * c + k - 1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t ai[4] = {aj[4 * i], aj[4 * i + 1], aj[4 * i + 2], aj[4 * i + 3]};
        const uint64_t dq = ptx::desc_advance(dQ, j * L::kQPanelBytes + i * 32);  // k-step 4 j + i
        if constexpr (kDs) ptx::wgmma_f16_rs<N>(sacc[(k - 1) / 2], ai, dq, (k - 1) % 2 != 0 || i > 0);
        else ptx::wgmma_f16_rs<N>(sv, ai, dq, true);
      }
    }
    ptx::wgmma_commit_group();
  }
  ptx::wgmma_wait_group<0>();
  ptx::wgmma_fence_operand(sv);
  ptx::wgmma_fence_operand(sacc[0]);
  ptx::wgmma_fence_operand(sacc[1]);
  ptx::wgmma_fence_operand(a[0]);
  ptx::wgmma_fence_operand(a[1]);
  if constexpr (kDs) {
    const float2 fl = *reinterpret_cast<const float2*>(row_lo + 512 + 8 * c);
    const float2 fh = *reinterpret_cast<const float2*>(row_hi + 512 + 8 * c);
    sc_lo[0] = fl.x;
    sc_lo[1] = fl.y;
    sc_hi[0] = fh.x;
    sc_hi[1] = fh.y;
#pragma unroll
    for (int i = 0; i < N / 2; ++i)  // sv[i]: key_lo when (i & 2) == 0, else key_hi
      sv[i] += ((i & 2) ? fh.x : fl.x) * sacc[0][i] + ((i & 2) ? fh.y : fl.y) * sacc[1][i];
  }
}

// Rows: PagedRows (mqa_decode, the uniform split-KV schedule's one unit per CTA) or IndexedRows (sparse_mqa).
template <int N, CacheFormat F, class Rows>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_raw_kernel(const __grid_constant__ CUtensorMap map, const DecodeSm90Params p) {
  using T = Traits;
  using L = RawTraits<N, F>;
  constexpr bool kSplit = L::kSplit;  // N 32: both consumer warpgroups on every tile, split by d (header)
  constexpr bool kDs = L::kDs;
  constexpr int kRows = N / 4;  // query rows per thread: 8j + 2t + e
  constexpr bool kF16V = !kDs;       // V as f16 through F2FP (fp8); fp8_ds_mla: bf16 (P times a key's scale)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kSlots;
  ptx::launch_dependents();  // the combine (a dependent launch) may take the SMs this grid leaves free
  const Unit u(p, !Rows::kPaged);
  if (u.n_tiles == 0) {  // uniform over the CTA
    write_empty_unit(p, u, threadIdx.x, blockDim.x);
    return;
  }
  uint64_t* qfull = empty + L::kSlots;
  uint8_t* q_stage = smem + L::kOffRing + L::kQSlot * L::kSlotBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kSlots; ++s) {
      ptx::mbar_init(&full[s], L::kFullArrivals);
      ptx::mbar_init(&empty[s], L::kEmptyArrivals);
    }
    ptx::mbar_init(qfull, 128);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<L::kProducerRegs>();
    stage_q<L>(p, u, q_stage, qfull, static_cast<int>(threadIdx.x));
    produce_raw<L, Rows>(p, u, smem, &map, ptx::warp_idx_in_warpgroup(), static_cast<int>(threadIdx.x & 31));
    ptx::cp_async_commit();  // no lane leaves with copies in flight
    ptx::cp_async_wait<0>();
    return;
  }
  ptx::setmaxnreg_inc<(504 - L::kProducerRegs) / 2>();

  const MqaRowParams& rp = p.rows;
  const int c = ptx::warpgroup_index() - 1, ct = threadIdx.x - 128;
  const int w = ptx::warp_idx_in_warpgroup(), lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
  const int wg_bar = 2 + c;
  uint8_t* sQ = smem + L::kOffQ;
  uint8_t* sP = smem + L::kOffP + c * L::kGroupsWg * L::kPBytes;
  float* sRed = reinterpret_cast<float*>(smem + L::kOffRed) + c * 4 * N;
  float* sML = reinterpret_cast<float*>(smem + L::kOffML);
  int* sLim = reinterpret_cast<int*>(smem + L::kOffLim);
  const uint64_t* sMask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask);
  // This thread's S rows: A rows rho_lo = 16 w + g8 and rho_hi = rho_lo + 8 hold keys key_lo, key_hi.
  const int sig = 2 * (g8 & 3) + (g8 >> 2);
  const int key_lo = 16 * w + sig, key_hi = key_lo + 8, rho_lo = 16 * w + g8, rho_hi = rho_lo + 8;
  // V: in each 16-key block, this thread's K columns 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 are keys kv[0..3]; its
  // load i reads kv[i ^ (t4 & 1)] (distinct banks over the warp), so pair selectors swap their sources for odd t4.
  const int s0 = 2 * ((2 * t4) & 3) + ((2 * t4) >> 2), s1 = 2 * ((2 * t4 + 1) & 3) + ((2 * t4 + 1) >> 2);
  const int kv[4] = {s0, s1, s0 + 8, s1 + 8};
  int v_off[4];  // byte offsets in a slot of load i (value group 0)
#pragma unroll
  for (int i = 0; i < 4; ++i) v_off[i] = ((t4 & 1) ? kv[i ^ 1] : kv[i]) * L::kStride + 4 * (8 * w + g8);
  uint32_t v_sel[4];  // bf16 V: byte b of the pair's first key, then of its second (sign-replicated halves)
#pragma unroll
  for (int b = 0; b < 4; ++b) v_sel[b] = (t4 & 1) ? raw_sel(4 + b, b) : raw_sel(b, 4 + b);
  // f16 V (fp8): bytes b of both keys, then bytes b + 1 of both, as one word for two F2FP (b = 0, 2)
  uint32_t v_sel16[2];
#pragma unroll
  for (int jb = 0; jb < 2; ++jb) {
    const uint32_t b = 2 * jb, x = (t4 & 1) ? 4 : 0, y = 4 - x;  // the first key's word is a (even t4) or b
    v_sel16[jb] = (b + x) | (b + y) << 4 | (b + 1 + x) << 8 | (b + 1 + y) << 12;
  }

  uint32_t* sAmax = reinterpret_cast<uint32_t*>(smem + L::kOffAmax);
  float* sQf = reinterpret_cast<float*>(smem + L::kOffQf);
  uint8_t* sOver = smem + L::kOffOver;
  if (ct < N) {
    sLim[ct] = query_row_limit(p, u, u.row0 + ct);
    sAmax[ct] = 0;
  }
  ptx::mbar_wait(qfull, 0);  // Q's rows staged in slot kQSlot (raw_parts.cuh stage_q)
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  q_row_amax<N>(q_stage, sAmax, ct);
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  store_q_permuted<N, kDs>(q_stage, sQ, sAmax, sQf, ct);
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
  if (kSplit || c == 1) ptx::mbar_arrive(&empty[L::kQSlot]);  // the staged rows are read: the slot goes to its first tile

  float m_run[kRows], l_part[kRows];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    m_run[rr] = -INFINITY;
    l_part[rr] = 0.0f;
  }
  // S: Q's rows carry 2^e (q_row_exponent), undone per row with the softmax scale (and fp8's cache scale);
  // O, fp8_ds_mla: 2^64 undoes V's 2^-120 and P's 2^56.
  constexpr float kUndo = 0x1p64f;
  float sl2[kRows];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr)
    sl2[rr] = (kDs ? rp.scale_log2 : rp.scale_log2 * p.gather.scale) * sQf[8 * (rr / 2) + 2 * t4 + rr % 2];
  // fp8's V is f16 (exact codes) against P times 2^7: O carries 2^7 instead of 2^64.
  const float out_scale = kDs ? kUndo : p.gather.scale * 0x1p-7f;
  const uint64_t dQ = ptx::desc_sw128_k_major(sQ), dP = ptx::desc_sw128_k_major(sP);
  // The rows' last visible key (causal, length), in registers: off the scores' latency chain.
  int lims[kRows];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) lims[rr] = sLim[8 * (rr / 2) + 2 * t4 + rr % 2];
  // f16 V turns a NaN code into NaN, and NaN * (P = 0) is NaN: a loaded key that some valid row must not see (the
  // causal limits of s_q > 1) would poison that row. Such tiles (`clean` false; the last one or two of a request)
  // first turn NaN codes into 448: rows that see the key are NaN through their score already (S reads the codes
  // as they are), the others multiply a finite value by 0. Keys past seq_len are never loaded.
  int lim_min = 0x7fffffff;
  for (int n = 0; n < N; ++n)
    if (u.row0 + n < u.m_rows) lim_min = min(lim_min, sLim[n]);
  constexpr int kOBlocks = kSplit ? 4 : 8;  // value blocks of O^T this warpgroup holds (split: 4c .. 4c + 3)
  constexpr int kGv = kOBlocks / 2;         // value groups (two blocks each) it multiplies
  float o[kOBlocks][N / 2];
#pragma unroll
  for (int mb = 0; mb < kOBlocks; ++mb)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o[mb][i] = 0.0f;

  for (int it = kSplit ? 0 : c; it < u.n_tiles; it += kSplit ? 1 : 2) {
    const int s = it % L::kSlots;
    const int k0 = u.key_begin + it * T::kBlockN;
    const bool clean = min(k0 + T::kBlockN, u.seq_len) - 1 <= lim_min;
    ptx::mbar_wait(&full[s], (it / L::kSlots) & 1);
    const uint64_t mask = sMask[s];
    const uint8_t* slot = smem + L::kOffRing + s * L::kSlotBytes;
    const uint8_t* row_lo = slot + key_lo * L::kStride;
    const uint8_t* row_hi = slot + key_hi * L::kStride;

    // ---- S^T = K Q^T: the whole d (whole_scores), or this warpgroup's half of it (split_scores) ----
    float sv[N / 2];  // the scores (fp8_ds_mla: the folded groups' sum so far)
    // fp8_ds_mla: the keys' scales of the P^T panels this warpgroup stores (split: groups 2c, 2c + 1)
    float sc_lo[L::kGroupsWg], sc_hi[L::kGroupsWg];
#pragma unroll
    for (int gi = 0; gi < L::kGroupsWg; ++gi) sc_lo[gi] = sc_hi[gi] = 1.0f;
    if constexpr (!kSplit) {
      whole_scores<N, L>(sv, sc_lo, sc_hi, row_lo, row_hi, dQ, t4);
    } else {  // ---- split by d: this warpgroup's half of the k-steps, then the partial scores exchanged ----
      split_scores<N, L>(sv, sc_lo, sc_hi, row_lo, row_hi, dQ, c, t4);
      float* xchg = reinterpret_cast<float*>(smem + L::kOffXchg) + (it & 1) * 2 * (N / 2) * 128;  // [wg][N / 2][128]
      float* mine = xchg + c * (N / 2) * 128;
      const float* other = xchg + (c ^ 1) * (N / 2) * 128;
      const int wt = ct & 127;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) mine[i * 128 + wt] = sv[i];
      // Both halves written. Buffer it & 1 is next written at tile it + 2, after this barrier's successor, which
      // the other warpgroup reaches only after its read below: one barrier per tile. (Addition is commutative:
      // both warpgroups hold the same scores, so every softmax decision below is the same in both.)
      ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) sv[i] += other[i * 128 + wt];
    }

    // ---- scores: mask, column (= query row) max over the 64 keys ----
    const bool in_lo = (mask >> key_lo) & 1, in_hi = (mask >> key_hi) & 1;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int i = 4 * (rr / 2) + rr % 2;  // sv[i]: (key_lo, row rr), sv[i + 2]: (key_hi, row rr)
      const int lim = lims[rr];
      sv[i] = in_lo && k0 + key_lo <= lim ? sv[i] * sl2[rr] : -INFINITY;
      sv[i + 2] = in_hi && k0 + key_hi <= lim ? sv[i + 2] * sl2[rr] : -INFINITY;
    }
    // P^T [n][rho], rho at chunk rho / 8: fp8 f16 times 2^7; fp8_ds_mla bf16 times 2^56 and, per panel, the key's
    // scale of that group. One conversion for both keys (the conversion unit is scarce).
    auto store_pt = [&](const float (&pl)[kRows], const float (&ph)[kRows]) {
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int n = 8 * (rr / 2) + 2 * t4 + rr % 2;
#pragma unroll
        for (int gi = 0; gi < L::kGroupsWg; ++gi) {
          uint8_t* pp = sP + gi * L::kPBytes;
          const uint32_t pk = kF16V ? ptx::pack_f16x2(pl[rr] * 0x1p7f, ph[rr] * 0x1p7f)
                                    : ptx::pack_bf16x2(pl[rr] * (0x1p56f * sc_lo[gi]), ph[rr] * (0x1p56f * sc_hi[gi]));
          *reinterpret_cast<uint16_t*>(pp + swz(n, rho_lo >> 3) + 2 * (rho_lo & 7)) = static_cast<uint16_t>(pk);
          *reinterpret_cast<uint16_t*>(pp + swz(n, rho_hi >> 3) + 2 * (rho_hi & 7)) = static_cast<uint16_t>(pk >> 16);
        }
      }
    };
    // Lazy maximum: the weights are taken against the running maximum m_run as it stands, with no exchange of
    // the tile's maxima, unless some score exceeds it by more than 2^kLazyLog2 (then p could overflow the
    // headroom): each warp flags that, the flags ride on the P^T barrier, and a flagged tile (the first of a
    // unit, a jump of the maximum; uniform over the warpgroup) redoes the exact step (small_tile_softmax, O's
    // rescale) and P^T. Weights up to 2^8 leave bf16 P (times 2^56 and a scale), f16 P (times 2^7: <= 2^15) and
    // the fp32 sums in range;
    // O and l share the reference, so out = O / l and lse = m + log l are unchanged.
    constexpr float kLazyLog2 = 8.0f;
    float p_lo[kRows], p_hi[kRows];
    bool over = false;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int i = 4 * (rr / 2) + rr % 2;
      const float top = m_run[rr] + kLazyLog2;  // -inf before the first key: every finite score is over
      over |= sv[i] > top || sv[i + 2] > top;   // NaN scores are not over: they turn their row NaN either way
      const float base_m = m_run[rr] == -INFINITY ? 0.0f : m_run[rr];
      p_lo[rr] = softmax::exp2_approx(sv[i] - base_m);
      p_hi[rr] = softmax::exp2_approx(sv[i + 2] - base_m);
    }
    const bool warp_over = __any_sync(0xffffffffu, over);
    uint8_t* over_flags = sOver + 8 * ((kSplit ? it : it >> 1) & 1) + 4 * c;  // this warpgroup's tile parity
    if (lane == 0) over_flags[w] = warp_over ? 1 : 0;
    store_pt(p_lo, p_hi);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(wg_bar, 128);
    if (*reinterpret_cast<const uint32_t*>(over_flags) != 0) {  // the exact step (rare after the first tile)
      float alpha[kRows];
      small_tile_softmax<N>(sv, m_run, l_part, alpha, p_lo, p_hi, sRed, w, g8, t4, wg_bar);
      store_pt(p_lo, p_hi);
      small_rescale_o<N, kOBlocks>(o, alpha);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(wg_bar, 128);
    } else {
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) l_part[rr] += p_lo[rr] + p_hi[rr];
    }

    // ---- O^T += V^T P^T: value group gv = blocks 2 gv, 2 gv + 1; one word per key and group ----
    uint32_t va[2][32];
#pragma unroll
    for (int lg = 0; lg < kGv; ++lg) {
      const int gv = kSplit ? 2 * c + lg : lg;  // split: warpgroup c's value groups 2c, 2c + 1
      uint32_t wv[4][4];  // [16-key block][load i]
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          wv[kb][i] = *reinterpret_cast<const uint32_t*>(slot + 16 * kb * L::kStride + v_off[i] + 128 * gv);
      if (lg >= 2) ptx::wgmma_wait_group<1>();   // group lg - 2's products retired: its A buffer is free
      uint32_t(&ag)[32] = va[lg & 1];
      ptx::wgmma_fence_operand(ag);
      if (kF16V && !clean) {  // NaN codes to 448 (see `clean`)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
#pragma unroll
          for (int i = 0; i < 4; ++i) wv[kb][i] &= ~((nan_bytes(wv[kb][i]) & 0x80808080u) >> 7);
      }
#pragma unroll
      for (int jb = 0; jb < 2; ++jb)      // value block 2 gv + jb: bytes 2 jb (rows g8) and 2 jb + 1 (rows g8 + 8)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {  // (wv[kb][0], wv[kb][1]): columns 2 t4, 2 t4 + 1; (2, 3): + 8
          uint32_t* d = ag + 16 * jb + 4 * kb;
          if constexpr (kF16V) {
            const uint32_t x01 = prmt(wv[kb][0], wv[kb][1], v_sel16[jb]), x23 = prmt(wv[kb][2], wv[kb][3], v_sel16[jb]);
            d[0] = e4m3x2_lo_to_f16x2(x01);
            d[1] = e4m3x2_hi_to_f16x2(x01);
            d[2] = e4m3x2_lo_to_f16x2(x23);
            d[3] = e4m3x2_hi_to_f16x2(x23);
          } else {
            d[0] = raw_pair(wv[kb][0], wv[kb][1], v_sel[2 * jb]);
            d[1] = raw_pair(wv[kb][0], wv[kb][1], v_sel[2 * jb + 1]);
            d[2] = raw_pair(wv[kb][2], wv[kb][3], v_sel[2 * jb]);
            d[3] = raw_pair(wv[kb][2], wv[kb][3], v_sel[2 * jb + 1]);
          }
        }
      if (lg == kGv - 1) ptx::mbar_arrive(&empty[s]);  // this thread's last words of the slot are consumed
      ptx::wgmma_fence_operand(ag);
      ptx::wgmma_fence_operand(o[2 * lg]);
      ptx::wgmma_fence_operand(o[2 * lg + 1]);
      ptx::wgmma_fence();
      const uint64_t dp = ptx::desc_advance(dP, (kDs ? lg : 0) * L::kPBytes);
#pragma unroll
      for (int jb = 0; jb < 2; ++jb)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          const uint32_t ai[4] = {ag[16 * jb + 4 * kb], ag[16 * jb + 4 * kb + 1], ag[16 * jb + 4 * kb + 2],
                                  ag[16 * jb + 4 * kb + 3]};
          if constexpr (kF16V) ptx::wgmma_f16_rs<N>(o[2 * lg + jb], ai, ptx::desc_advance(dp, kb * 32), true);
          else ptx::wgmma_bf16_rs<N>(o[2 * lg + jb], ai, ptx::desc_advance(dp, kb * 32), true);
        }
      ptx::wgmma_commit_group();
    }
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int mb = 0; mb < kOBlocks; ++mb) ptx::wgmma_fence_operand(o[mb]);
    ptx::wgmma_fence_operand(va[0]);
    ptx::wgmma_fence_operand(va[1]);
  }

  // ---- epilogue: split, each warpgroup its own columns; else kernel_small's, warpgroup 1's O^T through ring slot 1
  // (consumer 1's, drained) ----
  auto col_of = [&](int mb, int i) {  // value block mb (the kernel's permuted value rows)
    return 128 * (mb >> 1) + 32 * w + 4 * g8 + 2 * (mb & 1) + ((i >> 1) & 1);
  };
  if constexpr (kSplit) {
    split_epilogue<N>(p, u, o, m_run, l_part, sRed, out_scale, c, wg_bar,
                      [&](int mb, int i) { return col_of(4 * c + mb, i); });
  } else {
    float* xo = reinterpret_cast<float*>(smem + L::kOffRing + L::kSlotBytes);
    small_epilogue<N, L::kXRounds>(p, u, o, m_run, l_part, sRed, sML, xo, out_scale, c, wg_bar, col_of);
  }
}

}  // namespace mla::cuda::decode_sm90
