// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host side of the cache kernels: POD params from validated views, and the choice between the
// vector and the element-wise variant from the actual alignment. Shared by launch.cu and the kernel
// tuning benchmark (the tune_cache family in bench/cache.cu), so both run exactly the same configurations.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cache/params.h"
#include "cuda/cache/quant.cuh"
#include "cuda/common/vec.cuh"
#include "mla/cache.h"
#include "mla/error.h"

namespace mla::cuda::cache {

inline constexpr int kThreads = 256;
inline constexpr int kRows = 64;  // rows per block of the streamed kernels (64 * 72 chunks = 18 per thread)

inline bool multiple(int64_t v, int64_t m) { return v % m == 0; }

// Element size of the cache tensor (bf16: 2, fp8 / ds_mla bytes: 1).
inline int64_t cache_esize(const KVCache& c) { return static_cast<int64_t>(c.data.element_size()); }

// `chunk_bytes`-wide accesses are legal at the start of every row of `t` (2-D [rows, cols] view).
inline bool rows_aligned(const TensorView& t, int64_t chunk_bytes) {
  return dev::aligned_to(t.data, chunk_bytes) &&
         multiple(t.stride[0] * static_cast<int64_t>(t.element_size()), chunk_bytes);
}
inline bool cache_rows_aligned(const KVCache& c, int64_t chunk_bytes) {
  const int64_t es = cache_esize(c);
  return dev::aligned_to(c.data.data, chunk_bytes) && multiple(c.data.stride[0] * es, chunk_bytes) &&
         multiple(c.data.stride[1] * es, chunk_bytes);
}

// A record cache's pages start 16-byte aligned and, without page scales, so do its rows (a v4 page is packed:
// its 576-byte bodies are then 16-byte aligned too).
inline bool record_pages_aligned(const KVCache& c) {
  const int64_t es = cache_esize(c);
  return dev::aligned_to(c.data.data, 16) && multiple(c.data.stride[0] * es, 16) &&
         (page_row_bytes(c.format) != 0 || multiple(c.data.stride[1] * es, 16));
}

struct WritePlan {
  WriteParams p{};
  bool vec = false;    // 16-byte input chunks and aligned cache rows
  bool warp = false;   // bf16 / fp8: DeepSeek row shape, write_warp_kernel (latent_steps = latent / 256)
  int latent_steps = 0;
  bool recip = false;  // fp8: the per-tensor scale is in the reciprocal division's exact range
  bool act = false;    // kv_c or k_pe is f16 / f32: write_act_kernel (element-wise, any format)
};

inline WriteParams::Act write_act(DType t) {
  switch (t) {
    case DType::bf16: return WriteParams::Act::bf16;
    case DType::f16: return WriteParams::Act::f16;
    case DType::f32: return WriteParams::Act::f32;
    default: break;
  }
  throw Error(std::string("write_cache: kv_c and k_pe must be bf16, f16 or f32 on CUDA, got ") + to_string(t));
}

inline WritePlan plan_write(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping,
                            const KVCache& cache, DsMlaScale ds_scale) {
  WritePlan w;
  WriteParams& p = w.p;
  p.kv_c = static_cast<const uint16_t*>(kv_c.data);
  p.k_pe = static_cast<const uint16_t*>(k_pe.data);
  p.slots = slot_mapping.data;
  p.cache = cache.data.data;
  p.kv_c_stride = kv_c.stride[0];
  p.k_pe_stride = k_pe.stride[0];
  p.slot_stride = slot_mapping.stride[0];
  p.cache_stride0 = cache.data.stride[0];
  p.cache_stride1 = cache.data.stride[1];
  p.num_tokens = slot_mapping.size(0);
  p.num_blocks = cache.num_blocks();
  p.page_size = cache.page_size();
  p.latent = cache.d_latent();
  p.rope = cache.d_rope;
  p.scale = cache_format_info(cache.format).scale == CacheScale::per_tensor ? cache.scale : 1.0f;
  p.slots_i64 = slot_mapping.dtype == DType::i64;
  p.ds_pow2 = ds_scale == DsMlaScale::pow2;
  p.kv_c_dtype = write_act(kv_c.dtype);
  p.k_pe_dtype = write_act(k_pe.dtype);
  w.act = p.kv_c_dtype != WriteParams::Act::bf16 || p.k_pe_dtype != WriteParams::Act::bf16;
  // bf16 inputs are read in 16-byte chunks of 8 values; the cache is written in 16-byte (bf16,
  // ds_mla) or 8-byte (fp8) pieces.
  const bool in_vec = multiple(p.latent, 8) && multiple(p.rope, 8) && rows_aligned(kv_c, 16) && rows_aligned(k_pe, 16);
  if (cache_format_info(cache.format).record) {  // write_record_kernel: 16-value bf16 loads, 16 / 8-byte stores
    w.vec = in_vec && !w.act && record_pages_aligned(cache);
    return w;
  }
  dispatch_device_cache_format(cache.format, [&](auto fmt) {
    using Fmt = decltype(fmt);
    // Uniform formats are written in 8-value chunks (16 bytes bf16, 8 bytes e4m3); the tiled writer
    // stores 16-byte pieces.
    const int64_t chunk = Fmt::uniform() ? 8 * dtype_bytes(Fmt::kLatentDType) : 16;
    w.vec = in_vec && cache_rows_aligned(cache, chunk);
    w.warp = w.vec && Fmt::uniform() && p.rope == 64 && (p.latent == 256 || p.latent == 512);
  });
  w.latent_steps = p.latent / 256;
  w.recip = recip_scale_ok(p.scale);
  return w;
}

inline RowMap make_row_map(const KVCache& c, const TensorView& block_table, const TensorView& starts,
                           bool starts_are_cu, const TensorView& seq_starts, int64_t num_rows) {
  RowMap m{};
  const int64_t es = cache_esize(c);
  m.starts = static_cast<const int32_t*>(starts.data);
  m.starts_stride = starts.stride[0];
  m.num_requests = starts_are_cu ? starts.size(0) - 1 : starts.size(0);
  m.last_end = starts_are_cu ? m.starts + m.num_requests * m.starts_stride : nullptr;
  m.seq_starts = seq_starts.defined() ? static_cast<const int32_t*>(seq_starts.data) : nullptr;
  m.seq_starts_stride = seq_starts.defined() ? seq_starts.stride[0] : 0;
  m.block_table = static_cast<const int32_t*>(block_table.data);
  m.bt_stride = block_table.stride[0];
  m.max_blocks = block_table.size(1);
  m.num_rows = num_rows;
  m.num_blocks = c.num_blocks();
  m.page_size = c.page_size();
  m.cache_stride0 = c.data.stride[0] * es;
  m.cache_stride1 = c.data.stride[1] * es;
  return m;
}

struct GatherPlan {
  GatherParams p{};
  bool raw = false;  // byte copy (raw_gather_kernel); otherwise dequant_gather_kernel<format, dst dtype>
  bool vec = false;
};

// Dequantising gather into a bf16 / f16 / f32 dst (gather_cache, upconvert_ds_mla). Rows whose values
// are stored as dst's own unscaled bits (bf16 cache, bf16 dst) are raw copies of 2d bytes.
inline GatherPlan plan_gather_values(const KVCache& c, const TensorView& dst, const RowMap& map) {
  GatherPlan g;
  GatherParams& p = g.p;
  p.map = map;
  p.cache = c.data.data;
  p.dst = dst.data;
  const int64_t d = dst.size(1);
  if (cache_format_info(c.format).record) {  // record_gather_kernel: 8-value chunks, stores of 8 dst values
    p.scale = 1.0f;
    p.cols = static_cast<int>(d);
    p.dst_stride = dst.stride[0];
    g.vec = multiple(d, 8) && rows_aligned(dst, 16) && record_pages_aligned(c);
    return g;
  }
  dispatch_device_cache_format(c.format, [&](auto fmt) {
    using Fmt = decltype(fmt);
    p.scale = Fmt::kScale == CacheScale::per_tensor ? c.scale : 1.0f;
    if constexpr (Fmt::uniform() && Fmt::kScale == CacheScale::none) {
      if (dst.dtype == Fmt::kLatentDType) {  // a bit copy of the first d values
        g.raw = true;
        p.cols = static_cast<int>(d * dtype_bytes(Fmt::kLatentDType));
        p.dst_stride = dst.stride[0] * static_cast<int64_t>(dst.element_size());
        g.vec = multiple(p.cols, 16) && rows_aligned(dst, 16) && cache_rows_aligned(c, 16);
        return;
      }
    }
    // 8 codes per chunk: 8 bytes (e4m3) or 16 (bf16) at each part's start; dst chunks of 8 values.
    const int64_t code_chunk = 8 * std::max(dtype_bytes(Fmt::kLatentDType), dtype_bytes(Fmt::kRopeDType));
    const bool parts_aligned =
        Fmt::uniform() || Fmt::rope_offset(Fmt::kDqk - Fmt::kDrope) % std::min<int64_t>(code_chunk, 16) == 0;
    p.cols = static_cast<int>(d);
    p.dst_stride = dst.stride[0];
    g.vec = multiple(d, 8) && parts_aligned && rows_aligned(dst, 16) &&
            cache_rows_aligned(c, std::min<int64_t>(code_chunk, 16));
  });
  return g;
}

// Raw row copy (cp_gather_cache): dst rows hold the cache rows' bytes.
inline GatherPlan plan_cp_gather(const KVCache& c, const TensorView& dst, const RowMap& map) {
  GatherPlan g;
  GatherParams& p = g.p;
  p.map = map;
  p.cache = c.data.data;
  p.dst = dst.data;
  g.raw = true;
  p.cols = static_cast<int>(c.data.size(2) * cache_esize(c));
  p.dst_stride = dst.stride[0] * static_cast<int64_t>(dst.element_size());
  g.vec = multiple(p.cols, 16) && rows_aligned(dst, 16) && cache_rows_aligned(c, 16);
  return g;
}

}  // namespace mla::cuda::cache
