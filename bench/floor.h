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
//
// A call may read several row sets in one launch (at most kMaxRowSets): a DeepSeek-V4 row reads a main and an
// extra cache, and a v4 record is two pieces (its 576-byte body and its 8-byte scale slot in the page's scale
// region), each a set of its own. Both forms read every set's rows in the one launch, in set order.
#include <cstdint>
#include <vector>

#include "mla/cache.h"

namespace mla::bench {

class BenchContext;

enum class FloorKernel { loads, bulk };
constexpr int64_t kMaxFloorRowBytes = 2048;  // the bulk form's 64-row tile must fit in shared memory
constexpr int kMaxRowSets = 4;               // v4 + v4: two caches of bodies and scale slots

// Where a set's rows are: row `slot` is the row_bytes at base + (slot / page) * block_stride_bytes +
// (slot % page) * row_stride_bytes, the way the kernels locate a paged cache's rows (block, row in block).
// page 1 is a plain strided list (slot * block_stride_bytes). base and block_stride_bytes are 16-byte
// aligned; a row is either a 16-byte multiple (at most kMaxFloorRowBytes) at 16-byte aligned addresses
// (row_stride_bytes a multiple of 16), or shorter than 16 bytes and inside one aligned 16-byte chunk at every
// row of a page (v4's 8-byte scale slots, 8 bytes apart): such a row is read as that chunk, the least a
// 16-byte load or a bulk copy reads (DRAM moves 32-byte sectors either way).
struct RowLayout {
  const void* base = nullptr;
  int64_t row_bytes = 0;
  int64_t block_stride_bytes = 0;
  int64_t row_stride_bytes = 0;
  int64_t page = 1;
};

// The layout of rows `stride_bytes` apart: row `slot` at base + slot * stride_bytes.
RowLayout strided_rows(const void* base, int64_t stride_bytes, int64_t row_bytes);

// A set with its slots: a host list (RowSet, copied to the device once) or a device one (DeviceRowSet).
// Negative slots are skipped.
struct RowSet {
  RowLayout rows;
  std::vector<int32_t> slots;
};
struct DeviceRowSet {
  RowLayout rows;
  const int32_t* slots = nullptr;
  int64_t n = 0;
};

// The row sets the sm90 kernels read for `slots` of cache `c` (the records' `locate` in
// src/cuda/attention/sm90/convert/records.cuh, the row copies of src/cuda/attention/sm90/common/source.cuh):
// the whole entry at (block, row) of the cache tensor for every format but v4; for v4 the 576-byte bodies,
// packed in the page, and their 8-byte scale slots in the page's scale region (two sets, the format's own
// body_offset / slot_offset). Their bytes per slot sum to cache_entry_bytes.
std::vector<RowSet> cache_row_sets(const KVCache& c, std::vector<int32_t> slots);

// Reads the sets' rows (each row of a short row's chunk) with `kernel` in one launch. Returns the XOR of every
// 32-bit word read (the bulk form folds its rows out of shared memory for it). Throws mla::Error on a bad
// argument or a CUDA error. `stream` is a cudaStream_t.
uint32_t gather_rows_xor(FloorKernel kernel, const std::vector<DeviceRowSet>& sets, uint32_t* result_dev,
                         void* stream);
// One set of rows `stride_bytes` apart (strided_rows).
uint32_t gather_rows_xor(FloorKernel kernel, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const int32_t* slots_dev, int64_t n, uint32_t* result_dev, void* stream);

// The read floor of the sets (slots copied to the device once): both reading forms timed in ctx's timing
// (median, cold L2; `graph`: graph-replayed, BenchContext::time_graph_ms, as a graph-replayed row is), the
// faster one's milliseconds. `replayed` (optional): set to whether both were graph replays.
double gather_floor_ms(BenchContext& ctx, const std::vector<RowSet>& sets, bool graph = false,
                       bool* replayed = nullptr);
double gather_floor_ms(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                       const std::vector<int32_t>& slots, bool graph = false, bool* replayed = nullptr);
// gather_floor_ms, reported under ctx's last row (BenchContext::report_floor) with the bytes the op reads:
// row_bytes per non-negative slot of every set (a short row counts its own bytes, not its chunk's).
void report_gather_floor(BenchContext& ctx, const std::vector<RowSet>& sets, bool graph = false);
void report_gather_floor(BenchContext& ctx, const void* base, int64_t stride_bytes, int64_t row_bytes,
                         const std::vector<int32_t>& slots, bool graph = false);

// The cache slots mqa_decode reads: request r's keys 0 .. lens[r] - 1 through its row of the block table
// ([b][pages_per_request]); slot = block * page + key % page.
std::vector<int32_t> decode_row_slots(const std::vector<int32_t>& table, const std::vector<int32_t>& lens,
                                      int64_t pages_per_request, int64_t page);

}  // namespace mla::bench
