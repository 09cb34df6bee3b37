// SPDX-License-Identifier: Apache-2.0
// The attention layer's V up-projection with its output quantised in the epilogue
// (mla::up_project_quantized, docs/SEMANTICS.md §15 "Where it runs"): for token t and head n
//   x[t, n * V + c] = bf16( sum_l o_lat[t, n, l] * w[n, l, c] )    fp32 accumulation, rounded once to bf16
//   codes / scales  = quantize_output(x)                             the float operations of quantize_output.cu
// so the bytes equal quantize_output applied to this kernel's own bf16 product, and differ from
// quantize_output(bmm(o_lat, w)) only where cuBLAS's fp32 sum rounds to another bf16 value (a
// different summation order): at most one code there.
//
// Algorithm. The work is units of (row tile of BM tokens, head, 128-column tile of V, latent split) on a
// 1-D grid, the split rank fastest, then row tiles (computing, then padding), heads and column tiles; the
// schedule (BM and the split count S) is core/up_proj_schedule.h's, chosen by the host. Main loop over
// the CTA's share of the latent dim L (its rank's ceil(ceil(L / 32) / S) steps of 32): a cp.async pipeline
// of up to STAGES stages (A = o_lat rows [BM, 32], B = w rows [32, 128], zero-filled past M, L and V;
// stage s holds A then B, so a launch whose CTAs take fewer steps than STAGES asks for only those stages'
// memory) feeding mma.sync m16n8k16 bf16 -> fp32 (ldmatrix / ldmatrix.trans from +16-byte padded rows,
// conflict-free). Warps split the tile WARPS_M x WARPS_N, each holding WM x WN fp32 accumulators.
// Reduction (S > 1, sm_90: the S CTAs of a unit are one thread-block cluster): each CTA stores its fp32
// partial tile [BM, 128] into its shared memory (the pipeline's); after a cluster barrier rank r sums rows
// [r * BM / S, (r + 1) * BM / S) of the S partials through distributed shared memory in rank order,
// ((p_0 + p_1) + p_2) + ..., and a second cluster barrier keeps every partial alive until its readers are
// done. S = 1: the accumulators are the sums.
// Epilogue: the sums are rounded to bf16 into a shared tile X (the pipeline's memory; with S > 1 after the
// partial tile, only the CTA's rows), then the CTA quantises its rows of X:
//   fp8            one thread per 16 columns of a row: 16 codes, one 16-byte store
//   fp8_group128   G / 16 lanes per (row, group), 16 values each; the group's abs-max is a shuffle
//   fp8_group64      reduction that propagates NaN; the team's first lane writes the f32 scale
//   nvfp4          one thread per 16-value block: its e4m3 scale code, then 8 bytes of e2m1 pairs
// A group never straddles two CTAs: the tile starts at a multiple of 128 columns of the head and
// V is a multiple of the group (the front end checks). Padding tiles (row tile >= m_tiles) write rows
// M .. M_pad - 1 as quantize_output does (each rank its share of the tile's rows): zero codes, group
// scale 1, nvfp4 scale code 0.
//
// The split changes the fp32 summation order (per row a function of S, which the schedule takes from M,
// h and the device), not the rule: the bytes are quantize_output of this kernel's own bf16 sums.
//
// The Hopper mainloop (up_proj::Schedule::hopper, sm_90a; up_proj_quant_sm90_kernel below) replaces the mma.sync
// loop by wgmma over 64-wide latent stages and keeps the unit, the split and the epilogue (finish).
//
// Configurations: BM 16 (4 warps 1 x 4, 10 stages, 97.5 KiB), BM 64 (4 warps 2 x 2, 7 stages, 94.5 KiB),
// BM 128 (8 warps 4 x 2, 3 stages, 55.5 KiB); the split's partial tile and X fit in at most 70.3 KiB.
// Dynamic shared memory; sm_80 and later (mma.sync, cp.async, ldmatrix); splits need sm_90 (clusters).
// Registers (sm_90a, no spills): 106 / 162 / 162; BM 128 holds one CTA per SM by registers (the default
// bound held it to 128 registers and spilled).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "core/numeric.h"
#include "core/up_proj_schedule.h"
#include "cuda/block/params.h"
#include "cuda/block/up_proj_quant.h"
#include "cuda/cache/quant.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/cuda_ops.h"
#include "runtime/device_api.h"

namespace mla::cuda {
namespace {

constexpr int kBK = up_proj::kStep;      // latent columns per pipeline stage
constexpr int kBN = up_proj::kColumns;   // output columns per CTA
constexpr int kAStride = kBK + 8;        // shared row strides in elements: +16 bytes keeps ldmatrix conflict-free
constexpr int kBStride = kBN + 8;
constexpr int kXStride = kBN + 8;
constexpr int kPStride = kBN + 4;        // fp32 partial rows: the fragment's float2 stores two to a bank
constexpr int kMaxSplits = up_proj::kMaxSplits;

template <int BM_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct Cfg {
  static constexpr int BM = BM_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
  static constexpr bool kHopper = false;
  static constexpr int kStep = kBK;  // latent elements of one pipeline stage
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = kBN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int kAStage = BM * kAStride, kBStage = kBK * kBStride;  // elements
  static constexpr int kStageBytes = (kAStage + kBStage) * 2;              // stage s: A then B
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kXBytes = BM * kXStride * 2;
  static constexpr int kPartialBytes = BM * kPStride * 4;
  // A split CTA's epilogue: its partial tile, then X for its BM / S rows (at most BM / 2).
  static constexpr int kSplitBytes = kPartialBytes + BM / 2 * kXStride * 2;
  static constexpr int kSmem = kPipeBytes > kXBytes ? kPipeBytes : kXBytes;
  static constexpr int kSmemMax = kSmem > kSplitBytes ? kSmem : kSplitBytes;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are whole m16 tiles and pairs of n8 tiles");
  static_assert(BM % kMaxSplits == 0, "a split CTA reduces BM / S whole rows");
  static_assert(kSmemMax <= 99 * 1024, "fits the opt-in shared memory of sm_86 / sm_89");

  // The dynamic shared memory of a launch whose CTAs take `steps` latent steps in `splits` splits.
  static int smem_bytes(int64_t steps, int splits) {
    const int64_t stages = steps < STAGES ? (steps < 1 ? 1 : steps) : STAGES;
    const int64_t pipe = stages * kStageBytes;
    const int64_t epi = splits > 1 ? kPartialBytes + int64_t{BM} / splits * kXStride * 2 : kXBytes;
    return static_cast<int>(pipe > epi ? pipe : epi);
  }
};

// Decode-sized tiles unsplit (before sm_90, or h 128) are latency bound on the weight stream (one head's W_UV
// is 128 KiB for L 512, V 128, read by one CTA): deep pipelines keep most of it in flight. The depth stops at
// sm_86 / sm_89's 99 KiB.
using Cfg16 = Cfg<16, 1, 4, 10>;
using Cfg64 = Cfg<64, 2, 2, 7>;
using Cfg128 = Cfg<128, 4, 2, 3>;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float nan_max(float a, float b) { return (a != a) ? a : ((b != b) ? b : fmaxf(a, b)); }

// 16 consecutive bf16 of the shared tile (32-byte aligned) as floats.
__device__ __forceinline__ void load16(const uint16_t* x, float (&v)[16]) {
  const uint4 a = *reinterpret_cast<const uint4*>(x), b = *reinterpret_cast<const uint4*>(x + 8);
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = dev::bf16_to_float(static_cast<uint16_t>(w[i] & 0xffffu));
    v[2 * i + 1] = dev::bf16_to_float(static_cast<uint16_t>(w[i] >> 16));
  }
}

// N bytes (N = 8 or 16, packed little-endian in words) to dst: one vector store when `vec`, else bytes.
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&w)[N / 4], bool vec) {
  if (vec) {
    if constexpr (N == 16) *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    else *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

// 16 e4m3 codes of v / s (the IEEE quotient, as quantize_output.cu), packed four to a word. v are bf16 values, so a
// scale in the reciprocal's range takes cuda/cache/quant.cuh's three-operation form (proved equal to the IEEE
// division for bf16 x); kClamped: |v / s| may exceed 448 (the static scale), else it is at most 448 (1 + 2^-23).
template <bool kClamped>
__device__ __forceinline__ void e4m3_codes(const float (&v)[16], float s, uint32_t (&w)[4]) {
  float q[16];
  cache::bf16_quotients<kClamped>(v, s, q);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) w[i] |= static_cast<uint32_t>(dev::float_to_e4m3(q[4 * i + j])) << (8 * j);
  }
}

// Rows M .. M_pad - 1 of this CTA's columns: zero codes, group scale 1, nvfp4 scale code 0.
template <OutputQuant K>
__device__ void write_padding(const block::UpProjQuantParams& p, int64_t r0, int64_t r1, int64_t col0, int cols,
                              int nthreads) {
  const int64_t rows = r1 - r0;
  const int bytes = K == OutputQuant::nvfp4 ? cols / 2 : cols;
  for (int64_t i = threadIdx.x; i < rows * bytes; i += nthreads) {
    const int64_t t = r0 + i / bytes;
    p.codes[t * p.codes_stride + (K == OutputQuant::nvfp4 ? col0 / 2 : col0) + i % bytes] = 0;
  }
  if constexpr (K == OutputQuant::fp8_group128 || K == OutputQuant::fp8_group64) {
    constexpr int G = K == OutputQuant::fp8_group128 ? 128 : 64;
    const int groups = cols / G;
    for (int64_t i = threadIdx.x; i < rows * groups; i += nthreads) {
      const int64_t g = col0 / G + i / rows, t = r0 + i % rows;  // consecutive threads: consecutive rows
      static_cast<float*>(p.scales)[g * p.scales_stride + t] = 1.0f;
    }
  } else if constexpr (K == OutputQuant::nvfp4) {
    const int blocks = cols / 16;
    for (int64_t i = threadIdx.x; i < rows * blocks; i += nthreads) {
      const int64_t t = r0 + i / blocks;
      static_cast<uint8_t*>(p.scales)[t * p.scales_stride + col0 / 16 + i % blocks] = 0;
    }
  }
}

// Rows [q0, q1) of the tile: their bf16 sums X (row r at X + (r - q0) * kXStride) quantised into the output.
template <class C, OutputQuant K>
__device__ __forceinline__ void quantise_rows(const block::UpProjQuantParams& p, const uint16_t* X, int q0, int q1,
                                              int rows, int vcols, int64_t m0, int64_t col0) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nq = q1 - q0;
  if constexpr (K == OutputQuant::fp8 || K == OutputQuant::nvfp4) {
    for (int it = tid; it < nq * (kBN / 16); it += C::kThreads) {
      const int r = q0 + it / (kBN / 16), c = (it % (kBN / 16)) * 16;
      if (r >= rows || c >= vcols) continue;
      const int64_t t = m0 + r;
      float v[16];
      load16(X + (r - q0) * kXStride + c, v);
      if constexpr (K == OutputQuant::fp8) {
        uint32_t w[4];
        e4m3_codes<true>(v, p.scale, w);
        store_bytes<16>(p.codes + t * p.codes_stride + col0 + c, w, p.vec);
      } else {
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = nan_max(amax, fabsf(v[i]));
        const uint8_t s_code = dev::float_to_e4m3(__fmul_rn(p.scale, __fdiv_rn(amax, 6.0f)));
        static_cast<uint8_t*>(p.scales)[t * p.scales_stride + (col0 + c) / 16] = s_code;
        const float s = dev::e4m3_to_float(s_code);
        const float m = __fdiv_rn(s, p.scale);
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t lo = s == 0.f ? 0u : num::e2m1_bits(__fdiv_rn(v[2 * i], m));
          const uint32_t hi = s == 0.f ? 0u : num::e2m1_bits(__fdiv_rn(v[2 * i + 1], m));
          w[i / 4] |= (lo | (hi << 4)) << (8 * (i % 4));
        }
        store_bytes<8>(p.codes + t * p.codes_stride + (col0 + c) / 2, w, p.vec);
      }
    }
  } else {
    constexpr int G = K == OutputQuant::fp8_group128 ? 128 : 64;
    constexpr int kTeam = G / 16, kPerWarp = 32 / kTeam, kPerRow = kBN / G;
    constexpr int kWarps = C::kThreads / 32;
    const int total = nq * kPerRow;
    for (int base = warp * kPerWarp; base < total; base += kWarps * kPerWarp) {  // uniform per warp
      const int item = base + lane / kTeam, sub = lane % kTeam;
      const int r = q0 + item / kPerRow, gc = (item % kPerRow) * G;
      const bool ok = item < total && r < rows && gc < vcols;
      float v[16];
      float amax = 0.f;
      if (ok) {
        load16(X + (r - q0) * kXStride + gc + sub * 16, v);
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = nan_max(amax, fabsf(v[i]));
      }
#pragma unroll
      for (int o = kTeam / 2; o > 0; o >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (ok) {
        const float s = amax == 0.f ? 1.0f : __fdiv_rn(amax, 448.0f);
        const int64_t t = m0 + r;
        uint32_t w[4];
        e4m3_codes<false>(v, s, w);
        store_bytes<16>(p.codes + t * p.codes_stride + col0 + gc + sub * 16, w, p.vec);
        if (sub == 0) static_cast<float*>(p.scales)[((col0 + gc) / G) * p.scales_stride + t] = s;
      }
    }
  }
}

// The unit of this CTA: rank fastest, then row tile, head, column tile (grid = S * x_tiles * h * col_tiles).
struct UnitPos {
  int rank, xt, head, vcols;  // vcols: valid columns of the tile (a multiple of 16)
  int64_t n0, col0;           // first column of V in the tile; first column of the output row
};
__device__ __forceinline__ UnitPos unit_pos(const block::UpProjQuantParams& p) {
  UnitPos u;
  const int S = p.splits;
  u.rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(S));
  int unit = static_cast<int>(blockIdx.x / static_cast<unsigned>(S));
  u.xt = unit % p.x_tiles;
  unit /= p.x_tiles;
  u.head = static_cast<int>(unit % p.h);
  u.n0 = static_cast<int64_t>(unit / p.h) * kBN;
  u.vcols = static_cast<int>(min64(kBN, p.V - u.n0));
  u.col0 = static_cast<int64_t>(u.head) * p.V + u.n0;
  return u;
}

// A padding tile (xt >= m_tiles): rank r writes its BM / S rows of the tile.
template <class C, OutputQuant K>
__device__ __forceinline__ void pad_tile(const block::UpProjQuantParams& p, const UnitPos& u) {
  const int share = C::BM / p.splits;
  const int64_t r0 = p.M + static_cast<int64_t>(u.xt - p.m_tiles) * C::BM + static_cast<int64_t>(u.rank) * share;
  if (r0 < p.M_pad) write_padding<K>(p, r0, min64(r0 + share, p.M_pad), u.col0, u.vcols, C::kThreads);
}

// After the mainloop (the pipeline's memory free): the tile's fp32 sums, visited by frag.for_pairs(f) as
// f(row, column, v[column], v[column + 1]) over the thread's fragment, become the output. S = 1: rounded to bf16
// into X [BM, 128] and quantised. S > 1 (sm_90): the partial tile P [BM, 128] fp32; after a cluster barrier rank r
// sums rows [r * BM / S, (r + 1) * BM / S) of the S partials through distributed shared memory in rank order into
// X (after P) and quantises them; a second cluster barrier keeps every partial alive until its readers are done.
template <class C, OutputQuant K, class Frag>
__device__ __forceinline__ void finish(const block::UpProjQuantParams& p, uint8_t* smem, const Frag& frag,
                                       const UnitPos& u, int rows, int64_t m0) {
  const int S = p.splits, tid = threadIdx.x;
  if (S == 1) {
    // The sums rounded to bf16 (round to nearest even, what the unfused bmm writes).
    uint16_t* X = reinterpret_cast<uint16_t*>(smem);
    frag.for_pairs([&](int r, int c, float a, float b) {
      *reinterpret_cast<uint32_t*>(X + r * kXStride + c) = ptx::pack_bf16x2(a, b);
    });
    __syncthreads();
    quantise_rows<C, K>(p, X, 0, C::BM, rows, u.vcols, m0, u.col0);
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float* P = reinterpret_cast<float*>(smem);
  frag.for_pairs([&](int r, int c, float a, float b) {
    *reinterpret_cast<float2*>(P + r * kPStride + c) = make_float2(a, b);
  });
  ptx::cluster_sync();  // every rank's partial tile is written and visible to the cluster
  const int share = C::BM / S, q0 = u.rank * share;
  uint16_t* X = reinterpret_cast<uint16_t*>(smem + C::kPartialBytes);
  for (int it = tid; it < share * (kBN / 4); it += C::kThreads) {
    const int rl = it / (kBN / 4), c = (it % (kBN / 4)) * 4;
    if (q0 + rl >= rows) continue;
    const uint32_t local = ptx::smem_addr(P + (q0 + rl) * kPStride + c);
    float4 part[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < S) part[s] = ptx::ld_shared_cluster_v4f32(ptx::map_peer(local, static_cast<uint32_t>(s)));
    float4 v = part[0];
#pragma unroll
    for (int s = 1; s < kMaxSplits; ++s)
      if (s < S) v = make_float4(__fadd_rn(v.x, part[s].x), __fadd_rn(v.y, part[s].y), __fadd_rn(v.z, part[s].z),
                                 __fadd_rn(v.w, part[s].w));
    *reinterpret_cast<uint2*>(X + rl * kXStride + c) = make_uint2(ptx::pack_bf16x2(v.x, v.y), ptx::pack_bf16x2(v.z, v.w));
  }
  ptx::cluster_sync();  // every rank has read the partials (none may exit before), and X is complete
  quantise_rows<C, K>(p, X, q0, q0 + share, rows, u.vcols, m0, u.col0);
#else
  __trap();  // the host splits only on devices with thread-block clusters
#endif
}

// The mma.sync mainloop's fragment: warp (wm, wn) holds MT x NT m16n8 tiles of the 16-row groups and 8-column
// blocks of its WM x WN warp tile.
template <class C>
struct MmaFrag {
  const float (&acc)[C::MT][C::NT][4];
  int wm, wn, g, t4;
  template <class F>
  __device__ __forceinline__ void for_pairs(F&& f) const {
#pragma unroll
    for (int i = 0; i < C::MT; ++i)
#pragma unroll
      for (int j = 0; j < C::NT; ++j) {
        const int r = wm * C::WM + i * 16 + g, c = wn * C::WN + j * 8 + 2 * t4;
        f(r, c, acc[i][j][0], acc[i][j][1]);
        f(r + 8, c, acc[i][j][2], acc[i][j][3]);
      }
  }
};

template <class C, OutputQuant K>
__global__ void __launch_bounds__(C::kThreads, 1) up_proj_quant_kernel(block::UpProjQuantParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const UnitPos u = unit_pos(p);
  if (u.xt >= p.m_tiles) {
    pad_tile<C, K>(p, u);
    return;
  }
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;
  const int vcols = u.vcols;
  const int64_t m0 = static_cast<int64_t>(u.xt) * C::BM;
  const int rows = static_cast<int>(min64(C::BM, p.M - m0));
  const uint16_t* a_base = p.o_lat + m0 * p.o_stride_t + static_cast<int64_t>(u.head) * p.o_stride_h;
  const uint16_t* b_base = p.w + static_cast<int64_t>(u.head) * p.w_stride_h + u.n0;
  const int ktiles = static_cast<int>((p.L + kBK - 1) / kBK);
  const int kt0 = u.rank * p.split_k_tiles;
  const int nkt = max(0, min(ktiles - kt0, p.split_k_tiles));  // this CTA's latent steps (0 for an empty rank)

  // Stage s <- latent columns [kt * 32, kt * 32 + 32). Chunks of 8 elements are wholly inside or outside
  // L (a multiple of 8), the rows (M) and V (a multiple of 16); outside ones are zero-filled.
  auto load_stage = [&](int s, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    uint16_t* as = reinterpret_cast<uint16_t*>(smem + s * C::kStageBytes);
    uint16_t* bs = as + C::kAStage;
    for (int c = tid; c < C::BM * (kBK / 8); c += C::kThreads) {
      const int r = c / (kBK / 8), kc = (c % (kBK / 8)) * 8;
      const bool ok = r < rows && k0 + kc < p.L;
      ptx::cp_async_16_or_zero(as + r * kAStride + kc, ok ? a_base + r * p.o_stride_t + k0 + kc : p.o_lat, !ok);
    }
    for (int c = tid; c < kBK * (kBN / 8); c += C::kThreads) {
      const int r = c / (kBN / 8), nc = (c % (kBN / 8)) * 8;
      const bool ok = k0 + r < p.L && nc < vcols;
      ptx::cp_async_16_or_zero(bs + r * kBStride + nc, ok ? b_base + (k0 + r) * p.w_stride_l + nc : p.w, !ok);
    }
  };

  float acc[C::MT][C::NT][4];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < C::NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < nkt) load_stage(s, kt0 + s);
    ptx::cp_async_commit();
  }
  for (int i = 0; i < nkt; ++i) {
    ptx::cp_async_wait<C::STAGES - 2>();
    __syncthreads();  // step i landed for every thread; the stage of step i - 1 is free to refill
    const int next = i + C::STAGES - 1;
    if (next < nkt) load_stage(next % C::STAGES, kt0 + next);
    ptx::cp_async_commit();
    const uint16_t* as = reinterpret_cast<const uint16_t*>(smem + (i % C::STAGES) * C::kStageBytes);
    const uint16_t* bs = as + C::kAStage;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[C::MT][4];
#pragma unroll
      for (int mi = 0; mi < C::MT; ++mi)
        ptx::ldmatrix_x4(a[mi], as + (wm * C::WM + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kAStride + kk +
                                    (lane >> 4) * 8);
#pragma unroll
      for (int j = 0; j < C::NT / 2; ++j) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, bs + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * kBStride + wn * C::WN + j * 16 +
                                      (lane >> 4) * 8);
#pragma unroll
        for (int mi = 0; mi < C::MT; ++mi) {
          ptx::mma_bf16_16816(acc[mi][2 * j], a[mi], b[0], b[1]);
          ptx::mma_bf16_16816(acc[mi][2 * j + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's memory
  finish<C, K>(p, smem, MmaFrag<C>{acc, wm, wn, lane / 4, lane % 4}, u, rows, m0);
}

// ---- the Hopper mainloop (Schedule::hopper; sm_90a) ------------------------------------------------------------
//
// One CTA per unit as above, BM / 64 warpgroups, every thread loading. A stage holds kHopperStep = 64 latent
// columns: A = o_lat rows [BM][64] bf16 as 128-byte rows (K-major, 128-byte swizzle: chunk c of row r at
// r * 128 + ((c ^ (r % 8)) << 4)), B = w rows [64][128] as two MN-major panels of 64 columns ([64 latent rows][128
// bytes] each, the same swizzle). cp.async 16-byte chunks (zero-filled past M, L and V) in STAGES stages: BM 64
// keeps all eight steps of L 512 in flight (8 x 24 KiB), BM 128 six (6 x 32 KiB). Per step warpgroup w issues four
// wgmma m64n128k16 (A rows 64 w .. 64 w + 63 from the stage, B from both panels) into its 64 fp32 accumulators and
// waits for them before the step's stage is refilled. The accumulator rows are the rows of a 64-row wgmma D
// fragment (ptx/wgmma.cuh), the epilogue finish() as the mma.sync mainloop's.
template <int BM_, int STAGES_>
struct CfgHopper {
  static constexpr int BM = BM_, STAGES = STAGES_;
  static constexpr bool kHopper = true;
  static constexpr int kWarpgroups = BM / 64;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kStep = up_proj::kHopperStep;
  static constexpr int kABytes = BM * 128;          // [BM][64] bf16
  static constexpr int kBPanel = kStep * 128;       // [64 latent][64 columns] bf16
  static constexpr int kStageBytes = kABytes + 2 * kBPanel;
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kXBytes = BM * kXStride * 2;
  static constexpr int kPartialBytes = BM * kPStride * 4;
  static constexpr int kSplitBytes = kPartialBytes + BM / 2 * kXStride * 2;
  static constexpr int kAlign = 1024;  // the swizzled stages start on 1 KiB boundaries
  static constexpr int kSmemMax = std::max({kPipeBytes, kXBytes, kSplitBytes}) + kAlign;
  static_assert(BM % 64 == 0 && BM % kMaxSplits == 0, "whole warpgroups; a split CTA reduces BM / S whole rows");
  static_assert(kSmemMax <= 227 * 1024, "fits sm_90's shared memory per block");

  static int smem_bytes(int64_t steps, int splits) {
    const int64_t stages = steps < STAGES ? (steps < 1 ? 1 : steps) : STAGES;
    const int64_t pipe = stages * kStageBytes;
    const int64_t epi = splits > 1 ? kPartialBytes + int64_t{BM} / splits * kXStride * 2 : kXBytes;
    return static_cast<int>((pipe > epi ? pipe : epi) + kAlign);
  }
};
using CfgH64 = CfgHopper<64, 8>;
using CfgH128 = CfgHopper<128, 6>;

// The 64-row wgmma D fragment of warpgroup wg (ptx/wgmma.cuh): rows 64 wg + 16 w + g (+ 8), columns 8 j + 2 t4.
struct WgmmaFrag {
  const float (&acc)[kBN / 2];
  int r_lo, t4;
  template <class F>
  __device__ __forceinline__ void for_pairs(F&& f) const {
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      f(r_lo, 8 * j + 2 * t4, acc[4 * j], acc[4 * j + 1]);
      f(r_lo + 8, 8 * j + 2 * t4, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
};

template <class C, OutputQuant K>
__global__ void __launch_bounds__(C::kThreads, 1) up_proj_quant_sm90_kernel(block::UpProjQuantParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: sm_90a only (the fat build compiles this file for every target)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + C::kAlign - 1) &
                                             ~uintptr_t{C::kAlign - 1});
  const UnitPos u = unit_pos(p);
  if (u.xt >= p.m_tiles) {
    pad_tile<C, K>(p, u);
    return;
  }
  constexpr int kStep = C::kStep;
  const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128, w = (tid / 32) % 4;
  const int vcols = u.vcols;
  const int64_t m0 = static_cast<int64_t>(u.xt) * C::BM;
  const int rows = static_cast<int>(min64(C::BM, p.M - m0));
  const uint16_t* a_base = p.o_lat + m0 * p.o_stride_t + static_cast<int64_t>(u.head) * p.o_stride_h;
  const uint16_t* b_base = p.w + static_cast<int64_t>(u.head) * p.w_stride_h + u.n0;
  const int ktiles = static_cast<int>((p.L + kStep - 1) / kStep);
  const int kt0 = u.rank * p.split_k_tiles;
  const int nkt = max(0, min(ktiles - kt0, p.split_k_tiles));

  // Stage s <- latent columns [kt * 64, kt * 64 + 64): chunks of 8 elements, zero-filled outside M, L and V.
  auto load_stage = [&](int s, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kStep;
    uint8_t* as = smem + s * C::kStageBytes;
    uint8_t* bs = as + C::kABytes;
    for (int c = tid; c < C::BM * 8; c += C::kThreads) {
      const int r = c / 8, kc = c % 8;
      const bool ok = r < rows && k0 + 8 * kc < p.L;
      ptx::cp_async_16_or_zero(as + ptx::sw128_offset(r, kc), ok ? a_base + r * p.o_stride_t + k0 + 8 * kc : p.o_lat, !ok);
    }
    for (int c = tid; c < kStep * (kBN / 8); c += C::kThreads) {
      const int kr = c / (kBN / 8), nc = c % (kBN / 8);
      const bool ok = k0 + kr < p.L && 8 * nc < vcols;
      ptx::cp_async_16_or_zero(bs + (nc / 8) * C::kBPanel + ptx::sw128_offset(kr, nc % 8),
                               ok ? b_base + (k0 + kr) * p.w_stride_l + 8 * nc : p.w, !ok);
    }
  };

  float acc[kBN / 2];
#pragma unroll
  for (int e = 0; e < kBN / 2; ++e) acc[e] = 0.f;

#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < nkt) load_stage(s, kt0 + s);
    ptx::cp_async_commit();
  }
  for (int i = 0; i < nkt; ++i) {
    ptx::cp_async_wait<C::STAGES - 2>();
    ptx::fence_proxy_async_smem();  // this thread's landed chunks, before the async proxy (wgmma) reads them
    __syncthreads();                // step i landed for every thread; step i - 1's stage was retired by every wgmma
    const int next = i + C::STAGES - 1;
    if (next < nkt) load_stage(next % C::STAGES, kt0 + next);
    ptx::cp_async_commit();
    const uint8_t* as = smem + (i % C::STAGES) * C::kStageBytes;
    const uint64_t da = ptx::desc_sw128_k_major(as + wg * 64 * 128);
    const uint64_t db = ptx::desc_sw128_mn_major(as + C::kABytes, C::kBPanel);
    ptx::wgmma_fence_operand(acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kStep / 16; ++ks)
      ptx::wgmma_bf16_ss<kBN, ptx::Major::K, ptx::Major::MN>(acc, ptx::desc_advance(da, 32 * ks),
                                                             ptx::desc_advance(db, 2048 * ks), true);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(acc);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // every warpgroup is done with the pipeline's memory
  finish<C, K>(p, smem, WgmmaFrag{acc, 64 * wg + 16 * w + lane / 4, lane % 4}, u, rows, m0);
#else
  __trap();  // the host runs the Hopper mainloop only on sm_90a (up_proj_hopper_supported)
#endif
}

template <class C, OutputQuant K>
void launch(const block::UpProjQuantParams& base, int splits, cudaStream_t st) {
  constexpr const char* op = "up_project_quantized";
  block::UpProjQuantParams p = base;
  const int64_t m_tiles = (p.M + C::BM - 1) / C::BM, pad_tiles = (p.M_pad - p.M + C::BM - 1) / C::BM;
  const int64_t k_tiles = (p.L + C::kStep - 1) / C::kStep, split_k = up_proj::split_k_tiles(k_tiles, splits);
  const int64_t grid = (m_tiles + pad_tiles) * p.h * ((p.V + kBN - 1) / kBN) * splits;
  if (grid > 0x7fffffffLL) throw Error(std::string(op) + ": problem too large for one launch");
  p.m_tiles = static_cast<int>(m_tiles);
  p.x_tiles = static_cast<int>(m_tiles + pad_tiles);
  p.splits = splits;
  p.split_k_tiles = static_cast<int>(split_k);
  void (*kernel)(block::UpProjQuantParams) = nullptr;
  if constexpr (C::kHopper) kernel = up_proj_quant_sm90_kernel<C, K>;
  else kernel = up_proj_quant_kernel<C, K>;
  const int smem = C::smem_bytes(split_k, splits);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemMax),
             "up_project_quantized: shared memory attribute");
  if (splits == 1)
    kernel<<<static_cast<unsigned>(grid), C::kThreads, smem, st>>>(p);
  else
    launch_cluster(kernel, static_cast<unsigned>(grid), static_cast<unsigned>(splits), C::kThreads,
                   static_cast<std::size_t>(smem), st, op, p);
}

template <class C>
void launch_key(OutputQuant key, const block::UpProjQuantParams& p, int splits, cudaStream_t st) {
  switch (key) {
    case OutputQuant::fp8: return launch<C, OutputQuant::fp8>(p, splits, st);
    case OutputQuant::fp8_group128: return launch<C, OutputQuant::fp8_group128>(p, splits, st);
    case OutputQuant::fp8_group64: return launch<C, OutputQuant::fp8_group64>(p, splits, st);
    case OutputQuant::nvfp4: return launch<C, OutputQuant::nvfp4>(p, splits, st);
    case OutputQuant::none: break;
  }
  throw Error("up_project_quantized: key none has no quantised form");
}

bool aligned16(const void* ptr, int64_t stride_elems, std::size_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (stride_elems * static_cast<int64_t>(elem_bytes)) % 16 == 0;
}

// Whether the image `Kernel` runs on `device` was compiled from PTX of sm_90 or later (device_info validated the
// index): read once per (kernel, device), since the planner asks on every call.
template <auto Kernel>
bool image_from_sm90_ptx(int device) {
  static std::array<std::atomic<int>, 64> cached{};  // 0 unknown, 1 no, 2 yes
  std::atomic<int>& slot = cached[static_cast<std::size_t>(device)];
  int v = slot.load(std::memory_order_relaxed);
  if (v == 0) {
    DeviceGuard guard(Device::cuda(device));
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, Kernel), "up_project_quantized: kernel attributes");
    v = attr.ptxVersion >= 90 ? 2 : 1;
    slot.store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace

// The compute_80 PTX, JIT-compiled for a device the build has no image for, has its split epilogue compiled out:
// the image's PTX version says which one the device runs.
bool up_proj_splits_supported(int device) {
  if (cuda_rt::device_info(device).cc_major < 9) return false;
  return image_from_sm90_ptx<up_proj_quant_kernel<Cfg16, OutputQuant::fp8>>(device);
}

// The Hopper mainloop needs sm_90a's own image (wgmma): compute capability 9.0 and the kernel built for it.
bool up_proj_hopper_supported(int device) {
  const cuda_rt::DeviceInfo& info = cuda_rt::device_info(device);
  if (info.cc_major != 9 || info.cc_minor != 0) return false;
  return image_from_sm90_ptx<up_proj_quant_sm90_kernel<CfgH64, OutputQuant::fp8>>(device);
}

up_proj::Schedule up_proj_planned_schedule(int64_t rows, int64_t heads, int64_t L, int64_t V, int device) {
  up_proj::Problem prob;
  prob.rows = rows;
  prob.heads = heads;
  prob.col_tiles = (V + kBN - 1) / kBN;
  prob.k_tiles = (L + kBK - 1) / kBK;
  prob.sms = cuda_rt::device_info(device).sm_count;
  prob.max_splits = up_proj_splits_supported(device) ? kMaxSplits : 1;
  prob.hopper = up_proj_hopper_supported(device);
  return up_proj::schedule(prob);
}

void up_project_quantized_with(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                               const TensorView& scales, float scale, const up_proj::Schedule& sched,
                               const Context& ctx) {
  constexpr const char* op = "up_project_quantized";
  const int64_t M = o_lat.size(0), h = o_lat.size(1), L = o_lat.size(2), V = w_uv.size(2);
  const int64_t M_pad = codes.size(0);
  const int S = sched.splits;
  if (sched.hopper ? sched.tile_rows != 64 && sched.tile_rows != 128
                   : sched.tile_rows != 16 && sched.tile_rows != 64 && sched.tile_rows != 128)
    throw Error(std::string(op) + ": a tile of " + (sched.hopper ? "64 or 128" : "16, 64 or 128") + " rows" +
                (sched.hopper ? " for the Hopper mainloop" : "") + ", got " + std::to_string(sched.tile_rows));
  if (S != 1 && S != 2 && S != 4 && S != 8)
    throw Error(std::string(op) + ": a latent split of 1, 2, 4 or 8 CTAs, got " + std::to_string(S));
  const int step = up_proj::step_of(sched);
  if (S > 1 && S > up_proj::k_tiles_of(sched, L))
    throw Error(std::string(op) + ": a latent split of at most ceil(L / " + std::to_string(step) + ") = " +
                std::to_string(up_proj::k_tiles_of(sched, L)) + " CTAs, got " + std::to_string(S));
  if (M_pad == 0 || h == 0 || V == 0) return;
  DeviceGuard guard(codes.device);
  if (S > 1 && !up_proj_splits_supported(codes.device.index))
    throw Error(std::string(op) + ": a latent split needs thread-block clusters (sm_90 or later)");
  if (sched.hopper && !up_proj_hopper_supported(codes.device.index))
    throw Error(std::string(op) + ": the Hopper mainloop needs an sm_90a device (compute capability 9.0)");
  // cp.async moves 16-byte chunks of 8 elements: rows, head and token strides on 16-byte boundaries.
  if (!aligned16(o_lat.data, o_lat.stride[0], 2) || (o_lat.stride[1] * 2) % 16 != 0 || L % 8 != 0 ||
      !aligned16(w_uv.data, w_uv.stride[0], 2) || (w_uv.stride[1] * 2) % 16 != 0)
    throw Error(std::string(op) + ": on CUDA o_lat and w_uv need 16-byte aligned data and token, head and row "
                "strides (multiples of 8 elements) and L a multiple of 8, got o_lat " + o_lat.describe() + " and w_uv " +
                w_uv.describe());
  const bool fp4 = key == OutputQuant::nvfp4;
  block::UpProjQuantParams p{};
  p.o_lat = static_cast<const uint16_t*>(o_lat.data);
  p.w = static_cast<const uint16_t*>(w_uv.data);
  p.codes = static_cast<uint8_t*>(codes.data);
  p.scales = scales.defined() ? scales.data : nullptr;
  p.M = M, p.M_pad = M_pad, p.h = h, p.L = L, p.V = V;
  p.o_stride_t = o_lat.stride[0], p.o_stride_h = o_lat.stride[1], p.w_stride_h = w_uv.stride[0];
  p.w_stride_l = w_uv.stride[1], p.codes_stride = codes.stride[0];
  p.scales_stride = scales.defined() ? scales.stride[0] : 0;
  p.scale = scale;
  // fp8 keys store 16 codes per (row, 16 columns): 16-byte aligned when the row and its stride are; nvfp4
  // stores 8 bytes per 16-column block.
  p.vec = fp4 ? reinterpret_cast<uintptr_t>(codes.data) % 8 == 0 && codes.stride[0] % 8 == 0
              : reinterpret_cast<uintptr_t>(codes.data) % 16 == 0 && codes.stride[0] % 16 == 0;
  const cudaStream_t st = stream_of(ctx);
  if (sched.hopper) {
    if (sched.tile_rows == 64) launch_key<CfgH64>(key, p, S, st);
    else launch_key<CfgH128>(key, p, S, st);
  } else {
    switch (sched.tile_rows) {
      case 16: launch_key<Cfg16>(key, p, S, st); break;
      case 64: launch_key<Cfg64>(key, p, S, st); break;
      default: launch_key<Cfg128>(key, p, S, st); break;
    }
  }
  check_launch(op);
}

void up_project_quantized(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                          const TensorView& scales, float scale, const Context& ctx) {
  DeviceGuard guard(codes.device);
  const up_proj::Schedule sched =
      up_proj_planned_schedule(o_lat.size(0), o_lat.size(1), o_lat.size(2), w_uv.size(2), codes.device.index);
  up_project_quantized_with(o_lat, w_uv, key, codes, scales, scale, sched, ctx);
}

}  // namespace mla::cuda
