#pragma once
// Gather kernels: gather_cache (§5.1), cp_gather_cache (§5.2), upconvert_ds_mla (§5.3).
//
// Schedule: common/row_stream.cuh. Phase 1 resolves each output row of the block to a cache
// row (RowMap: binary search of the row's request in the starts vector, then one block-table read;
// kRows rows resolve in parallel, one per thread). Phase 2 streams the rows' chunks; a chunk is 8
// output values (16 bytes of bf16) or, for raw copies, 16 bytes.
//
// Formats (GatherFmt):
//   raw     byte copy (cp_gather_cache; a bf16 cache gathered into bf16 is the same copy)
//   fp8     per-tensor e4m3: bf16(float(q) * scale)
//   ds_mla  656-byte record: bf16(float(q) * tile_scale) for the 512 latent values, rope bf16 bits
// The product of an e4m3 value (4 significant bits) and an fp32 scale is exact in float before the
// single rounding to bf16, so results equal the CPU's double-precision dequantisation bit for bit.
#include <cstdint>

#include "cuda/cache/params.h"
#include "cuda/common/convert.cuh"
#include "cuda/common/row_stream.cuh"
#include "cuda/common/vec.cuh"

namespace mla::cuda::cache {

// Cache element offset of output row r's source, or -1 (skip).
__device__ __forceinline__ int64_t resolve_row(const RowMap& m, int64_t r) {
  // Request b = the last one whose first row is <= r (zero-length requests share their start with
  // the next one and lose the tie).
  int64_t lo = 0, hi = m.num_requests;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (m.starts[mid * m.starts_stride] <= r) lo = mid + 1;
    else hi = mid;
  }
  const int64_t b = lo - 1;
  if (b < 0) return -1;
  const int64_t begin = m.starts[b * m.starts_stride];
  const int64_t end = b + 1 < m.num_requests ? m.starts[(b + 1) * m.starts_stride]
                      : m.last_end            ? *m.last_end
                                              : m.num_rows;
  if (r >= end) return -1;
  const int64_t pos = (m.seq_starts ? m.seq_starts[b * m.seq_starts_stride] : 0) + (r - begin);
  if (pos < 0) return -1;
  const int64_t blk = pos / m.page_size;
  if (blk >= m.max_blocks) return -1;  // outside the table: never read, dst row untouched
  const int64_t phys = m.block_table[b * m.bt_stride + blk];
  if (phys < 0 || phys >= m.num_blocks) return -1;
  return phys * m.cache_stride0 + (pos - blk * m.page_size) * m.cache_stride1;
}

template <GatherFmt kFmt, bool kVec>
struct GatherOp {
  // A chunk is 16 bytes of a raw row, or 8 values of a converted row (8 e4m3 codes or 8 rope bf16 in,
  // one 16-byte bf16 store out: a warp's store instruction covers 512 contiguous bytes). 16-value
  // chunks (two 16-byte stores per thread, each warp instruction writing every other 16 bytes)
  // measured slower: docs/PERFORMANCE.md.
  static constexpr int kChunk = kFmt == GatherFmt::raw ? 16 : 8;
  using RowInfo = int64_t;
  struct Chunk {
    dev::Array<uint8_t, 16> b;  // raw bytes, e4m3 codes in b[0, 8), or 8 rope bf16 values
    float scale;                // ds_mla latent chunks: the tile's scale
  };

  GatherParams p;

  __device__ RowInfo resolve(int64_t r) const { return resolve_row(p.map, r); }
  __device__ bool active(RowInfo off) const { return off >= 0; }
  __device__ int chunks_per_row() const { return (p.cols + kChunk - 1) / kChunk; }

  using Codes = dev::Array<uint8_t, 8>;
  static __device__ Codes& codes(Chunk& v) { return reinterpret_cast<Codes&>(v.b); }
  static __device__ const Codes& codes(const Chunk& v) { return reinterpret_cast<const Codes&>(v.b); }

  __device__ void load(RowInfo off, int64_t, int c, Chunk& v) const {
    const int col = c * kChunk, n = min(kChunk, p.cols - col);
    const uint8_t* row = static_cast<const uint8_t*>(p.cache) + off;
    if constexpr (kFmt == GatherFmt::raw) {
      dev::load_chunk<kVec>(v.b, row + col, n);
    } else if constexpr (kFmt == GatherFmt::fp8) {
      dev::load_chunk<kVec>(codes(v), row + col, n);
    } else if (col < 512) {  // 512 latent codes: chunks never straddle the rope
      dev::load_chunk<kVec>(codes(v), row + col, 8);
      const uint8_t* s = row + 512 + 4 * (col / 128);
      if constexpr (kVec) v.scale = __ldg(reinterpret_cast<const float*>(s));
      else dev::copy_bytes(&v.scale, s, 4);
    } else {
      const uint8_t* rope = row + 528 + 2 * (col - 512);
      if constexpr (kVec) dev::load_bytes<16>(v.b.v, rope);
      else dev::copy_bytes(v.b.v, rope, 16);
    }
  }

  __device__ void store(RowInfo, int64_t r, int c, const Chunk& v) const {
    const int col = c * kChunk, n = min(kChunk, p.cols - col);
    if constexpr (kFmt == GatherFmt::raw) {
      dev::store_chunk<kVec>(static_cast<uint8_t*>(p.dst) + r * p.dst_stride + col, v.b, n);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(p.dst) + r * p.dst_stride + col;
      if (kFmt == GatherFmt::ds_mla && col >= 512) {  // rope: bf16 bits, copied
        dev::store_chunk<kVec>(dst, reinterpret_cast<const dev::Array<uint16_t, 8>&>(v.b), n);
        return;
      }
      float x[8];
      dev::e4m3_to_float(codes(v), x);
      const float s = kFmt == GatherFmt::fp8 ? p.scale : v.scale;
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] *= s;
      dev::Array<uint16_t, 8> o;
      dev::float_to_bf16(x, o);
      dev::store_chunk<kVec>(dst, o, n);
    }
  }
};

// kUnroll chunks in flight per thread (the launcher's choice and the alternatives measured are in
// docs/PERFORMANCE.md).
template <GatherFmt kFmt, bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) gather_kernel(GatherParams p) {
  dev::stream_rows<kRows, kThreads, kUnroll>(GatherOp<kFmt, kVec>{p}, p.map.num_rows);
}

}  // namespace mla::cuda::cache
