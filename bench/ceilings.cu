// SPDX-License-Identifier: Apache-2.0
// The two ceilings every benchmark row is compared with (DESIGN.md §6), measured in the same run:
//   copy  cudaMemcpyAsync device-to-device of 2 GiB (0.25 GiB with --quick);
//         GB/s = 2 * size / time (each byte is read once and written once)
//   gemm  cuBLAS bf16 GEMM m = n = k = 8192 (2048 with --quick) on random data, fp32 accumulation,
//         through mla::gemm; TFLOP/s = 2 m n k / time
//   launch  the floor of a graph-replayed small step (the issue 48 rows' timing): kernels that do nothing, one CTA
//         of 128 threads per SM, captured and replayed as time_graph_ms times a row (after the L2 flush) — one
//         kernel; two in stream order; two where the second is a programmatic dependent launch that waits on the
//         first (griddepcontrol.wait) and the first lets it start at its entry (griddepcontrol.launch_dependents),
//         the decode kernels' pattern. A row's time less the one-kernel floor is what its kernels add; the second
//         kernel's increment is what one more dependent launch in a step costs.
#include <cuda_runtime.h>

#include <functional>
#include <string>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/griddep.cuh"
#include "mla/error.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {

namespace {

__global__ void launch_floor_kernel() {}

// The first of a dependent pair: lets the dependent grid start at once, as the decode kernels do at their entry.
__global__ void launch_floor_primary_kernel() { cuda::ptx::launch_dependents(); }

// The dependent of the pair: waits for the primary grid's completion (and its memory) before returning.
__global__ void launch_floor_dependent_kernel() { cuda::ptx::grid_dependency_wait(); }

// `kernel` over one CTA of 128 threads per SM on `stream`; `pdl`: as a programmatic dependent launch.
void launch_empty(void (*kernel)(), int sms, cudaStream_t stream, bool pdl) {
  cuda::launch_kernel(kernel, static_cast<unsigned>(sms), 128, 0, stream, pdl, "launch ceiling");
}

// The three launch-floor rows (the header's "launch").
void report_launch_floor(BenchContext& ctx) {
  int sms = 0;
  cuda::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device()), "launch ceiling");
  const auto s = static_cast<cudaStream_t>(ctx.stream());
  const struct {
    const char* config;
    std::function<void()> launch;
  } rows[] = {
      {"1 empty kernel, 1 CTA / SM", [&] { launch_empty(launch_floor_kernel, sms, s, false); }},
      {"2 empty kernels in stream order",
       [&] {
         launch_empty(launch_floor_kernel, sms, s, false);
         launch_empty(launch_floor_kernel, sms, s, false);
       }},
      {"2 empty kernels, the 2nd PDL",
       [&] {
         launch_empty(launch_floor_primary_kernel, sms, s, false);
         launch_empty(launch_floor_dependent_kernel, sms, s, true);
       }},
  };
  for (const auto& r : rows) {
    std::string config = r.config;
    const double ms = ctx.time_ms(r.launch, true, config);
    ctx.report("ceiling: launch", config, ms, 0, 0, "graph-replayed after the L2 flush, as a small-step row");
  }
}

}  // namespace

void register_ceilings(Registry& r) {
  const char* what = "device-to-device copy bandwidth, cuBLAS bf16 GEMM rate, graph-replayed launch floor";
  r.add("ceilings", what, [](BenchContext& ctx) {
    const Device dev = Device::cuda(ctx.device());
    const int64_t bytes = ctx.quick() ? (int64_t{1} << 28) : (int64_t{1} << 31);
    {
      Tensor src = Tensor::empty({bytes}, DType::u8, dev), dst = Tensor::empty({bytes}, DType::u8, dev);
      fill_e4m3_codes(src, 1, ctx.stream());
      const double ms = ctx.time_ms([&] {
        const cudaError_t e = cudaMemcpyAsync(dst.data(), src.data(), static_cast<std::size_t>(bytes),
                                              cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(ctx.stream()));
        if (e != cudaSuccess) throw Error(std::string("copy ceiling: ") + cudaGetErrorString(e));
      });
      ctx.ceilings().copy_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e6);
      ctx.report("ceiling: copy", "cudaMemcpyAsync D2D " + std::to_string(bytes >> 20) + " MiB", ms,
                 2.0 * static_cast<double>(bytes), 0, "bytes = 2 * size (read + write)");
    }
    {
      const int64_t n = ctx.quick() ? 2048 : 8192;
      Tensor a = Tensor::empty({n, n}, DType::bf16, dev), b = Tensor::empty({n, n}, DType::bf16, dev);
      Tensor c = Tensor::empty({n, n}, DType::bf16, dev);
      fill_uniform(a, -1, 1, 2, ctx.stream());
      fill_uniform(b, -1, 1, 3, ctx.stream());
      const Context op = ctx.op_context();
      const double ms = ctx.time_ms([&] { gemm(a, b, c, 1.0f, 0.0f, op); });
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      ctx.ceilings().gemm_tflops = flops / (ms * 1e9);
      const std::string s = std::to_string(n);
      ctx.report("ceiling: gemm", "cuBLAS bf16 " + s + "x" + s + "x" + s, ms, 3.0 * n * n * 2, flops,
                 "flops = 2 m n k; bytes = a + b + c");
    }
    report_launch_floor(ctx);
  });
}

}  // namespace mla::bench
