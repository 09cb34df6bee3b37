// SPDX-License-Identifier: Apache-2.0
#pragma once
// Cache write kernels (concat_and_cache_mla, semantics §3-§4). Quantisation (x / scale to e4m3, bit
// for bit the CPU's) is in quant.cuh.
//
// bf16 / fp8 caches, DeepSeek rows (write_warp_kernel: latent 256 or 512, rope 64, 16-byte aligned
// views): a warp writes kWarpTokens = 4 tokens with a static lane -> chunk map, so no chunk needs
// index arithmetic. Lane l owns, in every token, the 8-value latent chunks l + 32 j (each warp load
// reads 512 contiguous bytes, each fp8 store writes 256), and the rope chunk l % 8 of token l / 8
// (the four tokens' 64-value ropes fill the warp once). Lane l resolves the slot of token l % 4 (one
// slot division per lane instead of one per token in every lane) and the warp exchanges the row
// offsets by shuffles. All data loads and the slot load are issued before the first store: each
// warp keeps 4 * 1152 bytes in flight. A slot < 0 or outside the cache skips the token (device-side
// garbage is never written).
//
// bf16 / fp8 caches, any other shape or misaligned views (write_rows_kernel): element-wise formats,
// streamed with the row schedule of common/row_stream.cuh. A block owns kRows tokens; phase 1 turns
// each token's slot into its cache row offset (or "skip"); phase 2 streams 8-element chunks, the
// latent's then the rope's, so a cache row is written front to back by consecutive threads.
//
// fp8_ds_mla (write_tiled_kernel; offsets from the format's traits): a warp per kTokens tokens,
// because the four 128-element tiles need an amax reduction before any byte can be written. Lane l holds latent elements [8l, 8l+8) and
// [256+8l, 256+8l+8): each load instruction of the warp reads 512 contiguous bytes, and the 16 lanes
// covering one tile reduce their amax with 4 xor-shuffles. Lanes then store 8 e4m3 codes each (two
// fully coalesced 256-byte stores), lane 0 the four fp32 scales (one 16-byte store) and lanes 0-7
// the 128 rope bytes. Slots are resolved one per lane and shuffled, as above. All loads of the
// warp's tokens are issued before the first use, so each warp keeps kTokens * 1152 bytes in flight.
// Memory per token: 1152 bytes read, 656 written.
//
// Block-scaled records v4 / v41 / v41_fp4 (write_record_kernel; the rule and offsets from the format's
// RecordLayout): a warp per token, lane l owning row columns [16 l, 16 l + 16) (512 = 32 x 16: kv_c's 448
// then k_pe's 64). The lanes of one scale block (tile 64: 4 lanes, 32: 2, 16: 1) reduce its amax (NaN never
// raises it) and NaN flag with xor-shuffles; each lane then stores its 16 codes (16 e4m3 bytes or 8 e2m1
// bytes), the first lane of a block its scale byte, lane 31 the slot's padding bytes (0), and for v4 lanes
// 28..31 the bf16 rope. The arithmetic is the CPU writer's (src/cpu/cache_ops.cpp write_record): the ue8m0
// byte from num::pow2_scale_ue8m0_bits, x / 2^k as x times the exact reciprocal (num::ue8m0_recip, the same
// correctly rounded number), the NVFP4 scale and codes through IEEE divisions, e4m3 and e2m1 rounded to
// nearest even (the hardware's satfinite conversion, num::e2m1_bits). Any activation dtype; bf16 rows with
// 16-byte aligned rows and cache pages take vector loads and stores (kVec).
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "core/numeric.h"
#include "cuda/cache/params.h"
#include "cuda/cache/quant.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/row_stream.cuh"
#include "cuda/common/vec.cuh"
#include "mla/cache_format.h"

namespace mla::cuda::cache {

// Uniform formats (mla/cache_format.h: latent and rope one run of bf16 values or e4m3 codes) go through
// write_rows_kernel / write_warp_kernel; per-tile formats through write_tiled_kernel.
template <class Fmt>
inline constexpr bool kBf16Rows = Fmt::kLatentDType == DType::bf16;

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

// Row offsets of the kTok tokens t0.. of a warp: lane l resolves token t0 + l % kTok (tokens past
// num_tokens resolve to -1); off(k) fetches token k's from lane k. Every lane must call off().
template <int kTok>
struct WarpSlots {
  int64_t mine;
  __device__ WarpSlots(const WriteParams& p, int64_t t0, int lane) {
    const int64_t t = t0 + (lane % kTok);
    mine = t < p.num_tokens ? slot_row_offset(p, t) : -1;
  }
  __device__ __forceinline__ int64_t off(int k) const { return __shfl_sync(0xffffffffu, mine, k); }
};

template <class Fmt, bool kVec>
struct WriteRowsOp {
  static_assert(Fmt::uniform() && Fmt::kScale != CacheScale::per_tile, "one run of codes, one scale");
  static constexpr int kChunk = 8;
  using RowInfo = int64_t;  // cache element offset of the row, -1 = skip
  using Chunk = dev::Array<uint16_t, kChunk>;
  using CacheT = std::conditional_t<kBf16Rows<Fmt>, uint16_t, uint8_t>;

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
    if constexpr (kBf16Rows<Fmt>) {
      static_assert(Fmt::kScale == CacheScale::none, "bf16 rows are stored unscaled");
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

template <class Fmt, bool kVec, int kRows, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) write_rows_kernel(WriteParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  constexpr int kChunk = WriteRowsOp<Fmt, kVec>::kChunk;
  const int lc = (p.latent + kChunk - 1) / kChunk, rc = (p.rope + kChunk - 1) / kChunk;
  const WriteRowsOp<Fmt, kVec> op{p, lc, lc + rc};
  dev::stream_rows<kRows, kThreads, kUnroll>(op, p.num_tokens);
}

// ---- bf16 / fp8, DeepSeek rows (lane roles in the header comment) ---------------------------------

inline constexpr int kWarpTokens = 4;  // 4 tokens' 8-lane ropes (64 values, checked by plan_write) fill one warp

template <bool kRecip>
__device__ __forceinline__ auto make_div(float scale) {
  if constexpr (kRecip) return RecipDiv<true>::make(scale);
  else return IeeeDiv{scale};
}

// kLatentSteps = latent / 256. kRecip: x / scale through the reciprocal (the host checked
// recip_scale_ok(scale)); otherwise IEEE division (reference variant, and scales out of range).
template <class Fmt, int kLatentSteps, bool kRecip>
__global__ void __launch_bounds__(256) write_warp_kernel(WriteParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  static_assert(Fmt::uniform() && Fmt::kScale != CacheScale::per_tile, "one run of codes, one scale");
  constexpr int kLatent = 256 * kLatentSteps;
  const int lane = threadIdx.x & 31;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * kWarpTokens;
  uint4 lat[kWarpTokens][kLatentSteps], rope;
#pragma unroll
  for (int k = 0; k < kWarpTokens; ++k) {
    if (t0 + k >= p.num_tokens) continue;
    const uint4* src = reinterpret_cast<const uint4*>(p.kv_c + (t0 + k) * p.kv_c_stride) + lane;
#pragma unroll
    for (int j = 0; j < kLatentSteps; ++j) lat[k][j] = __ldg(src + 32 * j);
  }
  const int rk = lane >> 3, rc = lane & 7;  // rope: token rk, chunk rc
  if (t0 + rk < p.num_tokens) rope = __ldg(reinterpret_cast<const uint4*>(p.k_pe + (t0 + rk) * p.k_pe_stride) + rc);
  const WarpSlots<kWarpTokens> slots(p, t0, lane);
  const int64_t rope_off = __shfl_sync(0xffffffffu, slots.mine, rk);

  if constexpr (kBf16Rows<Fmt>) {
    uint16_t* cache = static_cast<uint16_t*>(p.cache);
#pragma unroll
    for (int k = 0; k < kWarpTokens; ++k) {
      const int64_t off = slots.off(k);
      if (off < 0) continue;
      uint4* dst = reinterpret_cast<uint4*>(cache + off) + lane;
#pragma unroll
      for (int j = 0; j < kLatentSteps; ++j) dst[32 * j] = lat[k][j];
    }
    if (rope_off >= 0) reinterpret_cast<uint4*>(cache + rope_off + kLatent)[rc] = rope;
  } else {
    uint8_t* cache = static_cast<uint8_t*>(p.cache);
    const auto div = make_div<kRecip>(p.scale);
#pragma unroll
    for (int k = 0; k < kWarpTokens; ++k) {
      const int64_t off = slots.off(k);
      if (off < 0) continue;
      uint2* dst = reinterpret_cast<uint2*>(cache + off) + lane;
#pragma unroll
      for (int j = 0; j < kLatentSteps; ++j) dst[32 * j] = quantise8(lat[k][j], div);
    }
    if (rope_off >= 0) reinterpret_cast<uint2*>(cache + rope_off + kLatent)[rc] = quantise8(rope, div);
  }
}

// ---- per-tile formats (fp8_ds_mla) -------------------------------------------------------------

// The record the lane roles of write_tiled_kernel are laid out for (header comment): 512 e4m3 latent
// codes in 4 tiles of 128, fp32 tile scales, 64 bf16 rope values; offsets from the format's traits.
template <class Fmt>
struct TiledRecord {
  static constexpr int kLatent = Fmt::kDqk - Fmt::kDrope;
  static constexpr int kHalf = kLatent / 2;  // lane l holds latent [8l, 8l+8) and [kHalf+8l, kHalf+8l+8)
  static constexpr int kScales = static_cast<int>(Fmt::scale_offset(kLatent));
  static constexpr int kRope = static_cast<int>(Fmt::rope_offset(kLatent));
  static_assert(Fmt::kScale == CacheScale::per_tile && Fmt::kLatentDType == DType::fp8_e4m3 &&
                    Fmt::kRopeDType == DType::bf16,
                "e4m3 latent with tile scales, bf16 rope");
  static_assert(kLatent == 512 && Fmt::kTile == 128 && Fmt::kDrope == 64,
                "one warp: 32 lanes x 2 x 8 latent values, 16 lanes per tile, 8 lanes x 8 rope values");
  static_assert(kScales % 16 == 0 && kRope % 16 == 0, "16-byte stores of scales and rope");
};

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

__device__ __forceinline__ uint4 as_words(const dev::Array<uint16_t, 8>& a) {
  uint4 w;
  memcpy(&w, a.v, sizeof w);
  return w;
}

// One tile-chunk's codes: through the tile's reciprocal when its scale is in range (uniform over the
// 16 lanes of a tile; only tiles with amax under 448 * 2^-64 or above 448 * 2^100, or infinite, take
// the IEEE division). kRecip = false: IEEE division always (reference variant).
template <bool kRecip>
__device__ __forceinline__ dev::Array<uint8_t, 8> ds_quantise(const dev::Array<uint16_t, 8>& a, float s) {
  const uint2 q = kRecip && recip_scale_ok(s) ? quantise8(as_words(a), RecipDiv<false>::make(s))
                                              : quantise8(as_words(a), IeeeDiv{s});
  dev::Array<uint8_t, 8> out;
  memcpy(out.v, &q, sizeof q);
  return out;
}

// One token's part of the ds_mla write, after its loads: quantise and store (lane-level roles above).
template <class Fmt, bool kVec, bool kRecip>
__device__ __forceinline__ void tiled_store_token(const WriteParams& p, int64_t off, const dev::Array<uint16_t, 8>& a,
                                                  const dev::Array<uint16_t, 8>& b, const dev::Array<uint16_t, 8>& r,
                                                  int lane) {
  using R = TiledRecord<Fmt>;
  constexpr int kHalf = R::kHalf;
  // fmaxf ignores NaN like the CPU's std::fmax; the max is order-independent.
  float ma = 0.0f, mb = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ma = fmaxf(ma, fabsf(dev::bf16_to_float(a.v[i])));
    mb = fmaxf(mb, fabsf(dev::bf16_to_float(b.v[i])));
  }
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) {  // lanes 0-15 hold tiles 0 / 2, lanes 16-31 tiles 1 / 3
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, o));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
  }
  const float sa = ds_tile_scale(ma, p.ds_pow2), sb = ds_tile_scale(mb, p.ds_pow2);
  const float s1 = __shfl_sync(0xffffffffu, sa, 16), s3 = __shfl_sync(0xffffffffu, sb, 16);
  if (off < 0) return;  // uniform across the warp (one token), after the last shuffle
  const dev::Array<uint8_t, 8> qa = ds_quantise<kRecip>(a, sa), qb = ds_quantise<kRecip>(b, sb);
  uint8_t* row = static_cast<uint8_t*>(p.cache) + off;
  dev::store_chunk<kVec>(row + 8 * lane, qa, 8);  // bytes: element-wise is byte-wise when !kVec
  dev::store_chunk<kVec>(row + kHalf + 8 * lane, qb, 8);
  if (lane == 0) {
    const dev::Array<float, 4> sc{{sa, s1, sb, s3}};  // tiles 0..3 in byte order
    if constexpr (kVec) dev::store_bytes<16>(row + R::kScales, sc.v);
    else dev::copy_bytes(row + R::kScales, sc.v, 16);  // a u8 cache view may sit at any byte offset
  }
  if (lane < 8) {
    if constexpr (kVec) dev::store_bytes<16>(row + R::kRope + 16 * lane, r.v);
    else dev::copy_bytes(row + R::kRope + 16 * lane, r.v, 16);
  }
}

template <class Fmt, bool kVec, int kTokens, bool kRecip = true>
__global__ void __launch_bounds__(256) write_tiled_kernel(WriteParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int lane = threadIdx.x & 31;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * kTokens;
  dev::Array<uint16_t, 8> a[kTokens], b[kTokens], r[kTokens];
#pragma unroll
  for (int k = 0; k < kTokens; ++k) {
    const int64_t t = t0 + k;
    if (t >= p.num_tokens) continue;
    const uint16_t* src = p.kv_c + t * p.kv_c_stride;
    dev::load_chunk<kVec>(a[k], src + 8 * lane, 8);
    dev::load_chunk<kVec>(b[k], src + TiledRecord<Fmt>::kHalf + 8 * lane, 8);
    if (lane < 8) dev::load_chunk<kVec>(r[k], p.k_pe + t * p.k_pe_stride + 8 * lane, 8);
  }
  const WarpSlots<kTokens> slots(p, t0, lane);
#pragma unroll
  for (int k = 0; k < kTokens; ++k) {
    const int64_t off = slots.off(k);  // -1 past num_tokens: the warp's shuffles still run, nothing is stored
    tiled_store_token<Fmt, kVec, kRecip>(p, off, a[k], b[k], r[k], lane);
  }
}

// ---- f16 / f32 activations, every format ---------------------------------------------------------

// One activation value as float (exact for every dtype here).
__device__ __forceinline__ float load_act(const void* base, WriteParams::Act t, int64_t i) {
  switch (t) {
    case WriteParams::Act::f32: return static_cast<const float*>(base)[i];
    case WriteParams::Act::f16: {
      // A NaN as the CPU reads it (num::f16_to_float: the quiet NaN with the input's sign, no payload).
      const uint16_t h = static_cast<const uint16_t*>(base)[i];
      if ((h & 0x7fffu) > 0x7c00u) return __uint_as_float(0x7fc00000u | (static_cast<uint32_t>(h & 0x8000u) << 16));
      return __half2float(__ushort_as_half(h));
    }
    default: return dev::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
}

// write_cache from f16 / f32 kv_c or k_pe (vLLM's writer takes every activation dtype): a warp per token,
// element-wise, each value converted to float exactly and stored as the CPU writer stores it (semantics
// §3-§4): bf16 rounded to nearest even; e4m3 of x / scale by IEEE division; fp8_ds_mla tile scales from the
// amax of the float values (NaN never raises it), the rope rounded to bf16. Serving activations are bf16 and
// take the vectorised kernels above; this path trades their speed for any dtype and any alignment.
template <class Fmt>
__global__ void __launch_bounds__(256) write_act_kernel(WriteParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.num_tokens) return;  // uniform across the warp
  const int64_t off = slot_row_offset(p, t);
  if (off < 0) return;
  const char* kv = reinterpret_cast<const char*>(p.kv_c);
  const char* pe = reinterpret_cast<const char*>(p.k_pe);
  const int64_t kv_es = p.kv_c_dtype == WriteParams::Act::f32 ? 4 : 2, pe_es = p.k_pe_dtype == WriteParams::Act::f32 ? 4 : 2;
  const void* kv_row = kv + t * p.kv_c_stride * kv_es;
  const void* pe_row = pe + t * p.k_pe_stride * pe_es;
  if constexpr (Fmt::kScale == CacheScale::per_tile) {
    using R = TiledRecord<Fmt>;
    constexpr int kPerLane = Fmt::kTile / 32;
    uint8_t* row = static_cast<uint8_t*>(p.cache) + off;
    for (int tile = 0; tile < R::kLatent / Fmt::kTile; ++tile) {
      float x[kPerLane], amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        x[i] = load_act(kv_row, p.kv_c_dtype, tile * Fmt::kTile + lane + 32 * i);
        amax = fmaxf(amax, fabsf(x[i]));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float s = ds_tile_scale(amax, p.ds_pow2);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) row[tile * Fmt::kTile + lane + 32 * i] = dev::float_to_e4m3(__fdiv_rn(x[i], s));
      if (lane == 0) {  // the row may sit at any byte offset: byte stores, little-endian
        const uint32_t bits = __float_as_uint(s);
#pragma unroll
        for (int b = 0; b < 4; ++b) row[R::kScales + 4 * tile + b] = static_cast<uint8_t>(bits >> (8 * b));
      }
    }
    for (int j = lane; j < p.rope; j += 32) {
      // The CPU writer's rounding bit for bit, as a plain 32-bit integer (core/numeric.h bf16_bits_rn says why).
      const uint32_t h = num::bf16_bits_rn(load_act(pe_row, p.k_pe_dtype, j));
      row[R::kRope + 2 * j] = static_cast<uint8_t>(h & 0xffu);
      row[R::kRope + 2 * j + 1] = static_cast<uint8_t>(h >> 8);
    }
  } else {
    for (int i = lane; i < p.latent + p.rope; i += 32) {
      const float x = i < p.latent ? load_act(kv_row, p.kv_c_dtype, i) : load_act(pe_row, p.k_pe_dtype, i - p.latent);
      if constexpr (kBf16Rows<Fmt>) static_cast<uint16_t*>(p.cache)[off + i] = dev::float_to_bf16(x);
      else static_cast<uint8_t*>(p.cache)[off + i] = dev::float_to_e4m3(__fdiv_rn(x, p.scale));
    }
  }
}

// ---- block-scaled records (v4, v41, v41_fp4; lane roles in the header comment) ----------------------

template <class Fmt>
struct RecordWrite {
  static_assert(Fmt::kRecord, "block-scaled records only");
  static constexpr int kLatent = Fmt::kDqk - Fmt::kDrope;
  static constexpr int kCoded = static_cast<int>(Fmt::coded_cols(kLatent));
  static constexpr int kPer = 16;  // row columns per lane
  static constexpr int kLanesPerTile = Fmt::kTile / kPer;
  static constexpr int kTiles = static_cast<int>(Fmt::num_tiles(kLatent));
  static_assert(Fmt::kDqk == 32 * kPer && kLatent % kPer == 0 && Fmt::kTile % kPer == 0 && kCoded % Fmt::kTile == 0,
                "a lane per 16 columns; scale blocks of whole lanes");
  static_assert(kTiles <= Fmt::kScaleSlot && kTiles <= 32, "one byte per block in the slot");
};

// write_cache for a record format. kVec: kv_c and k_pe are bf16 with 16-byte aligned rows and the cache's
// base and block stride (and, without page scales, its row stride) are multiples of 16 bytes.
template <class Fmt, bool kVec>
__global__ void __launch_bounds__(256) write_record_kernel(WriteParams p) {
  ptx::dependent_entry();  // PDL (cuda/common/launch.h): nothing global before it
  using W = RecordWrite<Fmt>;
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.num_tokens) return;  // uniform across the warp
  const int64_t slot = load_slot(p, t);
  if (slot < 0 || slot >= p.num_blocks * p.page_size) return;  // uniform: skipped, garbage never written
  const int64_t blk = slot / p.page_size, r = slot - blk * p.page_size;
  uint8_t* page = static_cast<uint8_t*>(p.cache) + blk * p.cache_stride0;  // record caches hold bytes
  uint8_t* body = page + Fmt::body_offset(r, p.cache_stride1);
  uint8_t* sc = page + Fmt::slot_offset(p.page_size, r, p.cache_stride1);

  // This lane's 16 inputs (as float, exact) and, for rope lanes of v4, their bf16 bits.
  const int c0 = W::kPer * lane;
  const bool from_kv = c0 < W::kLatent;
  const int col = from_kv ? c0 : c0 - W::kLatent;
  const WriteParams::Act dt = from_kv ? p.kv_c_dtype : p.k_pe_dtype;
  float x[16];
  dev::Array<uint16_t, 16> h;  // aligned: stored with 16-byte stores
  if constexpr (kVec) {
    const uint16_t* src = from_kv ? p.kv_c + t * p.kv_c_stride + col : p.k_pe + t * p.k_pe_stride + col;
    dev::Array<uint16_t, 16> v;
    dev::load_bytes<32>(v.v, src);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      h.v[i] = v.v[i];
      x[i] = dev::bf16_to_float(v.v[i]);
    }
  } else {
    const char* base = from_kv ? reinterpret_cast<const char*>(p.kv_c) : reinterpret_cast<const char*>(p.k_pe);
    const int64_t es = dt == WriteParams::Act::f32 ? 4 : 2;
    const void* row = base + t * (from_kv ? p.kv_c_stride : p.k_pe_stride) * es;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      x[i] = load_act(row, dt, col + i);
      // bf16 inputs are copied bit-exactly; others rounded to nearest even (the CPU's bf16_bits).
      h.v[i] = dt == WriteParams::Act::bf16 ? static_cast<const uint16_t*>(row)[col + i]
                                          : static_cast<uint16_t>(num::bf16_bits_rn(x[i]));
    }
  }

  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    amax = fmaxf(amax, fabsf(x[i]));  // fmaxf ignores NaN, like the CPU's comparison
    nan = nan || x[i] != x[i];
  }
#pragma unroll
  for (int o = 1; o < W::kLanesPerTile; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    nan = __shfl_xor_sync(0xffffffffu, static_cast<int>(nan), o) != 0 || nan;
  }

  if (c0 < W::kCoded) {
    uint8_t s_byte;
    if constexpr (Fmt::kCode == CacheCode::e2m1) {
      // NVFP4: scale e4m3(clamp(amax / 6, 2^-9, 448)); a block holding a NaN gets the NaN scale and codes 0.
      s_byte = nan ? uint8_t{0x7f} : dev::float_to_e4m3(fminf(fmaxf(__fdiv_rn(amax, 6.0f), 0x1p-9f), 448.0f));
      const float s = dev::e4m3_to_float(s_byte);
      dev::Array<uint8_t, 8> q;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t lo = num::e2m1_bits(__fdiv_rn(x[2 * j], s)), hi = num::e2m1_bits(__fdiv_rn(x[2 * j + 1], s));
        q.v[j] = nan ? uint8_t{0} : static_cast<uint8_t>(lo | hi << 4);
      }
      uint8_t* dst = body + Fmt::code_offset(c0);
      if constexpr (kVec) dev::store_bytes<8>(dst, q.v);
      else dev::copy_bytes(dst, q.v, 8);
    } else {
      const uint32_t e = num::pow2_scale_ue8m0_bits(amax);
      s_byte = static_cast<uint8_t>(e);
      const float rs = num::ue8m0_recip(e);  // NaN for 0xff: every code NaN, like the CPU's x / NaN
      dev::Array<uint16_t, 8> q;  // pairs of e4m3 codes
#pragma unroll
      for (int j = 0; j < 8; ++j) q.v[j] = dev::float2_to_e4m3x2(__fmul_rn(x[2 * j], rs), __fmul_rn(x[2 * j + 1], rs));
      uint8_t* dst = body + Fmt::code_offset(c0);
      if constexpr (kVec) dev::store_bytes<16>(dst, q.v);
      else dev::copy_bytes(dst, q.v, 16);
    }
    if (lane % W::kLanesPerTile == 0) sc[lane / W::kLanesPerTile] = s_byte;
  } else if constexpr (!Fmt::kRopeCoded) {  // v4: the rope as bf16
    uint8_t* dst = body + Fmt::rope_offset(W::kLatent) + 2 * (c0 - W::kLatent);
    if constexpr (kVec) dev::store_bytes<32>(dst, h.v);
    else dev::copy_bytes(dst, h.v, 32);
  }
  if (lane == 31)
    for (int b = W::kTiles; b < Fmt::kScaleSlot; ++b) sc[b] = 0;  // padding: a record depends on its inputs only
}

}  // namespace mla::cuda::cache
