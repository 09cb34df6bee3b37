// SPDX-License-Identifier: Apache-2.0
#pragma once
// POD parameters shared by the latent-cache MQA kernels (attention/portable/{decode,sparse}/, attention/sm90/)
// and the split-KV combine (attention/combine/): the query/output rows of one "group" (a decode request or a
// sparse token) and the paged cache.
// Host-includable (no CUDA headers). Strides are in elements of the tensor's own dtype.
#include <cstdint>

#include "mla/cache_format.h"

namespace mla::cuda {

struct MqaCacheParams {
  const uint8_t* data;  // [num_blocks, page_size, row_elems] of the format's dtype (bf16 | e4m3 | u8 656)
  int64_t stride_block;  // elements between blocks
  int64_t stride_row;    // elements between rows of one block
  int64_t num_blocks;
  int64_t page_size;
  CacheFormat format;  // the row layout (mla/cache_format.h); the engine visits its traits per tile
  int32_t direct;     // 1: rows are d_qk unscaled bf16 values, copied straight into the K tile (no staging)
  int32_t elem_bytes; // bytes per element of the cache tensor (bf16: 2, byte formats: 1)
  int32_t row_bytes;  // bytes of one cache row the kernel reads (the format's entry_bytes)
  int32_t vec16;      // 1 when every row starts 16-byte aligned and row_bytes % 16 == 0 (cp.async path); records:
                      // pages (and rows without page scales) start 16-byte aligned
  int32_t record;     // 1: a block-scaled record (v4, v41, v41_fp4), staged [body | scale slot] and dequantised
                      // into the K tile (its values are bf16 numbers); the scale table stays 1
  float scale;        // value scale of every column for per-tensor formats (fp8: value = e4m3 * scale), else 1
};

// A group g (decode: request b; sparse: token t) owns rows (i, h), i < s_q, h < h_q; all its rows
// attend the same key set (MQA: one latent row per token), row r = i * h_q + h inside the group.
struct MqaRowParams {
  const void* q;  // [groups, s_q, h_q, d_qk] of the kernel's activation type (bf16 | f16 | f32)
  int64_t q_stride_g, q_stride_i, q_stride_h;
  void* out;      // [groups, s_q, h_q, d_v], the same type as q
  DType act;      // the element type of q and out (the kernels' Act: dispatch_activation)
  int64_t out_stride_g, out_stride_i, out_stride_h;
  float* lse;         // fp32 [groups, s_q, h_q], natural log; nullptr when not requested
  int64_t lse_stride_g, lse_stride_i, lse_stride_h;
  int64_t groups;
  int32_t s_q;
  int32_t h_q;
  int32_t d_qk;  // <= 576; query column c pairs with cache column c
  int32_t d_v;   // <= 512; values are the first d_v cache columns
  int32_t q_vec16;  // 1 when q rows are 16-byte aligned (base and all strides multiples of 8 elements); bf16 q only
  float scale_log2;  // softmax_scale * log2(e)
  int32_t pdl;       // host only: 1 launches the op's kernels as programmatic dependent launches (Context::pdl)
};

}  // namespace mla::cuda
