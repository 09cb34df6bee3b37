// Launchers of the cache kernels: unpack the validated views into POD params, choose the vector or
// element-wise variant from the actual alignment, and launch on ctx.stream.
#include "cuda/cache/gather_kernel.cuh"
#include "cuda/cache/write_kernel.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

using cache::GatherFmt;
using dev::aligned_to;

constexpr int kThreads = 256;
constexpr int kRows = 64;  // rows per block of the streamed kernels: 64 * 72 chunks = 18 per thread

bool multiple(int64_t v, int64_t m) { return v % m == 0; }

// Element size of the cache tensor (bf16: 2, fp8 / ds_mla bytes: 1).
int64_t cache_esize(const KVCache& c) { return static_cast<int64_t>(c.data.element_size()); }

// 16-byte (or `chunk_bytes`) accesses are legal for every row of `t` (2-D [rows, cols] view).
bool rows_aligned(const TensorView& t, int64_t chunk_bytes) {
  return aligned_to(t.data, chunk_bytes) && multiple(t.stride[0] * static_cast<int64_t>(t.element_size()), chunk_bytes);
}
bool cache_rows_aligned(const KVCache& c, int64_t chunk_bytes) {
  const int64_t es = cache_esize(c);
  return aligned_to(c.data.data, chunk_bytes) && multiple(c.data.stride[0] * es, chunk_bytes) &&
         multiple(c.data.stride[1] * es, chunk_bytes);
}

template <class Kernel, class Params>
void launch(Kernel kernel, unsigned grid, int threads, const Params& p, const Context& ctx, const char* what) {
  kernel<<<grid, threads, 0, stream_of(ctx)>>>(p);
  check_launch(what);
}

// ---- write ------------------------------------------------------------------------------------

template <cache::ElemFormat kFmt>
void launch_write_rows(const cache::WriteParams& p, bool vec, const Context& ctx) {
  const unsigned grid = grid_for(p.num_tokens, kRows, "write_cache");
  if (vec) launch(cache::write_rows_kernel<kFmt, true, kRows, kThreads>, grid, kThreads, p, ctx, "write_cache");
  else launch(cache::write_rows_kernel<kFmt, false, kRows, kThreads>, grid, kThreads, p, ctx, "write_cache");
}

// ---- gathers ----------------------------------------------------------------------------------

cache::RowMap make_map(const KVCache& c, const TensorView& block_table, const TensorView& starts, bool starts_are_cu,
                       const TensorView& seq_starts, int64_t num_rows) {
  cache::RowMap m{};
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

template <GatherFmt kFmt>
void launch_gather(const cache::GatherParams& p, bool vec, const Context& ctx, const char* what) {
  if (p.map.num_requests <= 0) return;  // no request: nothing is written
  const unsigned grid = grid_for(p.map.num_rows, kRows, what);
  if (vec) launch(cache::gather_kernel<kFmt, true, kRows, kThreads>, grid, kThreads, p, ctx, what);
  else launch(cache::gather_kernel<kFmt, false, kRows, kThreads>, grid, kThreads, p, ctx, what);
}

// Dequantising gather into a bf16 dst (gather_cache and upconvert_ds_mla).
void gather_to_bf16(const KVCache& c, const TensorView& dst, const cache::RowMap& map, const Context& ctx,
                    const char* what) {
  cache::GatherParams p{};
  p.map = map;
  p.cache = c.data.data;
  p.dst = dst.data;
  p.scale = c.scale;
  const int64_t d = dst.size(1);
  switch (c.format) {
    case CacheFormat::bf16: {  // bit copy of the first d values: a raw gather of 2d bytes
      p.cols = static_cast<int>(2 * d);
      p.dst_stride = 2 * dst.stride[0];
      const bool vec = multiple(p.cols, 16) && rows_aligned(dst, 16) && cache_rows_aligned(c, 16);
      launch_gather<GatherFmt::raw>(p, vec, ctx, what);
      return;
    }
    case CacheFormat::fp8: {  // 16 codes (16 bytes) -> 16 bf16 (32 bytes) per chunk
      p.cols = static_cast<int>(d);
      p.dst_stride = dst.stride[0];
      const bool vec = multiple(d, 16) && rows_aligned(dst, 16) && cache_rows_aligned(c, 16);
      launch_gather<GatherFmt::fp8>(p, vec, ctx, what);
      return;
    }
    case CacheFormat::fp8_ds_mla: {
      p.cols = static_cast<int>(d);
      p.dst_stride = dst.stride[0];
      const bool vec = rows_aligned(dst, 16) && cache_rows_aligned(c, 16);
      launch_gather<GatherFmt::ds_mla>(p, vec, ctx, what);
      return;
    }
  }
  throw Error(std::string(what) + ": unknown cache format");
}

}  // namespace

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,
                 DsMlaScale ds_scale, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  cache::WriteParams p{};
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
  p.scale = cache.scale;
  p.slots_i64 = slot_mapping.dtype == DType::i64;
  p.ds_pow2 = ds_scale == DsMlaScale::pow2;
  if (p.num_tokens == 0) return;
  // bf16 inputs read in 16-byte chunks of 8 values.
  const bool in_vec = multiple(p.latent, 8) && multiple(p.rope, 8) && rows_aligned(kv_c, 16) && rows_aligned(k_pe, 16);
  switch (cache.format) {
    case CacheFormat::bf16:
      launch_write_rows<cache::ElemFormat::bf16>(p, in_vec && cache_rows_aligned(cache, 16), ctx);
      return;
    case CacheFormat::fp8:
      launch_write_rows<cache::ElemFormat::fp8>(p, in_vec && cache_rows_aligned(cache, 8), ctx);
      return;
    case CacheFormat::fp8_ds_mla: {
      constexpr int kTokens = 2;  // per warp
      const unsigned grid = grid_for(p.num_tokens, kTokens * kThreads / 32, "write_cache");
      if (in_vec && cache_rows_aligned(cache, 16))
        launch(cache::write_ds_mla_kernel<true, kTokens>, grid, kThreads, p, ctx, "write_cache");
      else
        launch(cache::write_ds_mla_kernel<false, kTokens>, grid, kThreads, p, ctx, "write_cache");
      return;
    }
  }
  throw Error("write_cache: unknown cache format");
}

void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  gather_to_bf16(cache, dst, make_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0)), ctx,
                 "gather_cache");
}

void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  gather_to_bf16(cache, dst, make_map(cache, block_table, workspace_starts, false, seq_starts, dst.size(0)), ctx,
                 "upconvert_ds_mla");
}

void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  cache::GatherParams p{};
  p.map = make_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0));
  p.cache = cache.data.data;
  p.dst = dst.data;
  p.cols = static_cast<int>(cache.data.size(2) * cache_esize(cache));
  p.dst_stride = dst.stride[0] * static_cast<int64_t>(dst.element_size());
  const bool vec = multiple(p.cols, 16) && rows_aligned(dst, 16) && cache_rows_aligned(cache, 16);
  launch_gather<GatherFmt::raw>(p, vec, ctx, "cp_gather_cache");
}

}  // namespace mla::cuda
