// SPDX-License-Identifier: Apache-2.0
#pragma once
// convert_topk_indices (semantics §11.3): request-local top-k positions -> flat cache rows
// (block_table[req][idx / page] * block_stride_rows + idx % page) or prefill-workspace rows
// (starts[pid] + idx, no block-table bound check [PIN]); -1 for invalid entries and for positions
// whose block lies outside the table. Same arithmetic as the CPU backend (64-bit, then the int32
// output), and the valid count is the number of non-negative 64-bit results.
//
// Device-side guards the CPU front end turns into errors: a req_id outside the table's rows or a
// prefill id outside the starts vector makes the whole row -1 (nothing outside the inputs is read).
//
// One block per token row; each thread converts chunks of 4 consecutive entries (16-byte loads and
// stores when aligned), then the block sums its valid count with warp shuffles.
#include <cstdint>

#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/index/params.h"

namespace mla::cuda::index {

template <bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads) convert_topk_kernel(TopkParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int64_t t = blockIdx.x;
  const int64_t pid = p.ws_request ? p.ws_request[t * p.ws_request_stride] : -1;
  const bool to_ws = pid >= 0;
  const bool ws_ok = to_ws && pid < p.num_ws;
  const int64_t ws_start = ws_ok ? p.ws_starts[pid * p.ws_starts_stride] : 0;
  const int64_t req_any = p.seq_lens || !to_ws ? p.req_id[t * p.req_stride] : 0;
  const bool req_valid = req_any >= 0 && req_any < p.num_table_rows;
  const int64_t req = to_ws ? 0 : req_any;
  const bool req_ok = !to_ws && req_valid;
  // Positions at or past the request's length are invalid; with seq_lens, a token whose req_id names no
  // table row gets no valid entry at all.
  const int64_t limit = !p.seq_lens ? INT64_MAX : req_valid ? p.seq_lens[req_any * p.seq_lens_stride] : 0;
  const int32_t* bt_row = p.block_table + (req_ok ? req : 0) * p.bt_stride;
  const int32_t* in = p.indices + t * p.idx_stride;
  int32_t* out = p.out + t * p.out_stride;

  // kUnroll chunks of 4 entries per thread and step: all index loads, then all block-table reads,
  // then all stores, so a thread's dependent loads overlap instead of forming one chain per chunk.
  constexpr int kUnroll = 4;
  int valid = 0;
  for (int64_t base = 4 * static_cast<int64_t>(threadIdx.x); base < p.topk; base += 4 * kThreads * kUnroll) {
    dev::Array<int32_t, 4> idx[kUnroll], res[kUnroll];
    int n[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k0 = base + 4 * kThreads * u;
      n[u] = static_cast<int>(p.topk - k0 < 4 ? (p.topk - k0 > 0 ? p.topk - k0 : 0) : 4);
      if (n[u] > 0) dev::load_chunk<kVec>(idx[u], in + k0, n[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t tok = i < n[u] ? idx[u].v[i] : -1;
        int64_t row = -1;
        if (tok >= 0 && tok < limit) {
          if (to_ws) {
            if (ws_ok) row = ws_start + tok;
          } else if (req_ok) {
            const int64_t blk = tok / p.page_size;
            if (blk < p.max_blocks)
              row = static_cast<int64_t>(bt_row[blk]) * p.block_stride_rows + (tok - blk * p.page_size);
          }
        }
        if (row > INT32_MAX) row = -1;  // not representable in the int32 output: invalid, never a wrapped row
        res[u].v[i] = static_cast<int32_t>(row);
        valid += (i < n[u] && row >= 0) ? 1 : 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (n[u] > 0) dev::store_chunk<kVec>(out + base + 4 * kThreads * u, res[u], n[u]);
  }

  if (!p.valid) return;
  __shared__ int warp_sums[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) valid += __shfl_xor_sync(0xffffffffu, valid, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = valid;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    p.valid[t * p.valid_stride] = total;
  }
}

}  // namespace mla::cuda::index
