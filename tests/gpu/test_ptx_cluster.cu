// Device test of cluster.cuh with launch_cluster (cuda/common/launch.h), in clusters of two CTAs over several
// phases, the hand-overs of the decode crossover (decode_sm90/source_cross.cuh): each CTA's writer warp fills
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

TEST(PtxCluster, GridMustBeWholeClusters) {
  MLA_SKIP_UNLESS_SM90();
  test::DevBuf<int> bad(1);
  test::DevBuf<unsigned> ranks(3);
  EXPECT_THROW(cuda::launch_cluster(cluster_exchange_kernel, 3, 2, 64, 0, nullptr, "odd grid", bad.p, ranks.p), Error);
}

}  // namespace
}  // namespace mla
