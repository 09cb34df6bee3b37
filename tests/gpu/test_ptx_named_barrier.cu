// Device test of named_barrier.cuh: warpgroup 0 of a 384-thread CTA exits at once; warpgroups 1 and 2
// (256 threads) exchange values through shared memory over many rounds, synchronised only by named
// barrier 1. Each round every thread writes its slot of one of two buffers, syncs, and reads the slot
// of the thread 128 places away (the other warpgroup); a missing or partial barrier shows as a stale
// value. Mirrors the consumer exchange of the sm90 decode kernel (src/cuda/decode_sm90/kernel.cuh).
#include <vector>

#include "cuda/common/ptx/named_barrier.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

constexpr int kThreads = 384, kConsumers = 256, kRounds = 200;

__global__ void __launch_bounds__(kThreads) exchange_kernel(int* errors) {
  __shared__ int buf[2][kConsumers];
  if (threadIdx.x < 128) return;  // the "producer" warpgroup leaves: the barrier must not wait for it
  const int ct = threadIdx.x - 128, peer = (ct + 128) % kConsumers;
  int bad = 0;
  for (int r = 0; r < kRounds; ++r) {
    // Threads of the second warpgroup dawdle, so the first reaches the barrier long before them.
    if (ct >= 128 && (r % 3) == 0) {
      volatile int spin = 0;
      for (int k = 0; k < 200; ++k) spin = spin + k;
    }
    buf[r & 1][ct] = r * 1000 + ct;
    cuda::ptx::named_barrier_sync(1, kConsumers);
    if (buf[r & 1][peer] != r * 1000 + peer) ++bad;
  }
  atomicAdd(errors, bad);
}

TEST(PtxNamedBarrier, TwoWarpgroupsExchangeWhileThirdExited) {
  MLA_SKIP_UNLESS_SM90();
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  exchange_kernel<<<64, kThreads>>>(errors.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(errors.download()[0], 0);
}

}  // namespace
}  // namespace mla
