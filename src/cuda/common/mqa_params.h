#pragma once
// POD parameters shared by the two latent-cache MQA kernel families (decode/ and sparse/): the
// query/output rows of one "group" (a decode request or a sparse token) and the paged cache.
// Host-includable (no CUDA headers). Strides are in elements of the tensor's own dtype.
#include <cstdint>

namespace mla::cuda {

// Cache formats as the kernels see them (values match mla::CacheFormat).
enum MqaCacheFormat : int32_t { kCacheBf16 = 0, kCacheFp8 = 1, kCacheFp8DsMla = 2 };

struct MqaCacheParams {
  const uint8_t* data;  // [num_blocks, page_size, row_elems] of the format's dtype (bf16 | e4m3 | u8 656)
  int64_t stride_block;  // elements between blocks
  int64_t stride_row;    // elements between rows of one block
  int64_t num_blocks;
  int64_t page_size;
  int32_t format;     // MqaCacheFormat
  int32_t elem_bytes; // 2 (bf16) or 1
  int32_t row_bytes;  // bytes of one cache row the kernel reads: 2*d_qk, d_qk or 656
  int32_t vec16;      // 1 when every row starts 16-byte aligned and row_bytes % 16 == 0 (cp.async path)
  float scale;        // fp8 per-tensor scale (value = e4m3 * scale); unused otherwise
};

// A group g (decode: request b; sparse: token t) owns rows (i, h), i < s_q, h < h_q; all its rows
// attend the same key set (MQA: one latent row per token), row r = i * h_q + h inside the group.
struct MqaRowParams {
  const uint16_t* q;  // bf16 [groups, s_q, h_q, d_qk]
  int64_t q_stride_g, q_stride_i, q_stride_h;
  uint16_t* out;      // bf16 [groups, s_q, h_q, d_v]
  int64_t out_stride_g, out_stride_i, out_stride_h;
  float* lse;         // fp32 [groups, s_q, h_q], natural log; nullptr when not requested
  int64_t lse_stride_g, lse_stride_i, lse_stride_h;
  int64_t groups;
  int32_t s_q;
  int32_t h_q;
  int32_t d_qk;  // <= 576; query column c pairs with cache column c
  int32_t d_v;   // <= 512; values are the first d_v cache columns
  int32_t q_vec16;  // 1 when q rows are 16-byte aligned (base and all strides multiples of 8 elements)
  float scale_log2;  // softmax_scale * log2(e)
};

}  // namespace mla::cuda
