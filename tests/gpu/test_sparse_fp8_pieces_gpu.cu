// SPDX-License-Identifier: Apache-2.0
// Device tests of the pieces of the fp8 sparse prefill design (docs/design/sparse_prefill_fp8_plan.md §3): the value
// product turned around, O^T = V^T P^T, with V^T as wgmma's e4m3 A operand from registers, built from the raw
// K-major code tile by ldmatrix.trans and byte permutes (no V^T buffer), and P^T as the B operand from a P panel whose
// key positions follow vt_position. The first test checks the fragments and the product against a float64 product on
// the host; the second is the plan's experiment 1, the S and O roles' loop on resident operands, in cycles a tile.
// SASS: LDSM.T, PRMT, QGMMA (rs and ss), HGMMA (the rope's bf16 products).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/attention/sm90/fp8c/transpose.cuh"
#include "cuda/attention/sm90/prefill_fp8/traits.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;
using cuda::decode_sm90::fp8c::p_desc;
using cuda::decode_sm90::fp8c::p_fragments;
using cuda::decode_sm90::fp8c::store_p_panel;
using cuda::decode_sm90::fp8c::VtLayout;

constexpr int kKeys = 64, kCols = 512, kRows = 64;
constexpr int kRawBytes = 4 * VtLayout::kRawPanelBytes;  // four 128-byte-swizzled panels [64 keys][128 code bytes]
constexpr int kPanelBytes = kRows * kKeys;               // a P panel [64 rows][64 key positions] e4m3

// The e4m3 A fragment of O^T = V^T P^T for m64 block `blk` (value columns 64 blk .. 64 blk + 63) and k32 step kk
// (keys 32 kk .. 32 kk + 31) from the raw tile. One ldmatrix.x4.trans: matrix m (lanes 8m .. 8m + 7 give its row
// addresses) is keys 32 kk + 16 (m >> 1) + 8 (m & 1) + 0..7 at the 16 code bytes of this warp's value columns
// 64 blk + 16 w .. + 15; lane 4q + s then holds, per matrix, keys 2s, 2s + 1 of value columns 2q, 2q + 1, and two byte
// permutes per matrix pair make a[0] = column 2q, a[1] = column 2q + 1 at key positions 4s .. 4s + 3 of the first 16
// keys (keys 2s, 2s + 1, 8 + 2s, 9 + 2s: the vt_position order), a[2], a[3] the same of the next 16. So the fragment's
// row q of warp w is value column 64 blk + 16 w + 2q and row q + 8 is 64 blk + 16 w + 2q + 1 (`vt_row_column`).
// Conflict-free: the eight rows of a matrix are eight consecutive keys of one swizzled chunk.
__device__ __forceinline__ void vt_a_fragment(const uint8_t* raw, int blk, int kk, int warp, int lane, uint32_t (&a)[4]) {
  const int m = lane >> 3, key = 32 * kk + 16 * (m >> 1) + 8 * (m & 1) + (lane & 7);
  const int col = 64 * blk + 16 * warp;
  uint32_t r[4];
  ldmatrix_x4_trans(r, raw + (col >> 7) * VtLayout::kRawPanelBytes + sw128_offset(key, (col & 127) >> 4));
  a[0] = __byte_perm(r[0], r[1], 0x6420);
  a[1] = __byte_perm(r[0], r[1], 0x7531);
  a[2] = __byte_perm(r[2], r[3], 0x6420);
  a[3] = __byte_perm(r[2], r[3], 0x7531);
}
// The value column of O^T's accumulator row m (0..63) of block blk (vt_a_fragment's order).
__host__ __device__ constexpr int vt_row_column(int blk, int m) {
  return 64 * blk + 16 * (m / 16) + 2 * (m % 8) + (m % 16) / 8;
}

// raw_g: the four swizzled panels; p_g: P [64 rows][64 keys] fp32 (exact in e4m3); o_out: O [64 rows][512].
__global__ void __launch_bounds__(128) values_as_a_kernel(const uint8_t* raw_g, const float* p_g, float* o_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* raw = align1024(smem_raw);
  uint8_t* panel = raw + kRawBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int i = tid; i < kRawBytes / 16; i += 128)
    reinterpret_cast<uint4*>(raw)[i] = reinterpret_cast<const uint4*>(raw_g)[i];
  // P's panel as S would write it: its S-shaped fragment (rows r_lo, r_hi; keys 8 jj + 2 t, + 1) packed and stored.
  const int r_lo = 16 * warp + g, r_hi = r_lo + 8;
  float s[32];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    s[4 * jj] = p_g[r_lo * kKeys + 8 * jj + 2 * t];
    s[4 * jj + 1] = p_g[r_lo * kKeys + 8 * jj + 2 * t + 1];
    s[4 * jj + 2] = p_g[r_hi * kKeys + 8 * jj + 2 * t];
    s[4 * jj + 3] = p_g[r_hi * kKeys + 8 * jj + 2 * t + 1];
  }
  uint32_t pa[2][4];
  p_fragments(s, pa);
  store_p_panel(panel, pa, r_lo, r_hi, t);
  fence_proxy_async_smem();
  __syncthreads();
#pragma unroll 1
  for (int blk = 0; blk < 8; ++blk) {
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    uint32_t a[2][4];
    vt_a_fragment(raw, blk, 0, warp, lane, a[0]);
    vt_a_fragment(raw, blk, 1, warp, lane, a[1]);
    wgmma_fence_operand(d);
    wgmma_fence_operand(a[0]);
    wgmma_fence_operand(a[1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) wgmma_e4m3_rs<64>(d, a[kk], p_desc(panel, kk), kk > 0);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(d);
    // d[4j + e]: row 16 w + g (e < 2) or + 8, column (query row) 8 j + 2 t + e % 2.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 16 * warp + g + 8 * (e / 2), n = 8 * j + 2 * t + e % 2;
        o_out[n * kCols + vt_row_column(blk, m)] = d[4 * j + e];
      }
  }
}

TEST(SparseFp8PiecesGpu, ValuesAsRegisterOperandMatchHost) {
  MLA_SKIP_UNLESS_SM90();
  const std::vector<uint8_t> v = test::random_e4m3(std::size_t{kKeys} * kCols);
  std::vector<uint8_t> raw(kRawBytes);
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < kCols; ++c) {
      const int p = c / 128, cc = c % 128;
      raw[p * VtLayout::kRawPanelBytes + k * 128 + (((cc / 16) ^ (k % 8)) * 16) + cc % 16] = v[k * kCols + c];
    }
  std::vector<float> p(std::size_t{kRows} * kKeys);
  {
    const std::vector<uint8_t> codes = test::random_e4m3(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = test::e4m3_to_float(codes[i] & 0x7f);
  }
  test::DevBuf<uint8_t> d_raw(raw);
  test::DevBuf<float> d_p(p), d_o(std::size_t{kRows} * kCols);
  d_o.fill_bytes(0xff);  // NaN: an element the kernel does not write fails below
  constexpr int kSmem = kRawBytes + kPanelBytes + 1024;
  MLA_CUDA_OK(cudaFuncSetAttribute(values_as_a_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  values_as_a_kernel<<<1, 128, kSmem>>>(d_raw.p, d_p.p, d_o.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> o = d_o.download();
  double worst = 0.0;
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < kCols; ++d) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < kKeys; ++k) {
        const double x = double(p[r * kKeys + k]) * test::e4m3_to_float(v[k * kCols + d]);
        ref += x;
        mag += std::fabs(x);
      }
      const double got = o[r * kCols + d];
      const double err = std::isfinite(got) ? std::fabs(got - ref) / (mag * 1e-6 + 1e-30) : 1e30;
      worst = std::max(worst, err);
    }
  // As Fp8cTransposeGpu.VtLayoutAndValueProductMatchHost: exact products in the fp8 pipe's narrower adder; a wrong
  // fragment or column map errs by O(1), an unwritten element is NaN.
  std::printf("e4m3 O^T = V^T P^T, V^T from registers: worst |O - P V| = %.3g x 1e-6 sum |P V|\n", worst);
  EXPECT_LE(worst, 1000.0) << "worst |O - P V| in units of 1e-6 sum |P V|";
}

// The plan's experiment 1: one CTA per SM, 512 threads, operands resident (no producer traffic). Warpgroup 0 idles
// (the producer's registers), warpgroup 1 is S: per tile the rope's S (four bf16 ss m64n64k16) and the four 128-column
// groups' S (four e4m3 ss m64n64k32 each) in two alternating accumulators, each folded into S by its per-key scale,
// the softmax (running maximum, exp2, row sums), the four P_g panels (P times the group's per-key scale, e4m3) and the
// rows' factors into P buffer i % 2, then O told (named barrier). Warpgroups 2, 3 are O: value columns 256 h ..,
// rescale by the factors, then per m64 block the two k32 steps of O^T += V^T P_g^T with V^T's fragments from the raw
// tile (vt_a_fragment), one block retired behind the next; the buffer released (mbarrier). It prints the roles'
// cycles a tile and checks only that the loop ran.
constexpr int kLoopTiles = 64;
struct LoopSmem {
  static constexpr int kQ = 0;                                // Q nope e4m3: four panels [64][128], 128-byte swizzle
  static constexpr int kK = kQ + 4 * 8192;                    // the code tile: four panels [64 keys][128]
  static constexpr int kQRope = kK + 4 * 8192;                // Q rope bf16 [64][64]: one 128-byte-swizzled panel
  static constexpr int kKRope = kQRope + 8192;                // the records' rope bf16 [64][64]
  static constexpr int kScale = kKRope + 8192;                // fp32 [4 groups][64 keys]
  static constexpr int kP = kScale + 4 * 64 * 4;              // P buffers [2][4 groups] panels
  static constexpr int kFactor = kP + 2 * 4 * kPanelBytes;    // fp32 [2][64 rows]
  static constexpr int kBar = kFactor + 2 * 64 * 4;           // p_empty[2]
  static constexpr int kBytes = kBar + 64 + 1024;
};
constexpr int kBarPFull = 1;  // + b: S -> O, 384 threads

__device__ __forceinline__ void loop_issue_group(float (&acc)[32], const uint8_t* sm, int grp) {
  uint64_t dq = desc_sw128_k_major(sm + LoopSmem::kQ + grp * 8192), dk = desc_sw128_k_major(sm + LoopSmem::kK + grp * 8192);
  asm volatile("" : "+l"(dq), "+l"(dk));
  wgmma_fence_operand(acc);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_e4m3_ss<64>(acc, desc_advance(dq, ks * 32), desc_advance(dk, ks * 32), ks > 0);
  wgmma_commit_group();
}
// S += scale_g[key] * acc over the thread's keys 8 j + 2 t, + 1.
__device__ __forceinline__ void loop_fold(float (&sc)[32], float (&acc)[32], const float* scale, int t) {
  wgmma_fence_operand(acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 s = *reinterpret_cast<const float2*>(scale + 8 * j + 2 * t);
    sc[4 * j] = fmaf(s.x, acc[4 * j], sc[4 * j]);
    sc[4 * j + 1] = fmaf(s.y, acc[4 * j + 1], sc[4 * j + 1]);
    sc[4 * j + 2] = fmaf(s.x, acc[4 * j + 2], sc[4 * j + 2]);
    sc[4 * j + 3] = fmaf(s.y, acc[4 * j + 3], sc[4 * j + 3]);
  }
}

__device__ __forceinline__ void loop_s_role(uint8_t* sm, uint64_t* bar, long long* cycles, float* out) {
  const int t128 = threadIdx.x % 128, warp = t128 / 32, lane = t128 % 32, g = lane / 4, t = lane % 4;
  const int r_lo = 16 * warp + g, r_hi = r_lo + 8;
  const float* scale = reinterpret_cast<const float*>(sm + LoopSmem::kScale);
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  const long long t0 = clock64();
#pragma unroll 1
  for (int i = 0; i < kLoopTiles; ++i) {
    float sc[32], a0[32], a1[32];
    {  // the rope's S into sc, then the groups' S in a0 / a1
      uint64_t dq = desc_sw128_k_major(sm + LoopSmem::kQRope), dk = desc_sw128_k_major(sm + LoopSmem::kKRope);
      asm volatile("" : "+l"(dq), "+l"(dk));
      wgmma_fence_operand(sc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_bf16_ss<64>(sc, desc_advance(dq, ks * 32), desc_advance(dk, ks * 32), ks > 0);
      wgmma_commit_group();
    }
    loop_issue_group(a0, sm, 0);
    loop_issue_group(a1, sm, 1);
    wgmma_wait_group<1>();  // the rope and group 0 retired
    wgmma_fence_operand(sc);
    loop_fold(sc, a0, scale, t);
    loop_issue_group(a0, sm, 2);
    wgmma_wait_group<1>();
    loop_fold(sc, a1, scale + 64, t);
    loop_issue_group(a1, sm, 3);
    wgmma_wait_group<1>();
    loop_fold(sc, a0, scale + 128, t);
    wgmma_wait_group<0>();
    loop_fold(sc, a1, scale + 192, t);
    // Softmax: scale, row maxima over the quad, P = 2^(S - m + 8), row sums.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
      sc[j] *= 0.0625f; sc[j + 1] *= 0.0625f; sc[j + 2] *= 0.0625f; sc[j + 3] *= 0.0625f;
      mx_lo = fmaxf(mx_lo, fmaxf(sc[j], sc[j + 1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sc[j + 2], sc[j + 3]));
    }
    mx_lo = cuda::softmax::quad_max(mx_lo);
    mx_hi = cuda::softmax::quad_max(mx_hi);
    const float n_lo = fmaxf(m_lo, mx_lo), n_hi = fmaxf(m_hi, mx_hi);
    const float f_lo = cuda::softmax::exp2_approx(m_lo - n_lo), f_hi = cuda::softmax::exp2_approx(m_hi - n_hi);
    m_lo = n_lo;
    m_hi = n_hi;
    float s_lo = 0.0f, s_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
      sc[j] = cuda::softmax::exp2_approx(sc[j] - n_lo) * 256.0f;
      sc[j + 1] = cuda::softmax::exp2_approx(sc[j + 1] - n_lo) * 256.0f;
      sc[j + 2] = cuda::softmax::exp2_approx(sc[j + 2] - n_hi) * 256.0f;
      sc[j + 3] = cuda::softmax::exp2_approx(sc[j + 3] - n_hi) * 256.0f;
      s_lo += sc[j] + sc[j + 1];
      s_hi += sc[j + 2] + sc[j + 3];
    }
    l_lo = l_lo * f_lo + s_lo;
    l_hi = l_hi * f_hi + s_hi;
    // P buffer b free once both O warpgroups retired tile i - 2's products; then the four P_g panels and the factors.
    const int b = i & 1;
    if (i >= 2) mbar_wait(&bar[b], ((i >> 1) - 1) & 1);
    uint8_t* pbuf = sm + LoopSmem::kP + b * 4 * kPanelBytes;
#pragma unroll
    for (int grp = 0; grp < 4; ++grp) {
      float x[32];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 s = *reinterpret_cast<const float2*>(scale + 64 * grp + 8 * j + 2 * t);
        x[4 * j] = sc[4 * j] * s.x;
        x[4 * j + 1] = sc[4 * j + 1] * s.y;
        x[4 * j + 2] = sc[4 * j + 2] * s.x;
        x[4 * j + 3] = sc[4 * j + 3] * s.y;
      }
      uint32_t pa[2][4];
      p_fragments(x, pa);
      store_p_panel(pbuf + grp * kPanelBytes, pa, r_lo, r_hi, t);
    }
    float* factor = reinterpret_cast<float*>(sm + LoopSmem::kFactor) + 64 * b;
    if (t == 0) {
      factor[r_lo] = f_lo;
      factor[r_hi] = f_hi;
    }
    fence_proxy_async_smem();
    named_barrier_arrive(kBarPFull + b, 384);
  }
  const long long t1 = clock64();
  if (t128 == 0) cycles[blockIdx.x * 4] = t1 - t0;
  out[blockIdx.x * 512 + t128] = l_lo + l_hi + m_lo + m_hi;
}

__device__ __forceinline__ void loop_o_role(uint8_t* sm, uint64_t* bar, long long* cycles, float* out, int h) {
  const int t128 = threadIdx.x % 128, warp = t128 / 32, lane = t128 % 32, t = lane % 4;
  float o[4][32];
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[k][e] = 0.0f;
  const uint8_t* raw = sm + LoopSmem::kK;
  const long long t0 = clock64();
#pragma unroll 1
  for (int i = 0; i < kLoopTiles; ++i) {
    const int b = i & 1;
    named_barrier_sync(kBarPFull + b, 384);
    const float* factor = reinterpret_cast<const float*>(sm + LoopSmem::kFactor) + 64 * b;
    // O^T's columns are query rows: the thread's 8 j + 2 t, + 1.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 f = *reinterpret_cast<const float2*>(factor + 8 * j + 2 * t);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        o[k][4 * j] *= f.x;
        o[k][4 * j + 1] *= f.y;
        o[k][4 * j + 2] *= f.x;
        o[k][4 * j + 3] *= f.y;
      }
    }
    const uint8_t* pbuf = sm + LoopSmem::kP + b * 4 * kPanelBytes;
    uint32_t a[2][2][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int blk = 4 * h + k, grp = blk / 2;
      vt_a_fragment(raw, blk, 0, warp, lane, a[k & 1][0]);
      vt_a_fragment(raw, blk, 1, warp, lane, a[k & 1][1]);
      wgmma_fence_operand(o[k]);
      wgmma_fence_operand(a[k & 1][0]);
      wgmma_fence_operand(a[k & 1][1]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) wgmma_e4m3_rs<64>(o[k], a[k & 1][kk], p_desc(pbuf + grp * kPanelBytes, kk), true);
      wgmma_commit_group();
      if (k > 0) wgmma_wait_group<1>();  // block k - 1 retired: its fragments may be built again
    }
    wgmma_wait_group<0>();
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_fence_operand(o[k]);
    if (t128 == 0) mbar_arrive(&bar[b]);
  }
  const long long t1 = clock64();
  if (t128 == 0) cycles[blockIdx.x * 4 + 1 + h] = t1 - t0;
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int e = 0; e < 32; ++e) acc += o[k][e];
  out[blockIdx.x * 512 + 128 * (2 + h) + t128] = acc;
}

__global__ void __launch_bounds__(512, 1) sparse_fp8_loop_kernel(float* out, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = align1024(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm + LoopSmem::kBar);
  const int tid = threadIdx.x, wg = tid / 128;
  // Operands: small e4m3 codes (1.0 and 0.5 alternating), bf16 ropes of 1.0 / 0.5, scales 1, whatever the products make.
  for (int i = tid; i < LoopSmem::kQRope / 4; i += 512)
    reinterpret_cast<uint32_t*>(sm)[i] = (i & 1) ? 0x30383038u : 0x38303830u;
  for (int i = tid; i < (LoopSmem::kScale - LoopSmem::kQRope) / 4; i += 512)
    reinterpret_cast<uint32_t*>(sm + LoopSmem::kQRope)[i] = (i & 1) ? 0x3f003f80u : 0x3f803f00u;
  for (int i = tid; i < 4 * 64; i += 512) reinterpret_cast<float*>(sm + LoopSmem::kScale)[i] = 1.0f;
  fence_proxy_async_smem();
  if (tid == 0) {
    mbar_init(&bar[0], 2);  // p_empty: one thread of each O warpgroup
    mbar_init(&bar[1], 2);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<32>();
  } else if (wg == 1) {
    setmaxnreg_inc<128>();
    loop_s_role(sm, bar, cycles, out);
  } else {
    setmaxnreg_inc<176>();
    loop_o_role(sm, bar, cycles, out, wg - 2);
  }
}

TEST(SparseFp8PiecesGpu, LoopCyclesPerTile) {
  MLA_SKIP_UNLESS_SM90();
  int sms = 0;
  MLA_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  test::DevBuf<float> d_o(std::size_t(sms) * 512);
  test::DevBuf<long long> d_c(std::size_t(sms) * 4);
  MLA_CUDA_OK(cudaFuncSetAttribute(sparse_fp8_loop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LoopSmem::kBytes));
  for (int rep = 0; rep < 3; ++rep) sparse_fp8_loop_kernel<<<sms, 512, LoopSmem::kBytes>>>(d_o.p, d_c.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<long long> c = d_c.download();
  auto median = [&](int k) {
    std::vector<long long> v;
    for (int i = 0; i < sms; ++i) v.push_back(c[4 * i + k]);
    std::sort(v.begin(), v.end());
    return v[sms / 2] / double(kLoopTiles);
  };
  std::printf("fp8 sparse prefill loop (resident operands), %d tiles on %d SMs, cycles a tile (medians): S %.0f, "
              "O values 0..255 %.0f, O values 256..511 %.0f\n", kLoopTiles, sms, median(0), median(1), median(2));
  EXPECT_GT(median(0), 0.0);
}

}  // namespace
}  // namespace mla
