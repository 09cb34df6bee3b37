// SPDX-License-Identifier: Apache-2.0
// Device test of the e4m3 value transpose of the fp8-compute decode design (cuda/attention/sm90/fp8c/transpose.cuh):
// one warpgroup writes V^T of a 64-key tile from the TMA's swizzled panels, checked byte for byte against the layout
// (VtLayout::offset at vt_position), then multiplies P (64 x 64, packed from an S-shaped fp32 fragment as the
// prefill's to_pa packs it) by V with wgmma_e4m3_rs over the V^T descriptor, against a float64 product on the host.
// SASS: LDSM.T, STSM, PRMT, QGMMA.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/attention/sm90/fp8c/transpose.cuh"
#include "cuda/attention/sm90/prefill_fp8/traits.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;
using cuda::decode_sm90::fp8c::VtLayout;

constexpr int kKeys = 64, kCols = 512, kRows = 64;
constexpr int kRawBytes = 4 * VtLayout::kRawPanelBytes;
constexpr int kSmem = kRawBytes + VtLayout::kBytes + 16 + 1024;
// Keys the transposer treats as not loaded (they must come out as zeros): scattered, a whole group of 8, the last.
constexpr uint64_t kLoadedKeys = ~((uint64_t{1} << 3) | (uint64_t{1} << 17) | (uint64_t{0xff} << 40) | (uint64_t{1} << 63));

// raw_g: the four swizzled panels as the TMA would write them; p_g: P [64][64] fp32 (values exact in e4m3);
// vt_out: the V^T bytes; o_out: O [64][512]. The keys outside kLoadedKeys read the zero line.
__global__ void __launch_bounds__(128) transpose_kernel(const uint8_t* raw_g, const float* p_g, uint8_t* vt_out,
                                                        float* o_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* raw = align1024(smem_raw);
  uint8_t* vt = raw + kRawBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kRawBytes / 16; i += 128)
    reinterpret_cast<uint4*>(raw)[i] = reinterpret_cast<const uint4*>(raw_g)[i];
  // V^T's bytes start as 0x5a (the pad bytes must stay so: nothing writes them); the zero line after it.
  for (int i = tid; i < VtLayout::kBytes / 16 + 1; i += 128)
    reinterpret_cast<uint4*>(vt)[i] = i < VtLayout::kBytes / 16 ? make_uint4(0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au)
                                                               : make_uint4(0, 0, 0, 0);
  __syncthreads();
  cuda::decode_sm90::fp8c::transpose_values(raw, vt, warp, lane, kLoadedKeys, vt + VtLayout::kBytes);
  fence_proxy_async_smem();
  __syncthreads();
  for (int i = tid; i < VtLayout::kBytes / 16; i += 128)
    reinterpret_cast<uint4*>(vt_out)[i] = reinterpret_cast<const uint4*>(vt)[i];
  // P's register A fragments from an S-shaped fragment s (row r_lo: s[4jj], s[4jj + 1], keys 8 jj + 2 t, + 1;
  // row r_hi: s[4jj + 2], s[4jj + 3]), packed as the prefill's to_pa.
  const int g = lane / 4, t = lane % 4, r_lo = 16 * warp + g, r_hi = r_lo + 8;
  float s[32];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    s[4 * jj] = p_g[r_lo * kKeys + 8 * jj + 2 * t];
    s[4 * jj + 1] = p_g[r_lo * kKeys + 8 * jj + 2 * t + 1];
    s[4 * jj + 2] = p_g[r_hi * kKeys + 8 * jj + 2 * t];
    s[4 * jj + 3] = p_g[r_hi * kKeys + 8 * jj + 2 * t + 1];
  }
  uint32_t pa[2][4];
  cuda::decode_sm90::fp8c::p_fragments(s, pa);
  for (int h = 0; h < 2; ++h) {
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    wgmma_fence_operand(o);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) wgmma_fence_operand(pa[kk]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) wgmma_e4m3_rs<256>(o, pa[kk], cuda::decode_sm90::fp8c::vt_desc(vt, 256 * h, kk), kk > 0);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(o);
#pragma unroll
    for (int jj = 0; jj < 32; ++jj) {
      const int c = 256 * h + 8 * jj + 2 * t;
      o_out[r_lo * kCols + c] = o[4 * jj];
      o_out[r_lo * kCols + c + 1] = o[4 * jj + 1];
      o_out[r_hi * kCols + c] = o[4 * jj + 2];
      o_out[r_hi * kCols + c + 1] = o[4 * jj + 3];
    }
  }
}

TEST(Fp8cTransposeGpu, VtLayoutAndValueProductMatchHost) {
  MLA_SKIP_UNLESS_SM90();
  // V [64 keys][512] e4m3 codes (finite, |v| <= 2); the raw panels in the 128-byte swizzle.
  const std::vector<uint8_t> v = test::random_e4m3(std::size_t{kKeys} * kCols);
  std::vector<uint8_t> raw(kRawBytes);
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < kCols; ++c) {
      const int p = c / 128, cc = c % 128;
      raw[p * VtLayout::kRawPanelBytes + k * 128 + (((cc / 16) ^ (k % 8)) * 16) + cc % 16] = v[k * kCols + c];
    }
  // P [64][64]: non-negative e4m3 values (the codes' sign cleared), so the kernel's e4m3 packing is exact.
  std::vector<float> p(std::size_t{kRows} * kKeys);
  {
    const std::vector<uint8_t> codes = test::random_e4m3(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = test::e4m3_to_float(codes[i] & 0x7f);
  }
  test::DevBuf<uint8_t> d_raw(raw), d_vt(VtLayout::kBytes);
  test::DevBuf<float> d_p(p), d_o(std::size_t{kRows} * kCols);
  ASSERT_NE(d_raw.p, nullptr);
  MLA_CUDA_OK(cudaFuncSetAttribute(transpose_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  transpose_kernel<<<1, 128, kSmem>>>(d_raw.p, d_p.p, d_vt.p, d_o.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  // The layout: value row d, key k at VtLayout::offset(d, 16 (k / 16) + vt_position(k % 16)); pad bytes zero.
  const std::vector<uint8_t> vt = d_vt.download();
  std::vector<char> covered(vt.size(), 0);
  int bad = 0;
  for (int d = 0; d < kCols; ++d)
    for (int k = 0; k < kKeys; ++k) {
      const int off = VtLayout::offset(d, 16 * (k / 16) + cuda::prefill_sm90_fp8::vt_position(k % 16));
      covered[off] = 1;
      const uint8_t want = (kLoadedKeys >> k) & 1 ? v[k * kCols + d] : 0;
      if (vt[off] != want && bad++ < 8)
        ADD_FAILURE() << "V^T row " << d << " key " << k << ": " << int(vt[off]) << " != " << int(want);
    }
  for (std::size_t i = 0; i < vt.size(); ++i)
    if (!covered[i] && vt[i] != 0x5a && bad++ < 8) ADD_FAILURE() << "pad byte " << i << " written";
  EXPECT_EQ(bad, 0);
  // O = P V: fp32 accumulation of exact products, against float64.
  const std::vector<float> o = d_o.download();
  double worst = 0.0;
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < kCols; ++d) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < kKeys; ++k) {
        if (!((kLoadedKeys >> k) & 1)) continue;  // zeros in V^T
        const double x = double(p[r * kKeys + k]) * test::e4m3_to_float(v[k * kCols + d]);
        ref += x;
        mag += std::fabs(x);
      }
      const double err = std::fabs(o[r * kCols + d] - ref) / (mag * 1e-6 + 1e-30);
      worst = std::max(worst, err);
    }
  // The products are exact, but the fp8 tensor cores add them in a narrower adder than fp32 (measured on H200:
  // 4.4e-4 of sum |P V| at worst over this tile); a wrong layout errs by O(1).
  std::printf("e4m3 P V through V^T: worst |O - P V| = %.3g x 1e-6 sum |P V|\n", worst);
  EXPECT_LE(worst, 1000.0) << "worst |O - P V| in units of 1e-6 sum |P V|";
}


// Design C1's per-tile loop on resident operands (fp8_64row_plan.md "Design C1 concretely", its cycle model): one CTA
// per SM, 384 threads. Warpgroup 0 writes V^T of the resident raw tile into two alternating buffers (the
// transposer); warpgroup 1 computes S = Q K^T (18 e4m3 ss m64n64k32), the softmax steps (scale, row maxima over the
// quad, exp2, row sums), P as e4m3 A fragments and into a P panel for warpgroup 2, and O_L += P V^T_L (two rs
// m64n256k32), with S of the next tile issued before the softmax waits for the value products (FlashAttention-3's
// intra-warpgroup overlap); warpgroup 2 O_R += P V^T_R (two ss). Barriers: vt_full / vt_empty per buffer (mbarriers),
// P handed over by a named barrier. No global traffic: it prints the loop's cycles a tile, whole and with parts left
// out (the design note's decomposition), and checks only that the loop ran.
constexpr int kBenchTiles = 64;
// Registers a thread: transposer kTransposerRegs, S 240, R the rest of 504 (= 168 x 3, the launch's share).
constexpr int kTransposerRegs = 64;
struct C1Smem {
  static constexpr int kQ = 0;                                  // Q e4m3: five 128-byte-swizzled panels [64][128]
  static constexpr int kK = kQ + 5 * 8192;                      // K raw: five panels [64 keys][128]
  static constexpr int kVt = kK + 5 * 8192;                     // V^T: two buffers
  static constexpr int kP = kVt + 2 * VtLayout::kBytes;         // P e4m3 panels [64 rows][64 positions], no swizzle
  static constexpr int kPBytes = 64 * 64;
  static constexpr int kBar = kP + 2 * kPBytes;                 // vt_full[2], vt_empty[2]
  static constexpr int kBytes = kBar + 64 + 1024;
};

// kLeave: what the loop leaves out, to take its period apart (bits): 1 the transposer's work, 2 the value products,
// 4 S.
// S = Q K^T of one tile (18 e4m3 ss k-steps), committed as one group.
template <int kLeave>
__device__ __forceinline__ void c1_issue_s(float (&sc)[32], uint8_t* sm) {
  // The two base descriptors pass through a register move each call, so that the 36 k-step descriptors are formed
  // here and not hoisted out of the tile loop (72 registers held across it).
  uint64_t dq = desc_sw128_k_major(sm + C1Smem::kQ), dk = desc_sw128_k_major(sm + C1Smem::kK);
  asm volatile("" : "+l"(dq), "+l"(dk));
  wgmma_fence_operand(sc);
  wgmma_fence();
  if constexpr (!(kLeave & 4))
#pragma unroll
  for (int ks = 0; ks < 18; ++ks) {
    const int off = (ks / 4) * 8192 + (ks % 4) * 32;
    wgmma_e4m3_ss<64>(sc, desc_advance(dq, off), desc_advance(dk, off), ks > 0);
  }
  wgmma_commit_group();
}
// The softmax steps of one tile on retired scores: scale, row maxima over the quad, exp2, row sums; P * 2^8 as e4m3 A
// fragments; a_lo / a_hi the factors of O's rows.
struct C1Rows {
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
};
__device__ __forceinline__ void c1_softmax(float (&sc)[32], C1Rows& st, float& a_lo, float& a_hi, uint32_t (&pa)[2][4]) {
  float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < 32; j += 4) {
    sc[j] *= 0.0625f; sc[j + 1] *= 0.0625f; sc[j + 2] *= 0.0625f; sc[j + 3] *= 0.0625f;
    mx_lo = fmaxf(mx_lo, fmaxf(sc[j], sc[j + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sc[j + 2], sc[j + 3]));
  }
  mx_lo = cuda::softmax::quad_max(mx_lo);
  mx_hi = cuda::softmax::quad_max(mx_hi);
  const float n_lo = fmaxf(st.m_lo, mx_lo), n_hi = fmaxf(st.m_hi, mx_hi);
  a_lo = cuda::softmax::exp2_approx(st.m_lo - n_lo);
  a_hi = cuda::softmax::exp2_approx(st.m_hi - n_hi);
  st.m_lo = n_lo;
  st.m_hi = n_hi;
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
  st.l_lo = st.l_lo * a_lo + s_lo;
  st.l_hi = st.l_hi * a_hi + s_hi;
  cuda::decode_sm90::fp8c::p_fragments(sc, pa);
}
// P into R's panel, R told (named barrier 1 + b), O_L += P V^T_L issued and committed.
template <int kLeave>
__device__ __forceinline__ void c1_issue_pv(float (&o)[128], uint32_t (&pa)[2][4], uint8_t* sm, uint64_t* bar,
                                            int i, int r_lo, int r_hi, int t) {
  const int b = i & 1;
  mbar_wait(&bar[b], (i >> 1) & 1);
  fence_proxy_async_smem();
  cuda::decode_sm90::fp8c::store_p_panel(sm + C1Smem::kP + b * C1Smem::kPBytes, pa, r_lo, r_hi, t);
  fence_proxy_async_smem();
  named_barrier_arrive(1 + b, 256);
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) wgmma_fence_operand(pa[kk]);
  wgmma_fence_operand(o);
  wgmma_fence();
  if constexpr (!(kLeave & 2))
#pragma unroll
  for (int kk = 0; kk < 2; ++kk)
    wgmma_e4m3_rs<256>(o, pa[kk], cuda::decode_sm90::fp8c::vt_desc(sm + C1Smem::kVt + b * VtLayout::kBytes, 0, kk), true);
  wgmma_commit_group();
}
// One pipelined step (FlashAttention-3's intra-warpgroup overlap): at entry softmax_i is done (a_i, pa = P_i) and no
// product is in flight. S_{i+1} and O_L's product of tile i are issued back to back; softmax_{i+1} runs while the
// tensor pipe works through O_L's (and R's) products of tile i.
template <int kLeave>
__device__ __forceinline__ void c1_s_step(float (&o)[128], float (&sc)[32], uint32_t (&pa)[2][4],
                                          uint32_t (&pa_next)[2][4], float& a_lo, float& a_hi, C1Rows& st, uint8_t* sm,
                                          uint64_t* bar, int i, int r_lo, int r_hi, int t) {
  c1_issue_s<kLeave>(sc, sm);
  wgmma_scale_rows_if<256>(o, __any_sync(0xffffffffu, a_lo != 1.0f || a_hi != 1.0f), a_lo, a_hi);
  c1_issue_pv<kLeave>(o, pa, sm, bar, i, r_lo, r_hi, t);
  wgmma_wait_group<1>();  // S_{i+1} retired; O_L's product of tile i may still run
  wgmma_fence_operand(sc);
  c1_softmax(sc, st, a_lo, a_hi, pa_next);
  wgmma_wait_group<0>();
  wgmma_fence_operand(o);
  mbar_arrive(&bar[2 + (i & 1)]);  // O_L's product of tile i retired: S's share of its V^T buffer is free
}
template <int kLeave>
__device__ __forceinline__ void c1_s_pipelined(float (&o)[128], C1Rows& st, uint8_t* sm, uint64_t* bar, int r_lo,
                                               int r_hi, int t) {
  float sc[32], a_lo, a_hi;
  uint32_t pa[2][4], pb[2][4];
  c1_issue_s<kLeave>(sc, sm);
  wgmma_wait_group<0>();
  wgmma_fence_operand(sc);
  c1_softmax(sc, st, a_lo, a_hi, pa);
  for (int i = 0; i < kBenchTiles; i += 2) {
    c1_s_step<kLeave>(o, sc, pa, pb, a_lo, a_hi, st, sm, bar, i, r_lo, r_hi, t);
    c1_s_step<kLeave>(o, sc, pb, pa, a_lo, a_hi, st, sm, bar, i + 1, r_lo, r_hi, t);
  }
}

template <int kLeave>
__global__ void __launch_bounds__(384, 1) c1_loop_kernel(float* o_out, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = align1024(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm + C1Smem::kBar);
  const int tid = threadIdx.x, wg = tid / 128, t128 = tid % 128, warp = t128 / 32, lane = tid % 32;
  // Operands: small e4m3 codes (1.0 = 0x38 and 0.5 = 0x30 alternating), whatever the products make.
  for (int i = tid; i < (C1Smem::kVt - C1Smem::kQ) / 4; i += 384)
    reinterpret_cast<uint32_t*>(sm)[i] = (i & 1) ? 0x30383038u : 0x38303830u;
  fence_proxy_async_smem();  // the operands are read by the tensor cores (async proxy)
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(&bar[b], 128);      // vt_full: the transposer's threads
      mbar_init(&bar[2 + b], 256);  // vt_empty: S's and R's threads
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<kTransposerRegs>();
    const long long t0 = clock64();
    long long busy = 0;
    for (int i = 0; i < kBenchTiles; ++i) {
      const int b = i & 1;
      mbar_wait(&bar[2 + b], ((i >> 1) & 1) ^ 1);
      const long long u0 = clock64();
      if constexpr (!(kLeave & 1))
        cuda::decode_sm90::fp8c::transpose_values(sm + C1Smem::kK, sm + C1Smem::kVt + b * VtLayout::kBytes, warp, lane,
                                                  ~uint64_t{0}, sm + C1Smem::kK);
      fence_proxy_async_smem();
      busy += clock64() - u0;
      mbar_arrive(&bar[b]);
    }
    if (t128 == 0) {
      cycles[blockIdx.x * 4 + 2] = clock64() - t0;
      cycles[blockIdx.x * 4 + 3] = busy;
    }
    return;
  }
  const int g = lane / 4, t = lane % 4, r_lo = 16 * warp + g, r_hi = r_lo + 8;
  if (wg == 1) {
    setmaxnreg_inc<240>();
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    C1Rows st;
    const long long t0 = clock64();
    c1_s_pipelined<kLeave>(o, st, sm, bar, r_lo, r_hi, t);
    wgmma_wait_group<0>();
    wgmma_fence_operand(o);
    o[0] += st.l_lo + st.l_hi;
    const long long t1 = clock64();
    if (t128 == 0) cycles[blockIdx.x * 4] = t1 - t0;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; ++i) acc += o[i];
    o_out[blockIdx.x * 256 + t128] = acc;
  } else {
    setmaxnreg_inc<264 - kTransposerRegs>();
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const long long t0 = clock64();
    for (int i = 0; i < kBenchTiles; ++i) {
      const int b = i & 1;
      named_barrier_sync(1 + b, 256);
      mbar_wait(&bar[b], (i >> 1) & 1);
      fence_proxy_async_smem();
      const uint8_t* pp = sm + C1Smem::kP + b * C1Smem::kPBytes;
      wgmma_fence_operand(o);
      wgmma_fence();
      if constexpr (!(kLeave & 2))
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        wgmma_e4m3_ss<256>(o, cuda::decode_sm90::fp8c::p_desc(pp, kk),
                           cuda::decode_sm90::fp8c::vt_desc(sm + C1Smem::kVt + b * VtLayout::kBytes, 256, kk), true);
      wgmma_commit_group();
      wgmma_wait_group<0>();
      wgmma_fence_operand(o);
      mbar_arrive(&bar[2 + b]);
    }
    const long long t1 = clock64();
    if (t128 == 0) cycles[blockIdx.x * 4 + 1] = t1 - t0;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; ++i) acc += o[i];
    o_out[blockIdx.x * 256 + 128 + t128] = acc;
  }
}

template <int kLeave>
void run_c1_loop(const char* name) {
  const int leave_out = kLeave;
  int sms = 0;
  MLA_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  test::DevBuf<float> d_o(std::size_t(sms) * 256);
  test::DevBuf<long long> d_c(std::size_t(sms) * 4);
  MLA_CUDA_OK(cudaFuncSetAttribute(c1_loop_kernel<kLeave>, cudaFuncAttributeMaxDynamicSharedMemorySize, C1Smem::kBytes));
  for (int rep = 0; rep < 3; ++rep) c1_loop_kernel<kLeave><<<sms, 384, C1Smem::kBytes>>>(d_o.p, d_c.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<long long> c = d_c.download();
  auto median = [&](int k) {
    std::vector<long long> v;
    for (int i = 0; i < sms; ++i) v.push_back(c[4 * i + k]);
    std::sort(v.begin(), v.end());
    return v[sms / 2] / double(kBenchTiles);
  };
  std::printf("C1 loop (%s, leaving out %d), %d tiles on %d SMs, cycles a tile (medians): S %.0f, R %.0f, transposer %.0f "
              "(busy %.0f)\n", name, leave_out, kBenchTiles, sms, median(0), median(1), median(2), median(3));
  EXPECT_GT(median(0), 0.0);
}

TEST(Fp8cTransposeGpu, C1LoopCyclesPerTile) {
  MLA_SKIP_UNLESS_SM90();
  run_c1_loop<0>("the whole loop");
  run_c1_loop<1>("without the transposer's work");
  run_c1_loop<6>("the transposer alone");
}
}  // namespace
}  // namespace mla
