// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the sm90 attention kernels over a latent cache (POD, host-includable): mqa_decode
// (paged keys through a TMA tensor map passed beside these params, mqa_decode.cu builds it) and sparse_mqa
// (each token's top-k rows gathered by the producer warps, `gather` below; sparse_mqa.cu). Strides in
// elements unless named _bytes.
#include <cstdint>

#include "core/fast_div.h"
#include "cuda/common/mqa_params.h"
#include "cuda/common/rotation.cuh"

namespace mla::cuda {

// DecodeSm90Params::out_pairs: how bf16 out rows may be stored (launch_util.cuh out_pairs): 0 element by element,
// kOutPairs 4-byte pairs (even strides, 4-byte aligned base), kOutRows16 also 16-byte chunks (strides multiples of
// 8, 16-byte aligned base). Kernels that only pair test it for non-zero.
inline constexpr int32_t kOutPairs = 1, kOutRows16 = 2;

struct DecodeSm90Params {
  MqaRowParams rows;           // groups = b requests; q [b, s_q, h_q, 576], out [b, s_q, h_q, 512], lse [b, s_q, h_q]
  const int32_t* block_table;  // [b, max_blocks] page ids; ids outside [0, num_blocks) are never read
  int64_t block_table_stride;  // elements between requests
  int64_t max_blocks;
  int64_t num_blocks;          // pages in the cache
  int32_t page_size;           // divides 64 or is a multiple of 64 (mqa_decode.cu declines others)
  int32_t box_rows;            // rows of one TMA box: min(page_size, 64)
  const int32_t* seq_lens;     // [b]; clamped to [0, max_blocks * page_size] in the kernel
  int64_t seq_lens_stride;
  int32_t causal;              // query i sees positions [0, seq_len - s_q + i]; else [0, seq_len)
  int32_t num_splits;          // KV splits per request (1: the kernel writes out / lse itself)
  int32_t tile_rows;           // query rows per CTA: 64 (seesaw/kernel.cuh) or the small kernel's N (8, 16, 32)
  int32_t m_tiles;             // query tiles per request: ceil(s_q * h_q / tile_rows)
  int32_t out_pairs;           // kOutPairs: out rows take 4-byte (bf16x2) stores; kOutRows16: 16-byte ones too
  float* ws_lse;               // [b, num_splits, s_q * h_q] partial LSE (num_splits > 1); balanced: [b + grid, s_q * h_q]
  float* ws_o;                 // [b, num_splits, s_q * h_q, 512] partial O / l (num_splits > 1); balanced: [b + grid, ...]
  // 1: the balanced schedule (core/decode_balance.h; small kernel, m_tiles 1, num_splits 1): CTA k of the
  // grid runs its window's segments and writes partials to slot request + k; ws_meta [b][2] gets each
  // split request's (first slot, splits) for the combine.
  int32_t balanced;
  int32_t* ws_meta;
  // 1: the uniform schedule's num_splits (2..8) CTAs of a (request, row tile) run as one thread-block cluster,
  // unit blockIdx.x = (split, row tile, request) with the split innermost (= the cluster rank), and merge their
  // partials through distributed shared memory (attention/sm90/common/cluster_merge.cuh): no workspace, no combine
  // launch. The seesaw kernels (mqa_decode.cu) and the raw kernel's small-T sparse split (sparse_mqa.cu).
  int32_t cluster_merge;
  // 1: the small kernel under the uniform schedule with num_splits > 1 (core/decode_schedule.h wg_partials): each
  // consumer warpgroup c of split unit ws_slot writes its own partial, slot 2 ws_slot + c of ws_lse / ws_o laid out
  // for 2 num_splits partials a request (tile_io.cuh small_wg_partial); the combine merges 2 num_splits.
  int32_t wg_partials;
  // Gathered key source (sparse_mqa: a "request" g is a token, s_q = 1, causal 0; block_table / seq_lens
  // unused). mqa_decode's fp8 / fp8_ds_mla caches use the cache fields only (rows through the block table). Key j of token g is flat cache row idx = indices[g * indices_stride + j], read only when
  // j < len(g) and 0 <= idx < num_slots; len(g) = topk_length[g] clamped to [0, topk], or topk.
  struct Gather {
    const uint8_t* cache;          // row idx at (idx / page_size) * stride_block_bytes + (idx % page_size) * stride_row_bytes
    int64_t stride_block_bytes, stride_row_bytes;  // multiples of 16 (sparse_mqa.cu declines others)
    int64_t num_slots;             // num_blocks * page_size (< 2^31)
    int32_t page_size;
    FastDivisor page_div;          // page_size as a multiply-shift divisor (core/fast_div.h): row index / page_size
    int32_t topk;
    const int32_t* indices;        // [T, topk] (inner stride 1)
    int64_t indices_stride;
    const int32_t* topk_length;    // [T] or nullptr
    int64_t topk_length_stride;
    float scale;                   // fp8 per-tensor cache: KVCache::scale (latent and rope alike)
    // mqa_decode, fp8 / fp8_ds_mla at N 8 / 16 (raw/kernel.cuh): 1 when the launch's tensor map describes the cache
    // as [num_blocks][page_size][record / 4] int32 with 168 x 16 x 1 boxes (page_size % 16 == 0): whole 16-row runs
    // of a page come by TMA (raw/parts.cuh produce_raw). 0: every row by cp.async.
    int32_t raw_tma;
  } gather;
  // DeepSeek-V4 sparse_mqa (SparseOptions; the converter kernel's record path, convert/records.cuh): token g's keys
  // are its valid entries of the main list (gather above: the window cache) followed by those of the extra list
  // below (the compressed cache, its own format, pages, index rows and lengths), one softmax; a per-head sink
  // joins each row's sum in the epilogue. extra.indices nullptr: no extra list.
  struct Extra {
    const uint8_t* cache;
    int64_t stride_block_bytes, stride_row_bytes;
    int64_t num_slots;             // < 2^31
    int32_t page_size;
    FastDivisor page_div;
    int32_t topk;
    const int32_t* indices;        // [T, topk] (inner stride 1) or nullptr
    int64_t indices_stride;
    const int32_t* topk_length;    // [T] or nullptr
    int64_t topk_length_stride;
  } extra;
  const float* sink;               // [h_q] natural-log logits, or nullptr
  int64_t sink_stride;
  // The output's rotation (SparseOptions::out_rotation; cuda/common/rotation.cuh): out columns d_v - rot.dim ..
  // d_v - 1 of token g turned pairwise by its position times inv_freq before the store.
  dev::OutRotation rot;            // rot.dim 0: none
  // 1: the small kernel's uniform unit takes its query rows by TMA through the launch's q map (small/kernel.cuh
  // SmallMaps; mqa_decode.cu small_q_map), issued by the producer at its start beside its first block-table read;
  // 0: the consumers load them. Last, so that the fields before it keep their offsets in the kernels that never
  // read it.
  int32_t q_tma;
};

}  // namespace mla::cuda
