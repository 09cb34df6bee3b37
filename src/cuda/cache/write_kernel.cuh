#pragma once
// Cache write kernels (concat_and_cache_mla, semantics §3-§4).
//
// bf16 / fp8 caches (write_rows_kernel): element-wise formats, streamed with the row schedule of
// common/row_stream.cuh. A block owns kRows tokens; phase 1 turns each token's slot into its cache
// row offset (or "skip": slot < 0 or outside the cache, so device-side garbage is never written);
// phase 2 streams 8-element chunks, the latent's then the rope's, so a cache row is written front to
// back by consecutive threads. Each thread has kUnroll 16-byte chunk loads in flight.
//
// fp8_ds_mla (write_ds_mla_kernel): a warp per kTokens tokens, because the four 128-element tiles
// need an amax reduction before any byte can be written. Lane l holds latent elements [8l, 8l+8) and
// [256+8l, 256+8l+8): each load instruction of the warp reads 512 contiguous bytes, and the 16 lanes
// covering one tile reduce their amax with 4 xor-shuffles. Lanes then store 8 e4m3 codes each (two
// fully coalesced 256-byte stores), lane 0 the four fp32 scales (one 16-byte store) and lanes 0-7
// the 128 rope bytes. All loads of the warp's tokens (data and slots) are issued before the first
// use, so each warp keeps kTokens * 1152 bytes in flight. Memory per token: 1152 bytes read, 656
// written.
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "cuda/cache/params.h"
#include "cuda/common/convert.cuh"
#include "cuda/common/row_stream.cuh"
#include "cuda/common/vec.cuh"

namespace mla::cuda::cache {

enum class ElemFormat { bf16, fp8 };

__device__ __forceinline__ int64_t load_slot(const WriteParams& p, int64_t t) {
  return p.slots_i64 ? static_cast<const int64_t*>(p.slots)[t * p.slot_stride]
                     : static_cast<int64_t>(static_cast<const int32_t*>(p.slots)[t * p.slot_stride]);
}

// Cache element offset of token t's row, or -1 when the token is not written.
__device__ __forceinline__ int64_t slot_row_offset(const WriteParams& p, int64_t t) {
  const int64_t slot = load_slot(p, t);
  if (slot < 0 || slot >= p.num_blocks * p.page_size) return -1;
  const int64_t blk = slot / p.page_size;
  return blk * p.cache_stride0 + (slot - blk * p.page_size) * p.cache_stride1;
}

template <ElemFormat kFmt, bool kVec>
struct WriteRowsOp {
  static constexpr int kChunk = 8;
  using RowInfo = int64_t;  // cache element offset of the row, -1 = skip
  using Chunk = dev::Array<uint16_t, kChunk>;
  using CacheT = std::conditional_t<kFmt == ElemFormat::bf16, uint16_t, uint8_t>;

  WriteParams p;
  int latent_chunks, chunks;

  __device__ RowInfo resolve(int64_t t) const { return slot_row_offset(p, t); }
  __device__ bool active(RowInfo off) const { return off >= 0; }
  __device__ int chunks_per_row() const { return chunks; }

  // Column of chunk c in the cache row, its source and its element count.
  __device__ const uint16_t* source(int64_t t, int c, int& col, int& n) const {
    if (c < latent_chunks) {
      col = c * kChunk;
      n = min(kChunk, p.latent - col);
      return p.kv_c + t * p.kv_c_stride + col;
    }
    const int j = (c - latent_chunks) * kChunk;
    col = p.latent + j;
    n = min(kChunk, p.rope - j);
    return p.k_pe + t * p.k_pe_stride + j;
  }
  __device__ void load(RowInfo, int64_t t, int c, Chunk& v) const {
    int col, n;
    dev::load_chunk<kVec>(v, source(t, c, col, n), n);
  }
  __device__ void store(RowInfo off, int64_t t, int c, const Chunk& v) const {
    int col, n;
    source(t, c, col, n);
    CacheT* dst = static_cast<CacheT*>(p.cache) + off + col;
    if constexpr (kFmt == ElemFormat::bf16) {
      dev::store_chunk<kVec>(dst, v, n);
    } else {
      float x[kChunk];
      dev::bf16_to_float(v, x);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) x[i] = x[i] / p.scale;  // divide convention (§3.2), IEEE division
      dev::Array<uint8_t, kChunk> q;
      dev::float_to_e4m3(x, q);
      dev::store_chunk<kVec>(dst, q, n);
    }
  }
};

template <ElemFormat kFmt, bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) write_rows_kernel(WriteParams p) {
  constexpr int kChunk = WriteRowsOp<kFmt, kVec>::kChunk;
  const int lc = (p.latent + kChunk - 1) / kChunk, rc = (p.rope + kChunk - 1) / kChunk;
  const WriteRowsOp<kFmt, kVec> op{p, lc, lc + rc};
  dev::stream_rows<kRows, kThreads, kUnroll>(op, p.num_tokens);
}

// ---- fp8_ds_mla -----------------------------------------------------------------------------

// Tile scale (§3.3), identical to the CPU's ds_tile_scale: amax mode max(amax/448, FLT_MIN); pow2
// mode 2^ceil(log2(max(amax/448, 1e-4))) computed exactly from the float's bits.
__device__ __forceinline__ float ds_tile_scale(float amax, bool pow2) {
  if (!pow2) return fmaxf(amax / 448.0f, FLT_MIN);
  const float s = fmaxf(amax / 448.0f, 1e-4f);
  const uint32_t u = __float_as_uint(s);
  if ((u >> 23) >= 0xffu) return s;         // inf (amax inf): passed through like the CPU
  if ((u & 0x7fffffu) == 0) return s;        // already a power of two (s >= 1e-4 is normal)
  return __uint_as_float(((u >> 23) + 1) << 23);
}

// One token's part of the ds_mla write, after its loads: quantise and store (lane-level roles above).
template <bool kVec>
__device__ __forceinline__ void ds_mla_store_token(const WriteParams& p, int64_t off, const dev::Array<uint16_t, 8>& a,
                                                   const dev::Array<uint16_t, 8>& b, const dev::Array<uint16_t, 8>& r,
                                                   int lane) {
  constexpr int kHalf = 256;
  float xa[8], xb[8];
  dev::bf16_to_float(a, xa);
  dev::bf16_to_float(b, xb);
  // fmaxf ignores NaN like the CPU's std::fmax; the max is order-independent.
  float ma = 0.0f, mb = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ma = fmaxf(ma, fabsf(xa[i]));
    mb = fmaxf(mb, fabsf(xb[i]));
  }
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) {  // lanes 0-15 hold tiles 0 / 2, lanes 16-31 tiles 1 / 3
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, o));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
  }
  const float sa = ds_tile_scale(ma, p.ds_pow2), sb = ds_tile_scale(mb, p.ds_pow2);
  const float s1 = __shfl_sync(0xffffffffu, sa, 16), s3 = __shfl_sync(0xffffffffu, sb, 16);
  if (off < 0) return;  // uniform across the warp (one token), after the last shuffle
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // IEEE division: the CPU's float x / scale, bit for bit
    xa[i] = xa[i] / sa;
    xb[i] = xb[i] / sb;
  }
  dev::Array<uint8_t, 8> qa, qb;
  dev::float_to_e4m3(xa, qa);
  dev::float_to_e4m3(xb, qb);
  uint8_t* row = static_cast<uint8_t*>(p.cache) + off;
  dev::store_chunk<kVec>(row + 8 * lane, qa, 8);  // bytes: element-wise is byte-wise when !kVec
  dev::store_chunk<kVec>(row + kHalf + 8 * lane, qb, 8);
  if (lane == 0) {
    const dev::Array<float, 4> sc{{sa, s1, sb, s3}};  // tiles 0..3 in byte order 512..527
    if constexpr (kVec) dev::store_bytes<16>(row + 512, sc.v);
    else dev::copy_bytes(row + 512, sc.v, 16);  // a u8 cache view may sit at any byte offset
  }
  if (lane < 8) {
    if constexpr (kVec) dev::store_bytes<16>(row + 528 + 16 * lane, r.v);
    else dev::copy_bytes(row + 528 + 16 * lane, r.v, 16);
  }
}

template <bool kVec, int kTokens>
__global__ void __launch_bounds__(256) write_ds_mla_kernel(WriteParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * kTokens;
  dev::Array<uint16_t, 8> a[kTokens], b[kTokens], r[kTokens];
  int64_t off[kTokens];
#pragma unroll
  for (int k = 0; k < kTokens; ++k) {
    const int64_t t = t0 + k;
    off[k] = -1;
    if (t >= p.num_tokens) continue;
    off[k] = slot_row_offset(p, t);
    const uint16_t* src = p.kv_c + t * p.kv_c_stride;
    dev::load_chunk<kVec>(a[k], src + 8 * lane, 8);
    dev::load_chunk<kVec>(b[k], src + 256 + 8 * lane, 8);
    if (lane < 8) dev::load_chunk<kVec>(r[k], p.k_pe + t * p.k_pe_stride + 8 * lane, 8);
  }
#pragma unroll
  for (int k = 0; k < kTokens; ++k)
    if (t0 + k < p.num_tokens) ds_mla_store_token<kVec>(p, off[k], a[k], b[k], r[k], lane);
}

}  // namespace mla::cuda::cache
