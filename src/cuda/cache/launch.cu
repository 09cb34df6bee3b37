// Launchers of the cache kernels: params and the vector / element-wise choice come from setup.h;
// here the kernel configuration is picked and launched on ctx.stream.
#include "cuda/cache/gather_kernel.cuh"
#include "cuda/cache/setup.h"
#include "cuda/cache/write_kernel.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

using cache::GatherFmt;
using cache::kRows;
using cache::kThreads;

// Configurations (docs/PERFORMANCE.md has the measurements behind them).
constexpr int kWriteUnroll = 4;     // 16-byte chunk loads in flight per thread (generic bf16 / fp8 write)
constexpr int kDsTokensPerWarp = 2;  // fp8_ds_mla write: tokens whose loads a warp issues together
constexpr int kGatherUnroll = 4;    // chunks in flight per thread (8 converted: slower, measured)

template <class Kernel, class Params>
void launch(Kernel kernel, unsigned grid, const Params& p, const Context& ctx, const char* what) {
  kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(p);
  check_launch(what);
}

template <cache::ElemFormat kFmt, int kLatentSteps>
void launch_write_warp(const cache::WritePlan& w, const Context& ctx) {
  using cache::write_warp_kernel;
  const unsigned grid = grid_for(w.p.num_tokens, cache::kWarpTokens * kThreads / 32, "write_cache");
  if constexpr (kFmt == cache::ElemFormat::fp8) {
    if (w.recip) return launch(write_warp_kernel<kFmt, kLatentSteps, true>, grid, w.p, ctx, "write_cache");
  }
  launch(write_warp_kernel<kFmt, kLatentSteps, false>, grid, w.p, ctx, "write_cache");
}

template <cache::ElemFormat kFmt>
void launch_write_rows(const cache::WritePlan& w, const Context& ctx) {
  if (w.warp) return w.latent_steps == 2 ? launch_write_warp<kFmt, 2>(w, ctx) : launch_write_warp<kFmt, 1>(w, ctx);
  const unsigned grid = grid_for(w.p.num_tokens, kRows, "write_cache");
  if (w.vec) launch(cache::write_rows_kernel<kFmt, true, kRows, kThreads, kWriteUnroll>, grid, w.p, ctx, "write_cache");
  else launch(cache::write_rows_kernel<kFmt, false, kRows, kThreads, kWriteUnroll>, grid, w.p, ctx, "write_cache");
}

template <GatherFmt kFmt>
void launch_gather_fmt(const cache::GatherPlan& g, const Context& ctx, const char* what) {
  const unsigned grid = grid_for(g.p.map.num_rows, kRows, what);
  if (g.vec) launch(cache::gather_kernel<kFmt, true, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
  else launch(cache::gather_kernel<kFmt, false, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
}

void launch_gather(const cache::GatherPlan& g, const Context& ctx, const char* what) {
  if (g.p.map.num_requests <= 0) return;  // no request: nothing is written
  switch (g.fmt) {
    case GatherFmt::raw: return launch_gather_fmt<GatherFmt::raw>(g, ctx, what);
    case GatherFmt::fp8: return launch_gather_fmt<GatherFmt::fp8>(g, ctx, what);
    case GatherFmt::ds_mla: return launch_gather_fmt<GatherFmt::ds_mla>(g, ctx, what);
  }
}

}  // namespace

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,
                 DsMlaScale ds_scale, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::WritePlan w = cache::plan_write(kv_c, k_pe, slot_mapping, cache, ds_scale);
  if (w.p.num_tokens == 0) return;
  switch (cache.format) {
    case CacheFormat::bf16: return launch_write_rows<cache::ElemFormat::bf16>(w, ctx);
    case CacheFormat::fp8: return launch_write_rows<cache::ElemFormat::fp8>(w, ctx);
    case CacheFormat::fp8_ds_mla: {
      const unsigned grid = grid_for(w.p.num_tokens, kDsTokensPerWarp * kThreads / 32, "write_cache");
      if (w.vec) launch(cache::write_ds_mla_kernel<true, kDsTokensPerWarp>, grid, w.p, ctx, "write_cache");
      else launch(cache::write_ds_mla_kernel<false, kDsTokensPerWarp>, grid, w.p, ctx, "write_cache");
      return;
    }
  }
  throw Error("write_cache: unknown cache format");
}

void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0));
  launch_gather(cache::plan_gather_to_bf16(cache, dst, map), ctx, "gather_cache");
}

void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, workspace_starts, false, seq_starts, dst.size(0));
  launch_gather(cache::plan_gather_to_bf16(cache, dst, map), ctx, "upconvert_ds_mla");
}

void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0));
  launch_gather(cache::plan_cp_gather(cache, dst, map), ctx, "cp_gather_cache");
}

}  // namespace mla::cuda
