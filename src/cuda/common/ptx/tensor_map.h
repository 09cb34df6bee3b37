// SPDX-License-Identifier: Apache-2.0
#pragma once
// TMA tensor maps, host side: builds the 128-byte CUtensorMap that describes a strided tensor of rank
// 1..5 and the box (tile) one cp.async.bulk.tensor copy moves (device side: tma.cuh). The driver's
// cuTensorMapEncodeTiled is reached through cudaGetDriverEntryPointByVersion, so nothing links -lcuda.
// Host-only; usable from .cu launchers (no fmt).
//
// The map is passed to the kernel BY VALUE as a `const __grid_constant__ CUtensorMap` parameter; device
// code takes the parameter's address. Out-of-bounds elements of a box read as zeros.
#include <cuda.h>

#include <cstdint>

#include "mla/types.h"

namespace mla::cuda::ptx {

// Shared-memory swizzle the copy engine applies to each box (must match the consumer: wgmma
// descriptors of wgmma.cuh expect b128 for the tiles they read). With b128 the box's inner extent is
// at most 128 bytes and the destination must be 1024-byte aligned; 16-byte chunk c of 128-byte row r
// of the box lands at r * 128 + ((c ^ (r % 8)) * 16).
enum class TmaSwizzle { none, b32, b64, b128 };

struct TmaTensor {
  const void* base = nullptr;  // 16-byte aligned
  DType dtype = DType::bf16;
  int rank = 2;                // 1..5
  int64_t dims[5] = {};        // extents, innermost first (dims[0] is the contiguous one)
  int64_t strides[5] = {};     // strides in ELEMENTS, innermost first: strides[0] == 1, the others a
                               // multiple of 16 bytes
  int32_t box[5] = {};         // box extents, innermost first, each 1..256; box[0] * elem a multiple of 16
  TmaSwizzle swizzle = TmaSwizzle::none;
  int l2_promotion_bytes = 128;  // 0, 64, 128 or 256: L2 sector promotion of the loads
};

// Encodes the map. Throws mla::Error naming `what` and the offending field (expected vs got) when the
// description breaks a TMA rule, or when the driver rejects it or lacks the entry point.
CUtensorMap make_tensor_map(const TmaTensor& t, const char* what);

// Bytes one box delivers (what mbar_arrive_expect_tx must announce for one copy with this map).
int64_t box_bytes(const TmaTensor& t);

}  // namespace mla::cuda::ptx
