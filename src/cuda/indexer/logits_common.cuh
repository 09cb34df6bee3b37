#pragma once
// Pieces shared by the two logits kernels (logits_sm90.cuh, logits_portable.cuh): a row's visible key
// range and the address of key j of a row (contiguous K or paged cache).
#include <cstdint>

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
