// SPDX-License-Identifier: Apache-2.0
#pragma once
// V^T of one 64-key tile for e4m3 value products (docs/design/fp8_64row_plan.md "Design C1 concretely"): the fp8
// tensor cores take B K-major only, so O = P V needs the tile's value columns as rows of keys. The keys of each
// 16-aligned group sit at their `vt_position` (prefill_fp8/traits.cuh), the order in which a thread's S accumulators
// of a k32 step are already its e4m3 register A fragment (P needs no shuffle).
//
// Source: the tile's latent codes as the TMA writes them, four 128-byte-swizzled panels of [64 keys][128 columns]
// (8 KiB apart; panel p holds value columns 128p .. 128p + 127; ptx::sw128_offset).
// Target (VtLayout): K-major without swizzle, in core matrices of 8 value rows x 16 key positions (128 contiguous
// bytes): core (row group G, position group c) at G * kSbo + c * kLbo. kSbo is 4 * 128 + 16: the pad keeps the eight
// rows of one stmatrix matrix (value rows 2 apart) on eight distinct 16-byte bank groups.
//
// Per warp (16 units of 16 keys x 32 columns; four warps cover the tile): one ldmatrix.x4.trans of the four 8 x 8
// b16 blocks (keys 0..7 / 8..15 of the group x columns 0..15 / 16..31 of the unit) gives lane 4q + s the bytes of keys
// 2s, 2s + 1 (and 8 + 2s, 9 + 2s) at columns 2q, 2q + 1; two byte permutes per pair of registers make the words of
// keys (2s, 2s + 1, 8 + 2s, 9 + 2s) = positions 4s .. 4s + 3 for one column each; one stmatrix.x4 writes them as
// four 8-row matrices (value rows 2q, 2q + 1, 16 + 2q, 17 + 2q of the unit). Conflict-free: the ldmatrix rows are
// eight consecutive keys of one swizzled chunk, the stmatrix rows eight distinct bank groups (kSbo's pad).
// 32 KiB read and 32 KiB written a tile, 16 ldmatrix, 64 byte permutes and 16 stmatrix a warp.
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/stmatrix.cuh"
#include "cuda/common/ptx/wgmma.cuh"

namespace mla::cuda::decode_sm90::fp8c {

struct VtLayout {
  static constexpr int kKeys = 64, kCols = 512;
  static constexpr int kLbo = 128;                   // the next 16 key positions of the same 8 rows
  static constexpr int kSbo = 4 * 128 + 16;          // the next 8 value rows (padded, above)
  static constexpr int kBytes = kCols / 8 * kSbo;    // 33,792
  static constexpr int kRawPanelBytes = 64 * 128;    // a source panel: 64 keys x 128 columns
  // Byte of value row d (0..511), key position pos (0..63).
  __host__ __device__ static constexpr int offset(int d, int pos) {
    return (d / 8) * kSbo + (pos / 16) * kLbo + (d % 8) * 16 + pos % 16;
  }
};

// The wgmma B descriptor of value rows n0 .. n0 + N - 1 (n0 a multiple of 8) for the k32 step ks (key positions
// 32 ks .. 32 ks + 31): K-major, no swizzle, LBO = kLbo, SBO = kSbo.
__device__ __forceinline__ uint64_t vt_desc(const uint8_t* vt, int n0, int ks) {
  return ptx::make_smem_desc(vt + (n0 / 8) * VtLayout::kSbo + 2 * ks * VtLayout::kLbo, VtLayout::kLbo, VtLayout::kSbo,
                             0);
}

// V^T of the tile in raw (four swizzled panels, above) into vt: the 64 units of 16 keys x 32 value columns (unit u:
// keys 16 (u % 4) .., columns 32 (u / 4) ..), kUnits of them by warp `warp` from unit `first` + kUnits * warp (the
// whole tile: 16 a warp from 0 over four warps; one value half h: 8 a warp from 32 h). Keys whose bit in `mask` is
// clear (not loaded: stale or poisoned bytes, which would reach O as 0 * NaN) read the 16 zero bytes at `zero`
// instead. The caller fences the proxy (fence_proxy_async_smem) before the products read vt.
template <int kUnits = 16>
__device__ __forceinline__ void transpose_values(const uint8_t* raw, uint8_t* vt, int warp, int lane, uint64_t mask,
                                                 const uint8_t* zero, int first = 0) {
  const int r8 = lane & 7, m = lane >> 3;  // this lane's row of ldmatrix / stmatrix matrix m
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int unit = first + kUnits * warp + u, g = unit & 3, j = unit >> 2;  // keys 16 g .., columns 32 j ..
    const int key = 16 * g + 8 * (m & 1) + r8, chunk = 2 * (j & 3) + (m >> 1);
    const uint8_t* row = (mask >> key) & 1 ? raw + (j >> 2) * VtLayout::kRawPanelBytes + ptx::sw128_offset(key, chunk)
                                           : zero;
    uint32_t r[4];
    ptx::ldmatrix_x4_trans(r, row);
    const uint32_t w[4] = {__byte_perm(r[0], r[1], 0x6420), __byte_perm(r[0], r[1], 0x7531),
                           __byte_perm(r[2], r[3], 0x6420), __byte_perm(r[2], r[3], 0x7531)};
    const int d = 32 * j + 16 * (m >> 1) + 2 * r8 + (m & 1);  // value row of matrix m's row r8
    ptx::stmatrix_x4(vt + VtLayout::offset(d, 16 * g), w);
  }
}

// P's e4m3 register A fragments of the two k32 steps of a 64-key tile from the thread's S accumulators of
// m64n64 (s[4j], s[4j + 1]: its row g, keys 8 j + 2 t, + 1; s[4j + 2], s[4j + 3]: row g + 8): positions 4t .. 4t + 3
// of each 16-key group hold keys 2t, 2t + 1, 8 + 2t, 9 + 2t, the vt_position order V^T is written in.
__device__ __forceinline__ void p_fragments(const float (&s)[32], uint32_t (&pa)[2][4]) {
  auto pack4 = [](float a, float b, float c, float d) {
    return static_cast<uint32_t>(dev::float2_to_e4m3x2(a, b)) | (static_cast<uint32_t>(dev::float2_to_e4m3x2(c, d)) << 16);
  };
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const float* x = s + 16 * kk;
    pa[kk][0] = pack4(x[0], x[1], x[4], x[5]);
    pa[kk][1] = pack4(x[2], x[3], x[6], x[7]);
    pa[kk][2] = pack4(x[8], x[9], x[12], x[13]);
    pa[kk][3] = pack4(x[10], x[11], x[14], x[15]);
  }
}

// P as R's shared-memory A operand (K-major, no swizzle): core matrices of 8 rows x 16 key positions, row group 512
// bytes apart, position group 128 apart; positions in vt_position order, as p_fragments packs them.
__device__ __forceinline__ int p_offset(int row, int pos) {
  return (row >> 3) * 512 + (pos >> 4) * 128 + (row & 7) * 16 + (pos & 15);
}
// The panel's wgmma A descriptor for the k32 step ks.
__device__ __forceinline__ uint64_t p_desc(const uint8_t* panel, int ks) {
  return ptx::make_smem_desc(panel + 2 * ks * 128, 128, 512, 0);
}
// A thread's P fragments (p_fragments: rows r_lo = 16 w + g and r_hi = r_lo + 8, positions 4 t4 .. 4 t4 + 3 of each
// 16-position group) into the panel: one 4-byte word each.
__device__ __forceinline__ void store_p_panel(uint8_t* panel, const uint32_t (&pa)[2][4], int r_lo, int r_hi, int t4) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    *reinterpret_cast<uint32_t*>(panel + p_offset(r_lo, 32 * kk + 4 * t4)) = pa[kk][0];
    *reinterpret_cast<uint32_t*>(panel + p_offset(r_hi, 32 * kk + 4 * t4)) = pa[kk][1];
    *reinterpret_cast<uint32_t*>(panel + p_offset(r_lo, 32 * kk + 16 + 4 * t4)) = pa[kk][2];
    *reinterpret_cast<uint32_t*>(panel + p_offset(r_hi, 32 * kk + 16 + 4 * t4)) = pa[kk][3];
  }
}

}  // namespace mla::cuda::decode_sm90::fp8c
