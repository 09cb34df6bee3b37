// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launch parameters of the cache kernels (write_cache, gather_cache, cp_gather_cache,
// upconvert_ds_mla). Plain data: raw pointers with their shapes, strides in elements of the pointed
// type, 64-bit offsets everywhere.
#include <cstdint>

namespace mla::cuda::cache {

// concat_and_cache_mla (semantics §4).
struct WriteParams {
  const uint16_t* kv_c;   // [num_tokens, latent] of dtype kv_c_dtype (bf16 except in write_act_kernel), row stride kv_c_stride
  const uint16_t* k_pe;   // [num_tokens, rope] of dtype k_pe_dtype, row stride k_pe_stride
  const void* slots;      // [num_tokens] int64 (slots_i64) or int32, stride slot_stride; < 0: skip
  void* cache;            // [num_blocks, page_size, entry] bf16 / e4m3 / ds_mla bytes
  int64_t kv_c_stride, k_pe_stride, slot_stride;
  int64_t cache_stride0, cache_stride1;  // in cache elements (bf16: 2 bytes, otherwise bytes)
  int64_t num_tokens, num_blocks, page_size;
  int latent, rope;       // L, R (fixed-width formats: their kDqk - kDrope, kDrope)
  float scale;            // fp8: per-tensor scale (write x / scale)
  bool slots_i64;
  bool ds_pow2;           // fp8_ds_mla: power-of-two tile scales instead of amax / 448
  // Activation dtypes of kv_c / k_pe: the fast kernels read bf16 only; write_act_kernel any of these.
  enum class Act : uint8_t { bf16, f16, f32 };
  Act kv_c_dtype = Act::bf16, k_pe_dtype = Act::bf16;
};

// Output row -> cache row (§5.1-5.3). Request b owns output rows [starts[b], end_b) where end_b is
// starts[b+1] for b < B-1 and, for the last request, *last_end (cu_seq_lens[B]) or num_rows
// (workspace_starts). Its i-th row is logical position seq_starts[b] + i (0 if absent), which lives in
// physical block block_table[b][pos / page_size]. Rows outside every request, positions whose block is
// outside the table and block ids outside the cache resolve to "skip": never read, never written.
struct RowMap {
  const int32_t* starts;       // [num_requests], stride starts_stride
  const int32_t* last_end;     // nullptr: the last request ends at num_rows
  const int32_t* seq_starts;   // [num_requests] or nullptr, stride seq_starts_stride
  const int32_t* block_table;  // [>= num_requests, max_blocks], row stride bt_stride, unit inner stride
  int64_t starts_stride, seq_starts_stride, bt_stride;
  int64_t num_requests, max_blocks;
  int64_t num_rows;            // output rows (dst.size(0))
  int64_t num_blocks, page_size;
  int64_t cache_stride0, cache_stride1;  // in bytes (the gathers address caches bytewise)
};

// Gather of dequantised rows into bf16 / f16 / f32 (gather_cache, upconvert_ds_mla) or raw bytes
// (cp_gather_cache, and bf16 -> bf16 gathers, which are raw copies).
struct GatherParams {
  RowMap map;
  const void* cache;     // cache tensor data (element type per format)
  void* dst;             // [num_rows, cols] of the kernel's Dst type (raw: bytes)
  int64_t dst_stride;    // in dst elements, raw: in bytes
  int cols;              // values per dst row (raw: bytes per row)
  float scale;           // per-tensor formats: the cache's scale (value = code * scale); else 1
};

}  // namespace mla::cuda::cache
