// SPDX-License-Identifier: Apache-2.0
// Device tests of the sm_80 wrappers the portable kernels use (src/cuda/common/ptx/cp_async.cuh,
// ldmatrix.cuh, mma_sync.cuh): one warp copies A (16 x 16, row-major) and B (16 x 8 stored [k][n]) to
// shared memory with cp.async, loads fragments with ldmatrix / ldmatrix.trans, multiplies with mma.sync
// over two k-halves of a 16 x 32 problem, and the result is compared with a float64 CPU product.
// Also checks pack_bf16x2's half order, cp_async_arrive_mbarrier and cp_async_16_or_zero (and its _pf256 form).
// SASS: LDGSTS, LDSM, HMMA.
#include <vector>

#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;

constexpr int kM = 16, kK = 32, kN = 16;

// A [16][32] row-major, B [32][16] row-major ([k][n]); D [16][16] fp32.
__global__ void mma_sync_kernel(const uint16_t* a, const uint16_t* b, float* d, uint32_t* packed) {
  __shared__ __align__(128) uint16_t as[kM * kK], bs[kK * kN];
  __shared__ uint64_t bar;
  const int lane = threadIdx.x;
  if (lane == 0) mbar_init(&bar, 32);
  __syncwarp();
  for (int c = lane; c < kM * kK / 8; c += 32) cp_async_16(as + c * 8, a + c * 8);
  cp_async_commit();
  for (int c = lane; c < kK * kN / 8; c += 32) cp_async_16(bs + c * 8, b + c * 8);
  cp_async_arrive_mbarrier(&bar);  // B's copies complete on the mbarrier, A's through the group
  cp_async_wait<0>();
  mbar_wait(&bar, 0);
  __syncwarp();
  float acc[2][4] = {};
  for (int kh = 0; kh < kK / 16; ++kh) {
    uint32_t af[4], bf[4];
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
    ldmatrix_x4(af, as + (lane % 16) * kK + kh * 16 + (lane / 16) * 8);
    // B [k][n] transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
    ldmatrix_x4_trans(bf, bs + (kh * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kN + (lane / 16) * 8);
    mma_bf16_16816(acc[0], af, bf[0], bf[1]);
    mma_bf16_16816(acc[1], af, bf[2], bf[3]);
  }
  const int g = lane / 4, t = lane % 4;
  for (int nb = 0; nb < 2; ++nb) {
    d[g * kN + nb * 8 + 2 * t] = acc[nb][0];
    d[g * kN + nb * 8 + 2 * t + 1] = acc[nb][1];
    d[(g + 8) * kN + nb * 8 + 2 * t] = acc[nb][2];
    d[(g + 8) * kN + nb * 8 + 2 * t + 1] = acc[nb][3];
  }
  if (lane == 0) packed[0] = pack_bf16x2(1.0f, -2.0f);
}

TEST(PtxSm80, CpAsyncLdmatrixMmaSyncMatchCpuProduct) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(80);
  const std::vector<uint16_t> a = test::random_bf16(kM * kK), b = test::random_bf16(kK * kN);
  test::DevBuf<uint16_t> da(a), db(b);
  test::DevBuf<float> dd(kM * kN);
  dd.fill_bytes(0xff);
  test::DevBuf<uint32_t> packed(1);
  mma_sync_kernel<<<1, 32>>>(da.p, db.p, dd.p, packed.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = dd.download();
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < kK; ++k) {
        const double p = double(test::bf16_to_float(a[m * kK + k])) * test::bf16_to_float(b[k * kN + n]);
        ref += p, mag += std::fabs(p);
      }
      EXPECT_NEAR(got[m * kN + n], ref, 1e-5 * mag + 1e-6) << "D[" << m << "][" << n << "]";
    }
  EXPECT_EQ(packed.download()[0], 0xC0003F80u) << "pack_bf16x2: lo = 1.0 (0x3f80) in the low half";
}

// cp_async_4: 32 lanes gather every third float of a global array into shared memory (4-byte aligned,
// not 16), then write it back out. SASS: LDGSTS.E (4 bytes).
__global__ void cp_async_4_kernel(const float* src, float* dst) {
  __shared__ float s[32];
  const int lane = threadIdx.x;
  s[lane] = -1.0f;
  __syncwarp();
  cp_async_4(&s[lane], src + 3 * lane + 1);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  dst[lane] = s[31 - lane];
}

TEST(PtxSm80, CpAsync4CopiesScatteredWords) {
  MLA_SKIP_WITHOUT_GPU();
  std::vector<float> src(100);
  for (int i = 0; i < 100; ++i) src[i] = 0.5f * static_cast<float>(i);
  test::DevBuf<float> ds(src), dd(32);
  cp_async_4_kernel<<<1, 32>>>(ds.p, dd.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = dd.download();
  for (int l = 0; l < 32; ++l) EXPECT_EQ(got[l], src[3 * (31 - l) + 1]) << "lane " << l;
}

// cp_async_16_or_zero (kPf256: cp_async_16_or_zero_pf256, the shared address given): lane l copies 16 bytes of
// row l / 2 when its row is odd, zeros otherwise, over shared memory first filled with 0xff bytes; every byte is
// checked.
template <bool kPf256>
__global__ void cp_async_or_zero_kernel(const uint4* src, uint4* dst) {
  __shared__ uint4 s[32];
  const int lane = threadIdx.x;
  s[lane] = make_uint4(~0u, ~0u, ~0u, ~0u);
  __syncwarp();
  if constexpr (kPf256) cp_async_16_or_zero_pf256(smem_addr(&s[lane]), src + lane, (lane / 2) % 2 == 0);
  else cp_async_16_or_zero(&s[lane], src + lane, (lane / 2) % 2 == 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  dst[lane] = s[lane];
}

template <bool kPf256>
void check_cp_async_or_zero() {
  std::vector<uint32_t> src(128);
  for (int i = 0; i < 128; ++i) src[i] = 0x01020304u * static_cast<uint32_t>(i + 1);
  test::DevBuf<uint32_t> ds(src), dd(128);
  cp_async_or_zero_kernel<kPf256><<<1, 32>>>(reinterpret_cast<const uint4*>(ds.p), reinterpret_cast<uint4*>(dd.p));
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint32_t> got = dd.download();
  for (int i = 0; i < 128; ++i) {
    const int lane = i / 4;
    EXPECT_EQ(got[i], (lane / 2) % 2 == 0 ? 0u : src[i]) << "word " << i;
  }
}

TEST(PtxSm80, CpAsyncOrZeroCopiesOrZeroFills) {
  MLA_SKIP_WITHOUT_GPU();
  check_cp_async_or_zero<false>();
}

TEST(PtxSm80, CpAsyncOrZeroPrefetch256CopiesOrZeroFills) {
  MLA_SKIP_WITHOUT_GPU();
  check_cp_async_or_zero<true>();
}

}  // namespace
}  // namespace mla
