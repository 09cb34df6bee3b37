// SPDX-License-Identifier: Apache-2.0
#pragma once
// sm90 attention over e4m3-coded rows (fp8 per-tensor rows of mqa_decode, fp8_ds_mla records of mqa_decode and
// sparse_mqa) for N = 8 / 16 / 32 query rows, with no bf16 stage: the raw rows go into a ring of shared-memory slots
// and the consumers build wgmma's A operand in registers straight from the codes (docs/design/attention_sm90.md
// "4. The code-format kernel"). The producer's copies only move bytes and run two tiles ahead per consumer; the
// conversion is spread over the 8 consumer warps (a bf16 stage written by the producers would be bounded by the
// stage cycle and the conversion rate).
// Its parts (shared-memory layout RawTraits, code conversions, Q prologue, producer): raw/parts.cuh.
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
// upconvert of the seesaw kernel. Softmax: the lazy maximum (the consumer loop's comment), exact step on flagged tiles.
//
// Layouts (bank-conflict-free: each load phase's eight lanes hit eight distinct bank groups):
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
// (small/kernel.cuh's), release a slot after their last load from it.
// Epilogue: tile_io.cuh small_epilogue, both warpgroups' scaled O^T staged in ring slot 1 (drained: one unit).
//
// Ping-pong (N 32, and N 16 for sparse_mqa's indexed rows: RawTraitsFor; RawTraits::kPingPong): O^T of all 512
// columns would be 128 registers per thread beside S at N 32 (at N 16 the overlap of one warpgroup's softmax with
// the other's products is the gain where RawTraitsFor chooses it), so
// each warpgroup holds half of it (value groups 2c, 2c + 1: blocks 4c .. 4c + 3, 64 registers) and the two take
// turns on the tiles (tile t in slot t % kSlots): warpgroup c owns tiles t = c, c + 2, ... and computes all of S(t), the
// softmax and P^T(t) of all value groups into its buffer (published on pfull[c] with its lazy-maximum flags and,
// when flagged, its new maximum); both multiply each tile by their value half, so a slot is free after 256
// arrivals. Per own tile t, warpgroup c: S(t); the other's tile t - 1 (wait pfull[c ^ 1], take over its maximum
// and rescale the O half and row sums when it was flagged, P.V(t - 1) left in flight); the softmax of t (its
// reference is t - 1's maximum, known now) beside those products; publish; P.V(t). One softmax per tile, each
// beside the other warpgroup's tensor work. Epilogue: tile_io.cuh pingpong_epilogue (both hold the same m and l,
// each writes its columns). A split by d (both warpgroups on every tile, S split by k-steps, partial scores
// exchanged, both running every softmax) measured slower (docs/LAB.md, code formats at <= 32 rows).
//
// Small-T sparse split (p.cluster_merge, sparse_mqa.cu, core/sparse_split.h): the p.num_splits CTAs of
// a (row tile, token) are one cluster, each attends its share of the token's tiles, both epilogues leave O / l and
// the LSE in the drained ring (slot 0; N 32 into slot 1) instead of out, and cluster_merge.cuh merges them between
// two cluster barriers that every thread of every rank passes (producers after their loop, a tile-less rank whole).
//
// Shared memory (N 16, fp8_ds_mla): Q 18 KiB + 4 slots x 42 KiB + P^T 2 x 4 x 2 KiB + tables = 203 KiB.
// N 32 (fp8_ds_mla): Q 36 KiB + 3 slots x 42 KiB + P^T 2 x 4 x 4 KiB + tables = 194 KiB.
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
#include "cuda/common/ptx/stmatrix.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/attention/sm90/common/acc_frag.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/attention/sm90/raw/parts.cuh"
#include "cuda/attention/sm90/common/source.cuh"
#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/common/trace.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {


// A tile's scores (sv: this thread's elements of S^T, before the softmax scale): chunks j = 0 .. 8 (j 8: the rope),
// raw loads kAhead chunks ahead, A double-buffered; fp8_ds_mla's scale groups in two accumulators in turn, each
// folded into sv with the keys' scales as soon as its chunks retire, the bf16 rope in the first again once group 2
// is folded (sv is never a wgmma accumulator: a non-wgmma write to one while others are in flight serializes them).
template <int N, class L>
__device__ __forceinline__ void whole_scores(float (&sv)[N / 2], const uint8_t* row_lo, const uint8_t* row_hi,
                                             uint64_t dQ, int t4) {
  constexpr bool kDs = L::kDs;
  // fp8_ds_mla: group g and then the rope in buffer g % 2 (the rope: 0), so a group's products retire while the
  // next group's issue. Ping-pong (O half, the other's A operand beside S): one buffer, each group retired before
  // the next starts (the other warpgroup's products keep the tensor pipe busy meanwhile).
  constexpr int kAcc = kDs && !L::kPingPong ? 2 : 1;
  constexpr int kAhead = L::kPingPong ? 1 : 2;  // raw loads ahead (LDS latency; N 32: registers)
  uint32_t a[2][16];
  float sacc[kAcc][N / 2];
  // fp8_ds_mla: sv (+)= scale of group g x its accumulator (buffer g % 2), the scales of this thread's two keys.
  auto fold = [&](int g, float s_lo, float s_hi) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float t = (AccFrag<N>::at_hi(i) ? s_hi : s_lo) * sacc[(kAcc - 1) & g][i];
      sv[i] = g == 0 ? t : sv[i] + t;
    }
  };
  uint4 x[kAhead + 1][2];  // [buffer][lo, hi]: chunk j's 16 bytes of each key
  uint4 xr[2];             // fp8_ds_mla rope: the second 16 bytes (elements 32 + 8 t4 ..) of each key
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
    // fp8_ds_mla, j = 4, 6, 8: group j / 2 - 2 retired (its last chunk two steps ago): fold it, its buffer is next;
    // one buffer: j = 2, 4, 6, 8, group j / 2 - 1 (all products retired first)
    const bool fold_now = kDs && j >= 2 * kAcc && j % 2 == 0;
    const int g_done = j / 2 - kAcc;
    float f_lo = 0.0f, f_hi = 0.0f;
    if (fold_now) {  // its scales, read before the wait (which orders memory)
      f_lo = *reinterpret_cast<const float*>(row_lo + 512 + 4 * g_done);
      f_hi = *reinterpret_cast<const float*>(row_hi + 512 + 4 * g_done);
    }
    if (kAcc == 1 && fold_now) ptx::wgmma_wait_group<0>();
    else if (j >= 2) ptx::wgmma_wait_group<1>();  // chunk j - 2's products retired: its A buffer is free
    if (fold_now) {
      ptx::wgmma_fence_operand(sacc[(kAcc - 1) & g_done]);
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
    float(&d)[N / 2] = sacc[(kAcc - 1) & (j / 2)];
#pragma unroll
    for (int k = 0; k < kAcc; ++k) ptx::wgmma_fence_operand(sacc[k]);
    ptx::wgmma_fence_operand(aj);
    ptx::wgmma_fence();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ks = 4 * j + i;
      const uint32_t ai[4] = {aj[4 * i], aj[4 * i + 1], aj[4 * i + 2], aj[4 * i + 3]};
      // the first k-step into an accumulator initialises it: a group's first chunk, the rope, the first chunk
      const bool accumulate = kDs ? (j < 8 ? (j % 2 != 0 || i > 0) : i > 0) : ks > 0;
      const uint64_t dq = ptx::desc_advance(dQ, (ks >> 2) * L::kQPanelBytes + (ks & 3) * 32);
      if (kDs && j == 8) ptx::wgmma_bf16_rs<N>(d, ai, dq, accumulate);
      else ptx::wgmma_f16_rs<N>(d, ai, dq, accumulate);
    }
    ptx::wgmma_commit_group();
  }
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int k = 0; k < kAcc; ++k) ptx::wgmma_fence_operand(sacc[k]);
  ptx::wgmma_fence_operand(a[0]);
  ptx::wgmma_fence_operand(a[1]);

  if constexpr (kDs) {  // group 3 (buffer 1; one buffer: folded at j = 8), then the rope (buffer 0)
    if constexpr (kAcc == 2)
      fold(3, *reinterpret_cast<const float*>(row_lo + 524), *reinterpret_cast<const float*>(row_hi + 524));
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sv[i] += sacc[0][i];
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sv[i] = sacc[0][i];
  }
}

// The consumer warpgroups of the kernel below (warpgroups 1 and 2; c = warpgroup - 1): one object per thread, its
// members the thread's registers across the unit (the running maximum and sums, O^T, the rows' limits) and the
// fixed addresses of its fragments. The phases, in the order the kernel calls them:
//   prologue   Q from the staged rows into the permuted f16 / bf16 panels (raw/parts.cuh), the rows' state
//   mainloop   per tile: scores (whole_scores), tile_softmax (P^T panels), pv (O^T += V^T P^T); alternate tiles per
//              warpgroup, or the ping-pong turns (kPingPong)
//   epilogue   tile_io.cuh small_epilogue / pingpong_epilogue (out, lse, or the cluster partial)
// Fragments: S^T and O^T through AccFrag<N> (common/acc_frag.cuh); the kernel's key and value permutations
// (the header's "Layouts") in key_lo / key_hi, v_off and col_of.
template <int N, CacheFormat F, class Rows>
struct RawConsumer {
  using T = Traits;
  using L = RawTraitsFor<N, F, Rows>;
  using Frag = AccFrag<N>;  // S^T and O^T fragments: A rows (keys, value columns) x query rows
  static constexpr bool kPingPong = L::kPingPong;  // N 32, N 16 indexed: S by tile parity, P.V by value halves
  static constexpr bool kDs = L::kDs;
  static constexpr int kRows = Frag::kRows;  // query row slots per thread
  static constexpr bool kF16V = !kDs;  // V as f16 through F2FP (fp8); fp8_ds_mla: bf16 (P times a key's scale)
  static constexpr int kOBlocks = kPingPong ? 4 : 8;  // value blocks of O^T this warpgroup holds (ping-pong: 4c ..)
  static constexpr int kGv = kOBlocks / 2;            // value groups (two blocks each) it multiplies
  // The sparse N 16 kernel reads the rows' limits from shared memory too (with the compact epilogue its registers
  // spilled 20 bytes into the tile loop otherwise; a sparse row's limit is its length, so only a token's last,
  // partial tile reads them). Ping-pong (N 32) reads them there: 8 more registers spill otherwise (fp8).
  static constexpr bool kLimsShared = kPingPong || (N == 16 && !Rows::kPaged);

  const Unit u;  // a copy: its fields stay in registers
  uint8_t* smem;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* pfull;  // ping-pong: [warpgroup] its latest tile's P^T (and flag, maximum) published
  int c, ct, w, lane, g8, t4, wg_bar;
  uint8_t* sP;  // P^T of the tiles this warpgroup owns
  float* sRed;
  float* sML;
  int* sLim;
  const uint64_t* sMask;
  uint8_t* sOver;
  // This thread's S rows: A rows rho_lo = 16 w + g8 and rho_hi = rho_lo + 8 hold keys key_lo, key_hi.
  int key_lo, key_hi, rho_lo, rho_hi;
  int v_off[2];
  uint32_t v_sel, v_sel16;
  float m_run[kRows], l_part[kRows];
  float sl2[kRows];  // per row: the softmax scale (log2) times 2^-e of its Q row (fp8: the cache scale too)
  float out_scale;
  uint64_t dQ, dP, dP_other;
  int lims[kRows];
  int lim_min;
  float o[kOBlocks][N / 2];

  __device__ __forceinline__ RawConsumer(const Unit& u_, uint8_t* smem_, uint64_t* full_, uint64_t* empty_,
                                         uint64_t* pfull_)
      : u(u_), smem(smem_), full(full_), empty(empty_), pfull(pfull_) {}

  __device__ __forceinline__ int lim_of(int rr) const { return kLimsShared ? sLim[Frag::row(rr, t4)] : lims[rr]; }
  // Every valid row sees every loaded key of the tile at k0: no per-row limit to apply (the scores), no NaN code to
  // clear (f16 V). Rows past m_rows are never written.
  __device__ __forceinline__ bool is_clean(int k0) const { return min(k0 + T::kBlockN, u.seq_len) - 1 <= lim_min; }
  __device__ __forceinline__ uint8_t* slot_of(int s) const { return smem + L::kOffRing + s * L::kSlotBytes; }

  // Q staged in ring slot kQSlot by the producers (raw/parts.cuh stage_q) into the permuted panels; the thread's
  // fixed fragment addresses; the rows' state before the first tile.
  __device__ __forceinline__ void prologue(const DecodeSm90Params& p, uint64_t* qfull, const uint8_t* q_stage) {
    const MqaRowParams& rp = p.rows;
    c = ptx::warpgroup_index() - 1;
    ct = threadIdx.x - 128;
    w = ptx::warp_idx_in_warpgroup();
    lane = threadIdx.x & 31;
    g8 = lane >> 2;
    t4 = lane & 3;
    wg_bar = 2 + c;
    uint8_t* sQ = smem + L::kOffQ;
    sP = smem + L::kOffP + c * L::kGroups * L::kPBytes;
    sRed = reinterpret_cast<float*>(smem + L::kOffRed) + c * 4 * N;
    sML = reinterpret_cast<float*>(smem + L::kOffML);
    sLim = reinterpret_cast<int*>(smem + L::kOffLim);
    sMask = reinterpret_cast<const uint64_t*>(smem + L::kOffMask);
    const int sig = 2 * (g8 & 3) + (g8 >> 2);
    key_lo = 16 * w + sig;
    key_hi = key_lo + 8;
    rho_lo = 16 * w + g8;
    rho_hi = rho_lo + 8;
    // V: in each 16-key block, this thread's K columns 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 are keys kv[0..3]; its
    // load i reads kv[i ^ (t4 & 1)] (distinct banks over the warp), so pair selectors swap their sources for odd t4.
    const int s0 = 2 * ((2 * t4) & 3) + ((2 * t4) >> 2), s1 = 2 * ((2 * t4 + 1) & 3) + ((2 * t4 + 1) >> 2);
    // Keys kv = (s0, s1, s0 + 8, s1 + 8): loads 2, 3 are loads 0, 1 eight rows on (an immediate offset), so two
    // registers hold the four offsets (bytes in a slot of load i, value group 0).
    v_off[0] = ((t4 & 1) ? s1 : s0) * L::kStride + 4 * (8 * w + g8);
    v_off[1] = ((t4 & 1) ? s0 : s1) * L::kStride + 4 * (8 * w + g8);
    // bf16 V: selector b (byte b of the pair's first key, then of its second, sign-replicated halves) is v_sel +
    // b * 0x1111; f16 V (fp8): bytes b of both keys, then bytes b + 1 of both, as one word for two F2FP (b = 0, 2),
    // v_sel16 + b * 0x1111. One register each (the selectors of a tile are immediates off it).
    v_sel = (t4 & 1) ? raw_sel(4, 0) : raw_sel(0, 4);
    v_sel16 = (t4 & 1) ? (4u | 0u << 4 | 5u << 8 | 1u << 12) : (0u | 4u << 4 | 1u << 8 | 5u << 12);

    uint32_t* sAmax = reinterpret_cast<uint32_t*>(smem + L::kOffAmax);
    float* sQf = reinterpret_cast<float*>(smem + L::kOffQf);
    sOver = smem + L::kOffOver;
    if (ct < N) {
      sLim[ct] = query_row_limit(p, u, u.row0 + ct);
      sAmax[ct] = 0;
    }
    ptx::mbar_wait(qfull, 0);  // Q's rows staged in slot kQSlot (raw/parts.cuh stage_q)
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    q_row_amax<N>(q_stage, sAmax, ct);
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    store_q_permuted<N, kDs>(q_stage, sQ, sAmax, sQf, ct);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kConsumerBarrier, T::kConsumerThreads);
    // the staged rows are read: the slot goes to its first tile
    if (kPingPong || c == 1) ptx::mbar_arrive(&empty[L::kQSlot]);
    MLA_DECODE_TRACE_EVENT(3, 128);

#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      m_run[rr] = -INFINITY;
      l_part[rr] = 0.0f;
    }
    // S: Q's rows carry 2^e (q_row_exponent), undone per row with the softmax scale (and fp8's cache scale);
    // O, fp8_ds_mla: 2^64 undoes V's 2^-120 and P's 2^56.
    constexpr float kUndo = 0x1p64f;
    const float scale_log2 = kDs ? rp.scale_log2 : rp.scale_log2 * p.gather.scale;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) sl2[rr] = scale_log2 * sQf[Frag::row(rr, t4)];
    // fp8's V is f16 (exact codes) against P times 2^7: O carries 2^7 instead of 2^64.
    out_scale = kDs ? kUndo : p.gather.scale * 0x1p-7f;
    dQ = ptx::desc_sw128_k_major(sQ);
    dP = ptx::desc_sw128_k_major(sP);
    // ping-pong: the other warpgroup's P^T buffer
    dP_other = ptx::desc_sw128_k_major(smem + L::kOffP + (c ^ 1) * L::kGroups * L::kPBytes);
    // The rows' last visible key (causal, length), in registers: off the scores' latency chain (read on tiles that
    // are not clean only; kLimsShared: from shared memory).
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) lims[rr] = sLim[Frag::row(rr, t4)];
    // f16 V turns a NaN code into NaN, and NaN * (P = 0) is NaN: a loaded key that some valid row must not see (the
    // causal limits of s_q > 1) would poison that row. Such tiles (`clean` false; the last one or two of a request)
    // first turn NaN codes into 448: rows that see the key are NaN through their score already (S reads the codes
    // as they are), the others multiply a finite value by 0. Keys past seq_len are never loaded.
    lim_min = 0x7fffffff;
    for (int n = 0; n < N; ++n)
      if (u.row0 + n < u.m_rows) lim_min = min(lim_min, sLim[n]);
#pragma unroll
    for (int mb = 0; mb < kOBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) o[mb][i] = 0.0f;
  }

  // ---- tile_softmax: the softmax of a tile this warpgroup owns: sv (its scores, before the softmax scale) to
  // P^T panels at sP (all kGroups; fp8_ds_mla times the keys' scales, read from the slot). Returns whether the
  // tile was flagged (the exact step ran: m_run moved). Ping-pong: the other's tile's products may be in flight
  // into O, retired before a rescale of O. `own`: the warpgroup's own tile count so far (its flags' buffer
  // parity). ----
  __device__ __forceinline__ bool tile_softmax(float (&sv)[N / 2], const uint8_t* slot, uint64_t mask, int k0,
                                               int own) {
    // The scores leave this step relative to the running maximum: sv = s * scale - m_run (+ 7 for fp8, whose P^T is
    // f16 times 2^7: exp2 of it is the stored weight), one FFMA each; a masked score is -inf. `nb` is that shift
    // per row (-inf before the first key counts as 0 there, as the exact step's reference does).
    constexpr float kPExp = kF16V ? 7.0f : 0.0f;
    auto shift_of = [&](int rr) { return kPExp - (m_run[rr] == -INFINITY ? 0.0f : m_run[rr]); };
    const bool in_lo = (mask >> key_lo) & 1, in_hi = (mask >> key_hi) & 1;
    if (is_clean(k0)) {  // uniform: only the key mask (most tiles)
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int i = Frag::lo(rr), j = Frag::hi(rr);  // sv[i]: (key_lo, row rr), sv[j]: (key_hi, row rr)
        const float sl = sl2[rr], nb = shift_of(rr);
        sv[i] = in_lo ? fmaf(sv[i], sl, nb) : -INFINITY;
        sv[j] = in_hi ? fmaf(sv[j], sl, nb) : -INFINITY;
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int i = Frag::lo(rr), j = Frag::hi(rr);
        const int lim = lim_of(rr);
        const float sl = sl2[rr], nb = shift_of(rr);
        sv[i] = in_lo && k0 + key_lo <= lim ? fmaf(sv[i], sl, nb) : -INFINITY;
        sv[j] = in_hi && k0 + key_hi <= lim ? fmaf(sv[j], sl, nb) : -INFINITY;
      }
    }
    float sc_lo[L::kGroups], sc_hi[L::kGroups];  // fp8_ds_mla: this thread's keys' scales (P^T's panels)
#pragma unroll
    for (int gi = 0; gi < L::kGroups; ++gi) {
      sc_lo[gi] = kDs ? *reinterpret_cast<const float*>(slot + key_lo * L::kStride + 512 + 4 * gi) : 1.0f;
      sc_hi[gi] = kDs ? *reinterpret_cast<const float*>(slot + key_hi * L::kStride + 512 + 4 * gi) : 1.0f;
    }
    // P^T [n][rho], rho at chunk rho / 8: fp8 f16 times 2^7; fp8_ds_mla bf16 times 2^56 and, per panel, the key's
    // scale of that group. N 16 / 32: stmatrix, transposed — the thread's (key, rows n, n + 1) pairs are the
    // fragment of the 8 x 8 matrices (j, half) = (rows 8j .. 8j + 7, keys 16 w + 8 half + g8), stored as P^T rows
    // 8j + .. of 16 bytes at chunk 2 w + half (one STSM per four matrices instead of eight 16-bit stores). N 8
    // (two matrices): one 16-bit store per value, one conversion for both keys.
    // `scaled`: fp8's weights already carry 2^7 (the lazy step's exponent); the exact step's do not.
    auto store_pt = [&](const float (&pl)[kRows], const float (&ph)[kRows], bool scaled) {
#pragma unroll
      for (int gi = 0; gi < L::kGroups; ++gi) {
        uint8_t* pp = sP + gi * L::kPBytes;
        const float f16f = scaled ? 1.0f : 0x1p7f;
        const float f_lo = kF16V ? f16f : 0x1p56f * sc_lo[gi], f_hi = kF16V ? f16f : 0x1p56f * sc_hi[gi];
        auto pack = [&](float x, float y) { return kF16V ? ptx::pack_f16x2(x, y) : ptx::pack_bf16x2(x, y); };
        if constexpr (N >= 16) {
#pragma unroll
          for (int sm = 0; sm < N / 16; ++sm) {  // matrices i: j = 2 sm + i / 2, half = i % 2
            uint32_t r[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int j = 2 * sm + (i >> 1);
              r[i] = (i & 1) ? pack(ph[2 * j] * f_hi, ph[2 * j + 1] * f_hi) : pack(pl[2 * j] * f_lo, pl[2 * j + 1] * f_lo);
            }
            const int mi = lane >> 3;  // this lane's row address: row lane % 8 of matrix mi
            ptx::stmatrix_x4_trans(pp + swz(8 * (2 * sm + (mi >> 1)) + (lane & 7), 2 * w + (mi & 1)), r);
          }
        } else {
#pragma unroll
          for (int rr = 0; rr < kRows; ++rr) {
            const int n = Frag::row(rr, t4);
            const uint32_t pk = pack(pl[rr] * f_lo, ph[rr] * f_hi);
            *reinterpret_cast<uint16_t*>(pp + swz(n, rho_lo >> 3) + 2 * (rho_lo & 7)) = static_cast<uint16_t>(pk);
            *reinterpret_cast<uint16_t*>(pp + swz(n, rho_hi >> 3) + 2 * (rho_hi & 7)) = static_cast<uint16_t>(pk >> 16);
          }
        }
      }
    };
    // Lazy maximum: the weights are taken against the running maximum m_run as it stands, with no exchange of
    // the tile's maxima, unless some score exceeds it by more than 2^kLazyLog2 (then p could overflow the
    // headroom): each warp flags that, the flags ride on the P^T barrier, and a flagged tile (the first of a
    // unit, a jump of the maximum; uniform over the warpgroup) redoes the exact step (small_tile_softmax, O's
    // rescale) and P^T. Weights up to 2^8 leave bf16 P (times 2^56 and a scale), f16 P (times 2^7: <= 2^15) and
    // the fp32 sums in range; O and l share the reference, so out = O / l and lse = m + log l are unchanged.
    constexpr float kLazyLog2 = 8.0f;
    float p_lo[kRows], p_hi[kRows];
    bool over = false;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int i = Frag::lo(rr), j = Frag::hi(rr);
      // -inf before the first key: every finite score is over
      const float top = m_run[rr] == -INFINITY ? -INFINITY : kLazyLog2 + kPExp;
      over |= sv[i] > top || sv[j] > top;  // NaN scores are not over: they turn their row NaN either way
      p_lo[rr] = softmax::exp2_approx(sv[i]);
      p_hi[rr] = softmax::exp2_approx(sv[j]);
    }
    const bool warp_over = __any_sync(0xffffffffu, over);
    // This warpgroup's flags of its own tile `own` (ping-pong: the other warpgroup reads them too).
    uint8_t* over_flags = sOver + 8 * (own & 1) + 4 * c;
    if (lane == 0) over_flags[w] = warp_over ? 1 : 0;
    store_pt(p_lo, p_hi, true);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(wg_bar, 128);
    const bool flagged = *reinterpret_cast<const uint32_t*>(over_flags) != 0;
    if (flagged) {  // the exact step (rare after the first tile)
      float alpha[kRows];
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {  // the scores again (s * scale; to within the FFMA's rounding)
        const int i = Frag::lo(rr), j = Frag::hi(rr);
        const float nb = shift_of(rr);
        sv[i] -= nb;
        sv[j] -= nb;
      }
      small_tile_softmax<N>(sv, m_run, l_part, alpha, p_lo, p_hi, sRed, w, g8, t4, wg_bar);
      store_pt(p_lo, p_hi, false);
      if constexpr (kPingPong) {
        ptx::wgmma_wait_group<0>();
#pragma unroll
        for (int mb = 0; mb < kOBlocks; ++mb) ptx::wgmma_fence_operand(o[mb]);
      }
      small_rescale_o<N, kOBlocks>(o, alpha);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(wg_bar, 128);
    } else {
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) l_part[rr] += (p_lo[rr] + p_hi[rr]) * (kF16V ? 0x1p-7f : 1.0f);
    }
    return flagged;
  }

  // ---- pv: O^T += V^T P^T for this warpgroup's value groups of the tile in slot s (P^T panels at dPb): value group
  // gv = blocks 2 gv, 2 gv + 1, one word per key and group. Releases the slot after its last load; the products
  // are left in flight (the caller retires them). ----
  __device__ __forceinline__ void pv(const uint8_t* slot, uint64_t dPb, bool clean, int s) {
    // A buffers of kJb value blocks each (one commit group), double-buffered. Ping-pong: one block per buffer,
    // as sv of the next tile is live beside O (two-block buffers there serialized the wgmmas: ptxas C7512).
    constexpr int kJb = kPingPong ? 1 : 2;
    uint32_t va[2][16 * kJb];
#pragma unroll
    for (int lg = 0; lg < kGv; ++lg) {
      const int gv = kPingPong ? 2 * c + lg : lg;  // ping-pong: warpgroup c's value groups 2c, 2c + 1
      uint32_t wv[4][4];  // [16-key block][load i]
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          wv[kb][i] = *reinterpret_cast<const uint32_t*>(slot + (16 * kb + 8 * (i >> 1)) * L::kStride + v_off[i & 1] + 128 * gv);
      if (kF16V && !clean) {  // NaN codes to 448 (see `clean`)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
#pragma unroll
          for (int i = 0; i < 4; ++i) wv[kb][i] &= ~((nan_bytes(wv[kb][i]) & 0x80808080u) >> 7);
      }
      const uint64_t dp = ptx::desc_advance(dPb, (kDs ? gv : 0) * L::kPBytes);
#pragma unroll
      for (int h = 0; h < 2 / kJb; ++h) {
        const int q = lg * (2 / kJb) + h;          // commit group
        if (q >= 2) ptx::wgmma_wait_group<1>();   // group q - 2's products retired: its A buffer is free
        uint32_t(&ag)[16 * kJb] = va[q & 1];
        ptx::wgmma_fence_operand(ag);
#pragma unroll
        for (int jj = 0; jj < kJb; ++jj)    // value block 2 gv + jb: bytes 2 jb (rows g8) and 2 jb + 1 (rows g8 + 8)
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {  // (wv[kb][0], wv[kb][1]): columns 2 t4, 2 t4 + 1; (2, 3): + 8
            const int jb = h * kJb + jj;
            uint32_t* d = ag + 16 * jj + 4 * kb;
            if constexpr (kF16V) {
              const uint32_t x01 = prmt(wv[kb][0], wv[kb][1], v_sel16 + 0x2222u * jb), x23 = prmt(wv[kb][2], wv[kb][3], v_sel16 + 0x2222u * jb);
              d[0] = e4m3x2_lo_to_f16x2(x01);
              d[1] = e4m3x2_hi_to_f16x2(x01);
              d[2] = e4m3x2_lo_to_f16x2(x23);
              d[3] = e4m3x2_hi_to_f16x2(x23);
            } else {
              d[0] = raw_pair(wv[kb][0], wv[kb][1], v_sel + 0x2222u * jb);
              d[1] = raw_pair(wv[kb][0], wv[kb][1], v_sel + 0x2222u * jb + 0x1111u);
              d[2] = raw_pair(wv[kb][2], wv[kb][3], v_sel + 0x2222u * jb);
              d[3] = raw_pair(wv[kb][2], wv[kb][3], v_sel + 0x2222u * jb + 0x1111u);
            }
          }
        if (lg == kGv - 1 && h == 2 / kJb - 1) ptx::mbar_arrive(&empty[s]);  // this thread's last words of the slot
        ptx::wgmma_fence_operand(ag);
#pragma unroll
        for (int jj = 0; jj < kJb; ++jj) ptx::wgmma_fence_operand(o[2 * lg + h * kJb + jj]);
        ptx::wgmma_fence();
#pragma unroll
        for (int jj = 0; jj < kJb; ++jj)
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            const uint32_t ai[4] = {ag[16 * jj + 4 * kb], ag[16 * jj + 4 * kb + 1], ag[16 * jj + 4 * kb + 2],
                                    ag[16 * jj + 4 * kb + 3]};
            float(&acc)[N / 2] = o[2 * lg + h * kJb + jj];
            if constexpr (kF16V) ptx::wgmma_f16_rs<N>(acc, ai, ptx::desc_advance(dp, kb * 32), true);
            else ptx::wgmma_bf16_rs<N>(acc, ai, ptx::desc_advance(dp, kb * 32), true);
          }
        ptx::wgmma_commit_group();
      }
    }
  }

  __device__ __forceinline__ void retire_o() {
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int mb = 0; mb < kOBlocks; ++mb) ptx::wgmma_fence_operand(o[mb]);
  }

  // ---- the tiles of the unit; the products of the last are retired on return ----
  __device__ __forceinline__ void mainloop() {
    if constexpr (!kPingPong) {
      // ---- alternate tiles: tile it is warpgroup it % 2's, all of it ----
      for (int it = c; it < u.n_tiles; it += 2) {
        const int s = it % L::kSlots;
        const int k0 = u.key_begin + it * T::kBlockN;
        ptx::mbar_wait(&full[s], (it / L::kSlots) & 1);
        MLA_DECODE_TRACE_EVENT(4, 128, true);
        const uint8_t* slot = slot_of(s);
        float sv[N / 2];
        whole_scores<N, L>(sv, slot + key_lo * L::kStride, slot + key_hi * L::kStride, dQ, t4);
        tile_softmax(sv, slot, sMask[s], k0, it >> 1);
        pv(slot, dP, is_clean(k0), s);
        retire_o();
      }
    } else {
      // ---- ping-pong: warpgroup c owns tiles t = c, c + 2, ... (S, softmax, P^T of all value groups into its
      // buffer, published on pfull[c]); between its S(t) and its softmax of t it multiplies the other's tile t - 1
      // (P^T from the other's buffer) by its value half, after taking over that tile's maximum when flagged. The
      // softmaxes form a chain through the two warpgroups (tile t's reference is t - 1's maximum); each runs beside
      // the other warpgroup's products. Buffer c is rewritten at tile t + 2 only after the other published t + 1,
      // which it does after its products of tile t retired, and its flags / maximum likewise. ----
      float* pub_m = sML + c * 2 * N;             // the running maximum after a flagged own tile
      const float* other_m = sML + (c ^ 1) * 2 * N;
      for (int t = c;; t += 2) {
        const bool own = t < u.n_tiles, other = t >= 1 && t <= u.n_tiles;
        if (!own && !other) break;
        const int s = t % L::kSlots;
        const int k0 = u.key_begin + t * T::kBlockN;
        float sv[N / 2];
        if (own) {
          ptx::mbar_wait(&full[s], (t / L::kSlots) & 1);
          MLA_DECODE_TRACE_EVENT(4, 128, true);
          whole_scores<N, L>(sv, slot_of(s) + key_lo * L::kStride, slot_of(s) + key_hi * L::kStride, dQ, t4);
        }
        if (other) {  // the other warpgroup's tile r = t - 1
          const int r = t - 1, sr = r % L::kSlots;
          ptx::mbar_wait(&pfull[c ^ 1], (r >> 1) & 1);
          ptx::mbar_wait(&full[sr], (r / L::kSlots) & 1);  // the slot's rows, visible to this warpgroup too
          if (*reinterpret_cast<const uint32_t*>(sOver + 8 * ((r >> 1) & 1) + 4 * (c ^ 1)) != 0) {
            // r moved the running maximum: this warpgroup's O half and row sums go to the new reference (the same
            // alpha the owner applied: the same m before and after)
            float alpha[kRows];
#pragma unroll
            for (int rr = 0; rr < kRows; ++rr) {
              const float nm = other_m[Frag::row(rr, t4)];
              alpha[rr] = nm == -INFINITY ? 1.0f : softmax::exp2_approx(m_run[rr] - nm);
              m_run[rr] = nm;
              l_part[rr] *= alpha[rr];
            }
            small_rescale_o<N, kOBlocks>(o, alpha);
          }
          pv(slot_of(sr), dP_other, is_clean(u.key_begin + r * T::kBlockN), sr);
          if (!own) retire_o();
        }
        if (own) {
          const bool flagged = tile_softmax(sv, slot_of(s), sMask[s], k0, t >> 1);
          if (other) retire_o();  // tile r's products: the other may rewrite its P^T once this tile is published
          if (flagged && w == 0 && g8 == 0) {
#pragma unroll
            for (int rr = 0; rr < kRows; ++rr) pub_m[Frag::row(rr, t4)] = m_run[rr];
          }
          ptx::mbar_arrive(&pfull[c]);  // P^T (fenced for the async proxy in tile_softmax), flags, maximum
          pv(slot_of(s), dP, is_clean(k0), s);
        }
        retire_o();
      }
    }
  }

  // ---- ping-pong, each warpgroup its own columns; else kernel_small's, O staged in ring slot 1 (drained) ----
  __device__ __forceinline__ void epilogue(const DecodeSm90Params& p, float* part_o, float* part_lse) {
    auto col_of = [&](int mb, int i) {  // value block mb (the kernel's permuted value rows)
      return 128 * (mb >> 1) + 32 * w + 4 * g8 + 2 * (mb & 1) + (Frag::at_hi(i) ? 1 : 0);
    };
    if constexpr (kPingPong) {
      pingpong_epilogue<N>(p, u, o, m_run, l_part, reinterpret_cast<float*>(smem + L::kOffRed), out_scale, c, wg_bar,
                           [&](int mb, int i) { return col_of(4 * c + mb, i); }, part_o, part_lse);
    } else {
      float* xo = reinterpret_cast<float*>(smem + L::kOffRing + L::kSlotBytes);
      small_epilogue<N, L::kStageRows>(p, u, o, m_run, l_part, sRed, sML, xo, out_scale, c, wg_bar, col_of, part_o,
                                       part_lse);
    }
  }
};

// Rows: PagedRows (mqa_decode, the uniform split-KV schedule's one unit per CTA) or IndexedRows (sparse_mqa).
template <int N, CacheFormat F, class Rows>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_sm90_raw_kernel(const __grid_constant__ CUtensorMap map, const DecodeSm90Params p) {
  using T = Traits;
  using L = RawTraitsFor<N, F, Rows>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + L::kSlots;
  MLA_DECODE_TRACE_EVENT(0, 0);
  ptx::launch_dependents();  // the combine (a dependent launch) may take the SMs this grid leaves free
  ptx::grid_dependency_wait();  // PDL (cuda/common/launch.h): nothing global before it
  const Unit u(p, !Rows::kPaged);
  // p.cluster_merge (sparse_mqa, small T): the p.num_splits CTAs of a token are one cluster, each rank attends its
  // share of the token's tiles and leaves its normalised rows and LSE in ring slot 0 (drained by then; N 32's rows
  // run into slot 1, free there: ping-pong has no exchange buffer); cluster_merge.cuh merges them into out / lse
  // between two cluster barriers that every thread of every rank passes (an empty rank too).
  // mqa_decode (paged rows) never merges in a cluster here: its code carries none of it (kSplit false).
  constexpr bool kSplit = !Rows::kPaged;
  const bool merge = kSplit && p.cluster_merge;
  float* part_o = merge ? reinterpret_cast<float*>(smem + L::kOffRing) : nullptr;
  float* part_lse = part_o != nullptr ? part_o + N * ClusterMerge::kRowFloats : nullptr;
  const uint32_t part_lse_off = N * ClusterMerge::kRowFloats * 4;
  static_assert(N * ClusterMerge::kRowFloats * 4 + N * 4 <= (L::kPingPong ? 2 : 1) * L::kSlotBytes,
                "the cluster partial fits in the ring slots the epilogue leaves free");
  if (u.n_tiles == 0) {  // uniform over the CTA
    if (part_o != nullptr) {  // this rank contributes LSE -inf (its O is not read) and merges its columns
      if (threadIdx.x < N) part_lse[threadIdx.x] = -INFINITY;
      cluster_merge_protocol(p, u, reinterpret_cast<const uint8_t*>(part_o), static_cast<int>(threadIdx.x) - 128,
                             T::kConsumerThreads, part_lse_off);
      return;
    }
    write_empty_unit(p, u, threadIdx.x, blockDim.x);
    return;
  }
  uint64_t* qfull = empty + L::kSlots;
  uint64_t* pfull = qfull + 1;  // ping-pong: [warpgroup] its latest tile's P^T (and flag, maximum) published
  uint8_t* q_stage = smem + L::kOffRing + L::kQSlot * L::kSlotBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kSlots; ++s) {
      ptx::mbar_init(&full[s], L::kFullArrivals);
      ptx::mbar_init(&empty[s], L::kEmptyArrivals);
    }
    ptx::mbar_init(qfull, 128);
    ptx::mbar_init(&pfull[0], 128);
    ptx::mbar_init(&pfull[1], 128);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<L::kProducerRegs>();
    MLA_DECODE_TRACE_EVENT(1, 0);
    stage_q<L>(p, u, q_stage, qfull, static_cast<int>(threadIdx.x));
    produce_raw<L, Rows>(p, u, smem, &map, ptx::warp_idx_in_warpgroup(), static_cast<int>(threadIdx.x & 31));
    ptx::cp_async_commit();  // no lane leaves with copies in flight
    ptx::cp_async_wait<0>();
    MLA_DECODE_TRACE_EVENT(2, 0);
    if (merge) cluster_merge_pass();  // the merge's two barriers (the consumers merge)
    return;
  }
  ptx::setmaxnreg_inc<(504 - L::kProducerRegs) / 2>();
  RawConsumer<N, F, Rows> cons(u, smem, full, empty, pfull);
  cons.prologue(p, qfull, q_stage);
  cons.mainloop();
  MLA_DECODE_TRACE_EVENT(5, 128);
  cons.epilogue(p, part_o, part_lse);
  MLA_DECODE_TRACE_EVENT(6, 128);
  if (part_o != nullptr) {  // the partial's ordinary stores are released by the first cluster barrier
    cluster_merge_protocol(p, u, reinterpret_cast<const uint8_t*>(part_o), cons.ct, T::kConsumerThreads,
                           part_lse_off);
  }
  MLA_DECODE_TRACE_EVENT(7, 128);
}

}  // namespace mla::cuda::decode_sm90
