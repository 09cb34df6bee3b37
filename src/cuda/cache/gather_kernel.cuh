// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gather kernels: gather_cache (§5.1), cp_gather_cache (§5.2), upconvert_ds_mla (§5.3).
//
// Schedule: common/row_stream.cuh. Phase 1 resolves each output row of the block to a cache
// row (RowMap: binary search of the row's request in the starts vector, then one block-table read;
// kRows rows resolve in parallel, one per thread). Phase 2 streams the rows' chunks; a chunk is 8
// output values (16 bytes of bf16) or, for raw copies, 16 bytes.
//
// Dequantising gathers (gather_cache, upconvert_ds_mla) read a row of the cache format Fmt
// (mla/cache_format.h) and write Dst values (bf16 / f16 / f32): value = Dst(float(code) * scale) with
// the format's scale (none, per-tensor, or the latent tile's), formed in float and rounded once to Dst,
// as the CPU rounds its double product (tests/gpu compare bf16 and f32 destinations bit for bit, f16
// under the DESIGN.md §5 rule).
// Values stored as Dst's own bits (bf16 values into bf16) are copied bit-exactly. Raw gathers
// (cp_gather_cache, and bf16 caches into bf16) copy bytes.
#include <cstdint>

#include "core/numeric.h"
#include "cuda/cache/params.h"
#include "cuda/common/act_type.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/row_stream.cuh"
#include "cuda/common/vec.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::cache {

// Output row r's source as (physical block, row within the page); false: skip.
__device__ __forceinline__ bool resolve_page(const RowMap& m, int64_t r, int64_t& phys, int64_t& in_page) {
  // Request b = the last one whose first row is <= r (zero-length requests share their start with
  // the next one and lose the tie).
  int64_t lo = 0, hi = m.num_requests;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (m.starts[mid * m.starts_stride] <= r) lo = mid + 1;
    else hi = mid;
  }
  const int64_t b = lo - 1;
  if (b < 0) return false;
  const int64_t begin = m.starts[b * m.starts_stride];
  const int64_t end = b + 1 < m.num_requests ? m.starts[(b + 1) * m.starts_stride]
                      : m.last_end            ? *m.last_end
                                              : m.num_rows;
  if (r >= end) return false;
  const int64_t pos = (m.seq_starts ? m.seq_starts[b * m.seq_starts_stride] : 0) + (r - begin);
  if (pos < 0) return false;
  const int64_t blk = pos / m.page_size;
  if (blk >= m.max_blocks) return false;  // outside the table: never read, dst row untouched
  phys = m.block_table[b * m.bt_stride + blk];
  if (phys < 0 || phys >= m.num_blocks) return false;
  in_page = pos - blk * m.page_size;
  return true;
}

// Cache element offset of output row r's source, or -1 (skip).
__device__ __forceinline__ int64_t resolve_row(const RowMap& m, int64_t r) {
  int64_t phys, in_page;
  if (!resolve_page(m, r, phys, in_page)) return -1;
  return phys * m.cache_stride0 + in_page * m.cache_stride1;
}

// Raw copy in 16-byte chunks (p.cols and p.dst_stride in bytes).
template <bool kVec>
struct RawGatherOp {
  static constexpr int kChunk = 16;
  using RowInfo = int64_t;
  using Chunk = dev::Array<uint8_t, 16>;
  GatherParams p;

  __device__ RowInfo resolve(int64_t r) const { return resolve_row(p.map, r); }
  __device__ bool active(RowInfo off) const { return off >= 0; }
  __device__ int chunks_per_row() const { return (p.cols + kChunk - 1) / kChunk; }
  __device__ void load(RowInfo off, int64_t, int c, Chunk& v) const {
    const int col = c * kChunk;
    dev::load_chunk<kVec>(v, static_cast<const uint8_t*>(p.cache) + off + col, min(kChunk, p.cols - col));
  }
  __device__ void store(RowInfo, int64_t r, int c, const Chunk& v) const {
    const int col = c * kChunk;
    dev::store_chunk<kVec>(static_cast<uint8_t*>(p.dst) + r * p.dst_stride + col, v, min(kChunk, p.cols - col));
  }
};

// Dequantising gather of format Fmt into Dst. A chunk is 8 output values: 8 codes in (8 e4m3 bytes or
// 16 bf16 bytes), one store of 8 Dst values out (a warp's bf16 store instruction covers 512 contiguous
// bytes). 16-value chunks (two 16-byte stores per thread, each warp instruction writing every other 16
// bytes) measured slower: docs/PERFORMANCE.md. Chunks never straddle latent and rope: uniform formats
// are one run of codes, split formats have 8 | d_latent (static_assert).
template <class Fmt, class Dst, bool kVec>
struct DequantGatherOp {
  static constexpr int kChunk = 8;
  using RowInfo = int64_t;
  struct Chunk {
    dev::Array<uint8_t, 16> b;  // 8 codes: e4m3 in b[0, 8), or bf16 values
    float scale;                // per-tile formats, latent chunks: the tile's scale
  };
  static constexpr bool kUniform = Fmt::uniform();
  static constexpr int kLatent = kUniform ? 0 : Fmt::kDqk - Fmt::kDrope;  // split formats have fixed dims
  static_assert(kUniform || (Fmt::kDqk > 0 && kLatent % kChunk == 0), "split rows: 8-value chunks per part");

  GatherParams p;

  __device__ RowInfo resolve(int64_t r) const { return resolve_row(p.map, r); }
  __device__ bool active(RowInfo off) const { return off >= 0; }
  __device__ int chunks_per_row() const { return (p.cols + kChunk - 1) / kChunk; }

  // n codes of dtype D from src: one aligned vector load, or bytewise (a byte view's rows, and so its
  // bf16 parts, may sit at odd addresses).
  template <DType D>
  static __device__ __forceinline__ void load_codes(Chunk& v, const uint8_t* src, int n) {
    constexpr int kBytes = dtype_bytes(D);
    if constexpr (kVec) dev::load_bytes<kChunk * kBytes>(v.b.v, src);
    else dev::copy_bytes(v.b.v, src, n * kBytes);
  }

  __device__ void load(RowInfo off, int64_t, int c, Chunk& v) const {
    const int col = c * kChunk, n = min(kChunk, p.cols - col);
    const uint8_t* row = static_cast<const uint8_t*>(p.cache) + off;
    constexpr int lb = dtype_bytes(Fmt::kLatentDType), rb = dtype_bytes(Fmt::kRopeDType);
    if (kUniform || col < kLatent) {
      load_codes<Fmt::kLatentDType>(v, row + lb * col, n);
      if constexpr (Fmt::kScale == CacheScale::per_tile) {
        const uint8_t* s = row + Fmt::scale_offset(kLatent) + 4 * (col / Fmt::kTile);
        if constexpr (kVec) v.scale = __ldg(reinterpret_cast<const float*>(s));
        else dev::copy_bytes(&v.scale, s, 4);
      }
    } else {
      load_codes<Fmt::kRopeDType>(v, row + Fmt::rope_offset(kLatent) + rb * (col - kLatent), n);
    }
  }

  // 8 codes of dtype D times s into Dst (bit copy when the codes already are Dst's unscaled bits).
  template <DType D, bool kScaled>
  __device__ __forceinline__ void convert_store(const Chunk& v, float s, typename Dst::Storage* dst, int n) const {
    if constexpr (D == DType::bf16 && !kScaled && Dst::kDType == DType::bf16) {
      dev::store_chunk<kVec>(dst, reinterpret_cast<const dev::Array<uint16_t, 8>&>(v.b), n);
      return;
    } else {
      float x[8];
      if constexpr (D == DType::bf16) dev::bf16_to_float(reinterpret_cast<const dev::Array<uint16_t, 8>&>(v.b), x);
      else dev::e4m3_to_float(reinterpret_cast<const dev::Array<uint8_t, 8>&>(v.b), x);
      dev::Array<typename Dst::Storage, 8> o;
#pragma unroll
      for (int i = 0; i < 8; ++i) o.v[i] = Dst::from_float(kScaled ? x[i] * s : x[i]);
      dev::store_chunk<kVec>(dst, o, n);
    }
  }

  __device__ void store(RowInfo, int64_t r, int c, const Chunk& v) const {
    const int col = c * kChunk, n = min(kChunk, p.cols - col);
    auto* dst = static_cast<typename Dst::Storage*>(p.dst) + r * p.dst_stride + col;
    constexpr bool kLatentScaled = Fmt::kScale != CacheScale::none;
    if (kUniform || col < kLatent) {
      convert_store<Fmt::kLatentDType, kLatentScaled>(
          v, Fmt::kScale == CacheScale::per_tile ? v.scale : p.scale, dst, n);
    } else {
      convert_store<Fmt::kRopeDType, Fmt::rope_scaled()>(v, p.scale, dst, n);
    }
  }
};

// Dequantising gather of a block-scaled record (v4, v41, v41_fp4) into Dst: a chunk is 8 output values, 8
// coded columns (8 e4m3 bytes or 4 e2m1 bytes, one scale byte: blocks are >= 16 columns) or 8 of v4's bf16
// rope values. value = code * scale, exact in float (e4m3 / e2m1 codes times a power of two or an e4m3
// scale), rounded once to Dst: bit for bit the CPU's double product rounded to Dst. A v4 row's body and
// its scale slot (in the page's scale region) are resolved apart (RecordLayout::body_offset /
// slot_offset). kVec: 8-byte code and 16-byte rope loads (the cache's base and block stride, and without
// page scales its row stride, are multiples of 16 bytes) and 16-byte dst stores.
template <class Fmt, class Dst, bool kVec>
struct RecordGatherOp {
  static_assert(Fmt::kRecord, "block-scaled records only");
  static constexpr int kChunk = 8;
  static constexpr int kLatent = Fmt::kDqk - Fmt::kDrope;
  static constexpr int kCoded = static_cast<int>(Fmt::coded_cols(kLatent));
  static_assert(Fmt::kTile % kChunk == 0 && kLatent % kChunk == 0, "a chunk lies in one scale block and one part");
  struct RowInfo {
    int64_t body, slot;  // byte offsets in the cache; body < 0: skip
  };
  struct Chunk {
    dev::Array<uint8_t, 16> b;  // 8 e4m3 codes, 4 e2m1 bytes, or 8 bf16 rope values
    uint8_t scale;
  };
  GatherParams p;

  __device__ RowInfo resolve(int64_t r) const {
    int64_t phys, in_page;
    if (!resolve_page(p.map, r, phys, in_page)) return {-1, -1};
    const int64_t page = phys * p.map.cache_stride0;
    return {page + Fmt::body_offset(in_page, p.map.cache_stride1),
            page + Fmt::slot_offset(p.map.page_size, in_page, p.map.cache_stride1)};
  }
  __device__ bool active(const RowInfo& i) const { return i.body >= 0; }
  __device__ int chunks_per_row() const { return (p.cols + kChunk - 1) / kChunk; }

  __device__ void load(const RowInfo& i, int64_t, int c, Chunk& v) const {
    const int col = c * kChunk;
    const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
    if (col < kCoded) {
      constexpr int kBytes = kChunk * Fmt::code_bits() / 8;
      const uint8_t* src = cache + i.body + Fmt::code_offset(col);
      if constexpr (kVec) dev::load_bytes<kBytes>(v.b.v, src);
      else dev::copy_bytes(v.b.v, src, kBytes);
      v.scale = __ldg(cache + i.slot + col / Fmt::kTile);
    } else {
      const uint8_t* src = cache + i.body + Fmt::rope_offset(kLatent) + 2 * (col - kLatent);
      if constexpr (kVec) dev::load_bytes<16>(v.b.v, src);
      else dev::copy_bytes(v.b.v, src, 16);
    }
  }

  __device__ void store(const RowInfo&, int64_t r, int c, const Chunk& v) const {
    const int col = c * kChunk, n = min(kChunk, p.cols - col);
    auto* dst = static_cast<typename Dst::Storage*>(p.dst) + r * p.dst_stride + col;
    dev::Array<typename Dst::Storage, 8> o;
    if (col < kCoded) {
      float x[8];
      if constexpr (Fmt::kCode == CacheCode::e2m1) {
#pragma unroll
        for (int k = 0; k < 8; ++k) x[k] = num::e2m1_value(v.b.v[k / 2] >> (4 * (k % 2)) & 0xfu);
      } else {
        dev::e4m3_to_float(reinterpret_cast<const dev::Array<uint8_t, 8>&>(v.b), x);
      }
      const float s = Fmt::kScale == CacheScale::ue8m0 ? num::ue8m0_to_float(v.scale) : dev::e4m3_to_float(v.scale);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float y = __fmul_rn(x[k], s);
        // A NaN as the CPU's double product gives it (the hardware's is 0x7fffffff): the quiet NaN, with the
        // sign of a NaN e4m3 code (its first operand), else positive (a NaN scale byte).
        if (y != y) {
          uint32_t sign = 0;
          if constexpr (Fmt::kCode != CacheCode::e2m1)
            if (x[k] != x[k]) sign = static_cast<uint32_t>(v.b.v[k] & 0x80u) << 24;
          y = __uint_as_float(0x7fc00000u | sign);
        }
        o.v[k] = Dst::from_float(y);
      }
    } else if constexpr (Dst::kDType == DType::bf16) {
      o = reinterpret_cast<const dev::Array<uint16_t, 8>&>(v.b);  // v4's rope: the stored bits
    } else {
      float x[8];
      dev::bf16_to_float(reinterpret_cast<const dev::Array<uint16_t, 8>&>(v.b), x);
#pragma unroll
      for (int k = 0; k < 8; ++k) o.v[k] = Dst::from_float(x[k]);
    }
    dev::store_chunk<kVec>(dst, o, n);
  }
};

template <class Fmt, class Dst, bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) record_gather_kernel(GatherParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  dev::stream_rows<kRows, kThreads, kUnroll>(RecordGatherOp<Fmt, Dst, kVec>{p}, p.map.num_rows);
}

// kUnroll chunks in flight per thread (the launcher's choice and the alternatives measured are in
// docs/PERFORMANCE.md).
template <bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) raw_gather_kernel(GatherParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  dev::stream_rows<kRows, kThreads, kUnroll>(RawGatherOp<kVec>{p}, p.map.num_rows);
}
template <class Fmt, class Dst, bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) dequant_gather_kernel(GatherParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  dev::stream_rows<kRows, kThreads, kUnroll>(DequantGatherOp<Fmt, Dst, kVec>{p}, p.map.num_rows);
}

}  // namespace mla::cuda::cache
