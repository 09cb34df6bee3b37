// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pieces shared by the logits kernels (logits_sm90.cuh, logits_tma.cuh, logits_portable.cuh): a row's
// visible key range, the address of key j of a row (contiguous K or paged cache), the sm90 kernels' tile
// span and wgmma epilogue.
#include <cstdint>

#include "core/indexer_math.h"
#include "cuda/indexer/cache_addr.cuh"
#include "cuda/indexer/params.h"

namespace mla::cuda::indexer {

// Keys [lo, hi) that row t sees, clipped to the logits width and (paged) to the block table.
__device__ __forceinline__ void row_range(const LogitsParams& p, int64_t t, int64_t& lo, int64_t& hi) {
  if (p.paged) {
    lo = 0;
    hi = static_cast<int64_t>(p.seq_lens[(t / p.s_q) * p.sl_stride]) - p.s_q + t % p.s_q + 1;
    const int64_t cap = p.max_blocks * p.cache.page_size;
    hi = hi < cap ? hi : cap;
  } else {
    lo = p.row_starts[t * p.rs_stride];
    hi = p.row_ends[t * p.re_stride];
    lo = lo < 0 ? 0 : lo;
  }
  hi = hi < p.n_cols ? hi : p.n_cols;
  if (hi < lo) hi = lo;
}

// The 64-key tiles from c0 that cover the rows' union [ulo, uhi) of chunk [c0, c1): [t_begin, t_end), the
// last clipped to c1, empty when the union is; the chunk's columns outside them are -inf in the rows
// [row0, row0 + nrows) (written by threads tid of nthreads). Both sm90 kernels.
__device__ __forceinline__ void tile_span(const LogitsParams& p, int64_t row0, int nrows, int64_t c0, int64_t c1,
                                          int64_t ulo, int64_t uhi, int tid, int nthreads, int64_t& t_begin,
                                          int64_t& t_end) {
  constexpr int64_t kTile = 64;
  t_begin = t_end = c0;
  if (uhi > ulo) {
    t_begin = c0 + (ulo - c0) / kTile * kTile;
    t_end = c0 + (uhi - c0 + kTile - 1) / kTile * kTile;
    t_end = t_end < c1 ? t_end : c1;
  }
  const float ninf = -__int_as_float(0x7f800000);
  for (int g = 0; g < nrows; ++g) {
    float* out = p.logits + (row0 + g) * p.out_row;
    for (int64_t c = c0 + tid; c < t_begin; c += nthreads) out[c] = ninf;
    for (int64_t c = t_end + tid; c < c1; c += nthreads) out[c] = ninf;
  }
}

// The epilogue of one query row over a 64-key tile, for the thread that holds D[key r0][heads 8j + 2t,
// +1] in d[4j], d[4j + 1] and D[key r1][...] in d[4j + 2], d[4j + 3] (wgmma m64n64 layout): the sums
// sum_h w[h] * relu_nan(D[key][h] * scale) of keys r0 (x) and r1 (y) over the quad's 4 lanes (16 heads
// each). weight(j) = the float2 of heads 8j + 2t, +1. Both sm90 kernels.
template <class Weight>
__device__ __forceinline__ float2 quad_logits(const float (&d)[32], float s0, float s1, Weight&& weight) {
  float part0 = 0.0f, part1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 w = weight(j);
    part0 += w.x * mla::indexer::relu_nan(d[4 * j] * s0) + w.y * mla::indexer::relu_nan(d[4 * j + 1] * s0);
    part1 += w.x * mla::indexer::relu_nan(d[4 * j + 2] * s1) + w.y * mla::indexer::relu_nan(d[4 * j + 3] * s1);
  }
  part0 += __shfl_xor_sync(0xffffffffu, part0, 1);
  part0 += __shfl_xor_sync(0xffffffffu, part0, 2);
  part1 += __shfl_xor_sync(0xffffffffu, part1, 1);
  part1 += __shfl_xor_sync(0xffffffffu, part1, 2);
  return make_float2(part0, part1);
}

// Codes and scale of key j for rows of request `req` (paged) / of the contiguous K. A key whose block id
// lies outside the cache is never read: codes = nullptr (the kernels give it a NaN scale, so its logit
// is NaN).
struct KeyAddr {
  const uint8_t* codes;
  const float* scale;
};
__device__ __forceinline__ KeyAddr key_addr(const LogitsParams& p, int64_t req, int64_t j) {
  if (!p.paged) return {p.k + j * p.k_row, p.k_scale + j * p.k_scale_stride};
  const int32_t ps = p.cache.page_size, jj = static_cast<int32_t>(j);  // positions < 2^31 (int32 seq_lens)
  const int64_t block = p.block_table[req * p.bt_row + jj / ps];
  if (block < 0 || block >= p.cache.num_blocks) return {nullptr, nullptr};
  const int64_t off = jj % ps;
  return {codes_ptr(p.cache, block, off), scale_ptr(p.cache, block, off)};
}

}  // namespace mla::cuda::indexer
