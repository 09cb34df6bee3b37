// SPDX-License-Identifier: Apache-2.0
#pragma once
// mqa_decode: absorbed MQA over the paged latent cache (docs/SEMANTICS.md §6), split-KV.
//
// Algorithm: request b's rows (i, h), M = s_q * h_q of them, are cut into 64-row tiles; its positions
// [0, seq_len) into num_splits contiguous ranges of whole 32-key tiles. One CTA of the MQA engine
// (common/mqa_core.cuh: warp roles, shared-memory budget and pipeline are described there) computes one
// (row tile, split, request) and, with one split, writes out / lse directly. With several splits it
// writes O / l and the partial LSE into the caller's workspace and `decode_combine_kernel` merges them:
// lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) * O_s (splits with lse_s = -inf are skipped,
// so empty splits cost nothing and an all-empty row gives out 0, lse -inf).
// Causality within the step: query i (position seq_len - s_q + i) sees positions <= seq_len - s_q + i.
// The kernel reads only positions < seq_len (clamped to max_blocks * page_size, so never outside the
// block table) and only pages whose id lies in [0, num_blocks); other keys are masked.
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_core.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/decode/params.h"
#include "cuda/decode/traits.cuh"

namespace mla::cuda::decode {

struct DecodeKeys {
  using Params = DecodeParams;
  int64_t group;
  int key_begin, key_end;
  float* ws_o;
  float* ws_lse;
  int64_t ws_row0;
  int seq_len, s_q, causal;
  const int32_t* table;  // this request's block-table row
  int64_t page_size, num_blocks, stride_block, stride_row;
  int elem_bytes;

  __device__ DecodeKeys(const DecodeParams& p, int64_t unit) {
    const int splits = p.num_splits;
    group = unit / splits;
    const int split = static_cast<int>(unit % splits);
    page_size = p.cache.page_size;
    const int64_t cap = p.max_blocks * page_size;
    const int64_t len = p.seq_lens[group * p.seq_lens_stride];
    seq_len = static_cast<int>(len < 0 ? 0 : len > cap ? cap : len);
    const int tiles = (seq_len + Traits::kBlockN - 1) / Traits::kBlockN;
    const int per_split = (tiles + splits - 1) / splits;
    const int t0 = min(split * per_split, tiles), t1 = min(t0 + per_split, tiles);
    key_begin = t0 * Traits::kBlockN;
    key_end = min(t1 * Traits::kBlockN, seq_len);
    s_q = p.rows.s_q;
    causal = p.causal;
    table = p.block_table + group * p.block_table_stride;
    num_blocks = p.cache.num_blocks;
    stride_block = p.cache.stride_block;
    stride_row = p.cache.stride_row;
    elem_bytes = p.cache.elem_bytes;
    if (splits > 1) {
      ws_o = p.ws_o;
      ws_lse = p.ws_lse;
      ws_row0 = unit * (static_cast<int64_t>(p.rows.s_q) * p.rows.h_q);
    } else {
      ws_o = nullptr;
      ws_lse = nullptr;
      ws_row0 = 0;
    }
  }

  __device__ int row_limit(int i) const {
    const int lim = causal ? seq_len - s_q + i : seq_len - 1;
    return lim < -1 ? -1 : lim;
  }

  // Positions are tags: the softmax compares them with row_limit.
  __device__ int64_t row_offset(int pos, int& tag) const {
    const int64_t blk = table[pos / page_size];
    if (blk < 0 || blk >= num_blocks) return -1;
    tag = pos;
    return (blk * stride_block + (pos % page_size) * stride_row) * elem_bytes;
  }
};

// One CTA per (request, row): merges the splits' partials into out (activation type Act). Thread s < splits computes split s's weight.
// Partials of request g: slots g * num_splits + s, or with ws_meta (the sm90 balanced schedule) the
// slots the meta names (a request with one slot was written by the attention kernel: nothing to do).
template <class Act>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const DecodeParams p) {
  __shared__ float weight[kMaxCombineSplits];
  __shared__ float total_lse;
  const MqaRowParams& rp = p.rows;
  const int64_t m_rows = static_cast<int64_t>(rp.s_q) * rp.h_q;
  const int64_t g = blockIdx.x / m_rows;
  const int row = static_cast<int>(blockIdx.x % m_rows);
  const int i = row / rp.h_q, h = row % rp.h_q;
  auto* out = static_cast<typename Act::Storage*>(rp.out) + g * rp.out_stride_g + i * rp.out_stride_i +
              h * rp.out_stride_h;
  // While the attention kernel runs (this grid waits on the device below): the output row's first line
  // into L2, so that the final stores find it (and its translation) warm after a cold start.
  if (threadIdx.x == 0) cuda::ptx::prefetch_l2(out);
  cuda::ptx::grid_dependency_wait();  // launched as a dependent of the attention kernel: its partials
  int splits = p.num_splits;
  int64_t slot0 = g * splits;
  if (p.ws_meta != nullptr) {
    slot0 = p.ws_meta[2 * g];
    splits = min(p.ws_meta[2 * g + 1], kMaxCombineSplits);
    if (splits <= 1) return;
  }
  const float* lse_s = p.ws_lse + slot0 * m_rows + row;  // split s at lse_s[s * m_rows]
  if (threadIdx.x < 32) {
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) mx = fmaxf(mx, lse_s[s * m_rows]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float l = lse_s[s * m_rows];
      sum += l == -INFINITY ? 0.0f : expf(l - mx);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    // sum == 0: every split empty. A NaN split LSE (fmaxf dropped it from mx) makes sum NaN: the merged
    // LSE and every weight are NaN (SEMANTICS.md §14.6a), even when the other splits are empty.
    const float lse = sum == 0.0f ? -INFINITY : mx + logf(sum);
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float l = lse_s[s * m_rows];
      weight[s] = l == -INFINITY ? 0.0f : expf(l - lse);
    }
    if (threadIdx.x == 0) total_lse = lse;
  }
  __syncthreads();
  if (threadIdx.x == 0 && rp.lse) rp.lse[g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = total_lse;
  const float* o_s = p.ws_o + (slot0 * m_rows + row) * int64_t(Traits::kMaxDv);
  const int64_t split_stride = m_rows * Traits::kMaxDv;
  // kBatch partials per column loaded at once (independent loads in flight: one load after the other
  // took one L2 round trip per split); summed in split order. Skipped splits (weight 0) may hold
  // garbage: not read.
  constexpr int kBatch = 8;
  for (int col = threadIdx.x; col < rp.d_v; col += kCombineThreads) {
    float acc = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        v[j] = s0 + j < splits && weight[s0 + j] != 0.0f ? o_s[(s0 + j) * split_stride + col] : 0.0f;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (s0 + j < splits && weight[s0 + j] != 0.0f) acc += weight[s0 + j] * v[j];
    }
    out[col] = Act::from_float(acc);
  }
}

}  // namespace mla::cuda::decode
