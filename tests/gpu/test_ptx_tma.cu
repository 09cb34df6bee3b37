// SPDX-License-Identifier: Apache-2.0
// Device tests of the TMA and mbarrier wrappers (src/cuda/common/ptx/tma.cuh, mbarrier.cuh,
// tensor_map.h): tensor tile loads of rank 2..5 with and without the 128-byte swizzle, each shared-memory
// byte checked against the placement the copy engine promises (out-of-bounds elements as zeros, over a
// poisoned tile), the plain bulk copy, mbarrier arrival / transaction counting and phase parity, and a
// 3-stage producer/consumer ring over 11 tiles whose slow consumers would expose a producer that did not
// wait for its stage to be released. SASS of these kernels (scripts/sass_summary.sh, sm_90a):
// UTMALDG in the tile kernels, UBLKCP in the bulk one, SYNCS for the barriers; no LDL/STL.
#include <cuda.h>

#include <array>
#include <vector>

#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "mla/error.h"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;

struct Coords {
  int32_t c[5];
};

// One elected thread loads one box at `co` into a poisoned (0xAB) tile; every thread then copies the
// tile out.
__global__ void tma_box_kernel(const __grid_constant__ CUtensorMap map, int rank, Coords co, uint32_t bytes, int hint,
                               uint8_t* out) {
  extern __shared__ uint8_t raw[];
  uint8_t* tile = align1024(raw);
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    fence_mbarrier_init();
  }
  for (uint32_t i = threadIdx.x; i < bytes; i += blockDim.x) tile[i] = 0xAB;
  fence_proxy_async_smem();  // the poison (generic proxy) is ordered before the copy engine's writes
  __syncthreads();
  if (canonical_warp_idx() == 0 && elect_one_sync()) {
    tma_prefetch_descriptor(&map);
    mbar_arrive_expect_tx(&bar, bytes);
    const int32_t* c = co.c;
    switch (rank) {
      case 2:
        tma_prefetch_l2_2d(&map, c[0], c[1]);  // warms L2 for the load below (no observable effect)
        if (hint) tma_load_2d(tile, &map, &bar, c[0], c[1], L2Hint::evict_first);
        else tma_load_2d(tile, &map, &bar, c[0], c[1]);
        break;
      case 3:
        tma_prefetch_l2_3d(&map, c[0], c[1], c[2]);
        if (hint) tma_load_3d(tile, &map, &bar, c[0], c[1], c[2], L2Hint::evict_last);
        else tma_load_3d(tile, &map, &bar, c[0], c[1], c[2]);
        break;
      case 4: tma_load_4d(tile, &map, &bar, c[0], c[1], c[2], c[3]); break;
      default: tma_load_5d(tile, &map, &bar, c[0], c[1], c[2], c[3], c[4]); break;
    }
  }
  mbar_wait(&bar, 0);
  for (uint32_t i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = tile[i];
  __syncthreads();
  if (threadIdx.x == 0) mbar_inval(&bar);
}

uint16_t element_value(int64_t idx) { return static_cast<uint16_t>(((idx * 2654435761LL) >> 9) | 1); }  // never 0

struct BoxCase {
  std::array<int64_t, 5> dims;
  std::array<int32_t, 5> box;
  std::array<int32_t, 5> at;
  int rank;
  TmaSwizzle swizzle;
  int hint;
};

// Loads the box on the device and compares every byte with the expected placement.
void check_box(const BoxCase& bc) {
  const int r = bc.rank;
  // Row pitch rounded up to 16 bytes plus 16 more: the map's strides, not the extents, address memory.
  std::array<int64_t, 5> stride{1, 0, 0, 0, 0};
  stride[1] = (bc.dims[0] + 7) / 8 * 8 + 8;
  for (int i = 2; i < r; ++i) stride[i] = stride[i - 1] * bc.dims[i - 1];
  const int64_t total = stride[r - 1] * bc.dims[r - 1];
  std::vector<uint16_t> host(static_cast<std::size_t>(total));
  for (int64_t i = 0; i < total; ++i) host[i] = element_value(i);
  test::DevBuf<uint16_t> src(host);

  TmaTensor t;
  t.base = src.p;
  t.dtype = DType::bf16;
  t.rank = r;
  for (int i = 0; i < r; ++i) {
    t.dims[i] = bc.dims[i];
    t.strides[i] = stride[i];
    t.box[i] = bc.box[i];
  }
  t.swizzle = bc.swizzle;
  const CUtensorMap map = make_tensor_map(t, "test");
  const auto bytes = static_cast<uint32_t>(box_bytes(t));
  test::DevBuf<uint8_t> out(bytes);
  Coords co{};
  for (int i = 0; i < r; ++i) co.c[i] = bc.at[i];
  const int smem = static_cast<int>(bytes) + 1024;
  MLA_CUDA_OK(cudaFuncSetAttribute(tma_box_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tma_box_kernel<<<1, 128, smem>>>(map, r, co, bytes, bc.hint, out.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = out.download();

  const int64_t inner = bc.box[0] * 2;
  int64_t rows = 1;
  for (int i = 1; i < r; ++i) rows *= bc.box[i];
  int bad = 0;
  for (int64_t row = 0; row < rows; ++row) {
    // Box coordinates of this row (dims 1..r-1), then the global element.
    int64_t rem = row, gidx = 0;
    bool inside = true;
    for (int i = 1; i < r; ++i) {
      const int64_t g = bc.at[i] + rem % bc.box[i];
      rem /= bc.box[i];
      inside = inside && g >= 0 && g < bc.dims[i];
      gidx += g * stride[i];
    }
    for (int64_t e = 0; e < bc.box[0]; ++e) {
      const int64_t g0 = bc.at[0] + e;
      const bool in = inside && g0 >= 0 && g0 < bc.dims[0];
      const uint16_t want = in ? host[gidx + g0] : 0;
      const int64_t x = e * 2;
      int64_t off = row * inner + x;
      if (bc.swizzle == TmaSwizzle::b128) off = row * 128 + (((x / 16) ^ (row % 8)) * 16) + x % 16;
      const uint16_t have = static_cast<uint16_t>(got[off] | (got[off + 1] << 8));
      if (have != want && ++bad <= 5)
        ADD_FAILURE() << "rank " << r << " box row " << row << " element " << e << ": got " << have << " want "
                      << want << (in ? "" : " (out of bounds: zero fill)");
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(PtxTma, TileLoads2dTo5dWithAndWithoutSwizzle) {
  MLA_SKIP_UNLESS_SM90();
  const auto none = TmaSwizzle::none, sw = TmaSwizzle::b128;
  const std::vector<BoxCase> cases = {
      {{100, 70}, {64, 32}, {0, 0}, 2, none, 0},
      {{100, 70}, {64, 32}, {48, 50}, 2, none, 1},    // partial in both dimensions
      {{100, 70}, {64, 32}, {-16, -8}, 2, none, 0},   // negative coordinates read zeros
      {{100, 70}, {64, 32}, {8, 16}, 2, sw, 0},
      {{100, 70}, {64, 32}, {64, 56}, 2, sw, 1},      // partial + swizzle
      {{64, 20, 5}, {64, 8, 2}, {0, 16, 4}, 3, sw, 0},
      {{64, 20, 5}, {64, 8, 2}, {0, 4, 1}, 3, none, 1},
      {{32, 6, 5, 3}, {32, 4, 2, 2}, {0, 4, 3, 2}, 4, none, 0},
      {{16, 3, 4, 3, 2}, {16, 2, 2, 2, 2}, {8, 2, 3, 1, 1}, 5, none, 0},
  };
  for (const BoxCase& bc : cases) {
    SCOPED_TRACE("rank " + std::to_string(bc.rank) + (bc.swizzle == sw ? " swizzle128" : " plain") + " at " +
                 std::to_string(bc.at[0]) + "," + std::to_string(bc.at[1]));
    check_box(bc);
  }
}

TEST(PtxTma, TensorMapRejectsBadDescriptions) {
  MLA_SKIP_UNLESS_SM90();
  test::DevBuf<uint16_t> buf(4096);
  TmaTensor t;
  t.base = buf.p;
  t.rank = 2;
  t.dims[0] = 64, t.dims[1] = 32;
  t.strides[0] = 1, t.strides[1] = 64;
  t.box[0] = 64, t.box[1] = 8;
  EXPECT_NO_THROW(make_tensor_map(t, "ok"));
  TmaTensor bad = t;
  bad.strides[1] = 60;  // 120 bytes: not a multiple of 16
  EXPECT_THROW(make_tensor_map(bad, "stride"), Error);
  bad = t;
  bad.box[0] = 128, bad.swizzle = TmaSwizzle::b128;  // 256-byte inner box > 128-byte swizzle span
  EXPECT_THROW(make_tensor_map(bad, "swizzle"), Error);
  bad = t;
  bad.base = reinterpret_cast<const uint8_t*>(buf.p) + 8;
  EXPECT_THROW(make_tensor_map(bad, "align"), Error);
  bad = t;
  bad.box[1] = 300;
  EXPECT_THROW(make_tensor_map(bad, "box"), Error);
}

// Records arrival / transaction / parity facts one step at a time (thread 0), then a bulk copy.
__global__ void mbarrier_facts_kernel(const uint8_t* src, int* facts, uint8_t* copied) {
  __shared__ __align__(128) uint8_t buf[64];
  __shared__ uint64_t bar;
  if (threadIdx.x != 0) return;
  mbar_init(&bar, 2);
  fence_mbarrier_init();
  facts[0] = mbar_try_wait(&bar, 0);  // 0: nobody arrived
  mbar_arrive(&bar);
  facts[1] = mbar_try_wait(&bar, 0);  // 0: one of two arrivals
  mbar_arrive(&bar);
  facts[2] = mbar_try_wait(&bar, 0);  // 1: phase 0 complete
  facts[3] = mbar_try_wait(&bar, 1);  // 0: phase 1 under way
  mbar_arrive_expect_tx(&bar, 48);
  mbar_arrive(&bar);
  facts[4] = mbar_try_wait(&bar, 1);  // 0: arrivals complete, 48 bytes outstanding
  bulk_prefetch_l2(src, 256);
  bulk_load(buf, src, 32, &bar);
  bulk_load(buf + 32, src + 64, 16, &bar, L2Hint::evict_first);
  mbar_wait(&bar, 1);
  facts[5] = 1;
  mbar_expect_tx(&bar, 16);            // phase 2 (parity 0): bytes announced without arriving
  mbar_arrive(&bar, 2);
  facts[6] = mbar_try_wait(&bar, 0);  // 0: 16 bytes outstanding
  facts[7] = mbar_try_wait(&bar, 1);  // 1: phase 1 is complete
  bulk_load(buf + 48, src + 128, 16, &bar);
  mbar_wait(&bar, 0);
  facts[8] = 1;
  for (int i = 0; i < 64; ++i) copied[i] = buf[i];
  mbar_inval(&bar);
}

TEST(PtxMbarrier, ArrivalsTransactionBytesAndParity) {
  MLA_SKIP_UNLESS_SM90();
  std::vector<uint8_t> src(256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  test::DevBuf<uint8_t> d_src(src), copied(64);
  test::DevBuf<int> facts(9);
  facts.fill_bytes(0xff);
  mbarrier_facts_kernel<<<1, 32>>>(d_src.p, facts.p, copied.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(facts.download(), (std::vector<int>{0, 0, 1, 0, 0, 1, 0, 1, 1}));
  const std::vector<uint8_t> got = copied.download();
  for (int i = 0; i < 64; ++i) {
    const int from = i < 32 ? i : i < 48 ? 64 + (i - 32) : 128 + (i - 48);
    EXPECT_EQ(got[i], src[from]) << "bulk-copied byte " << i;
  }
}

constexpr int kStages = 3, kTileRows = 8, kCols = 64;

// Warp 4 (one elected lane) produces tiles i = 0..tiles-1 into stage i % 3 with TMA; warps 0-3 consume
// (copy out), sleeping on the first tiles so that a producer which did not wait on `empty` would
// overwrite a stage still being read.
__global__ void tma_ring_kernel(const __grid_constant__ CUtensorMap map, int tiles, uint16_t* out) {
  extern __shared__ uint8_t raw[];
  uint8_t* stages = align1024(raw);
  constexpr int kTileBytes = kTileRows * kCols * 2;
  __shared__ uint64_t full[kStages], empty[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int warp = canonical_warp_idx();
  if (warp == 4) {
    if (elect_one_sync()) {
      for (int i = 0; i < tiles; ++i) {
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(&empty[s], ((i / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[s], kTileBytes);
        tma_load_2d(stages + s * kTileBytes, &map, &full[s], 0, i * kTileRows);
      }
    }
    return;
  }
  for (int i = 0; i < tiles; ++i) {
    const int s = i % kStages;
    mbar_wait(&full[s], (i / kStages) & 1);
    if (i < 2 * kStages) __nanosleep(20000);
    const auto* tile = reinterpret_cast<const uint16_t*>(stages + s * kTileBytes);
    for (int e = threadIdx.x; e < kTileRows * kCols; e += 128) out[static_cast<int64_t>(i) * kTileRows * kCols + e] = tile[e];
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s]);
  }
}

TEST(PtxMbarrier, ThreeStageTmaRingFlipsPhases) {
  MLA_SKIP_UNLESS_SM90();
  constexpr int kTiles = 11, kRows = kTiles * kTileRows - 3;  // the last tile is partial: zeros
  std::vector<uint16_t> host(static_cast<std::size_t>(kRows) * kCols);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = element_value(static_cast<int64_t>(i));
  test::DevBuf<uint16_t> src(host), out(static_cast<std::size_t>(kTiles) * kTileRows * kCols);
  out.fill_bytes(0xAB);
  TmaTensor t;
  t.base = src.p;
  t.rank = 2;
  t.dims[0] = kCols, t.dims[1] = kRows;
  t.strides[0] = 1, t.strides[1] = kCols;
  t.box[0] = kCols, t.box[1] = kTileRows;
  const CUtensorMap map = make_tensor_map(t, "ring");
  const int smem = kStages * kTileRows * kCols * 2 + 1024;
  tma_ring_kernel<<<1, 160, smem>>>(map, kTiles, out.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const uint16_t want = i < host.size() ? host[i] : 0;
    if (got[i] != want && ++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want;
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace mla
