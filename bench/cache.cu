// SPDX-License-Identifier: Apache-2.0
// Cache data-movement benchmarks: write_cache, gather_cache / cp_gather_cache, upconvert_ds_mla.
// Sizes: 2^21 tokens (2^16 with --quick), page 64, blocks scattered by a random permutation (as a
// serving cache's pages are). Bytes counted are the minimum each op must move: every input row read
// once, every output row written once, plus the index metadata it reads.
#include <algorithm>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/cache/gather_kernel.cuh"
#include "cuda/cache/setup.h"
#include "cuda/cache/write_kernel.cuh"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr int64_t kPage = 64;
constexpr int64_t kRowIn = 2 * 576;  // bf16 latent + rope of one token

int64_t num_tokens(const BenchContext& ctx) { return ctx.quick() ? (int64_t{1} << 16) : (int64_t{1} << 21); }

// A cache of `format` with every slot holding random finite data.
CacheBuffer filled_cache(CacheFormat f, int64_t slots, const BenchContext& ctx) {
  CacheBuffer c = allocate_cache(f, slots / kPage, kPage, Device::cuda(ctx.device()), 0.05f);
  switch (f) {
    case CacheFormat::bf16: fill_uniform(c.storage, -2, 2, 11, ctx.stream()); break;
    case CacheFormat::fp8: fill_e4m3_codes(c.storage, 12, ctx.stream()); break;
    case CacheFormat::fp8_ds_mla: fill_ds_mla_rows(c.storage, 13, ctx.stream()); break;
    default: break;  // CPU-only formats (f64, the V4 records): allocate_cache refused them above
  }
  return c;
}

Tensor device_i32(const std::vector<int32_t>& v, int64_t rows, int64_t cols, const BenchContext& ctx) {
  Tensor h = Tensor::empty({rows, cols}, DType::i32);
  std::copy(v.begin(), v.end(), static_cast<int32_t*>(h.data()));
  return h.to(Device::cuda(ctx.device()));
}

std::string fmt_name(CacheFormat f) { return to_string(f); }

// T random tokens and their slots: whole pages in a random block order, tokens consecutive within
// a page (as a serving step's new tokens land).
struct WriteInputs {
  Tensor kv_c, k_pe, slots;
};
WriteInputs write_inputs(const BenchContext& ctx) {
  const int64_t T = num_tokens(ctx);
  const Device dev = Device::cuda(ctx.device());
  WriteInputs in;
  in.kv_c = Tensor::empty({T, 512}, DType::bf16, dev);
  in.k_pe = Tensor::empty({T, 64}, DType::bf16, dev);
  fill_uniform(in.kv_c, -4, 4, 21, ctx.stream());
  fill_uniform(in.k_pe, -4, 4, 22, ctx.stream());
  const std::vector<int32_t> perm = random_permutation(T / kPage, 23);
  Tensor slots_h = Tensor::empty({T}, DType::i64);
  auto* s = static_cast<int64_t*>(slots_h.data());
  for (int64_t t = 0; t < T; ++t) s[t] = static_cast<int64_t>(perm[static_cast<std::size_t>(t / kPage)]) * kPage + t % kPage;
  in.slots = slots_h.to(dev);
  return in;
}

void bench_write(BenchContext& ctx) {
  const int64_t T = num_tokens(ctx);
  const Device dev = Device::cuda(ctx.device());
  const WriteInputs in = write_inputs(ctx);
  const Tensor &kv_c = in.kv_c, &k_pe = in.k_pe, &slots = in.slots;
  const Context op = ctx.op_context();
  struct Variant {
    CacheFormat f;
    DsMlaScale mode;
    const char* label;
  };
  for (const Variant& v : {Variant{CacheFormat::bf16, DsMlaScale::amax, "bf16"}, Variant{CacheFormat::fp8, DsMlaScale::amax, "fp8"},
                           Variant{CacheFormat::fp8_ds_mla, DsMlaScale::amax, "fp8_ds_mla amax"},
                           Variant{CacheFormat::fp8_ds_mla, DsMlaScale::pow2, "fp8_ds_mla pow2"}}) {
    CacheBuffer c = allocate_cache(v.f, T / kPage, kPage, dev, 0.05f);
    const double ms = ctx.time_ms([&] { write_cache(kv_c, k_pe, slots, c.cache, v.mode, op); });
    const double bytes = static_cast<double>(T) * static_cast<double>(kRowIn + cache_entry_bytes(v.f) + 8);
    ctx.report("write_cache", std::string(v.label) + " T=" + std::to_string(T) + " page 64", ms, bytes, 0,
               "bytes = T * (2*576 bf16 read + entry written + 8 slot)");
  }
}

// Requests of 16384 tokens (1024 with --quick) covering the whole cache through a scattered table.
struct GatherSetup {
  int64_t T, B, per_req;
  Tensor table, cu, ws_starts;
};
GatherSetup gather_setup(const BenchContext& ctx) {
  GatherSetup g;
  g.T = num_tokens(ctx);
  g.per_req = ctx.quick() ? 1024 : 16384;
  g.B = g.T / g.per_req;
  const int64_t width = g.per_req / kPage;
  g.table = device_i32(random_permutation(g.T / kPage, 31), g.B, width, ctx);
  std::vector<int32_t> cu(static_cast<std::size_t>(g.B + 1));
  for (int64_t b = 0; b <= g.B; ++b) cu[static_cast<std::size_t>(b)] = static_cast<int32_t>(b * g.per_req);
  g.cu = device_i32(cu, 1, g.B + 1, ctx);  // [1, B+1] storage, viewed [B+1] below
  g.ws_starts = device_i32(std::vector<int32_t>(cu.begin(), cu.end() - 1), 1, g.B, ctx);
  return g;
}

void bench_gather(BenchContext& ctx) {
  const GatherSetup g = gather_setup(ctx);
  const Device dev = Device::cuda(ctx.device());
  const TensorView cu = g.cu.view().reshape({g.B + 1});
  const Context op = ctx.op_context();
  const std::string shape = " TOT=" + std::to_string(g.T) + " B=" + std::to_string(g.B) + " page 64";
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    CacheBuffer c = filled_cache(f, g.T, ctx);
    const double table_bytes = 4.0 * static_cast<double>(g.T / kPage);
    {
      Tensor dst = Tensor::empty({g.T, 576}, DType::bf16, dev);
      const double ms = ctx.time_ms([&] { gather_cache(c.cache, dst, g.table, cu, {}, op); });
      ctx.report("gather_cache", fmt_name(f) + " -> bf16 [TOT, 576]" + shape, ms,
                 static_cast<double>(g.T) * static_cast<double>(cache_entry_bytes(f) + kRowIn) + table_bytes, 0,
                 "bytes = TOT * (entry read + 2*576 written) + block table");
    }
    {
      Tensor dst = Tensor::empty({g.T, c.cache.data.size(2)}, c.cache.data.dtype, dev);
      const double ms = ctx.time_ms([&] { cp_gather_cache(c.cache, dst, g.table, cu, {}, op); });
      ctx.report("cp_gather_cache", fmt_name(f) + " raw rows" + shape, ms,
                 2.0 * static_cast<double>(g.T) * static_cast<double>(cache_entry_bytes(f)) + table_bytes, 0,
                 "bytes = TOT * 2 * entry + block table");
    }
  }
}

void bench_upconvert(BenchContext& ctx) {
  const GatherSetup g = gather_setup(ctx);
  const Device dev = Device::cuda(ctx.device());
  CacheBuffer c = filled_cache(CacheFormat::fp8_ds_mla, g.T, ctx);
  Tensor dst = Tensor::empty({g.T, 576}, DType::bf16, dev);
  const TensorView ws = g.ws_starts.view().reshape({g.B});
  const Context op = ctx.op_context();
  const double ms = ctx.time_ms([&] { upconvert_ds_mla(c.cache, dst, g.table, ws, {}, op); });
  ctx.report("upconvert_ds_mla",
             "fp8_ds_mla -> bf16 TOT=" + std::to_string(g.T) + " B=" + std::to_string(g.B) + " page 64", ms,
             static_cast<double>(g.T) * (656.0 + kRowIn) + 4.0 * static_cast<double>(g.T / kPage), 0,
             "bytes = TOT * (656 read + 2*576 written) + block table");
}

// ---- kernel configurations side by side (the launcher's choice and its neighbours) ---------------
// Same inputs as write_cache / gather_cache above, kernels launched directly with the params the
// launcher would build (cuda/cache/setup.h); the ops' own rows above are the shipped configuration.

template <class Kernel, class Params>
void launch_on(BenchContext& ctx, Kernel kernel, unsigned grid, const Params& p) {
  kernel<<<grid, cuda::cache::kThreads, 0, static_cast<cudaStream_t>(ctx.stream())>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("tune_cache launch: ") + cudaGetErrorString(e));
}

unsigned blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

void bench_tune(BenchContext& ctx) {
  namespace cc = cuda::cache;
  using Bf16Fmt = CacheFormatTraits<CacheFormat::bf16>;
  using Fp8Fmt = CacheFormatTraits<CacheFormat::fp8>;
  using DsFmt = CacheFormatTraits<CacheFormat::fp8_ds_mla>;
  const int64_t T = num_tokens(ctx);
  const Device dev = Device::cuda(ctx.device());
  const WriteInputs in = write_inputs(ctx);
  const Tensor &kv_c = in.kv_c, &k_pe = in.k_pe, &slots = in.slots;
  const char* wf = "bytes = T * (2*576 bf16 read + entry written + 8 slot)";
  const std::string tt = " T=" + std::to_string(T);
  // bf16 / fp8: the generic row-stream kernel (shipped before the warp kernel) against the warp
  // kernel, and for fp8 IEEE division against the reciprocal (quant.cuh).
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    CacheBuffer c = allocate_cache(f, T / kPage, kPage, dev, 0.05f);
    const cc::WritePlan w = cc::plan_write(kv_c, k_pe, slots, c.cache, DsMlaScale::amax);
    if (!w.warp || w.latent_steps != 2 || (f == CacheFormat::fp8 && !w.recip)) throw Error("tune_cache: unexpected write plan");
    const double bytes = static_cast<double>(T) * static_cast<double>(kRowIn + cache_entry_bytes(f) + 8);
    const std::string op = std::string("tune: write ") + to_string(f);
    const unsigned gw = blocks(T, cc::kWarpTokens * cc::kThreads / 32);
    double ms;
    if (f == CacheFormat::bf16) {
      ms = ctx.time_ms([&] { launch_on(ctx, cc::write_rows_kernel<Bf16Fmt, true, cc::kRows, cc::kThreads, 4>, blocks(T, cc::kRows), w.p); });
      ctx.report(op, "row stream, unroll 4" + tt, ms, bytes, 0, wf);
      ms = ctx.time_ms([&] { launch_on(ctx, cc::write_warp_kernel<Bf16Fmt, 2, false>, gw, w.p); });
      ctx.report(op, "warp per 4 tokens (shipped)" + tt, ms, bytes, 0, wf);
    } else {
      ms = ctx.time_ms([&] { launch_on(ctx, cc::write_rows_kernel<Fp8Fmt, true, cc::kRows, cc::kThreads, 4>, blocks(T, cc::kRows), w.p); });
      ctx.report(op, "row stream, unroll 4, IEEE division" + tt, ms, bytes, 0, wf);
      ms = ctx.time_ms([&] { launch_on(ctx, cc::write_warp_kernel<Fp8Fmt, 2, false>, gw, w.p); });
      ctx.report(op, "warp per 4 tokens, IEEE division" + tt, ms, bytes, 0, wf);
      ms = ctx.time_ms([&] { launch_on(ctx, cc::write_warp_kernel<Fp8Fmt, 2, true>, gw, w.p); });
      ctx.report(op, "warp per 4 tokens, reciprocal (shipped)" + tt, ms, bytes, 0, wf);
    }
  }
  for (DsMlaScale mode : {DsMlaScale::amax, DsMlaScale::pow2}) {
    CacheBuffer c = allocate_cache(CacheFormat::fp8_ds_mla, T / kPage, kPage, dev);
    const cc::WritePlan w = cc::plan_write(kv_c, k_pe, slots, c.cache, mode);
    const double bytes = static_cast<double>(T) * (kRowIn + 656 + 8);
    const std::string op = std::string("tune: write ds_mla ") + (mode == DsMlaScale::pow2 ? "pow2" : "amax");
    double ms = ctx.time_ms([&] { launch_on(ctx, cc::write_tiled_kernel<DsFmt, true, 2, false>, blocks(T, 16), w.p); });
    ctx.report(op, "2 tokens per warp, IEEE division" + tt, ms, bytes, 0, wf);
    ms = ctx.time_ms([&] { launch_on(ctx, cc::write_tiled_kernel<DsFmt, true, 1, true>, blocks(T, 8), w.p); });
    ctx.report(op, "1 token per warp, reciprocal" + tt, ms, bytes, 0, wf);
    ms = ctx.time_ms([&] { launch_on(ctx, cc::write_tiled_kernel<DsFmt, true, 2, true>, blocks(T, 16), w.p); });
    ctx.report(op, "2 tokens per warp, reciprocal (shipped)" + tt, ms, bytes, 0, wf);
    ms = ctx.time_ms([&] { launch_on(ctx, cc::write_tiled_kernel<DsFmt, true, 4, true>, blocks(T, 32), w.p); });
    ctx.report(op, "4 tokens per warp, reciprocal" + tt, ms, bytes, 0, wf);
  }
  const GatherSetup gs = gather_setup(ctx);
  const TensorView cu = gs.cu.view().reshape({gs.B + 1});
  const char* gf = "bytes = TOT * (entry read + 2*576 written) + block table";
  for (CacheFormat f : {CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    CacheBuffer c = filled_cache(f, gs.T, ctx);
    Tensor dst = Tensor::empty({gs.T, 576}, DType::bf16, dev);
    const cc::GatherPlan gp = cc::plan_gather_values(c.cache, dst, cc::make_row_map(c.cache, gs.table, cu, true, {}, gs.T));
    const double bytes = static_cast<double>(gs.T) * static_cast<double>(cache_entry_bytes(f) + kRowIn);
    const unsigned g = blocks(gs.T, cc::kRows);
    const std::string op = std::string("tune: gather ") + to_string(f);
    double ms4, ms8;
    if (f == CacheFormat::fp8) {
      ms4 = ctx.time_ms([&] { launch_on(ctx, cc::dequant_gather_kernel<Fp8Fmt, cuda::Bf16, true, cc::kRows, cc::kThreads, 4>, g, gp.p); });
      ms8 = ctx.time_ms([&] { launch_on(ctx, cc::dequant_gather_kernel<Fp8Fmt, cuda::Bf16, true, cc::kRows, cc::kThreads, 8>, g, gp.p); });
    } else {
      ms4 = ctx.time_ms([&] { launch_on(ctx, cc::dequant_gather_kernel<DsFmt, cuda::Bf16, true, cc::kRows, cc::kThreads, 4>, g, gp.p); });
      ms8 = ctx.time_ms([&] { launch_on(ctx, cc::dequant_gather_kernel<DsFmt, cuda::Bf16, true, cc::kRows, cc::kThreads, 8>, g, gp.p); });
    }
    ctx.report(op, "unroll 4 (shipped)" + tt, ms4, bytes, 0, gf);
    ctx.report(op, "unroll 8" + tt, ms8, bytes, 0, gf);
  }
}

}  // namespace

void register_cache(Registry& r) {
  r.add("write_cache", "concat_and_cache_mla into bf16 / fp8 / fp8_ds_mla caches", bench_write);
  r.add("gather_cache", "gather_cache (dequantising) and cp_gather_cache (raw) for every format", bench_gather);
  r.add("upconvert", "upconvert_ds_mla into a bf16 workspace", bench_upconvert);
  r.add("tune_cache", "cache kernel configurations side by side (write kernels and dividers, tokens per warp, unroll depth)", bench_tune);
}

}  // namespace mla::bench
