// SPDX-License-Identifier: Apache-2.0
// The two ceilings every benchmark row is compared with (DESIGN.md §6), measured in the same run:
//   copy  cudaMemcpyAsync device-to-device of 2 GiB (0.25 GiB with --quick);
//         GB/s = 2 * size / time (each byte is read once and written once)
//   gemm  cuBLAS bf16 GEMM m = n = k = 8192 (2048 with --quick) on random data, fp32 accumulation,
//         through mla::gemm; TFLOP/s = 2 m n k / time
#include <cuda_runtime.h>

#include <string>

#include "mla/error.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {

void register_ceilings(Registry& r) {
  r.add("ceilings", "device-to-device copy bandwidth and cuBLAS bf16 GEMM rate", [](BenchContext& ctx) {
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
  });
}

}  // namespace mla::bench
