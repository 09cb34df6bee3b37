// SPDX-License-Identifier: Apache-2.0
#pragma once
// The read floor of a memory-bound row (docs/PERFORMANCE.md "Read floors"): the cache rows an attention call
// reads, read once more by kernels that only read them, timed the same way as the op (BenchContext::time_ms:
// cold L2, median); the floor is the faster of two forms: `loads` (16-byte loads, eight in flight per
// thread, four 256-thread blocks per SM, the words XOR-folded into one so no load is dead) and `bulk` (one
// cp.async.bulk per row into shared memory, 64-row tiles, as many CTAs per SM as fit). It answers "how fast can
// these bytes, in this order and granularity, be read at all on this machine, in this methodology": the
// launch, the first DRAM round trip, the tail and the write-back of the L2 flush's dirty lines are in it as
// they are in the op. A measured reference, not a proof of optimum (a better reading kernel would lower it).
#include <cstdint>
#include <vector>

namespace mla::bench {

class BenchContext;

enum class FloorKernel { loads, bulk };
constexpr int64_t kMaxFloorRowBytes = 2048;  // the bulk form's 64-row tile must fit in shared memory

// Rows are `row_bytes` long (a multiple of 16, at most kMaxFloorRowBytes) at base + slot * stride_bytes (base
// and stride 16-byte aligned), one per entry of `slots` (negative entries skipped). Returns the XOR of every
// 32-bit word read (the bulk form folds its rows out of shared memory for it). Throws mla::Error on a bad
// argument or a CUDA error. `stream` is a cudaStream_t.
uint32_t gather_rows_xor(FloorKernel kernel, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const int32_t* slots_dev, int64_t n, uint32_t* result_dev, void* stream);

// The read floor of `slots` (host list, copied to the device once): both reading forms timed in ctx's timing
// (median, cold L2; `graph`: graph-replayed, BenchContext::time_graph_ms, as a graph-replayed row is), the
// faster one's milliseconds. `replayed` (optional): set to whether both were graph replays.
double gather_floor_ms(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                       const std::vector<int32_t>& slots, bool graph = false, bool* replayed = nullptr);
// gather_floor_ms, reported under ctx's last row (BenchContext::report_floor).
void report_gather_floor(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const std::vector<int32_t>& slots, bool graph = false);

// The cache slots mqa_decode reads: request r's keys 0 .. lens[r] - 1 through its row of the block table
// ([b][pages_per_request]); slot = block * page + key % page.
std::vector<int32_t> decode_row_slots(const std::vector<int32_t>& table, const std::vector<int32_t>& lens,
                                      int64_t pages_per_request, int64_t page);

}  // namespace mla::bench
