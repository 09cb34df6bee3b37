// SPDX-License-Identifier: Apache-2.0
// Read floors (floor.h): a load-only gather of the rows an attention call reads.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>

#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "floor.h"
#include "mla/error.h"
#include "mla/tensor.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr int kThreads = 256, kUnroll = 8, kBlocksPerSm = 4;
constexpr int kBulkRows = 64;  // rows per tile of the bulk kernel, one per thread

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("mla bench: read floor: ") + what + ": " + cudaGetErrorString(e));
}

// Flattened over (row, 16-byte chunk) in grid-stride order, so a warp's 32 lanes read 512 consecutive bytes of
// one or two rows; kUnroll independent loads per thread are in flight before any is used. kChunks > 0 fixes
// the chunk count at compile time (the division becomes a multiply); 0 reads it from `chunks`.
template <int kChunks>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const uint4* __restrict__ base, int64_t stride16,
                                                               const int32_t* __restrict__ slots, int64_t n,
                                                               int64_t chunks, uint32_t* result) {
  const int64_t c_per_row = kChunks > 0 ? kChunks : chunks;
  const int64_t total = n * c_per_row, step = int64_t(gridDim.x) * kThreads;
  uint32_t acc = 0;
  for (int64_t c0 = int64_t(blockIdx.x) * kThreads + threadIdx.x; c0 < total; c0 += step * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * step;
      v[u] = make_uint4(0, 0, 0, 0);
      if (c < total) {
        const int64_t row = c / c_per_row;
        const int32_t slot = __ldg(slots + row);
        if (slot >= 0) v[u] = __ldg(base + int64_t(slot) * stride16 + (c - row * c_per_row));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) atomicXor(result, acc);  // one atomic per warp: keeps every load live
}

// The copy engine's form: CTA b takes tiles b, b + grid, ... of kBulkRows slots; thread t copies row t of each
// tile into shared memory with one cp.async.bulk (complete_tx on the CTA's one mbarrier), waits for the tile
// to land and goes on to its next tile; as many CTAs per SM as shared memory allows keep that many tiles in
// flight. kFold: each thread then XOR-folds its row out of shared memory (the device test's check that the
// right rows landed; the timed floor skips it).
template <bool kFold>
__global__ void __launch_bounds__(kBulkRows) gather_rows_bulk_kernel(const char* __restrict__ base,
                                                                      int64_t stride_bytes, uint32_t row_bytes,
                                                                      const int32_t* __restrict__ slots, int64_t n,
                                                                      uint32_t* result) {
  extern __shared__ __align__(128) char smem[];
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  char* rows = smem + 128;
  const int t = threadIdx.x;
  if (t == 0) {
    cuda::ptx::mbar_init(bar, kBulkRows);
    cuda::ptx::fence_mbarrier_init();
  }
  __syncthreads();
  uint32_t acc = 0, parity = 0;
  const int64_t tiles = (n + kBulkRows - 1) / kBulkRows;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, parity ^= 1u) {
    const int64_t r = tile * kBulkRows + t;
    const int32_t slot = r < n ? __ldg(slots + r) : -1;
    char* dst = rows + t * row_bytes;
    if (slot >= 0) {
      cuda::ptx::mbar_arrive_expect_tx(bar, row_bytes);
      cuda::ptx::bulk_load(dst, base + int64_t(slot) * stride_bytes, row_bytes, bar);
    } else {
      cuda::ptx::mbar_arrive(bar);
    }
    cuda::ptx::mbar_wait(bar, parity);
    if (kFold && slot >= 0) {
      for (uint32_t w = 0; w < row_bytes / 4; ++w) acc ^= reinterpret_cast<const uint32_t*>(dst)[w];
      cuda::ptx::fence_proxy_async_smem();  // the row read through the generic proxy before the next copy into it
    }
  }
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (kFold && t % 32 == 0) atomicXor(result, acc);
}

int sm_count() {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return sms;
}

void launch_gather(const void* base, int64_t stride_bytes, int64_t row_bytes, const int32_t* slots, int64_t n,
                   uint32_t* result, int sms, cudaStream_t s) {
  if (n == 0) return;
  const auto* b = static_cast<const uint4*>(base);
  const int64_t stride16 = stride_bytes / 16, chunks = row_bytes / 16;
  const dim3 grid(static_cast<unsigned>(sms * kBlocksPerSm));
  switch (chunks) {  // the row sizes of the cache formats at d_qk 576 / 512
    case 32: gather_rows_kernel<32><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result); break;
    case 36: gather_rows_kernel<36><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result); break;
    case 41: gather_rows_kernel<41><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result); break;
    case 64: gather_rows_kernel<64><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result); break;
    case 72: gather_rows_kernel<72><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result); break;
    default: gather_rows_kernel<0><<<grid, kThreads, 0, s>>>(b, stride16, slots, n, chunks, result);
  }
  check(cudaGetLastError(), "launch");
}

// The bulk kernel's launch shape: shared memory for one 64-row tile, as many CTAs per SM as fit. Set up once per
// row size, outside any timed call (the attribute and the occupancy query are host work).
struct BulkLaunch {
  void (*kernel)(const char*, int64_t, uint32_t, const int32_t*, int64_t, uint32_t*);
  dim3 grid;
  int smem;
};

BulkLaunch bulk_launch(bool fold, int64_t row_bytes, int sms) {
  BulkLaunch l{fold ? gather_rows_bulk_kernel<true> : gather_rows_bulk_kernel<false>, dim3(1),
               128 + kBulkRows * static_cast<int>(row_bytes)};
  check(cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem), "cudaFuncSetAttribute");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l.kernel, kBulkRows, l.smem), "occupancy");
  l.grid = dim3(static_cast<unsigned>(sms * std::max(per_sm, 1)));
  return l;
}

void launch_bulk(const BulkLaunch& l, const void* base, int64_t stride_bytes, int64_t row_bytes, const int32_t* slots,
                 int64_t n, uint32_t* result, cudaStream_t s) {
  if (n == 0) return;
  l.kernel<<<l.grid, kBulkRows, l.smem, s>>>(static_cast<const char*>(base), stride_bytes,
                                             static_cast<uint32_t>(row_bytes), slots, n, result);
  check(cudaGetLastError(), "launch");
}

// The rows' preconditions shared by both reading forms.
void check_rows(const void* base, int64_t stride_bytes, int64_t row_bytes) {
  if (row_bytes <= 0 || row_bytes % 16 || row_bytes > kMaxFloorRowBytes || stride_bytes < row_bytes ||
      stride_bytes % 16 || reinterpret_cast<uintptr_t>(base) % 16)
    throw Error("mla bench: read floor: rows must be 16-byte multiples of at most " +
                std::to_string(kMaxFloorRowBytes) + " B at 16-byte aligned addresses (row " +
                std::to_string(row_bytes) + " B, stride " + std::to_string(stride_bytes) + " B)");
}

}  // namespace

uint32_t gather_rows_xor(FloorKernel kernel, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const int32_t* slots_dev, int64_t n, uint32_t* result_dev, void* stream) {
  check_rows(base, stride_bytes, row_bytes);
  auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemsetAsync(result_dev, 0, sizeof(uint32_t), s), "cudaMemsetAsync");
  if (kernel == FloorKernel::loads)
    launch_gather(base, stride_bytes, row_bytes, slots_dev, n, result_dev, sm_count(), s);
  else
    launch_bulk(bulk_launch(true, row_bytes, sm_count()), base, stride_bytes, row_bytes, slots_dev, n, result_dev, s);
  uint32_t h = 0;
  check(cudaMemcpyAsync(&h, result_dev, sizeof(h), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return h;
}

double gather_floor_ms(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                       const std::vector<int32_t>& slots, bool graph, bool* replayed) {
  check_rows(base, stride_bytes, row_bytes);
  auto s = static_cast<cudaStream_t>(ctx.stream());
  const int64_t n = static_cast<int64_t>(slots.size());
  // The slots, then one word for the fold's result (not reset between runs: only the loads' liveness matters).
  Tensor mem = Tensor::empty({n + 1}, DType::i32, Device::cuda(ctx.device()));
  auto* d_slots = static_cast<int32_t*>(mem.data());
  auto* d_result = reinterpret_cast<uint32_t*>(d_slots + n);
  check(cudaMemcpyAsync(d_slots, slots.data(), slots.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync");
  check(cudaMemsetAsync(d_result, 0, sizeof(uint32_t), s), "cudaMemsetAsync");
  const int sms = sm_count();
  const BulkLaunch bulk = bulk_launch(false, row_bytes, sms);
  // Timed: the kernels alone; the floor is the faster of the two reading forms.
  bool all_graph = graph;
  auto time = [&](const std::function<void()>& call) {
    if (!graph) return ctx.time_ms(call);
    const BenchContext::GraphTiming t = ctx.time_graph_ms(call);
    all_graph = all_graph && t.graph;
    return t.ms;
  };
  const double ms = std::min(time([&] { launch_gather(base, stride_bytes, row_bytes, d_slots, n, d_result, sms, s); }),
                             time([&] { launch_bulk(bulk, base, stride_bytes, row_bytes, d_slots, n, d_result, s); }));
  if (replayed) *replayed = all_graph;
  return ms;
}

void report_gather_floor(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const std::vector<int32_t>& slots, bool graph) {
  bool replayed = false;
  const double ms = gather_floor_ms(ctx, base, stride_bytes, row_bytes, slots, graph, &replayed);
  const auto rows = std::count_if(slots.begin(), slots.end(), [](int32_t v) { return v >= 0; });
  ctx.report_floor(ms, static_cast<double>(rows) * static_cast<double>(row_bytes), replayed);
}

std::vector<int32_t> decode_row_slots(const std::vector<int32_t>& table, const std::vector<int32_t>& lens,
                                      int64_t pages_per_request, int64_t page) {
  std::vector<int32_t> slots;
  for (std::size_t r = 0; r < lens.size(); ++r)
    for (int64_t k = 0; k < lens[r]; ++k) {
      const int32_t block = table[r * static_cast<std::size_t>(pages_per_request) + static_cast<std::size_t>(k / page)];
      slots.push_back(block < 0 ? -1 : static_cast<int32_t>(block * page + k % page));
    }
  return slots;
}

}  // namespace mla::bench
