// SPDX-License-Identifier: Apache-2.0
#pragma once
// Paged latent KV cache: the descriptor every cache-reading/writing op takes, and the exact byte
// layout of each format (DESIGN.md §4, docs/SEMANTICS.md §3).
#include <cstdint>

#include "mla/cache_format.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// How fp8_ds_mla writers choose each tile's scale. Readers accept any fp32 scale.
enum class DsMlaScale : uint8_t {
  amax = 0,  // max(amax/448, FLT_MIN): vLLM's writer [PIN default]
  pow2 = 1,  // 2^ceil(log2(max(amax/448, 1e-4))): UE8M0-exact for SM100 decode kernels
};
// Throws mla::Error naming the value unless `s` is one of the modes.
void check_ds_mla_scale(DsMlaScale s, const char* what);

// Descriptor of one layer's paged cache. Token slot s lives at block s / page_size, row s % page_size;
// the row's layout is its format's (mla/cache_format.h):
//   bf16:       data bf16     [num_blocks, page_size, d_qk]
//   fp8:        data fp8_e4m3 [num_blocks, page_size, d_qk] (u8 accepted), value = q * scale
//   fp8_ds_mla: data u8       [num_blocks, page_size, 656]  (d_qk must be 576)
// Strides are honoured (the cache may be a view inside a larger allocation); the innermost stride
// must be 1.
struct KVCache {
  TensorView data;
  CacheFormat format = CacheFormat::bf16;
  float scale = 1.0f;  // fp8 only
  int d_qk = 576;      // logical row width: kv_lora_rank + rope (576; 320 also valid for bf16/fp8)
  int d_rope = 64;

  int64_t num_blocks() const { return data.size(0); }
  int64_t page_size() const { return data.size(1); }
  int64_t num_slots() const { return num_blocks() * page_size(); }
  int d_latent() const { return d_qk - d_rope; }
};

// Bytes of one cache row for a format (bf16: 2*d_qk, fp8: d_qk, fp8_ds_mla: 656). Throws on a bad
// format value.
int64_t cache_entry_bytes(CacheFormat format, int d_qk = 576, int d_rope = 64);
// Element count of one row in the cache tensor's own dtype (bf16/fp8: d_qk, fp8_ds_mla: 656).
int64_t cache_entry_elems(CacheFormat format, int d_qk = 576, int d_rope = 64);
// The element type a cache tensor of this format holds.
DType cache_dtype(CacheFormat format);
// Allocate a cache of the given shape (contents undefined).
struct CacheBuffer {
  Tensor storage;
  KVCache cache;
};
CacheBuffer allocate_cache(CacheFormat format, int64_t num_blocks, int64_t page_size, Device device,
                           float scale = 1.0f, int d_qk = 576, int d_rope = 64);
// Throws mla::Error unless `c` is a well-formed cache descriptor (shape, dtype, strides, scale).
void validate_cache(const KVCache& c, const char* what = "cache");

}  // namespace mla
