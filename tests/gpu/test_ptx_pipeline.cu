// SPDX-License-Identifier: Apache-2.0
// Device test of a warp-specialised pipeline built from the Hopper wrappers (setmaxnreg.cuh,
// warpgroup.cuh, mbarrier.cuh, tma.cuh bulk copies): per CTA, warpgroup 0 gives registers back
// (setmaxnreg_dec) and one elected thread streams 16 KiB chunks of a 48 MiB array into a 4-stage ring with
// cp.async.bulk; warpgroups 1 and 2 take registers (setmaxnreg_inc), each transforms half of every
// stage into the output and releases the stage. Every output byte is checked. Also checks elect.one
// picks exactly one lane per warp and that the warp / warpgroup indices agree with threadIdx.
// SASS (scripts/sass_summary.sh, sm_90a): USETMAXREG x2, UBLKCP, no LDL/STL; the build
// prints no C7508 (setmaxnreg ignored) warning.
#include <vector>

#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;

constexpr int kStages = 4, kChunk = 16384, kThreads = 3 * kWarpgroupThreads;

__device__ __forceinline__ uint32_t transform(uint32_t v, uint32_t word) { return (v ^ 0x5A5A5A5Au) + word; }

__global__ void __launch_bounds__(kThreads, 1)
    ws_pipeline_kernel(const uint8_t* in, uint8_t* out, int64_t chunks, int* role_errors) {
  extern __shared__ uint8_t raw[];
  uint8_t* ring = align1024(raw);
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ int elected[kThreads / 32];
  if (threadIdx.x < kThreads / 32) elected[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * kWarpgroupThreads);  // every consumer thread releases every stage
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int warp = canonical_warp_idx();
  if (elect_one_sync()) atomicAdd(&elected[warp], 1);
  if (warp != static_cast<int>(threadIdx.x / 32) || warpgroup_index() != static_cast<int>(threadIdx.x / 128) ||
      warp_idx_in_warpgroup() != static_cast<int>((threadIdx.x / 32) % 4))
    atomicAdd(role_errors, 1);

  // This CTA's chunks: blockIdx.x, blockIdx.x + gridDim.x, ...
  const int64_t mine = chunks > blockIdx.x ? (chunks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  if (warpgroup_index() == 0) {
    setmaxnreg_dec<40>();
    if (warp == 0 && elect_one_sync()) {
      for (int64_t i = 0; i < mine; ++i) {
        const int s = static_cast<int>(i % kStages);
        if (i >= kStages) mbar_wait(&empty[s], static_cast<uint32_t>(((i / kStages) & 1) ^ 1));
        mbar_arrive_expect_tx(&full[s], kChunk);
        const int64_t c = blockIdx.x + i * gridDim.x;
        bulk_load(ring + s * kChunk, in + c * kChunk, kChunk, &full[s], L2Hint::evict_first);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int half = warpgroup_index() - 1, lt = threadIdx.x % kWarpgroupThreads;
    for (int64_t i = 0; i < mine; ++i) {
      const int s = static_cast<int>(i % kStages);
      mbar_wait(&full[s], static_cast<uint32_t>((i / kStages) & 1));
      const int64_t c = blockIdx.x + i * gridDim.x;
      const auto* src = reinterpret_cast<const uint4*>(ring + s * kChunk + half * (kChunk / 2));
      auto* dst = reinterpret_cast<uint4*>(out + c * kChunk + half * (kChunk / 2));
      for (int v = lt; v < kChunk / 2 / 16; v += kWarpgroupThreads) {
        uint4 x = src[v];
        const uint32_t word = static_cast<uint32_t>((c * kChunk + half * (kChunk / 2)) / 4 + v * 4);
        x.x = transform(x.x, word), x.y = transform(x.y, word + 1), x.z = transform(x.z, word + 2),
        x.w = transform(x.w, word + 3);
        dst[v] = x;
      }
      mbar_arrive(&empty[s]);
    }
  }
  __syncthreads();
  if (threadIdx.x < kThreads / 32 && elected[threadIdx.x] != 1) atomicAdd(role_errors, 100);
}

TEST(PtxPipeline, WarpSpecialisedRingWithSetmaxnregMovesEveryByte) {
  MLA_SKIP_UNLESS_SM90();
  constexpr int64_t kChunks = 3072;  // 48 MiB
  const std::size_t bytes = static_cast<std::size_t>(kChunks) * kChunk;
  std::vector<uint32_t> host(bytes / 4);
  uint32_t x = 0x9E3779B9u;
  for (auto& v : host) v = (x = x * 1664525u + 1013904223u);
  test::DevBuf<uint32_t> in(host), out(host.size());
  out.fill_bytes(0xAB);
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = kStages * kChunk + 1024;
  MLA_CUDA_OK(cudaFuncSetAttribute(ws_pipeline_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  ws_pipeline_kernel<<<sms, kThreads, smem>>>(reinterpret_cast<const uint8_t*>(in.p),
                                              reinterpret_cast<uint8_t*>(out.p), kChunks, errors.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(errors.download()[0], 0) << "warp / warpgroup index or elect.one mismatch";
  const std::vector<uint32_t> got = out.download();
  int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const uint32_t want = (host[i] ^ 0x5A5A5A5Au) + static_cast<uint32_t>(i);
    if (got[i] != want && ++bad <= 5) ADD_FAILURE() << "word " << i << ": got " << got[i] << " want " << want;
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace mla
