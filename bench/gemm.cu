// SPDX-License-Identifier: Apache-2.0
// The layer's matrix products through mla::gemm / mla::bmm (cuBLAS), as shares of the GEMM ceiling:
//   kv_b_proj   [T, 512] x [512, N*(P+V)]                          T = 8192, N = 128: 2*T*512*32768 flops
//   q absorb    (N, B, P) x (N, P, L): q_nope strided out of q [B, N, 192], ql written into [B, N, 512]
//   v up-proj   (N, B, L) x (N, L, V): o_lat [B, N, 512] strided, out written into [B, N*V]
//   v up-proj quantised (--out-quant KEY, default fp8_group128): the same product with its output in
//               KEY's format, two ways in the same call: bmm + quantize_output (two passes, the bf16
//               product written and read back) and up_project_quantized (one kernel, the quantiser in
//               its epilogue), N 16 / 64 / 128, B 1 .. 8192; each pair followed by fused / two-pass and the
//               schedule the fused call ran (core/up_proj_schedule.h: rows per CTA, latent split), and for
//               B <= 128 (the decode sizes) every schedule the device runs, timed alike, the planner's marked.
// flops = 2 * batch * m * n * k; bytes = a + b + c (each read or written once; quantised rows: the codes
// and scales written, not the two-pass row's bf16 round trip).
#include <cstdio>
#include <string>

#include "core/up_proj_schedule.h"
#include "cuda/block/up_proj_quant.h"
#include "mla/block_ops.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {
namespace {

void bench_gemm(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t q = ctx.quick() ? 8 : 1;
  const int64_t N = 128, P = 128, R = 64, L = 512, V = 128;
  const char* formula = "flops = 2*batch*m*n*k; bytes = a + b + c";
  {
    const int64_t T = 8192 / q, n = N * (P + V);
    Tensor a = Tensor::empty({T, L}, DType::bf16, dev), w = Tensor::empty({L, n}, DType::bf16, dev);
    Tensor c = Tensor::empty({T, n}, DType::bf16, dev);
    fill_uniform(a, -1, 1, 61, ctx.stream());
    fill_uniform(w, -0.05, 0.05, 62, ctx.stream());
    const double ms = ctx.time_ms([&] { gemm(a, w, c, 1.0f, 0.0f, op); });
    ctx.report("gemm", "kv_b_proj [" + std::to_string(T) + ", 512] x [512, 32768]", ms,
               2.0 * (T * L + L * n + T * n), 2.0 * T * L * n, formula);
  }
  for (const int64_t B : {int64_t{128}, int64_t{4096} / q}) {
    // q absorb: a = q[:, :, :P] as (N, B, P), b = W_UK_T (N, P, L), c = ql (N, B, L) inside [B, N, L].
    Tensor qt = Tensor::empty({B, N, P + R}, DType::bf16, dev), wuk = Tensor::empty({N, P, L}, DType::bf16, dev);
    Tensor ql = Tensor::empty({B, N, L}, DType::bf16, dev);
    fill_uniform(qt, -1, 1, 63, ctx.stream());
    fill_uniform(wuk, -0.1, 0.1, 64, ctx.stream());
    const TensorView a = qt.view().slice(2, 0, P).transpose(0, 1), c = ql.view().transpose(0, 1);
    double ms = ctx.time_ms([&] { bmm(a, wuk, c, 1.0f, 0.0f, op); });
    ctx.report("bmm", "q absorb (128, " + std::to_string(B) + ", 128) x (128, 128, 512)", ms,
               2.0 * (N * B * P + N * P * L + N * B * L), 2.0 * N * B * P * L, formula);
    // v up-projection: a = o_lat (N, B, L) inside [B, N, L], b = W_UV (N, L, V), c = out (N, B, V) inside [B, N*V].
    Tensor wuv = Tensor::empty({N, L, V}, DType::bf16, dev), out = Tensor::empty({B, N, V}, DType::bf16, dev);
    fill_uniform(wuv, -0.1, 0.1, 65, ctx.stream());
    const TensorView o = out.view().transpose(0, 1);
    ms = ctx.time_ms([&] { bmm(c, wuv, o, 1.0f, 0.0f, op); });
    ctx.report("bmm", "v up-proj (128, " + std::to_string(B) + ", 512) x (128, 512, 128)", ms,
               2.0 * (N * B * L + N * L * V + N * B * V), 2.0 * N * B * L * V, formula);
  }
  // The V up-projection with a quantised output: two passes against the fused kernel.
  const OutputQuant key = ctx.options().out_quant == "none" ? OutputQuant::fp8_group128
                                                           : parse_output_quant(ctx.options().out_quant);
  const bool fp4 = key == OutputQuant::nvfp4;
  const int64_t G = output_quant_group(key);
  const float scale = fp4 ? 448.0f * 6.0f / 8.0f : 1.0f / 64.0f;
  const int max_splits = cuda::up_proj_splits_supported(ctx.device()) ? up_proj::kMaxSplits : 1;
  for (const int64_t heads : {int64_t{16}, int64_t{64}, int64_t{128}})
    for (const int64_t B : {1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192}) {
      if (ctx.quick() && B > 1024) continue;
      const int64_t W = heads * V;
      Tensor o_lat = Tensor::empty({B, heads, L}, DType::bf16, dev), wuv = Tensor::empty({heads, L, V}, DType::bf16, dev);
      Tensor x = Tensor::empty({B, W}, DType::bf16, dev);
      Tensor codes = Tensor::empty({B, fp4 ? W / 2 : W}, fp4 ? DType::u8 : DType::fp8_e4m3, dev), scales;
      if (fp4) scales = Tensor::empty({B, W / 16}, DType::fp8_e4m3, dev);
      else if (G > 0) scales = Tensor::empty({W / G, B}, DType::f32, dev);
      fill_uniform(o_lat, -1, 1, 66, ctx.stream());
      fill_uniform(wuv, -0.1, 0.1, 67, ctx.stream());
      const TensorView sv = scales.defined() ? scales.view() : TensorView{};
      const double flops = 2.0 * heads * B * L * V;
      const double bytes = 2.0 * (heads * B * L + heads * L * V) + static_cast<double>(codes.nbytes()) +
                           (scales.defined() ? static_cast<double>(scales.nbytes()) : 0.0);
      const std::string shape = "(" + std::to_string(heads) + ", " + std::to_string(B) + ", 512) x (" +
                                std::to_string(heads) + ", 512, 128) out=" + to_string(key);
      const double two = ctx.time_ms([&] {
        bmm(o_lat.view().transpose(0, 1), wuv, x.view().reshape({B, heads, V}).transpose(0, 1), 1.0f, 0.0f, op);
        quantize_output(x, key, codes, sv, scale, op);
      });
      ctx.report("bmm", "v up-proj + quantize_output " + shape, two, bytes, flops, formula);
      const double one = ctx.time_ms([&] { up_project_quantized(o_lat, wuv, key, codes, sv, scale, op); });
      ctx.report("bmm", "v up-proj quantised, fused " + shape, one, bytes, flops, formula);
      const up_proj::Schedule planned = cuda::up_proj_planned_schedule(B, heads, L, V, ctx.device());
      std::printf("    fused / two-pass: x%.3f (schedule: %d rows x %d splits)\n", two > 0 ? one / two : 0.0,
                  planned.tile_rows, planned.splits);
      if (B <= 128)  // every schedule at the decode sizes: the planner's model against the clock
        for (const bool hopper : {false, true}) {
          if (hopper && !cuda::up_proj_hopper_supported(ctx.device())) continue;
          for (int splits = 1; splits <= max_splits; splits *= 2)
            for (const int rows : up_proj::kTileRows) {
              if (hopper && rows == 16) continue;  // the Hopper mainloop's tiles are 64 and 128 rows
              const up_proj::Schedule s{rows, splits, hopper};
              const double ms =
                  ctx.time_ms([&] { cuda::up_project_quantized_with(o_lat, wuv, key, codes, sv, scale, s, op); });
              std::printf("      %c %3d rows x %d splits%s: %.4f ms  x%.3f of two-pass\n", s == planned ? '*' : ' ',
                          rows, splits, hopper ? " hopper" : "", ms, two > 0 ? ms / two : 0.0);
            }
        }
      std::fflush(stdout);
    }
}

}  // namespace

void register_gemm(Registry& r) { r.add("gemm", "the layer's GEMM / BMM shapes through cuBLAS", bench_gemm); }

}  // namespace mla::bench
