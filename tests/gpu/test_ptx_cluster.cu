// SPDX-License-Identifier: Apache-2.0
// Device test of cluster.cuh with launch_cluster (cuda/common/launch.h), in clusters of two CTAs over several
// phases, the hand-overs of the decode crossover (attention/sm90/seesaw/source_cross.cuh): each CTA's writer warp fills
// its own staging buffer with ordinary stores, fences the proxy and bulk-copies it into the PEER's receive
// buffer (bulk_copy_to_peer), completing on the peer's `full` barrier, whose receiving CTA announced the bytes
// (expect_tx) and waits (mbar_wait_cluster); the reader checks every element, then arrives on the writer's
// `empty` barrier at cluster scope (mbar_arrive_cluster), after which the writer may rewrite its staging
// buffer and the peer's receive buffer for the next phase. cluster_sync after the barriers' initialisation
// and before exit; the CTA ranks are blockIdx.x % 2.
#include <vector>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/common/ptx/tma.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

constexpr int kWords = 512;  // uint4 per buffer (8 KiB)
constexpr int kPhases = 6;

__global__ void cluster_exchange_kernel(int* bad, unsigned* ranks) {
  __shared__ alignas(128) uint4 stage[kWords];  // this CTA's outgoing data
  __shared__ alignas(128) uint4 recv[kWords];   // written by the peer's bulk copy
  __shared__ alignas(8) uint64_t full, empty;
  using namespace cuda::ptx;
  const uint32_t rank = cluster_ctarank(), peer = rank ^ 1u;
  if (threadIdx.x == 0) {
    mbar_init(&full, 1);    // the reader's arrival with the expected bytes; the peer's copy completes them
    mbar_init(&empty, 32);  // the peer's reader warp, one cluster-scope arrival per lane: recv read
    fence_mbarrier_init();
  }
  cluster_sync();
  if (threadIdx.x == 0) ranks[blockIdx.x] = rank;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  for (int ph = 0; ph < kPhases; ++ph) {
    const uint32_t parity = ph & 1;
    if (warp == 0) {  // writer: once the peer has read the previous phase (its copy from `stage` landed)
      if (ph > 0) mbar_wait_cluster(&empty, parity ^ 1);
      for (int i = lane; i < kWords; i += 32) {
        const uint32_t v = (blockIdx.x ^ 1u) * 1000003u + ph * 7919u + i;
        stage[i] = make_uint4(v, v + 1, v + 2, v + 3);
      }
      fence_proxy_async_smem();
      __syncwarp();
      if (lane == 0)
        bulk_copy_to_peer(map_peer(smem_addr(recv), peer), smem_addr(stage), kWords * 16, map_peer(smem_addr(&full), peer));
    } else if (warp == 1) {  // reader: this CTA's recv, written by the peer's copy
      if (lane == 0) mbar_arrive_expect_tx(&full, kWords * 16);
      mbar_wait_cluster(&full, parity);
      for (int i = lane; i < kWords; i += 32) {
        const uint32_t v = blockIdx.x * 1000003u + ph * 7919u + i;
        const uint4 w = recv[i];
        if (w.x != v || w.y != v + 1 || w.z != v + 2 || w.w != v + 3) atomicAdd(bad, 1);
      }
      mbar_arrive_cluster(map_peer(smem_addr(&empty), peer));  // the peer may write the next phase
    }
  }
  cluster_sync();
}

TEST(PtxCluster, PairExchangeThroughPeerSharedMemory) {
  MLA_SKIP_UNLESS_SM90();
  const int grid = 64;
  test::DevBuf<int> bad(1);
  test::DevBuf<unsigned> ranks(grid);
  bad.fill_bytes(0);
  ranks.fill_bytes(0xff);
  for (int rep = 0; rep < 3; ++rep)
    cuda::launch_cluster(cluster_exchange_kernel, grid, 2, 64, 0, nullptr, "cluster_exchange_kernel", bad.p, ranks.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(bad.download()[0], 0);
  const std::vector<unsigned> r = ranks.download();
  for (int i = 0; i < grid; ++i) EXPECT_EQ(r[i], static_cast<unsigned>(i & 1)) << "CTA " << i;
}

// ld_shared_cluster_f32 / ld_shared_cluster_v4f32 and cluster_nctarank (the decode cluster merge's reads): each
// CTA of a cluster of `n` fills its shared buffer with ordinary stores, cluster_sync, then every thread reads
// element i of every rank's buffer (scalar and 16-byte loads), checks it, and a second cluster_sync keeps every
// buffer alive until all reads are done.
constexpr int kDsmemFloats = 1024;

__device__ float dsmem_value(unsigned cta, int i) { return static_cast<float>(cta * 4096u + static_cast<unsigned>(i)); }

__global__ void dsmem_read_kernel(int* bad, unsigned* sizes) {
  __shared__ alignas(16) float buf[kDsmemFloats];
  using namespace cuda::ptx;
  const uint32_t n = cluster_nctarank(), rank = cluster_ctarank();
  const unsigned first = blockIdx.x - rank;  // the cluster's CTAs are consecutive in x
  for (int i = threadIdx.x; i < kDsmemFloats; i += blockDim.x) buf[i] = dsmem_value(blockIdx.x, i);
  if (threadIdx.x == 0) sizes[blockIdx.x] = n;
  cluster_sync();
  for (uint32_t r = 0; r < n; ++r) {
    const uint32_t base = map_peer(smem_addr(buf), r);
    for (int i = threadIdx.x; i < kDsmemFloats; i += blockDim.x)
      if (ld_shared_cluster_f32(base + 4u * i) != dsmem_value(first + r, i)) atomicAdd(bad, 1);
    for (int i = threadIdx.x; i < kDsmemFloats / 4; i += blockDim.x) {
      const float4 v = ld_shared_cluster_v4f32(base + 16u * i);
      if (v.x != dsmem_value(first + r, 4 * i) || v.y != dsmem_value(first + r, 4 * i + 1) ||
          v.z != dsmem_value(first + r, 4 * i + 2) || v.w != dsmem_value(first + r, 4 * i + 3))
        atomicAdd(bad, 1);
    }
  }
  cluster_sync();
}

TEST(PtxCluster, ReadsEveryRanksSharedMemory) {
  MLA_SKIP_UNLESS_SM90();
  for (unsigned n : {2u, 3u, 8u}) {
    const unsigned grid = 4 * n;
    test::DevBuf<int> bad(1);
    test::DevBuf<unsigned> sizes(grid);
    bad.fill_bytes(0);
    sizes.fill_bytes(0);
    cuda::launch_cluster(dsmem_read_kernel, grid, n, 128, 0, nullptr, "dsmem_read_kernel", bad.p, sizes.p);
    MLA_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(bad.download()[0], 0) << "cluster of " << n;
    for (unsigned s : sizes.download()) EXPECT_EQ(s, n);
  }
}

TEST(PtxCluster, GridMustBeWholeClusters) {
  MLA_SKIP_UNLESS_SM90();
  test::DevBuf<int> bad(1);
  test::DevBuf<unsigned> ranks(3);
  EXPECT_THROW(cuda::launch_cluster(cluster_exchange_kernel, 3, 2, 64, 0, nullptr, "odd grid", bad.p, ranks.p), Error);
}

// tma_load_3d_multicast (tma.cuh) with a two-CTA multicast ring protocol (the one a paged decode source would use):
// a tile of kBoxes boxes (kBoxRows rows x 64 bf16 columns, 128-byte swizzle) per phase in two stages; CTA
// rank r issues the boxes b with b % 2 == r, multicast to both CTAs; each CTA's producer announces the
// whole tile on its own full barrier; each CTA's consumer warp checks every element of its copy, then
// releases the stage locally (one arrival) and at the peer (one cluster-scope arrival): the empty barrier
// counts both, so no CTA rewrites a stage the peer still reads. Tile t of the cluster = rows
// [t * kTileRows, ...) of a [kPages][kBoxRows][64] tensor read as boxes (0, row in page, page).
constexpr int kBoxRows = 16, kBoxes = 4, kTileRows = kBoxRows * kBoxes, kMcTiles = 9, kMcStages = 2;
constexpr int kMcTileBytes = kTileRows * 128;

__global__ void multicast_ring_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* src, int* bad) {
  extern __shared__ uint8_t raw[];
  uint8_t* stages = align1024(raw);
  __shared__ alignas(8) uint64_t full[kMcStages], empty[kMcStages];
  using namespace cuda::ptx;
  const uint32_t rank = cluster_ctarank(), peer = rank ^ 1u;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMcStages; ++s) {
      mbar_init(&full[s], 1);   // this CTA's announcing arrival; both CTAs' copies complete the bytes
      mbar_init(&empty[s], 2);  // the local consumer warp's lane 0 and the peer's
    }
    fence_mbarrier_init();
  }
  cluster_sync();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  for (int t = 0; t < kMcTiles; ++t) {
    const int s = t % kMcStages;
    const uint32_t parity = (t / kMcStages) & 1;
    uint8_t* tile = stages + s * kMcTileBytes;
    if (warp == 0 && lane == 0) {  // producer
      mbar_wait_cluster(&empty[s], parity ^ 1);
      mbar_arrive_expect_tx(&full[s], kMcTileBytes);
      if (blockIdx.x < 2 && t == 0) __nanosleep(2000 * (1 + rank));  // skew the CTAs: early peer copies
      for (int b = static_cast<int>(rank); b < kBoxes; b += 2) {
        const int row = t * kTileRows + b * kBoxRows;  // first tensor row of the box
        tma_load_3d_multicast(tile + b * kBoxRows * 128, &map, &full[s], 0, row % (4 * kBoxRows),
                              row / (4 * kBoxRows), 0x3);
      }
    } else if (warp == 1) {  // consumer
      mbar_wait_cluster(&full[s], parity);
      for (int e = lane; e < kTileRows * 64; e += 32) {
        const int r = e / 64, x = (e % 64) * 2;
        const int off = r * 128 + (((x / 16) ^ (r % 8)) * 16) + x % 16;
        const uint16_t have = *reinterpret_cast<const uint16_t*>(tile + off);
        const uint16_t want = src[static_cast<int64_t>(t * kTileRows + r) * 64 + e % 64];
        if (have != want) atomicAdd(bad, 1);
      }
      if (t % 3 == static_cast<int>(rank)) __nanosleep(5000);  // slow readers: a copy that did not wait shows
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(&empty[s]);
        mbar_arrive_cluster(map_peer(smem_addr(&empty[s]), peer));
      }
    }
  }
  cluster_sync();
}

TEST(PtxCluster, MulticastTmaRingIntoBothCtas) {
  MLA_SKIP_UNLESS_SM90();
  const int rows = kMcTiles * kTileRows, pages = rows / (4 * kBoxRows);
  std::vector<uint16_t> host(static_cast<std::size_t>(rows) * 64);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(((i * 2654435761u) >> 9) | 1);
  test::DevBuf<uint16_t> src(host);
  cuda::ptx::TmaTensor t;
  t.base = src.p;
  t.dtype = DType::bf16;
  t.rank = 3;
  t.dims[0] = 64, t.dims[1] = 4 * kBoxRows, t.dims[2] = pages;
  t.strides[0] = 1, t.strides[1] = 64, t.strides[2] = 64 * 4 * kBoxRows;
  t.box[0] = 64, t.box[1] = kBoxRows, t.box[2] = 1;
  t.swizzle = cuda::ptx::TmaSwizzle::b128;
  const CUtensorMap map = cuda::ptx::make_tensor_map(t, "multicast");
  const int smem = kMcStages * kMcTileBytes + 1024;
  MLA_CUDA_OK(cudaFuncSetAttribute(multicast_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  test::DevBuf<int> bad(1);
  bad.fill_bytes(0);
  for (int rep = 0; rep < 3; ++rep)
    cuda::launch_cluster(multicast_ring_kernel, 16, 2, 64, smem, nullptr, "multicast_ring_kernel", map,
                         static_cast<const uint16_t*>(src.p), bad.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(bad.download()[0], 0);
}

}  // namespace
}  // namespace mla
