// SPDX-License-Identifier: Apache-2.0
#pragma once
// Top-k per row (docs/INDEXER.md §4): one CTA of 1024 threads per row, exact radix select on the
// 32-bit order key of core/indexer_math.h (larger key first; NaN -> 0), then one ordered output pass.
//
//   rows with len <= k: positions 0..len-1 then -1 (no select).
//   select: three histogram passes over the row (bits 31..21, 20..10, 9..0; 2048 / 2048 / 1024 bins in
//     shared memory), each counting only the keys that match the prefix chosen so far; warps aggregate
//     equal bins with __match_any_sync before the shared atomic (logits share their top bits, so a plain
//     atomic per element would serialise on a few bins). A block-wide scan over the bins from the top
//     finds the bin holding the remaining-th largest key. After the passes: thr = the k-th largest key,
//     need = how many keys equal to thr are taken (the lowest positions: the tie rule).
//   output: chunks of 1024 x 4 consecutive positions; per thread (#greater, #equal) packed in one int,
//     one block exclusive scan gives each position its output slot = #selected before it, so positions
//     come out ascending; the rest of the row is -1.
// Loads: each thread keeps kUnroll independent loads in flight (a row is read 4 times; one CTA per row).
// Shared memory: 8 KiB histogram + 32 warp sums.
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/indexer/params.h"

namespace mla::cuda::indexer {

constexpr int kTopkThreads = 1024;
constexpr int kTopkUnroll = 8;

// Exclusive prefix sum of v over the CTA (thread order) and the total; `warp_sums` holds 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kTopkThreads / 32 ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    warp_sums[lane] = w;  // inclusive
  }
  __syncthreads();
  const int before = warp == 0 ? 0 : warp_sums[warp - 1];
  total = warp_sums[kTopkThreads / 32 - 1];
  __syncthreads();  // warp_sums may be reused by the next scan
  return before + x - v;
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const TopkParams p) {
  __shared__ int hist[2048];
  __shared__ int warp_sums[32];
  __shared__ int sel_bin, sel_above;
  const int tid = threadIdx.x, lane = tid % 32;
  const int64_t row = blockIdx.x;
  int64_t start = 0, end = 0;
  if (p.seq_lens != nullptr) {
    end = static_cast<int64_t>(p.seq_lens[(row / p.s_q) * p.sl_stride]) - p.s_q + row % p.s_q + 1;
  } else {
    start = p.row_starts != nullptr ? p.row_starts[row * p.rs_stride] : 0;
    end = p.row_ends[row * p.re_stride];
  }
  start = start < 0 ? 0 : start;
  end = end > p.n_cols ? p.n_cols : end;
  const int64_t len = end > start ? end - start : 0;
  int32_t* out = p.out + row * p.out_row;
  const int64_t K = p.k;
  if (len <= K) {
    for (int64_t j = tid; j < K; j += kTopkThreads) out[j] = j < len ? static_cast<int32_t>(j) : -1;
    return;
  }
  const float* x = p.logits + row * p.lg_row + start;
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = K;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass == 2 ? 1024 : 2048;
    for (int i = tid; i < 2048; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t base = 0; base < len; base += int64_t{kTopkThreads} * kTopkUnroll) {
      float v[kTopkUnroll];
#pragma unroll
      for (int e = 0; e < kTopkUnroll; ++e) {
        const int64_t i = base + e * kTopkThreads + tid;
        v[e] = i < len ? x[i] : 0.0f;
      }
#pragma unroll
      for (int e = 0; e < kTopkUnroll; ++e) {
        const int64_t i = base + e * kTopkThreads + tid;
        int bin = -1;
        if (i < len) {
          const uint32_t key = mla::indexer::topk_key(v[e]);
          if ((key & mask) == prefix) bin = static_cast<int>((key >> shift) & static_cast<uint32_t>(nb - 1));
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    // Bins from the top: thread tid owns bins nb-1-(tid*per) .. nb-per-(tid*per).
    const int per = nb / kTopkThreads;
    int local = 0;
    for (int e = 0; e < per; ++e) local += hist[nb - 1 - (tid * per + e)];
    int total = 0;
    int above = block_exclusive_scan(local, warp_sums, total);
    for (int e = 0; e < per; ++e) {
      const int bin = nb - 1 - (tid * per + e), h = hist[bin];
      if (above < remaining && above + h >= remaining) {
        sel_bin = bin;
        sel_above = above;
      }
      above += h;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sel_bin) << shift;
    mask |= static_cast<uint32_t>(nb - 1) << shift;
    remaining -= sel_above;
    __syncthreads();  // sel_* and hist are rewritten by the next pass
  }
  const uint32_t thr = prefix;
  const int64_t need = remaining;  // keys equal to thr to take, lowest positions first
  int64_t run_gt = 0, run_eq = 0;
  constexpr int kPer = 4;
  for (int64_t base = 0; base < len; base += int64_t{kTopkThreads} * kPer) {
    uint32_t key[kPer];
    int gt = 0, eq = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = base + tid * kPer + e;
      key[e] = i < len ? mla::indexer::topk_key(x[i]) : 0u;
      const bool in = i < len;
      gt += in && key[e] > thr;
      eq += in && key[e] == thr;
    }
    int total = 0;
    const int excl = block_exclusive_scan(gt | (eq << 16), warp_sums, total);
    int64_t gtb = run_gt + (excl & 0xffff), eqb = run_eq + (excl >> 16);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = base + tid * kPer + e;
      if (i >= len) break;
      if (key[e] > thr) {
        out[gtb + (eqb < need ? eqb : need)] = static_cast<int32_t>(i);
        ++gtb;
      } else if (key[e] == thr) {
        if (eqb < need) out[gtb + eqb] = static_cast<int32_t>(i);
        ++eqb;
      }
    }
    run_gt += total & 0xffff;
    run_eq += total >> 16;
  }
}

}  // namespace mla::cuda::indexer
