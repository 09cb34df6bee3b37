// SPDX-License-Identifier: Apache-2.0
// Device tests of the wgmma wrappers (src/cuda/common/ptx/wgmma.cuh) against a float64 CPU GEMM: one
// warpgroup computes D(64 x N) = A(64 x K) * B(K x N) for bf16 with A from shared memory (K-major and
// MN-major) and from registers, f16 (both A sources), B K-major and MN-major ("transposed"), N = 64 / 128 /
// 256, and e4m3 with A from shared memory and registers; and the in-place row scaling of a D fragment
// (wgmma_scale_rows_if). Operand tiles arrive by TMA with the 128-byte swizzle (tma.cuh),
// except in the register-A bf16 case, where the threads write B into the swizzled layout with ordinary
// stores and publish it with fence_proxy_async_smem (fence.cuh). SASS (scripts/sass_summary.sh, sm_90a):
// HGMMA in every bf16 instantiation, QGMMA in every e4m3 one, no LDL/STL (no spills).
#include <cuda.h>

#include <string>
#include <vector>

#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "ptx_test_util.cuh"

#pragma nv_diag_suppress 177  // Cfg members unused by some instantiations

namespace mla {
namespace {

using namespace cuda::ptx;

template <int N, int K, Major kA, Major kB, bool kRegA, bool kFp8, bool kStoreB, bool kF16 = false>
struct Cfg {
  static constexpr int kElem = kFp8 ? 1 : 2;
  static constexpr int kKStep = kFp8 ? 32 : 16;
  static constexpr int kSteps = K / kKStep;
  static constexpr int kRowElems = 128 / kElem;  // elements per swizzled 128-byte row
  static constexpr int kABytes = 64 * K * kElem, kBBytes = N * K * kElem;
  static constexpr int kAPanels = kA == Major::K ? K * kElem / 128 : 1;
  static constexpr int kBPanels = kB == Major::K ? K * kElem / 128 : N / 64;
  static constexpr int kSmem = kABytes + kBBytes + 1024;
  static_assert(!kFp8 || (kA == Major::K && kB == Major::K), "fp8 wgmma is K-major only");
  static_assert(kABytes % 1024 == 0, "B must start 1024-byte aligned");
};

// Shared-memory byte offset of k-step s in a K-major swizzled operand of `rows` rows.
__device__ __forceinline__ uint32_t k_major_step(int s, int step_bytes, int rows) {
  return (s * step_bytes / 128) * rows * 128 + (s * step_bytes) % 128;
}

template <int N, int K, Major kA, Major kB, bool kRegA, bool kFp8, bool kStoreB, bool kF16>
__global__ void __launch_bounds__(128) wgmma_tile_kernel(const __grid_constant__ CUtensorMap map_a,
                                                         const __grid_constant__ CUtensorMap map_b,
                                                         const uint8_t* a_g, const uint8_t* b_g, float* d_out) {
  using C = Cfg<N, K, kA, kB, kRegA, kFp8, kStoreB, kF16>;
  extern __shared__ uint8_t raw[];
  uint8_t* a_s = align1024(raw);
  uint8_t* b_s = a_s + C::kABytes;
  __shared__ uint64_t bar;
  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(&bar, 1);
    fence_mbarrier_init();
  }
  if constexpr (kStoreB) {  // B global [N][K]: 16-byte chunks into the K-major swizzled panels
    constexpr int kRowChunks = K * C::kElem / 16;
    for (int c = tid; c < N * kRowChunks; c += 128) {
      const int row = c / kRowChunks, rc = c % kRowChunks, panel = rc / 8, ch = rc % 8;
      const uint4 v = *reinterpret_cast<const uint4*>(b_g + static_cast<int64_t>(row) * K * C::kElem + rc * 16);
      *reinterpret_cast<uint4*>(b_s + panel * N * 128 + row * 128 + ((ch ^ (row % 8)) * 16)) = v;
    }
    fence_proxy_async_smem();
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t bytes = (kRegA ? 0 : C::kABytes) + (kStoreB ? 0 : C::kBBytes);
    mbar_arrive_expect_tx(&bar, bytes);
    if constexpr (!kRegA)
      for (int p = 0; p < C::kAPanels; ++p) tma_load_2d(a_s + p * 64 * 128, &map_a, &bar, p * C::kRowElems, 0);
    if constexpr (!kStoreB) {
      for (int p = 0; p < C::kBPanels; ++p) {
        if constexpr (kB == Major::K) tma_load_2d(b_s + p * N * 128, &map_b, &bar, p * C::kRowElems, 0);
        else tma_load_2d(b_s + p * K * 128, &map_b, &bar, p * 64, 0);
      }
    }
  }
  mbar_wait(&bar, 0);

  const int w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  uint32_t areg[C::kSteps][4];
  if constexpr (kRegA) {  // A global [64][K] row-major: the register fragment of each k-step
    const int64_t row0 = (16 * w + g) * int64_t(K) * C::kElem, row8 = row0 + 8 * int64_t(K) * C::kElem;
    constexpr int kHalf = C::kKStep / 2 * C::kElem;  // byte offset of the upper k half
#pragma unroll
    for (int s = 0; s < C::kSteps; ++s) {
      const int k0 = s * C::kKStep * C::kElem + t * 4;  // 2 bf16 or 4 e4m3 per register
      areg[s][0] = *reinterpret_cast<const uint32_t*>(a_g + row0 + k0);
      areg[s][1] = *reinterpret_cast<const uint32_t*>(a_g + row8 + k0);
      areg[s][2] = *reinterpret_cast<const uint32_t*>(a_g + row0 + k0 + kHalf);
      areg[s][3] = *reinterpret_cast<const uint32_t*>(a_g + row8 + k0 + kHalf);
    }
  }
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  wgmma_fence_operand(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < C::kSteps; ++s) {
    const int step_bytes = C::kKStep * C::kElem;
    const uint64_t db = kB == Major::K ? desc_sw128_k_major(b_s + k_major_step(s, step_bytes, N))
                                       : desc_sw128_mn_major(b_s + s * 2048, K * 128);
    if constexpr (kRegA) {
      if constexpr (kFp8) wgmma_e4m3_rs<N>(acc, areg[s], db, s > 0);
      else if constexpr (kF16) wgmma_f16_rs<N, kB>(acc, areg[s], db, s > 0);
      else wgmma_bf16_rs<N, kB>(acc, areg[s], db, s > 0);
    } else {
      const uint64_t da = kA == Major::K ? desc_sw128_k_major(a_s + k_major_step(s, step_bytes, 64))
                                         : desc_sw128_mn_major(a_s + s * 2048, K * 128);
      if constexpr (kFp8) wgmma_e4m3_ss<N>(acc, da, db, s > 0);
      else if constexpr (kF16) wgmma_f16_ss<N, kA, kB>(acc, da, db, s > 0);
      else wgmma_bf16_ss<N, kA, kB>(acc, da, db, s > 0);
    }
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(acc);
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int r = 16 * w + g, c = 8 * j + 2 * t;
    d_out[r * N + c] = acc[4 * j];
    d_out[r * N + c + 1] = acc[4 * j + 1];
    d_out[(r + 8) * N + c] = acc[4 * j + 2];
    d_out[(r + 8) * N + c + 1] = acc[4 * j + 3];
  }
  __syncthreads();
  if (tid == 0) mbar_inval(&bar);
}

// 2-D map over a row-major [rows][cols] byte-addressed array with a 128B-swizzled box.
CUtensorMap map_2d(const void* base, bool fp8, int64_t rows, int64_t cols, int box_rows) {
  TmaTensor t;
  t.base = base;
  t.dtype = fp8 ? DType::u8 : DType::bf16;
  t.rank = 2;
  t.dims[0] = cols, t.dims[1] = rows;
  t.strides[0] = 1, t.strides[1] = cols;
  t.box[0] = fp8 ? 128 : 64, t.box[1] = box_rows;
  t.swizzle = TmaSwizzle::b128;
  return make_tensor_map(t, "wgmma test");
}

template <int N, int K, Major kA, Major kB, bool kRegA, bool kFp8, bool kStoreB, bool kF16 = false>
void run_case(uint64_t seed) {
  using C = Cfg<N, K, kA, kB, kRegA, kFp8, kStoreB, kF16>;
  test::reseed(seed);
  // Logical A [64][K], B [K][N] as element codes, and their values.
  std::vector<uint16_t> a16, b16;
  std::vector<uint8_t> a8, b8;
  std::vector<double> av(64 * K), bv(static_cast<std::size_t>(K) * N);
  if constexpr (kFp8) {
    a8 = test::random_e4m3(av.size()), b8 = test::random_e4m3(bv.size());
    for (std::size_t i = 0; i < av.size(); ++i) av[i] = test::e4m3_to_float(a8[i]);
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = test::e4m3_to_float(b8[i]);
  } else if constexpr (kF16) {  // f16 codes of random bf16 values scaled into f16's range (exact: 8 <= 11 bits)
    a16 = test::random_bf16(av.size()), b16 = test::random_bf16(bv.size());
    for (uint16_t& x : a16) x = test::float_to_f16(test::bf16_to_float(x) * 64.0f);
    for (uint16_t& x : b16) x = test::float_to_f16(test::bf16_to_float(x) * 0.25f);
    for (std::size_t i = 0; i < av.size(); ++i) av[i] = test::f16_to_float(a16[i]);
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = test::f16_to_float(b16[i]);
  } else {
    a16 = test::random_bf16(av.size()), b16 = test::random_bf16(bv.size());
    for (std::size_t i = 0; i < av.size(); ++i) av[i] = test::bf16_to_float(a16[i]);
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = test::bf16_to_float(b16[i]);
  }
  // Global layouts: A row-major [64][K] (K-major) or [K][64] (MN-major); B [N][K] (K-major) or [K][N].
  auto code_bytes = [&](bool is_a, int r, int c) {  // element (r, c) of the logical matrix, as bytes
    std::vector<uint8_t> b(C::kElem);
    const std::size_t idx = is_a ? static_cast<std::size_t>(r) * K + c : static_cast<std::size_t>(r) * N + c;
    if constexpr (kFp8) b[0] = is_a ? a8[idx] : b8[idx];
    else {
      const uint16_t v = is_a ? a16[idx] : b16[idx];
      b[0] = v & 0xff, b[1] = v >> 8;
    }
    return b;
  };
  std::vector<uint8_t> ag(av.size() * C::kElem), bg(bv.size() * C::kElem);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < K; ++k) {
      const std::size_t pos = kA == Major::K ? static_cast<std::size_t>(m) * K + k : static_cast<std::size_t>(k) * 64 + m;
      const auto e = code_bytes(true, m, k);
      for (int i = 0; i < C::kElem; ++i) ag[pos * C::kElem + i] = e[i];
    }
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) {
      const std::size_t pos = kB == Major::K ? static_cast<std::size_t>(n) * K + k : static_cast<std::size_t>(k) * N + n;
      const auto e = code_bytes(false, k, n);
      for (int i = 0; i < C::kElem; ++i) bg[pos * C::kElem + i] = e[i];
    }
  test::DevBuf<uint8_t> da(ag), db(bg);
  test::DevBuf<float> dd(static_cast<std::size_t>(64) * N);
  dd.fill_bytes(0xff);  // NaN
  const CUtensorMap ma = kA == Major::K ? map_2d(da.p, kFp8, 64, K, 64) : map_2d(da.p, kFp8, K, 64, K);
  const CUtensorMap mb = kB == Major::K ? map_2d(db.p, kFp8, N, K, N) : map_2d(db.p, kFp8, K, N, K);
  auto* kernel = wgmma_tile_kernel<N, K, kA, kB, kRegA, kFp8, kStoreB, kF16>;
  MLA_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  kernel<<<1, 128, C::kSmem>>>(ma, mb, da.p, db.p, dd.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = dd.download();
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        ref += av[static_cast<std::size_t>(m) * K + k] * bv[static_cast<std::size_t>(k) * N + n];
        mag += std::fabs(av[static_cast<std::size_t>(m) * K + k] * bv[static_cast<std::size_t>(k) * N + n]);
      }
      const double have = got[static_cast<std::size_t>(m) * N + n];
      // bf16 products are exact in fp32, so only the accumulation rounds; Hopper's fp8 path accumulates with
      // fewer mantissa bits (about 14), hence the wider bound. A layout error is off by O(mag).
      const double tol = (kFp8 ? 2e-3 : 1e-4) * mag + 1e-6;
      if (!(std::fabs(have - ref) <= tol) && ++bad <= 5)
        ADD_FAILURE() << "D[" << m << "][" << n << "] = " << have << ", want " << ref;
    }
  EXPECT_EQ(bad, 0) << "of " << 64 * N;
}

constexpr Major kK = Major::K, kMN = Major::MN;

TEST(PtxWgmma, Bf16SmemAKMajorB) {
  MLA_SKIP_UNLESS_SM90();
  run_case<64, 128, kK, kK, false, false, false>(11);
  run_case<128, 128, kK, kK, false, false, false>(12);
  run_case<256, 128, kK, kK, false, false, false>(13);
}

TEST(PtxWgmma, Bf16TransposedOperands) {
  MLA_SKIP_UNLESS_SM90();
  run_case<128, 64, kK, kMN, false, false, false>(21);   // B [K][N] (V in P V)
  run_case<256, 64, kK, kMN, false, false, false>(22);
  run_case<64, 64, kMN, kK, false, false, false>(23);    // A [K][M]
}

TEST(PtxWgmma, Bf16RegisterA) {
  MLA_SKIP_UNLESS_SM90();
  run_case<128, 128, kK, kK, true, false, true>(31);  // B written by ordinary stores + proxy fence
  run_case<64, 64, kK, kMN, true, false, false>(32);
  run_case<256, 64, kK, kK, true, false, false>(33);
}

// f16 (the raw-codes decode kernel's S product: e4m3 codes unpacked to f16 in registers).
TEST(PtxWgmma, F16SmemAndRegisterA) {
  MLA_SKIP_UNLESS_SM90();
  run_case<64, 128, kK, kK, false, false, false, true>(51);
  run_case<16, 128, kK, kK, true, false, true, true>(52);  // B written by ordinary stores
  run_case<8, 64, kK, kK, true, false, true, true>(53);
}

TEST(PtxWgmma, E4m3SmemAndRegisterA) {
  MLA_SKIP_UNLESS_SM90();
  run_case<128, 128, kK, kK, false, true, false>(41);
  run_case<256, 128, kK, kK, false, true, false>(42);
  run_case<64, 256, kK, kK, true, true, false>(43);
}

// wgmma_scale_rows_if: a D fragment (no product needed: its layout is what the wrapper assumes) filled with
// distinct values; warp w's `any` is taken from the host's flags, the factors depend on the row. Rows of warps
// with any = 0 must come back untouched, the others multiplied by their row's factor, with no lane left out.
template <int N>
__global__ void __launch_bounds__(128) scale_rows_kernel(const int* any_of_warp, float* d_out) {
  const int tid = threadIdx.x, w = tid / 32, g = (tid & 31) / 4, t = tid & 3;
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = static_cast<float>(tid * 256 + i);
  const float f_lo = 0.5f + (16 * w + g), f_hi = 0.25f + (16 * w + g + 8);  // products below 2^21 in quarters: exact
  wgmma_scale_rows_if<N>(d, any_of_warp[w] != 0, f_lo, f_hi);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      d_out[row * N + col] = d[4 * j + e];
    }
}

template <int N>
void run_scale_rows(const std::vector<int>& any_of_warp) {
  test::DevBuf<int> dany(any_of_warp);
  test::DevBuf<float> dd(static_cast<std::size_t>(64) * N);
  dd.fill_bytes(0xff);  // NaN: every element must be written
  scale_rows_kernel<N><<<1, 128>>>(dany.p, dd.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = dd.download();
  int bad = 0;
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < N; ++col) {
      const int w = row / 16, g = row % 8, hi = (row % 16) / 8, t = (col % 8) / 2, j = col / 8;
      const int tid = 32 * w + 4 * g + t, i = 4 * j + 2 * hi + (col & 1);
      const double f = hi ? 0.25 + row : 0.5 + row;
      const double want = (tid * 256.0 + i) * (any_of_warp[w] ? f : 1.0);
      if (got[static_cast<std::size_t>(row) * N + col] != want && ++bad <= 5)
        ADD_FAILURE() << "N " << N << " D[" << row << "][" << col << "] = " << got[row * N + col] << ", want " << want;
    }
  EXPECT_EQ(bad, 0) << "of " << 64 * N;
}

TEST(PtxWgmma, ScaleRowsIf) {
  MLA_SKIP_UNLESS_SM90();
  run_scale_rows<256>({1, 0, 1, 0});  // the seesaw's O half (seesaw/kernel.cuh rescale_o)
  run_scale_rows<256>({0, 0, 0, 0});
  run_scale_rows<64>({0, 1, 1, 1});
  run_scale_rows<8>({1, 1, 0, 1});
}

}  // namespace
}  // namespace mla
