// SPDX-License-Identifier: Apache-2.0
// docs/design/bf16_64row_plan.md's experiment 1: the seesaw pair's consumer chain in FlashMLA's order (design A, §1
// "Order of a pair") over two resident 64-key tiles, no refills: C, the cycles of a pair when the keys are always
// there. Two consumer warpgroups (256 threads, FlashMLA's CTA), warpgroup 0 owning tile K0 and O columns 0..255,
// warpgroup 1 tile K1 and columns 256..511; Q's rope in registers (rs k-steps of S), P1 in Q's rope panel, P0 in its
// own buffer; the four named barriers of the order (scale 0 ready, scale 1 ready, P0 ready, the remote products
// issued). Operands are small constant values; it prints cycles a pair and checks only that the loop ran.
// SASS: HGMMA (rs and ss), no local memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/attention/sm90/common/tile_io.cuh"
#include "cuda/attention/sm90/common/traits.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/common/softmax.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;
using cuda::decode_sm90::exp2_rows;
using cuda::decode_sm90::issue_pv_rs;
using cuda::decode_sm90::p_fragments_bf16;
using T = cuda::decode_sm90::Traits;

constexpr int kPairs = 64;
struct PairSmem {
  static constexpr int kQ = 0;                           // Q [64][576] bf16: nine 128-byte-swizzled K-major panels
  static constexpr int kK0 = kQ + T::kTileBytes;         // tile 0: nine panels [64 keys][64 columns]
  static constexpr int kK1 = kK0 + T::kTileBytes;        // tile 1
  static constexpr int kP0 = kK1 + T::kTileBytes;        // P0 [64 rows][64 keys] bf16, swizzled K-major
  static constexpr int kP1 = kQ + 8 * T::kPanelBytes;    // P1 in Q's rope panel (the rope is in registers)
  static constexpr int kM = kP0 + T::kPanelBytes;        // row maxima [2][64] fp32
  static constexpr int kBytes = kM + 2 * 64 * 4 + 1024;  // + the 1024-byte alignment
};
static_assert(PairSmem::kBytes <= 232448, "the plan fits one SM's shared memory");
enum : int { kBarScale0 = 1, kBarScale1 = 2, kBarP0 = 3, kBarRemote = 4 };

__device__ __forceinline__ uint64_t dk(const uint8_t* p) { return desc_sw128_k_major(p); }
__device__ __forceinline__ uint64_t dmn(const uint8_t* p) { return desc_sw128_mn_major(p, T::kPanelBytes); }

// S (+)= Q K^T over panels [kP0, kP1) of `tile` (ss k-steps) and, with kRope, the rope panel first (rs from qr);
// kZero: the call's first k-step starts S afresh. Fenced and issued; the caller commits.
template <bool kRope, bool kZero, int kP0, int kP1>
__device__ __forceinline__ void issue_s(float (&s)[32], uint32_t (&qr)[4][4], const uint8_t* sm,
                                        const uint8_t* tile) {
  if constexpr (kRope) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_fence_operand(qr[kk]);
  }
  wgmma_fence_operand(s);
  wgmma_fence();
  // The base descriptors pass through a register move per call, so that ptxas forms the k-steps' descriptors here
  // instead of hoisting all of them out of the pair loop (two 64-bit registers a k-step held across it).
  uint64_t dq = dk(sm + PairSmem::kQ), dt = dk(tile);
  asm volatile("" : "+l"(dq), "+l"(dt));
  if constexpr (kRope) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_bf16_rs<64>(s, qr[kk], desc_advance(dt, 8 * T::kPanelBytes + kk * 32), kk > 0 || !kZero);
  }
#pragma unroll
  for (int pc = kP0; pc < kP1; ++pc)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_bf16_ss<64>(s, desc_advance(dq, pc * T::kPanelBytes + ks * 32), desc_advance(dt, pc * T::kPanelBytes + ks * 32),
                        kRope || !kZero || pc > kP0 || ks > 0);
}
// O += P V over the value half h (panels 4h .. 4h + 3) of `tile`, P from shared memory (ss). Issued, not committed.
__device__ __forceinline__ void issue_remote(float (&o)[128], const uint8_t* sp, const uint8_t* tile, int h) {
  uint64_t dp = dk(sp), dv = dmn(tile + 4 * h * T::kPanelBytes);
  asm volatile("" : "+l"(dp), "+l"(dv));
  wgmma_fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma_bf16_ss<256, Major::K, Major::MN>(o, desc_advance(dp, ks * 32), desc_advance(dv, ks * 2048), true);
}
// O += P V over this warpgroup's own value half of its tile, P from registers (rs). Issued, not committed.
__device__ __forceinline__ void issue_local(float (&o)[128], uint32_t (&pa)[4][4], const uint8_t* half) {
  uint64_t dv = dmn(half);
  asm volatile("" : "+l"(dv));
  issue_pv_rs<256>(o, pa, [&](int ks) { return desc_advance(dv, ks * 2048); });
}
// P's bf16 rs fragments (p_fragments_bf16's layout: pa[ks][e], row r_lo (e even) or r_hi, keys 16 ks + 8 (e >> 1) +
// 2 t4, + 1) times a per-row factor into a swizzled K-major panel [64 rows][64 keys]: the remote product's A operand,
// written from the fragments so that the fp32 scores need not stay live (FlashMLA rescales its bf16 P the same way).
__device__ __forceinline__ void store_pa(uint8_t* sp, const uint32_t (&pa)[4][4], float f_lo, float f_hi, int r_lo,
                                         int r_hi, int t4) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float f = (e & 1) ? f_hi : f_lo;
      const float lo = __uint_as_float(pa[ks][e] << 16) * f, hi = __uint_as_float(pa[ks][e] & 0xffff0000u) * f;
      *reinterpret_cast<uint32_t*>(sp + sw128_offset((e & 1) ? r_hi : r_lo, 2 * ks + (e >> 1)) + 4 * t4) =
          pack_bf16x2(lo, hi);
    }
}
// Scores scaled into the log2 domain, the rows' maxima over the quad.
__device__ __forceinline__ void scale_max(float (&s)[32], float& mx_lo, float& mx_hi) {
  mx_lo = -INFINITY;
  mx_hi = -INFINITY;
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    s[i] *= 0.0625f; s[i + 1] *= 0.0625f; s[i + 2] *= 0.0625f; s[i + 3] *= 0.0625f;
    mx_lo = fmaxf(mx_lo, fmaxf(s[i], s[i + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[i + 2], s[i + 3]));
  }
  mx_lo = cuda::softmax::quad_max(mx_lo);
  mx_hi = cuda::softmax::quad_max(mx_hi);
}
__device__ __forceinline__ void scale_o(float (&o)[128], float f_lo, float f_hi) {
#pragma unroll
  for (int i = 0; i < 128; i += 4) {
    o[i] *= f_lo; o[i + 1] *= f_lo; o[i + 2] *= f_hi; o[i + 3] *= f_hi;
  }
}

// Warpgroup 0's pair (design A): softmax of S0 against its running maximum, m0 published (scale 0 ready); local
// P0 V0L issued and retired; m1 read (scale 1 ready); P0 times 2^(m0 - m1) stored (P0 ready); after warpgroup 1's
// remote product is issued, O_L rescaled and the remote P1 V1L issued, then the next S0 over panels 0..3, the
// remote retired, the rest of the next S0 (panels 4..7 and the rope), retired.
__device__ __forceinline__ void pair_wg0(float (&o)[128], float (&s)[32], uint32_t (&qr)[4][4], uint8_t* sm,
                                         float& m_lo, float& m_hi, float& l_lo, float& l_hi, int r_lo, int r_hi, int t4) {
  float* sM = reinterpret_cast<float*>(sm + PairSmem::kM);
  float mx_lo, mx_hi;
  scale_max(s, mx_lo, mx_hi);
  const float n_lo = fmaxf(m_lo, mx_lo), n_hi = fmaxf(m_hi, mx_hi);
  const float a_lo = cuda::softmax::exp2_approx(m_lo - n_lo), a_hi = cuda::softmax::exp2_approx(m_hi - n_hi);
  if (t4 == 0) {
    sM[r_lo] = n_lo;
    sM[r_hi] = n_hi;
  }
  named_barrier_arrive(kBarScale0, 256);
  float sum_lo, sum_hi;
  exp2_rows(s, n_lo, n_hi, sum_lo, sum_hi);
  uint32_t pa[4][4];
  p_fragments_bf16(s, pa);
  scale_o(o, a_lo, a_hi);
  issue_local(o, pa, sm + PairSmem::kK0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(o);
  named_barrier_sync(kBarScale1, 256);
  const float m1_lo = sM[64 + r_lo], m1_hi = sM[64 + r_hi];
  const float b_lo = cuda::softmax::exp2_approx(n_lo - m1_lo), b_hi = cuda::softmax::exp2_approx(n_hi - m1_hi);
  store_pa(sm + PairSmem::kP0, pa, b_lo, b_hi, r_lo, r_hi, t4);
  fence_proxy_async_smem();
  named_barrier_arrive(kBarP0, 256);
  named_barrier_sync(kBarRemote, 256);
  scale_o(o, b_lo, b_hi);
  issue_remote(o, sm + PairSmem::kP1, sm + PairSmem::kK1, 0);
  wgmma_commit_group();
  issue_s<false, true, 0, 4>(s, qr, sm, sm + PairSmem::kK0);
  wgmma_commit_group();
  wgmma_wait_group<1>();  // the remote product retired
  wgmma_fence_operand(o);
  issue_s<true, false, 4, 8>(s, qr, sm, sm + PairSmem::kK0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(s);
  l_lo = (l_lo * a_lo + sum_lo) * b_lo;
  l_hi = (l_hi * a_hi + sum_hi) * b_hi;
  m_lo = m1_lo;
  m_hi = m1_hi;
}

// Warpgroup 1's pair: m0 read (scale 0 ready); its maximum against m0, m1 published (scale 1 ready), O_R rescaled;
// P1 stored into Q's rope panel, local P1 V1R issued; P0 ready: the remote P0 V0R issued (the remote products
// issued); both retired; the next S1, the right value half's panels first, then the left and the rope.
__device__ __forceinline__ void pair_wg1(float (&o)[128], float (&s)[32], uint32_t (&qr)[4][4], uint8_t* sm,
                                         float& m_lo, float& m_hi, float& l_lo, float& l_hi, int r_lo, int r_hi, int t4) {
  float* sM = reinterpret_cast<float*>(sm + PairSmem::kM);
  float mx_lo, mx_hi;
  scale_max(s, mx_lo, mx_hi);
  named_barrier_sync(kBarScale0, 256);
  const float m0_lo = sM[r_lo], m0_hi = sM[r_hi];
  const float n_lo = fmaxf(m0_lo, mx_lo), n_hi = fmaxf(m0_hi, mx_hi);
  if (t4 == 0) {
    sM[64 + r_lo] = n_lo;
    sM[64 + r_hi] = n_hi;
  }
  named_barrier_arrive(kBarScale1, 256);
  const float a_lo = cuda::softmax::exp2_approx(m_lo - n_lo), a_hi = cuda::softmax::exp2_approx(m_hi - n_hi);
  scale_o(o, a_lo, a_hi);
  float sum_lo, sum_hi;
  exp2_rows(s, n_lo, n_hi, sum_lo, sum_hi);
  uint32_t pa[4][4];
  p_fragments_bf16(s, pa);
  store_pa(sm + PairSmem::kP1, pa, 1.0f, 1.0f, r_lo, r_hi, t4);
  fence_proxy_async_smem();
  issue_local(o, pa, sm + PairSmem::kK1 + 4 * T::kPanelBytes);
  wgmma_commit_group();
  named_barrier_sync(kBarP0, 256);
  issue_remote(o, sm + PairSmem::kP0, sm + PairSmem::kK0, 1);
  wgmma_commit_group();
  named_barrier_arrive(kBarRemote, 256);
  wgmma_wait_group<0>();
  wgmma_fence_operand(o);
  issue_s<true, true, 4, 8>(s, qr, sm, sm + PairSmem::kK1);
  issue_s<false, false, 0, 4>(s, qr, sm, sm + PairSmem::kK1);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(s);
  l_lo = l_lo * a_lo + sum_lo;
  l_hi = l_hi * a_hi + sum_hi;
  m_lo = n_lo;
  m_hi = n_hi;
}

__global__ void __launch_bounds__(256, 1) pair_order_kernel(float* out, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = align1024(smem_raw);
  const int tid = threadIdx.x, wg = tid / 128, t128 = tid % 128, warp = t128 / 32, lane = tid % 32;
  const int r_lo = 16 * warp + lane / 4, r_hi = r_lo + 8, t4 = lane % 4;
  // Q and both tiles: bf16 1.0 / 0.5 alternating; P0's buffer and the maxima: zero.
  for (int i = tid; i < PairSmem::kP0 / 4; i += 256) reinterpret_cast<uint32_t*>(sm)[i] = (i & 1) ? 0x3f003f80u : 0x3f803f00u;
  for (int i = tid; i < (PairSmem::kM + 512 - PairSmem::kP0) / 4; i += 256)
    reinterpret_cast<uint32_t*>(sm + PairSmem::kP0)[i] = 0u;
  uint32_t qr[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) qr[kk][e] = 0x3f803f80u;
  fence_proxy_async_smem();
  __syncthreads();
  float o[128], s[32];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  // The first pair's S, as the unit's start does.
  issue_s<true, true, 0, 8>(s, qr, sm, sm + (wg == 0 ? PairSmem::kK0 : PairSmem::kK1));
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(s);
  const long long t0 = clock64();
  if (wg == 0) {
#pragma unroll 1
    for (int j = 0; j < kPairs; ++j) pair_wg0(o, s, qr, sm, m_lo, m_hi, l_lo, l_hi, r_lo, r_hi, t4);
  } else {
#pragma unroll 1
    for (int j = 0; j < kPairs; ++j) pair_wg1(o, s, qr, sm, m_lo, m_hi, l_lo, l_hi, r_lo, r_hi, t4);
  }
  const long long t1 = clock64();
  if (t128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  float acc = l_lo + l_hi + m_lo + m_hi;
#pragma unroll
  for (int i = 0; i < 128; ++i) acc += o[i];
  out[blockIdx.x * 256 + tid] = acc;
}

TEST(Bf16PairOrderGpu, PairCyclesOnResidentTiles) {
  MLA_SKIP_UNLESS_SM90();
  int sms = 0;
  MLA_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  test::DevBuf<float> d_o(std::size_t(sms) * 256);
  test::DevBuf<long long> d_c(std::size_t(sms) * 2);
  MLA_CUDA_OK(cudaFuncSetAttribute(pair_order_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PairSmem::kBytes));
  for (int rep = 0; rep < 3; ++rep) pair_order_kernel<<<sms, 256, PairSmem::kBytes>>>(d_o.p, d_c.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<long long> c = d_c.download();
  auto median = [&](int k) {
    std::vector<long long> v;
    for (int i = 0; i < sms; ++i) v.push_back(c[2 * i + k]);
    std::sort(v.begin(), v.end());
    return v[sms / 2] / double(kPairs);
  };
  std::printf("bf16 pair in FlashMLA's order (resident tiles), %d pairs on %d SMs, cycles a pair (medians): "
              "warpgroup 0 %.0f, warpgroup 1 %.0f (the plan's C: predicted 4,400-4,570)\n", kPairs, sms, median(0),
              median(1));
  EXPECT_GT(median(0), 0.0);
}

}  // namespace
}  // namespace mla
