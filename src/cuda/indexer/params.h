// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the lightning-indexer kernels (docs/INDEXER.md). Strides in elements (bytes
// for the u8 cache and e4m3 codes), 64-bit. The cache of a launch is a run of blocks `block_stride`
// bytes apart; block b holds page_size x 128 codes, then page_size fp32 scales.
#include <cstdint>

namespace mla::cuda::indexer {

struct CacheRef {
  uint8_t* base;         // block 0
  int64_t block_stride;  // bytes between blocks (multiple of 4; of 16 where the logits kernel reads it)
  int64_t num_blocks;
  int32_t page_size;
};

template <class Storage>
struct WriteParams {
  const Storage* k;              // [T, 128] activations, row stride k_row
  int64_t k_row;
  const void* slots;             // [T] int32 or int64 (slots_i64), stride slot_stride
  int64_t slot_stride;
  bool slots_i64;
  bool ue8m0;
  int64_t num_tokens;
  CacheRef cache;
};

struct GatherParams {
  CacheRef cache;
  uint8_t* dst_k;                // [TOT, 128] codes, row stride dst_k_row
  int64_t dst_k_row;
  float* dst_scale;              // [TOT], stride dst_scale_stride
  int64_t dst_scale_stride;
  const int32_t* block_table;    // [B, max_blocks], row stride bt_row
  int64_t bt_row, max_blocks;
  const int32_t* cu;             // [B+1], stride cu_stride
  int64_t cu_stride;
  int64_t num_requests, tot;
};

// Logits of query rows over keys (prefill: a contiguous K; decode: the paged cache).
// Row t's keys are positions [row_lo(t), row_hi(t)) (clipped to [0, N)); every column of [0, N) of
// the row is written (-inf outside).
struct LogitsParams {
  const uint8_t* q;              // [T, h, 128] e4m3 codes, strides q_row, q_head
  int64_t q_row, q_head;
  const float* w;                // [T, h], strides w_row, w_head
  int64_t w_row, w_head;
  float* logits;                 // [T, N], row stride out_row
  int64_t out_row;
  int64_t num_rows, h, n_cols;   // T, h, N
  // prefill (paged == false): keys are rows of k; row t sees [row_starts[t], row_ends[t])
  const uint8_t* k;              // [Tk, 128] codes, row stride k_row
  int64_t k_row;
  const float* k_scale;          // [Tk], stride k_scale_stride
  int64_t k_scale_stride;
  const int32_t* row_starts;     // [T], stride rs_stride
  const int32_t* row_ends;       // [T], stride re_stride
  int64_t rs_stride, re_stride;
  // decode (paged == true): rows t = b * s_q + i see positions [0, seq_lens[b] - s_q + i + 1)
  bool paged;
  CacheRef cache;
  const int32_t* block_table;    // [b, max_blocks], row stride bt_row
  int64_t bt_row, max_blocks;
  const int32_t* seq_lens;       // [b], stride sl_stride
  int64_t sl_stride;
  int64_t s_q;
};

// Top-k per row: row t considers [start, end) of logits [T, N] and writes out [T, k].
struct TopkParams {
  const float* logits;           // [T, N], row stride lg_row
  int64_t lg_row, num_rows, n_cols;
  int32_t* out;                  // [T, k], row stride out_row
  int64_t out_row, k;
  const int32_t* row_starts;     // [T] or nullptr (0), stride rs_stride
  const int32_t* row_ends;       // [T] (when seq_lens is nullptr), stride re_stride
  int64_t rs_stride, re_stride;
  const int32_t* seq_lens;       // [T / s_q] or nullptr: decode rows' causal ends
  int64_t sl_stride, s_q;
};

}  // namespace mla::cuda::indexer
