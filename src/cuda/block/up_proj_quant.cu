// SPDX-License-Identifier: Apache-2.0
// The attention layer's V up-projection with its output quantised in the epilogue
// (mla::up_project_quantized, docs/SEMANTICS.md §15 "Where it runs"): for token t and head n
//   x[t, n * V + c] = bf16( sum_l o_lat[t, n, l] * w[n, l, c] )    fp32 accumulation, rounded once to bf16
//   codes / scales  = quantize_output(x)                             the float operations of quantize_output.cu
// so the bytes equal quantize_output applied to this kernel's own bf16 product, and differ from
// quantize_output(bmm(o_lat, w)) only where cuBLAS's fp32 sum rounds to another bf16 value (a
// different summation order): at most one code there.
//
// Algorithm. One CTA computes a tile of BM tokens x 128 output columns of one head (grid y = head,
// z = 128-column tile of V, x = token tiles, then padding tiles). Main loop over the latent dim L in
// steps of 32: a cp.async pipeline of STAGES stages (A = o_lat rows [BM, 32], B = w rows [32, 128],
// zero-filled past M, L and V) feeding mma.sync m16n8k16 bf16 -> fp32 (ldmatrix / ldmatrix.trans
// from +16-byte padded rows, conflict-free). Warps split the tile WARPS_M x WARPS_N, each holding
// WM x WN fp32 accumulators. Epilogue: the accumulators are rounded to bf16 into a shared tile
// [BM, 128] (the pipeline's memory), then the CTA quantises that tile:
//   fp8            one thread per 16 columns of a row: 16 codes, one 16-byte store
//   fp8_group128   G / 16 lanes per (row, group), 16 values each; the group's abs-max is a shuffle
//   fp8_group64      reduction that propagates NaN; the team's first lane writes the f32 scale
//   nvfp4          one thread per 16-value block: its e4m3 scale code, then 8 bytes of e2m1 pairs
// A group never straddles two CTAs: the tile starts at a multiple of 128 columns of the head and
// V is a multiple of the group (the front end checks). Padding CTAs (x >= m_tiles) write rows
// M .. M_pad - 1 as quantize_output does: zero codes, group scale 1, nvfp4 scale code 0.
//
// Configurations (host choice by M): BM 16 (4 warps 1 x 4, 10 stages, 97.5 KiB) for decode-sized M <= 16;
// BM 128 (8 warps 4 x 2, 3 stages, 55.5 KiB) when there are at least 264 such CTAs; else BM 64 (4 warps
// 2 x 2, 7 stages, 94.5 KiB). Dynamic shared memory; sm_80 and later (mma.sync, cp.async, ldmatrix).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/numeric.h"
#include "cuda/block/params.h"
#include "cuda/common/convert.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/cuda_ops.h"

namespace mla::cuda {
namespace {

constexpr int kBK = 32;              // latent columns per pipeline stage
constexpr int kBN = 128;             // output columns per CTA
constexpr int kAStride = kBK + 8;    // shared row strides in elements: +16 bytes keeps ldmatrix conflict-free
constexpr int kBStride = kBN + 8;
constexpr int kXStride = kBN + 8;

template <int BM_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct Cfg {
  static constexpr int BM = BM_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = kBN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int kAStage = BM * kAStride, kBStage = kBK * kBStride;  // elements
  static constexpr int kPipeBytes = STAGES * (kAStage + kBStage) * 2;
  static constexpr int kXBytes = BM * kXStride * 2;
  static constexpr int kSmem = kPipeBytes > kXBytes ? kPipeBytes : kXBytes;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are whole m16 tiles and pairs of n8 tiles");
  static_assert(kSmem <= 99 * 1024, "fits the opt-in shared memory of sm_86 / sm_89");
};

// Decode-sized tiles are latency bound on the weight stream (one head's W_UV is 128 KiB for L 512, V 128,
// read by one CTA): deep pipelines keep most of it in flight. The depth stops at sm_86 / sm_89's 99 KiB.
using CfgDecode = Cfg<16, 1, 4, 10>;
using CfgMid = Cfg<64, 2, 2, 7>;
using CfgLarge = Cfg<128, 4, 2, 3>;

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

// 16 e4m3 codes of v / s (IEEE division, as quantize_output.cu), packed four to a word.
__device__ __forceinline__ void e4m3_codes(const float (&v)[16], float s, uint32_t (&w)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) w[i] |= static_cast<uint32_t>(dev::float_to_e4m3(__fdiv_rn(v[4 * i + j], s))) << (8 * j);
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

template <class C, OutputQuant K>
__global__ void __launch_bounds__(C::kThreads) up_proj_quant_kernel(block::UpProjQuantParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int head = blockIdx.y;
  const int64_t n0 = static_cast<int64_t>(blockIdx.z) * kBN;                   // first column of V in this tile
  const int vcols = static_cast<int>(min64(kBN, p.V - n0));            // valid columns (a multiple of 16)
  const int64_t col0 = static_cast<int64_t>(head) * p.V + n0;                  // first column of the output row
  if (static_cast<int>(blockIdx.x) >= p.m_tiles) {
    const int64_t r0 = p.M + static_cast<int64_t>(blockIdx.x - p.m_tiles) * C::BM;
    write_padding<K>(p, r0, min64(r0 + C::BM, p.M_pad), col0, vcols, C::kThreads);
    return;
  }
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * C::BM;
  const int rows = static_cast<int>(min64(C::BM, p.M - m0));
  uint16_t* sA = reinterpret_cast<uint16_t*>(smem);
  uint16_t* sB = sA + C::STAGES * C::kAStage;
  const uint16_t* a_base = p.o_lat + m0 * p.o_stride_t + static_cast<int64_t>(head) * p.o_stride_h;
  const uint16_t* b_base = p.w + static_cast<int64_t>(head) * p.w_stride_h + n0;

  // Stage s <- latent columns [kt * 32, kt * 32 + 32). Chunks of 8 elements are wholly inside or outside
  // L (a multiple of 8), the rows (M) and V (a multiple of 16); outside ones are zero-filled.
  auto load_stage = [&](int s, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    uint16_t* as = sA + s * C::kAStage;
    uint16_t* bs = sB + s * C::kBStage;
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

  const int ktiles = static_cast<int>((p.L + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    ptx::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    ptx::cp_async_wait<C::STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
    const int next = kt + C::STAGES - 1;
    if (next < ktiles) load_stage(next % C::STAGES, next);
    ptx::cp_async_commit();
    const uint16_t* as = sA + (kt % C::STAGES) * C::kAStage;
    const uint16_t* bs = sB + (kt % C::STAGES) * C::kBStage;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[C::MT][4];
#pragma unroll
      for (int i = 0; i < C::MT; ++i)
        ptx::ldmatrix_x4(a[i], as + (wm * C::WM + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kAStride + kk +
                                   (lane >> 4) * 8);
#pragma unroll
      for (int j = 0; j < C::NT / 2; ++j) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, bs + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * kBStride + wn * C::WN + j * 16 +
                                      (lane >> 4) * 8);
#pragma unroll
        for (int i = 0; i < C::MT; ++i) {
          ptx::mma_bf16_16816(acc[i][2 * j], a[i], b[0], b[1]);
          ptx::mma_bf16_16816(acc[i][2 * j + 1], a[i], b[2], b[3]);
        }
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's memory

  // The product rounded to bf16 (round to nearest even, what the unfused bmm writes) into X [BM, 128].
  uint16_t* X = reinterpret_cast<uint16_t*>(smem);
  {
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int i = 0; i < C::MT; ++i)
#pragma unroll
      for (int j = 0; j < C::NT; ++j) {
        const int r = wm * C::WM + i * 16 + g, c = wn * C::WN + j * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(X + r * kXStride + c) = ptx::pack_bf16x2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<uint32_t*>(X + (r + 8) * kXStride + c) = ptx::pack_bf16x2(acc[i][j][2], acc[i][j][3]);
      }
  }
  __syncthreads();

  if constexpr (K == OutputQuant::fp8 || K == OutputQuant::nvfp4) {
    for (int it = tid; it < C::BM * (kBN / 16); it += C::kThreads) {
      const int r = it / (kBN / 16), c = (it % (kBN / 16)) * 16;
      if (r >= rows || c >= vcols) continue;
      const int64_t t = m0 + r;
      float v[16];
      load16(X + r * kXStride + c, v);
      if constexpr (K == OutputQuant::fp8) {
        uint32_t w[4];
        e4m3_codes(v, p.scale, w);
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
    constexpr int kTeam = G / 16, kPerWarp = 32 / kTeam, kPerRow = kBN / G, kTotal = C::BM * kPerRow;
    constexpr int kWarps = C::kThreads / 32;
    for (int base = warp * kPerWarp; base < kTotal; base += kWarps * kPerWarp) {  // uniform per warp
      const int item = base + lane / kTeam, sub = lane % kTeam;
      const int r = item / kPerRow, gc = (item % kPerRow) * G;
      const bool ok = item < kTotal && r < rows && gc < vcols;
      float v[16];
      float amax = 0.f;
      if (ok) {
        load16(X + r * kXStride + gc + sub * 16, v);
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = nan_max(amax, fabsf(v[i]));
      }
#pragma unroll
      for (int o = kTeam / 2; o > 0; o >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (ok) {
        const float s = amax == 0.f ? 1.0f : __fdiv_rn(amax, 448.0f);
        const int64_t t = m0 + r;
        uint32_t w[4];
        e4m3_codes(v, s, w);
        store_bytes<16>(p.codes + t * p.codes_stride + col0 + gc + sub * 16, w, p.vec);
        if (sub == 0) static_cast<float*>(p.scales)[((col0 + gc) / G) * p.scales_stride + t] = s;
      }
    }
  }
}

template <class C, OutputQuant K>
void launch(const block::UpProjQuantParams& base, cudaStream_t st) {
  block::UpProjQuantParams p = base;
  const int64_t m_tiles = (p.M + C::BM - 1) / C::BM, pad_tiles = (p.M_pad - p.M + C::BM - 1) / C::BM;
  if (m_tiles + pad_tiles > 0x7fffffffLL) throw Error("up_project_quantized: problem too large for one launch");
  p.m_tiles = static_cast<int>(m_tiles);
  const dim3 grid(static_cast<unsigned>(m_tiles + pad_tiles), static_cast<unsigned>(p.h),
                  static_cast<unsigned>((p.V + kBN - 1) / kBN));
  auto* kernel = up_proj_quant_kernel<C, K>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem),
             "up_project_quantized: shared memory attribute");
  kernel<<<grid, C::kThreads, C::kSmem, st>>>(p);
}

template <class C>
void launch_key(OutputQuant key, const block::UpProjQuantParams& p, cudaStream_t st) {
  switch (key) {
    case OutputQuant::fp8: return launch<C, OutputQuant::fp8>(p, st);
    case OutputQuant::fp8_group128: return launch<C, OutputQuant::fp8_group128>(p, st);
    case OutputQuant::fp8_group64: return launch<C, OutputQuant::fp8_group64>(p, st);
    case OutputQuant::nvfp4: return launch<C, OutputQuant::nvfp4>(p, st);
    case OutputQuant::none: break;
  }
  throw Error("up_project_quantized: key none has no quantised form");
}

bool aligned16(const void* ptr, int64_t stride_elems, std::size_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (stride_elems * static_cast<int64_t>(elem_bytes)) % 16 == 0;
}

}  // namespace

void up_project_quantized(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                          const TensorView& scales, float scale, const Context& ctx) {
  constexpr const char* op = "up_project_quantized";
  const int64_t M = o_lat.size(0), h = o_lat.size(1), L = o_lat.size(2), V = w_uv.size(2);
  const int64_t M_pad = codes.size(0);
  if (M_pad == 0 || h == 0 || V == 0) return;
  // cp.async moves 16-byte chunks of 8 elements: rows, head and token strides on 16-byte boundaries.
  if (!aligned16(o_lat.data, o_lat.stride[0], 2) || (o_lat.stride[1] * 2) % 16 != 0 || L % 8 != 0 ||
      !aligned16(w_uv.data, w_uv.stride[0], 2) || (w_uv.stride[1] * 2) % 16 != 0)
    throw Error(std::string(op) + ": on CUDA o_lat and w_uv need 16-byte aligned data and token, head and row "
                "strides (multiples of 8 elements) and L a multiple of 8, got o_lat " + o_lat.describe() + " and w_uv " +
                w_uv.describe());
  if (h > 65535) throw Error(std::string(op) + ": at most 65535 heads on CUDA, got " + std::to_string(h));
  const bool fp4 = key == OutputQuant::nvfp4;
  block::UpProjQuantParams p{static_cast<const uint16_t*>(o_lat.data),
                             static_cast<const uint16_t*>(w_uv.data),
                             static_cast<uint8_t*>(codes.data),
                             scales.defined() ? scales.data : nullptr,
                             M, M_pad, h, L, V,
                             o_lat.stride[0], o_lat.stride[1], w_uv.stride[0], w_uv.stride[1],
                             codes.stride[0], scales.defined() ? scales.stride[0] : 0,
                             0, scale,
                             // fp8 keys store 16 codes per (row, 16 columns): 16-byte aligned when the row
                             // and its stride are; nvfp4 stores 8 bytes per 16-column block.
                             fp4 ? reinterpret_cast<uintptr_t>(codes.data) % 8 == 0 && codes.stride[0] % 8 == 0
                                 : reinterpret_cast<uintptr_t>(codes.data) % 16 == 0 && codes.stride[0] % 16 == 0};
  DeviceGuard guard(codes.device);
  const cudaStream_t st = stream_of(ctx);
  const int64_t col_tiles = (V + kBN - 1) / kBN;
  if (M <= CfgDecode::BM)
    launch_key<CfgDecode>(key, p, st);
  else if ((M + CfgLarge::BM - 1) / CfgLarge::BM * h * col_tiles >= 264)
    launch_key<CfgLarge>(key, p, st);
  else
    launch_key<CfgMid>(key, p, st);
  check_launch(op);
}

}  // namespace mla::cuda
