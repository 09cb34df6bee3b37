// SPDX-License-Identifier: Apache-2.0
// Device tests of the Hopper helpers around the main pipeline: named barriers (barrier.cuh), stmatrix
// (stmatrix.cuh) and TMA stores with bulk async-groups (tma_store.cuh). Each can fail: the barrier test
// delays writers so that a barrier that did not wait shows stale values; stmatrix's placement is
// checked element by element (and round-tripped through ldmatrix); TMA stores are checked against the
// box's clipped placement with everything outside left untouched.
#include <cuda.h>

#include <array>
#include <vector>

#include "cuda/common/ptx/barrier.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/fence.cuh"
#include "cuda/common/ptx/ldmatrix.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/stmatrix.cuh"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/common/ptx/tma_store.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using namespace cuda::ptx;

// 8 warps. Round 1: warps 0-3 and 4-7 each sync on their own barrier (ids 1, 2) after late writes and
// read a value another warp of their group wrote. Round 2: warp 4 writes then bar.arrive's on id 3;
// warps 0-3 bar.sync on it (160 threads) and read warp 4's values.
__global__ void named_barrier_kernel(int* errors) {
  __shared__ int vals[256], late[32];
  const int tid = threadIdx.x, warp = tid / 32, group = warp / 4, local = tid % 128;
  __nanosleep(4000 * (warp % 4));
  vals[tid] = tid * 3 + 1;
  named_barrier_sync(1 + group, 128);
  const int other = group * 128 + (local + 64) % 128;
  if (vals[other] != other * 3 + 1) atomicAdd(errors, 1);
  if (warp == 4) {
    __nanosleep(20000);
    late[tid % 32] = tid * 7;
    named_barrier_arrive(3, 160);
  } else if (warp < 4) {
    named_barrier_sync(3, 160);
    if (late[tid % 32] != (128 + tid % 32) * 7) atomicAdd(errors, 100);
  }
}

TEST(PtxBarrier, NamedBarriersSyncOnlyTheirWarps) {
  MLA_SKIP_WITHOUT_GPU();
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  named_barrier_kernel<<<1, 256>>>(errors.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(errors.download()[0], 0);
}

// The hand-over protocol of the seesaw decode kernel (attention/sm90/seesaw/kernel.cuh), in a loop: warpgroup
// 0 writes a buffer and bar.arrive's on id 2; warpgroup 1 bar.sync's on it, checks every value, and
// bar.arrive's on id 3 (owed only when another round follows) before warpgroup 0 may rewrite the buffer
// (bar.sync on 3). Writers are delayed so that a hand-over that did not wait reads the previous round.
// Under compute-sanitizer racecheck this is the reference for reading reports on the kernel's barriers.
__global__ void barrier_handover_kernel(int rounds, int* errors) {
  __shared__ int buf[128];
  const int tid = threadIdx.x, wg = tid / 128, local = tid % 128;
  for (int r = 0; r < rounds; ++r) {
    if (wg == 0) {
      if (r > 0) named_barrier_sync(3, 256);
      __nanosleep(200 * (local % 7));
      buf[(local + 37) % 128] = r * 1000 + local;
      named_barrier_arrive(2, 256);
    } else {
      named_barrier_sync(2, 256);
      const int k = (local + 91) % 128;  // written by thread (k + 91) % 128 of warpgroup 0
      if (buf[k] != r * 1000 + (k + 91) % 128) atomicAdd(errors, 1);
      if (r + 1 < rounds) named_barrier_arrive(3, 256);
    }
  }
}

TEST(PtxBarrier, ArriveSyncHandOverInALoop) {
  MLA_SKIP_WITHOUT_GPU();
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  barrier_handover_kernel<<<1, 256>>>(64, errors.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(errors.download()[0], 0);
}

// The raw decode kernel's Q slot (attention/sm90/raw/kernel.cuh, RawTraits::kQSlot), in a loop: the producer
// warpgroup fills a shared buffer by cp.async (completion on the `full` mbarrier), each consumer warpgroup reads
// its half, the two meet on a 256-thread named barrier, and only consumer warpgroup 1 hands the buffer back (128
// arrivals on `empty`) before the next round's copies overwrite it. Warpgroup 0's reads are ordered before that
// release by the named barrier: correct by construction, and delayed so that a hand-over that did not wait reads
// the next round. Under compute-sanitizer racecheck this is the reference for the reports on the raw kernel's
// staged Q (store_q_permuted / q_row_amax against produce_raw's copies; docs/DEVELOPING.md's sanitizer table).
__global__ void slot_release_by_one_group_kernel(const int4* src, int rounds, int* errors) {
  __shared__ alignas(16) int4 buf[256];
  __shared__ alignas(8) uint64_t full, empty;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    mbar_init(&full, 128);
    mbar_init(&empty, 128);
    fence_mbarrier_init();
  }
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    if (wg == 0) {
      if (r > 0) mbar_wait(&empty, (r - 1) & 1);
      for (int i = tid; i < 256; i += 128) cp_async_16_or_zero(&buf[i], &src[r * 256 + i], false);
      cp_async_arrive_mbarrier(&full);
    } else {
      const int c = tid - 128;
      mbar_wait(&full, r & 1);
      if (wg == 1) __nanosleep(300 * (c % 7));
      if (buf[c].x != r * 256 + c) atomicAdd(errors, 1);
      named_barrier_sync(1, 256);
      if (wg == 2) mbar_arrive(&empty);
    }
  }
  if (wg == 0) {  // no copies in flight at exit
    cp_async_commit();
    cp_async_wait<0>();
  }
}

// Runs a slot probe kernel (src: chunk i of round r holds r * chunks + i in .x) for one round and for 16 and
// expects it to have counted no error.
void expect_slot_probe_clean(void (*kernel)(const int4*, int, int*), int threads, int chunks) {
  constexpr int kRounds = 16;
  std::vector<int4> host(static_cast<std::size_t>(kRounds * chunks));
  for (int i = 0; i < kRounds * chunks; ++i) host[static_cast<std::size_t>(i)] = make_int4(i, 0, 0, 0);
  test::DevBuf<int4> src(host.size());
  src.upload(host);
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  for (const int rounds : {1, kRounds}) {
    kernel<<<1, threads>>>(src.p, rounds, errors.p);
    MLA_CUDA_OK(cudaDeviceSynchronize());
  }
  EXPECT_EQ(errors.download()[0], 0);
}

TEST(PtxBarrier, SlotReleasedByOneOfTwoReadingWarpgroups) {
  MLA_SKIP_WITHOUT_GPU();
  expect_slot_probe_clean(slot_release_by_one_group_kernel, 384, 256);
}

// The N 16 V4 kernel's record ring (attention/sm90/convert/n16.cuh RingLoader, kernel.cuh RingFeed), in a loop: a
// loader warp waits `empty`, fills a slot by cp.async (each lane's copies counted on `full` by
// cp.async.mbarrier.arrive.noinc, lane 0 arrives too: 33 arrivals), a reader warp waits `full`, every lane reads
// chunks other lanes copied, then __syncwarp and lane 0 alone arrives on `empty` (count 1) before the next round's
// copies overwrite the slot. The other lanes' reads are ordered before that release by __syncwarp: correct by
// construction, and the readers are delayed so that a release that did not wait shows the next round's values.
// Under compute-sanitizer racecheck this is the reference for the reports on the ring (RingFeed's records::Warp
// reads against RingLoader's copies; docs/DEVELOPING.md's sanitizer table).
__global__ void slot_release_by_lane0_kernel(const int4* src, int rounds, int* errors) {
  __shared__ alignas(16) int4 buf[64];
  __shared__ alignas(8) uint64_t full, empty;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar_init(&full, 33);
    mbar_init(&empty, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    if (warp == 0) {
      if (r > 0) mbar_wait(&empty, (r - 1) & 1);
      cp_async_16(&buf[lane], &src[r * 64 + lane]);
      cp_async_16(&buf[lane + 32], &src[r * 64 + lane + 32]);
      cp_async_arrive_mbarrier(&full);
      if (lane == 0) mbar_arrive(&full);
    } else {
      mbar_wait(&full, r & 1);
      __nanosleep(300 * (lane % 7));
      const int a = (lane + 13) % 64, b = (lane + 45) % 64;  // chunks copied by other lanes
      if (buf[a].x != r * 64 + a || buf[b].x != r * 64 + b) atomicAdd(errors, 1);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty);
    }
  }
  if (warp == 0) {  // no copies in flight at exit
    cp_async_commit();
    cp_async_wait<0>();
  }
}

TEST(PtxBarrier, RingSlotReleasedByLaneZeroAfterSyncwarp) {
  MLA_SKIP_WITHOUT_GPU();
  expect_slot_probe_clean(slot_release_by_lane0_kernel, 64, 64);
}

// The seesaw kernel's epilogue exchange (attention/sm90/seesaw/kernel.cuh run(): each consumer warpgroup
// writes its row sums, bar.sync on a named barrier counted for the two consumer warpgroups only, then
// every thread reads both halves), in a 384-thread block whose first warpgroup (the producers) takes no
// part and exits early. bar.sync on both sides: correct by construction, checked by the values read.
// Under compute-sanitizer racecheck this is the reference for reports on that exchange (docs/DEVELOPING.md "GPU
// sanitizers").
__global__ void partial_sync_exchange_kernel(int rounds, int* errors) {
  __shared__ float sL[2][128];
  const int tid = threadIdx.x, wg = tid / 128, local = tid % 128;
  if (wg == 0) return;  // the producer warpgroup
  const int c = wg - 1;
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) named_barrier_sync(1, 256);  // both consumers read round r - 1 before it is rewritten
    __nanosleep(100 * (local % 5));
    sL[c][local] = static_cast<float>(r * 1000 + c * 300 + local);
    named_barrier_sync(1, 256);
    const int k = (local + 53) % 128;
    if (sL[1 - c][k] != static_cast<float>(r * 1000 + (1 - c) * 300 + k)) atomicAdd(errors, 1);
  }
}

// A 384-thread exchange kernel (rounds, error count) run for 1 and 16 rounds: no wrong value read.
void expect_exchange_clean(void (*kernel)(int, int*)) {
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  for (const int rounds : {1, 16}) {
    kernel<<<1, 384>>>(rounds, errors.p);
    MLA_CUDA_OK(cudaDeviceSynchronize());
  }
  EXPECT_EQ(errors.download()[0], 0);
}

TEST(PtxBarrier, SyncSyncExchangeBetweenTwoOfThreeWarpgroups) {
  MLA_SKIP_WITHOUT_GPU();
  expect_exchange_clean(partial_sync_exchange_kernel);
}

// The seesaw epilogue's barrier as that kernel reaches it (attention/sm90/seesaw/kernel.cuh SeesawBase<C, ...>::finish):
// each consumer warpgroup runs its own template instance, so the two reach the 256-thread named barrier from two
// different PCs, right after a store by one lane in four. Correct by construction (bar.sync on both sides, values
// checked). Under compute-sanitizer synccheck: the reference for its "Divergent thread(s) in block" report on
// finish() (docs/DEVELOPING.md "GPU sanitizers"): flagged here too means
// a tool limit, clean here means a fault there.
template <int C>
__device__ __noinline__ void two_pc_exchange_side(float* sL, int r, int local, int* errors) {
  if ((local & 3) == 0) sL[C * 32 + local / 4] = static_cast<float>(r * 1000 + C * 300 + local / 4);
  named_barrier_sync(1, 256);
  const int k = (local / 4 + 7) % 32;
  if (sL[(1 - C) * 32 + k] != static_cast<float>(r * 1000 + (1 - C) * 300 + k)) atomicAdd(errors, 1);
  named_barrier_sync(1, 256);  // both sides read round r before it is rewritten
}
__global__ void two_pc_exchange_kernel(int rounds, int* errors) {
  __shared__ float sL[2 * 32];
  const int tid = threadIdx.x, wg = tid / 128, local = tid % 128;
  if (wg == 0) return;  // the producer warpgroup
  for (int r = 0; r < rounds; ++r) {
    if (wg == 1) two_pc_exchange_side<0>(sL, r, local, errors);
    else two_pc_exchange_side<1>(sL, r, local, errors);
  }
}

TEST(PtxBarrier, NamedBarrierFromTwoTemplateInstances) {
  MLA_SKIP_WITHOUT_GPU();
  expect_exchange_clean(two_pc_exchange_kernel);
}

// Both patterns in one kernel, as the decode kernels have them: per round, consumer 1 hands a buffer to
// consumer 0 by bar.arrive (id 2) / bar.sync and consumer 0 releases it by bar.arrive (id 3), then the two
// exchange a second buffer with bar.sync on both sides (id 1), the producer warpgroup idle. Correct by
// construction (values checked). Under racecheck: whether reports on the sync / sync exchange appear
// once the same warps also use arrive / sync hand-overs (docs/DEVELOPING.md "GPU sanitizers", the small kernel's
// epilogue).
__global__ void mixed_handover_kernel(int rounds, int* errors) {
  __shared__ float a[128], x[2][128];
  const int tid = threadIdx.x, wg = tid / 128, local = tid % 128;
  if (wg == 0) return;
  const int c = wg - 1;
  for (int r = 0; r < rounds; ++r) {
    if (c == 1) {
      if (r > 0) named_barrier_sync(3, 256);
      a[(local + 11) % 128] = static_cast<float>(r * 7 + local);
      named_barrier_arrive(2, 256);
    } else {
      named_barrier_sync(2, 256);
      const int k = (local + 29) % 128;  // written by thread (k + 117) % 128 of consumer 1
      if (a[k] != static_cast<float>(r * 7 + (k + 117) % 128)) atomicAdd(errors, 1);
      if (r + 1 < rounds) named_barrier_arrive(3, 256);
    }
    __nanosleep(100 * (local % 3));
    x[c][local] = static_cast<float>(r * 1000 + c * 300 + local);
    named_barrier_sync(1, 256);
    const int k = (local + 53) % 128;
    if (x[1 - c][k] != static_cast<float>(r * 1000 + (1 - c) * 300 + k)) atomicAdd(errors, 1);
    named_barrier_sync(1, 256);  // both read x before the next round rewrites it
  }
}

TEST(PtxBarrier, ArriveSyncHandOverThenSyncSyncExchange) {
  MLA_SKIP_WITHOUT_GPU();
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  mixed_handover_kernel<<<1, 384>>>(16, errors.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(errors.download()[0], 0);
}

__host__ __device__ inline uint16_t stm_value(int i, int r, int c) { return static_cast<uint16_t>(i * 64 + r * 8 + c + 1); }

// One warp stores the four matrices (value stm_value) with stmatrix and stmatrix.trans into two 16x16
// tiles (matrix i at rows (i % 2) * 8, cols (i / 2) * 8), copies both out, and reloads the plain tile
// with ldmatrix to compare with the registers it stored.
__global__ void stmatrix_kernel(uint16_t* plain_out, uint16_t* trans_out, int* roundtrip_errors) {
  __shared__ __align__(128) uint16_t plain[256], trans[256];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t r[4];
  for (int i = 0; i < 4; ++i)
    r[i] = static_cast<uint32_t>(stm_value(i, g, 2 * t)) | (static_cast<uint32_t>(stm_value(i, g, 2 * t + 1)) << 16);
  const int row = ((lane / 8) % 2) * 8 + lane % 8, col = (lane / 16) * 8;
  stmatrix_x4(plain + row * 16 + col, r);
  stmatrix_x4_trans(trans + row * 16 + col, r);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) plain_out[e] = plain[e], trans_out[e] = trans[e];
  uint32_t back[4];
  ldmatrix_x4(back, plain + row * 16 + col);
  for (int i = 0; i < 4; ++i)
    if (back[i] != r[i]) atomicAdd(roundtrip_errors, 1);
}

TEST(PtxStmatrix, PlacementAndLdmatrixRoundTrip) {
  MLA_SKIP_UNLESS_SM90();
  test::DevBuf<uint16_t> plain(256), trans(256);
  test::DevBuf<int> errors(1);
  errors.fill_bytes(0);
  stmatrix_kernel<<<1, 32>>>(plain.p, trans.p, errors.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> p = plain.download(), q = trans.download();
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) {
        const int base = (i % 2) * 8 * 16 + (i / 2) * 8;
        EXPECT_EQ(p[base + r * 16 + c], stm_value(i, r, c)) << "plain: matrix " << i << " (" << r << "," << c << ")";
        EXPECT_EQ(q[base + c * 16 + r], stm_value(i, r, c)) << "trans: matrix " << i << " (" << r << "," << c << ")";
      }
  EXPECT_EQ(errors.download()[0], 0) << "ldmatrix did not read back what stmatrix stored";
}

__host__ __device__ inline uint16_t tile_value(int64_t i) { return static_cast<uint16_t>((i * 40503) | 1); }

// 128 threads write box element k (row-major over the box) = tile_value(k) into its shared position
// (128B swizzle when `swizzled`), fence, and one thread stores the box at `at`.
__global__ void tma_store_kernel(const __grid_constant__ CUtensorMap map, int rank, int32_t c0, int32_t c1, int32_t c2,
                                 int box0, int elems, int swizzled) {
  extern __shared__ uint8_t raw[];
  uint8_t* tile = align1024(raw);
  for (int k = threadIdx.x; k < elems; k += blockDim.x) {
    const int row = k / box0, x = (k % box0) * 2;
    const int off = swizzled ? row * 128 + (((x / 16) ^ (row % 8)) * 16) + x % 16 : row * box0 * 2 + x;
    *reinterpret_cast<uint16_t*>(tile + off) = tile_value(k);
  }
  fence_proxy_async_smem();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (rank == 2) tma_store_2d(&map, tile, c0, c1);
    else tma_store_3d(&map, tile, c0, c1, c2);
    bulk_commit_group();
    bulk_wait_group_read<0>();
    bulk_wait_group<0>();
  }
}

struct StoreCase {
  std::array<int64_t, 3> dims;
  std::array<int32_t, 3> box, at;
  int rank;
  bool swizzle;
};

void check_store(const StoreCase& sc) {
  const int r = sc.rank;
  std::array<int64_t, 3> stride{1, sc.dims[0], sc.dims[0] * sc.dims[1]};
  const int64_t total = stride[r - 1] * sc.dims[r - 1];
  constexpr uint16_t kUntouched = 0x7777;
  test::DevBuf<uint16_t> dst(std::vector<uint16_t>(static_cast<std::size_t>(total), kUntouched));
  TmaTensor t;
  t.base = dst.p;
  t.rank = r;
  for (int i = 0; i < r; ++i) t.dims[i] = sc.dims[i], t.strides[i] = stride[i], t.box[i] = sc.box[i];
  t.swizzle = sc.swizzle ? TmaSwizzle::b128 : TmaSwizzle::none;
  const CUtensorMap map = make_tensor_map(t, "tma store test");
  const int elems = static_cast<int>(box_bytes(t) / 2), smem = elems * 2 + 1024;
  MLA_CUDA_OK(cudaFuncSetAttribute(tma_store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tma_store_kernel<<<1, 128, smem>>>(map, r, sc.at[0], sc.at[1], r == 3 ? sc.at[2] : 0, sc.box[0], elems,
                                     sc.swizzle);
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dst.download();
  int bad = 0;
  for (int64_t i = 0; i < total; ++i) {
    const int64_t g[3] = {i % sc.dims[0], (i / sc.dims[0]) % sc.dims[1], r == 3 ? i / stride[2] : 0};
    int64_t k = 0, mul = 1;
    bool in_box = true;
    for (int d = 0; d < r; ++d) {
      const int64_t b = g[d] - sc.at[d];
      in_box = in_box && b >= 0 && b < sc.box[d];
      k += b * mul;
      mul *= sc.box[d];
    }
    const uint16_t want = in_box ? tile_value(k) : kUntouched;
    if (got[i] != want && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want << (in_box ? " (stored)" : " (untouched)");
  }
  EXPECT_EQ(bad, 0);
}

TEST(PtxTmaStore, BoxesLandClippedAndNothingElseIsWritten) {
  MLA_SKIP_UNLESS_SM90();
  const std::vector<StoreCase> cases = {
      {{104, 70, 1}, {64, 32, 1}, {8, 16, 0}, 2, false},  // rows of 208 bytes: TMA strides are 16-byte multiples
      {{104, 70, 1}, {64, 32, 1}, {48, 50, 0}, 2, true},  // clipped in both dimensions, swizzled tile
      {{64, 20, 5}, {64, 8, 2}, {0, 16, 4}, 3, true},
  };
  for (const StoreCase& sc : cases) {
    SCOPED_TRACE("rank " + std::to_string(sc.rank) + (sc.swizzle ? " swizzle128" : " plain"));
    check_store(sc);
  }
}

}  // namespace
}  // namespace mla
