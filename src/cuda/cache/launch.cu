// SPDX-License-Identifier: Apache-2.0
// Launchers of the cache kernels: params and the vector / element-wise choice come from setup.h;
// here the kernel configuration is picked and launched on ctx.stream.
#include "cuda/cache/gather_kernel.cuh"
#include "cuda/cache/setup.h"
#include "cuda/cache/write_kernel.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

using cache::kRows;
using cache::kThreads;

// Configurations (docs/PERFORMANCE.md has the measurements behind them).
constexpr int kWriteUnroll = 4;     // 16-byte chunk loads in flight per thread (generic bf16 / fp8 write)
constexpr int kDsTokensPerWarp = 2;  // fp8_ds_mla write: tokens whose loads a warp issues together
constexpr int kGatherUnroll = 4;    // chunks in flight per thread (8 converted: slower, measured)

template <class Kernel, class Params>
void launch(Kernel kernel, unsigned grid, const Params& p, const Context& ctx, const char* what) {
  launch_kernel(kernel, grid, kThreads, 0, stream_of(ctx), ctx.pdl, what, p);  // every cache kernel keeps PDL's rule
}

template <class Fmt, int kLatentSteps>
void launch_write_warp(const cache::WritePlan& w, const Context& ctx) {
  using cache::write_warp_kernel;
  const unsigned grid = grid_for(w.p.num_tokens, cache::kWarpTokens * kThreads / 32, "write_cache");
  if constexpr (!cache::kBf16Rows<Fmt>) {
    if (w.recip) return launch(write_warp_kernel<Fmt, kLatentSteps, true>, grid, w.p, ctx, "write_cache");
  }
  launch(write_warp_kernel<Fmt, kLatentSteps, false>, grid, w.p, ctx, "write_cache");
}

// One format's writer: uniform formats stream rows (warp kernel for DeepSeek shapes), per-tile
// formats take the tiled kernel.
template <class Fmt>
void launch_write(const cache::WritePlan& w, const Context& ctx) {
  if (w.act) {  // f16 / f32 activations: a warp per token
    const unsigned grid = grid_for(w.p.num_tokens, kThreads / 32, "write_cache");
    return launch(cache::write_act_kernel<Fmt>, grid, w.p, ctx, "write_cache");
  }
  if constexpr (Fmt::kScale == CacheScale::per_tile) {
    const unsigned grid = grid_for(w.p.num_tokens, kDsTokensPerWarp * kThreads / 32, "write_cache");
    if (w.vec) launch(cache::write_tiled_kernel<Fmt, true, kDsTokensPerWarp>, grid, w.p, ctx, "write_cache");
    else launch(cache::write_tiled_kernel<Fmt, false, kDsTokensPerWarp>, grid, w.p, ctx, "write_cache");
  } else {
    if (w.warp) return w.latent_steps == 2 ? launch_write_warp<Fmt, 2>(w, ctx) : launch_write_warp<Fmt, 1>(w, ctx);
    const unsigned grid = grid_for(w.p.num_tokens, kRows, "write_cache");
    if (w.vec) launch(cache::write_rows_kernel<Fmt, true, kRows, kThreads, kWriteUnroll>, grid, w.p, ctx, "write_cache");
    else launch(cache::write_rows_kernel<Fmt, false, kRows, kThreads, kWriteUnroll>, grid, w.p, ctx, "write_cache");
  }
}

// Raw copies, or the dequantising kernel of (cache format, dst activation type).
void launch_gather(const KVCache& c, const TensorView& dst, const cache::GatherPlan& g, const Context& ctx,
                   const char* what) {
  if (g.p.map.num_requests <= 0) return;  // no request: nothing is written
  const unsigned grid = grid_for(g.p.map.num_rows, kRows, what);
  if (g.raw) {
    if (g.vec) launch(cache::raw_gather_kernel<true, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
    else launch(cache::raw_gather_kernel<false, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
    return;
  }
  if (cache_format_info(c.format).record) {
    dispatch_record_cache_format(c.format, [&](auto fmt) {
      dispatch_activation(dst.dtype, what, [&](auto act) {
        using Fmt = decltype(fmt);
        using Dst = decltype(act);
        if (g.vec) launch(cache::record_gather_kernel<Fmt, Dst, true, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
        else launch(cache::record_gather_kernel<Fmt, Dst, false, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
      });
    });
    return;
  }
  dispatch_device_cache_format(c.format, [&](auto fmt) {
    dispatch_activation(dst.dtype, what, [&](auto act) {
      using Fmt = decltype(fmt);
      using Dst = decltype(act);
      if (g.vec) launch(cache::dequant_gather_kernel<Fmt, Dst, true, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
      else launch(cache::dequant_gather_kernel<Fmt, Dst, false, kRows, kThreads, kGatherUnroll>, grid, g.p, ctx, what);
    });
  });
}

}  // namespace

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,
                 DsMlaScale ds_scale, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::WritePlan w = cache::plan_write(kv_c, k_pe, slot_mapping, cache, ds_scale);
  if (w.p.num_tokens == 0) return;
  if (cache_format_info(cache.format).record) {  // a warp per token, any activation dtype
    const unsigned grid = grid_for(w.p.num_tokens, kThreads / 32, "write_cache");
    return dispatch_record_cache_format(cache.format, [&](auto fmt) {
      using Fmt = decltype(fmt);
      if (w.vec) launch(cache::write_record_kernel<Fmt, true>, grid, w.p, ctx, "write_cache");
      else launch(cache::write_record_kernel<Fmt, false>, grid, w.p, ctx, "write_cache");
    });
  }
  dispatch_device_cache_format(cache.format, [&](auto fmt) { launch_write<decltype(fmt)>(w, ctx); });
}

void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0));
  launch_gather(cache, dst, cache::plan_gather_values(cache, dst, map), ctx, "gather_cache");
}

void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, workspace_starts, false, seq_starts, dst.size(0));
  launch_gather(cache, dst, cache::plan_gather_values(cache, dst, map), ctx, "upconvert_ds_mla");
}

void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  DeviceGuard guard(cache.data.device);
  const cache::RowMap map = cache::make_row_map(cache, block_table, cu_seq_lens, true, seq_starts, dst.size(0));
  launch_gather(cache, dst, cache::plan_cp_gather(cache, dst, map), ctx, "cp_gather_cache");
}

}  // namespace mla::cuda
