// SPDX-License-Identifier: Apache-2.0
// Read floors (floor.h): a load-only gather of the rows an attention call reads.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "core/fast_div.h"
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

// One row set as the kernels take it (RowLayout with its device slots). A row is read as the `chunks` aligned
// 16-byte chunks from its offset rounded down to 16 (the row itself, or a short row's one chunk).
struct Set {
  const char* base;
  const int32_t* slots;
  int64_t n, block_stride, row_stride;
  FastDivisor page, chunks;
  int64_t chunk_begin;  // the set's first chunk in the flat (set, row, chunk) order
  int64_t tile_begin;   // the set's first 64-row tile in the flat (set, tile) order
};
struct Sets {
  Set s[kMaxRowSets];
  int count;
  int64_t chunks, tiles;  // over all sets
  uint32_t span;          // the most bytes one row reads (the bulk form's row pitch in shared memory)
};

// Byte offset from the set's base of the aligned chunk a row starts in.
__device__ __forceinline__ int64_t row_offset(const Set& s, int32_t slot) {
  uint32_t blk, r;
  fast_divmod(static_cast<uint32_t>(slot), s.page, blk, r);
  return (int64_t(blk) * s.block_stride + int64_t(r) * s.row_stride) & ~int64_t{15};
}

// Flattened over (set, row, 16-byte chunk) in grid-stride order, so a warp's 32 lanes read 512 consecutive
// bytes of one or two rows; kUnroll independent loads per thread are in flight before any is used. One loop per
// set (its fields held in registers), each starting where the flat order puts this thread in it.
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const __grid_constant__ Sets sets, uint32_t* result) {
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x, step = int64_t(gridDim.x) * kThreads;
  uint32_t acc = 0;
#pragma unroll 1
  for (int k = 0; k < sets.count; ++k) {
    const Set& s = sets.s[k];
    const int64_t total = s.n * s.chunks.d;
    const auto* base = reinterpret_cast<const uint4*>(s.base);
    for (int64_t c0 = ((tid - s.chunk_begin) % step + step) % step; c0 < total; c0 += step * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * step;
        v[u] = make_uint4(0, 0, 0, 0);
        if (c < total) {
          uint32_t row, chunk;
          fast_divmod(static_cast<uint32_t>(c), s.chunks, row, chunk);
          const int32_t slot = __ldg(s.slots + row);
          if (slot >= 0) v[u] = __ldg(base + (row_offset(s, slot) >> 4) + chunk);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) atomicXor(result, acc);  // one atomic per warp: keeps every load live
}

// The copy engine's form: CTA b takes tiles b, b + grid, ... of the flat (set, tile) order, a tile being
// kBulkRows slots of one set; thread t copies row t of each tile into shared memory with one cp.async.bulk
// (complete_tx on the CTA's one mbarrier), waits for the tile to land and goes on to its next tile; as many
// CTAs per SM as shared memory allows keep that many tiles in flight. kFold: each thread then XOR-folds its row
// out of shared memory (the device test's check that the right rows landed; the timed floor skips it).
template <bool kFold>
__global__ void __launch_bounds__(kBulkRows) gather_rows_bulk_kernel(const __grid_constant__ Sets sets,
                                                                      uint32_t* result) {
  extern __shared__ __align__(128) char smem[];
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  const int t = threadIdx.x;
  char* dst = smem + 128 + t * sets.span;
  if (t == 0) {
    cuda::ptx::mbar_init(bar, kBulkRows);
    cuda::ptx::fence_mbarrier_init();
  }
  __syncthreads();
  uint32_t acc = 0, parity = 0;
  for (int64_t tile = blockIdx.x; tile < sets.tiles; tile += gridDim.x, parity ^= 1u) {
    int k = 0;
    while (k + 1 < sets.count && tile >= sets.s[k + 1].tile_begin) ++k;
    const Set& s = sets.s[k];
    const int64_t r = (tile - s.tile_begin) * kBulkRows + t;
    const int32_t slot = r < s.n ? __ldg(s.slots + r) : -1;
    const uint32_t bytes = s.chunks.d * 16;
    if (slot >= 0) {
      cuda::ptx::mbar_arrive_expect_tx(bar, bytes);
      cuda::ptx::bulk_load(dst, s.base + row_offset(s, slot), bytes, bar);
    } else {
      cuda::ptx::mbar_arrive(bar);
    }
    cuda::ptx::mbar_wait(bar, parity);
    if (kFold && slot >= 0) {
      for (uint32_t w = 0; w < bytes / 4; ++w) acc ^= reinterpret_cast<const uint32_t*>(dst)[w];
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

// A layout's preconditions (floor.h, RowLayout) for n rows; returns the 16-byte chunks a row reads.
int64_t check_layout(const RowLayout& l, int64_t n) {
  const bool shrt = l.row_bytes > 0 && l.row_bytes < 16;
  bool ok = l.row_bytes > 0 && l.row_bytes <= kMaxFloorRowBytes && l.page >= 1 && l.page <= INT32_MAX &&
            l.block_stride_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(l.base) % 16 == 0 &&
            (l.page == 1 ? l.block_stride_bytes : l.row_stride_bytes) >= l.row_bytes;
  if (!shrt) ok = ok && l.row_bytes % 16 == 0 && (l.page == 1 || l.row_stride_bytes % 16 == 0);
  for (int64_t r = 0; shrt && r < std::min<int64_t>(l.page, 16); ++r)  // the offsets mod 16 repeat after 16 rows
    ok = ok && (r * l.row_stride_bytes) % 16 + l.row_bytes <= 16;
  const int64_t chunks = shrt ? 1 : l.row_bytes / 16;
  if (!ok)
    throw Error("mla bench: read floor: rows must be 16-byte multiples of at most " +
                std::to_string(kMaxFloorRowBytes) + " B at 16-byte aligned addresses, or shorter rows inside one "
                "aligned 16-byte chunk (row " + std::to_string(l.row_bytes) + " B, strides " +
                std::to_string(l.block_stride_bytes) + " / " + std::to_string(l.row_stride_bytes) + " B, page " +
                std::to_string(l.page) + ")");
  if (n < 0 || n * chunks > INT32_MAX) throw Error("mla bench: read floor: more than 2^31 chunks in one row set");
  return chunks;
}

// The kernels' view of the sets, checked.
Sets make_sets(const std::vector<DeviceRowSet>& in) {
  if (in.empty() || in.size() > static_cast<std::size_t>(kMaxRowSets))
    throw Error("mla bench: read floor: 1 to " + std::to_string(kMaxRowSets) + " row sets");
  Sets out{};
  out.count = static_cast<int>(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const RowLayout& l = in[i].rows;
    const int64_t chunks = check_layout(l, in[i].n);
    out.s[i] = {static_cast<const char*>(l.base), in[i].slots, in[i].n, l.block_stride_bytes, l.row_stride_bytes,
                make_fast_divisor(static_cast<uint32_t>(l.page)), make_fast_divisor(static_cast<uint32_t>(chunks)),
                out.chunks, out.tiles};
    out.chunks += in[i].n * chunks;
    out.tiles += (in[i].n + kBulkRows - 1) / kBulkRows;
    out.span = std::max(out.span, static_cast<uint32_t>(chunks * 16));
  }
  return out;
}

void launch_gather(const Sets& sets, uint32_t* result, int sms, cudaStream_t s) {
  if (sets.chunks == 0) return;
  gather_rows_kernel<<<dim3(static_cast<unsigned>(sms * kBlocksPerSm)), kThreads, 0, s>>>(sets, result);
  check(cudaGetLastError(), "launch");
}

// The bulk kernel's launch shape: shared memory for one 64-row tile, as many CTAs per SM as fit. Set up once per
// row size, outside any timed call (the attribute and the occupancy query are host work).
struct BulkLaunch {
  void (*kernel)(Sets, uint32_t*);
  dim3 grid;
  int smem;
};

BulkLaunch bulk_launch(bool fold, const Sets& sets, int sms) {
  BulkLaunch l{fold ? gather_rows_bulk_kernel<true> : gather_rows_bulk_kernel<false>, dim3(1),
               128 + kBulkRows * static_cast<int>(sets.span)};
  check(cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem), "cudaFuncSetAttribute");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l.kernel, kBulkRows, l.smem), "occupancy");
  l.grid = dim3(static_cast<unsigned>(sms * std::max(per_sm, 1)));
  return l;
}

void launch_bulk(const BulkLaunch& l, const Sets& sets, uint32_t* result, cudaStream_t s) {
  if (sets.tiles == 0) return;
  l.kernel<<<l.grid, kBulkRows, l.smem, s>>>(sets, result);
  check(cudaGetLastError(), "launch");
}

}  // namespace

RowLayout strided_rows(const void* base, int64_t stride_bytes, int64_t row_bytes) {
  return {base, row_bytes, stride_bytes, 0, 1};
}

std::vector<RowSet> cache_row_sets(const KVCache& c, std::vector<int32_t> slots) {
  const auto eb = static_cast<int64_t>(c.data.element_size());
  const RowLayout entry{c.data.data, cache_entry_bytes(c.format, c.d_qk, c.d_rope), c.data.stride_of(0) * eb,
                        c.data.stride_of(1) * eb, c.page_size()};
  return dispatch_cache_format(c.format, [&](auto traits) -> std::vector<RowSet> {
    using Tr = decltype(traits);
    if constexpr (Tr::kRecord && Tr::kPageScales) {  // bodies packed in the page, scale slots after them
      const auto* base = static_cast<const char*>(entry.base);
      const int64_t rs = entry.row_stride_bytes, page = entry.page;
      RowLayout body = entry, scale = entry;
      body.base = base + Tr::body_offset(0, rs);
      body.row_stride_bytes = Tr::body_offset(1, rs) - Tr::body_offset(0, rs);
      body.row_bytes = Tr::scale_offset(Tr::kDqk - Tr::kDrope);  // [codes | rope]
      scale.base = base + Tr::slot_offset(page, 0, rs);
      scale.row_stride_bytes = Tr::slot_offset(page, 1, rs) - Tr::slot_offset(page, 0, rs);
      scale.row_bytes = Tr::kScaleSlot;
      return {{body, slots}, {scale, std::move(slots)}};
    } else {
      return {{entry, std::move(slots)}};
    }
  });
}

uint32_t gather_rows_xor(FloorKernel kernel, const std::vector<DeviceRowSet>& sets, uint32_t* result_dev,
                         void* stream) {
  const Sets d = make_sets(sets);
  auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemsetAsync(result_dev, 0, sizeof(uint32_t), s), "cudaMemsetAsync");
  if (kernel == FloorKernel::loads) launch_gather(d, result_dev, sm_count(), s);
  else launch_bulk(bulk_launch(true, d, sm_count()), d, result_dev, s);
  uint32_t h = 0;
  check(cudaMemcpyAsync(&h, result_dev, sizeof(h), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return h;
}

uint32_t gather_rows_xor(FloorKernel kernel, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const int32_t* slots_dev, int64_t n, uint32_t* result_dev, void* stream) {
  return gather_rows_xor(kernel, {{strided_rows(base, stride_bytes, row_bytes), slots_dev, n}}, result_dev, stream);
}

double gather_floor_ms(BenchContext& ctx, const std::vector<RowSet>& sets, bool graph, bool* replayed) {
  auto s = static_cast<cudaStream_t>(ctx.stream());
  int64_t n = 0;
  for (const RowSet& r : sets) n += static_cast<int64_t>(r.slots.size());
  // Every set's slots, then one word for the fold's result (not reset between runs: only the loads' liveness
  // matters).
  Tensor mem = Tensor::empty({n + 1}, DType::i32, Device::cuda(ctx.device()));
  auto* d_slots = static_cast<int32_t*>(mem.data());
  auto* d_result = reinterpret_cast<uint32_t*>(d_slots + n);
  std::vector<DeviceRowSet> dev;
  int32_t* at = d_slots;
  for (const RowSet& r : sets) {
    dev.push_back({r.rows, at, static_cast<int64_t>(r.slots.size())});
    check(cudaMemcpyAsync(at, r.slots.data(), r.slots.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync");
    at += r.slots.size();
  }
  const Sets d = make_sets(dev);
  check(cudaMemsetAsync(d_result, 0, sizeof(uint32_t), s), "cudaMemsetAsync");
  const int sms = sm_count();
  const BulkLaunch bulk = bulk_launch(false, d, sms);
  // Timed: the kernels alone; the floor is the faster of the two reading forms.
  bool all_graph = graph;
  auto time = [&](const std::function<void()>& call) {
    if (!graph) return ctx.time_ms(call);
    const BenchContext::GraphTiming t = ctx.time_graph_ms(call);
    all_graph = all_graph && t.graph;
    return t.ms;
  };
  const double ms = std::min(time([&] { launch_gather(d, d_result, sms, s); }),
                             time([&] { launch_bulk(bulk, d, d_result, s); }));
  if (replayed) *replayed = all_graph;
  return ms;
}

double gather_floor_ms(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                       const std::vector<int32_t>& slots, bool graph, bool* replayed) {
  return gather_floor_ms(ctx, {{strided_rows(base, stride_bytes, row_bytes), slots}}, graph, replayed);
}

void report_gather_floor(BenchContext& ctx, const std::vector<RowSet>& sets, bool graph) {
  bool replayed = false;
  const double ms = gather_floor_ms(ctx, sets, graph, &replayed);
  double bytes = 0;
  for (const RowSet& r : sets)
    bytes += static_cast<double>(std::count_if(r.slots.begin(), r.slots.end(), [](int32_t v) { return v >= 0; })) *
             static_cast<double>(r.rows.row_bytes);
  ctx.report_floor(ms, bytes, replayed);
}

void report_gather_floor(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const std::vector<int32_t>& slots, bool graph) {
  report_gather_floor(ctx, {{strided_rows(base, stride_bytes, row_bytes), slots}}, graph);
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
