// SPDX-License-Identifier: Apache-2.0
// PeerWindow (peer_exchange.h): all_gather / all_to_all by stores into the peers' windows.
//
// Window of each rank (bytes): [0] u32 epoch (calls completed), [4] u32 blocks finished in the running
// call, [8] u32 timed-out flag, [64] u64 arrivals (peers' blocks that completed their stores, all calls),
// [256...] data: 2 parities x W slots of `slot_` bytes; slot s of parity e & 1 receives rank s's block
// of call e. Every rank makes the same calls in the same order with the same grid (kBlocks), so call e
// is complete on this rank once arrivals >= e · (W − 1) · kBlocks.
//
// One kernel per call, kBlocks CTAs; CTA c owns 1/kBlocks of every block's 16-byte units:
//   1. store its units of the block for peer d into d's window, slot (parity, this rank), for each d;
//   2. fence (system scope), CTA barrier, thread 0 adds 1 to each peer's arrivals (system atomic);
//   3. thread 0 waits (ld.acquire.sys, bounded by the timeout) until this window's arrivals reach the
//      call's target, CTA barrier;
//   4. copies its units of every rank's block to out (this rank's own block from `in`, the others from
//      this window's slots, read through L2: they were written by other GPUs);
//   5. the last CTA to finish advances the epoch (read by the next call on this stream).
// Why no closing handshake is needed: a peer stores parity p slots of call e + 2 only after its call
// e + 1 saw this rank's call e + 1 arrivals, i.e. after this rank's call e kernel finished reading them
// (stream order); call e + 1 uses the other parity. Arrivals are monotonic, so a fast peer's next call
// may count here early without harm.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "mla/error.h"
#include "runtime/device_api.h"
#include "runtime/peer_exchange.h"

namespace mla::cuda_rt {
namespace {

constexpr std::size_t kEpoch = 0, kFinish = 4, kTimedOut = 8, kArrive = 64, kData = 256;
constexpr unsigned kBlocks = 16, kThreads = 512;
constexpr int kMagic = 0x4d4c4150;  // "MLAP"

struct Params {
  const char* in;                 // [W, block] (all_to_all) or [block] (all_gather)
  char* out;                      // [W, block]
  unsigned long long block;       // bytes per rank block, a multiple of 16
  unsigned long long slot;        // bytes per window slot
  unsigned long long timeout_ns;  // a wait longer than this gives up (flag at kTimedOut)
  char* win[kMaxPeerRanks];       // every rank's window, as this device addresses it
  int world, rank, gather;
};

__device__ unsigned long long load_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) peer_exchange_kernel(const __grid_constant__ Params p) {
  char* own = p.win[p.rank];
  const unsigned e = *reinterpret_cast<volatile unsigned*>(own + kEpoch) + 1;
  const unsigned long long parity = e & 1u;
  const unsigned long long units = p.block / 16, per = (units + gridDim.x - 1) / gridDim.x;
  const unsigned long long u0 = min(units, blockIdx.x * per), u1 = min(units, u0 + per);
  for (int d = 0; d < p.world; ++d) {  // 1. this rank's block for d, into d's slot (parity, rank)
    if (d == p.rank) continue;
    const auto* src = reinterpret_cast<const uint4*>(p.in + (p.gather ? 0ull : d * p.block));
    auto* dst = reinterpret_cast<uint4*>(p.win[d] + kData + (parity * p.world + p.rank) * p.slot);
    for (unsigned long long u = u0 + threadIdx.x; u < u1; u += blockDim.x) dst[u] = src[u];
  }
  __threadfence_system();  // 2. the stores before the arrival count, system-wide
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int d = 0; d < p.world; ++d)
      if (d != p.rank) atomicAdd_system(reinterpret_cast<unsigned long long*>(p.win[d] + kArrive), 1ull);
    // 3. every peer's CTAs of this call have stored into this window
    const unsigned long long target = static_cast<unsigned long long>(e) * (p.world - 1) * gridDim.x;
    const auto* arrivals = reinterpret_cast<const unsigned long long*>(own + kArrive);
    const unsigned long long start = global_ns();
    while (load_acquire_sys(arrivals) < target) {
      if (global_ns() - start > p.timeout_ns) {
        *reinterpret_cast<volatile unsigned*>(own + kTimedOut) = 1;
        break;
      }
    }
  }
  __syncthreads();
  for (int s = 0; s < p.world; ++s) {  // 4. every rank's block to out
    auto* dst = reinterpret_cast<uint4*>(p.out + s * p.block);
    if (s == p.rank) {
      const auto* src = reinterpret_cast<const uint4*>(p.in + (p.gather ? 0ull : s * p.block));
      for (unsigned long long u = u0 + threadIdx.x; u < u1; u += blockDim.x) dst[u] = src[u];
    } else {
      const auto* src = reinterpret_cast<const uint4*>(own + kData + (parity * p.world + s) * p.slot);
      for (unsigned long long u = u0 + threadIdx.x; u < u1; u += blockDim.x) dst[u] = __ldcg(src + u);
    }
  }
  __syncthreads();  // 5. the last CTA advances the epoch
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(reinterpret_cast<unsigned*>(own + kFinish), 1u) == gridDim.x - 1) {
      *reinterpret_cast<volatile unsigned*>(own + kFinish) = 0;
      *reinterpret_cast<volatile unsigned*>(own + kEpoch) = e;
    }
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("peer exchange: ") + what + ": " + cudaGetErrorString(e));
}
void require(bool ok, const std::string& what) {
  if (!ok) throw Error("peer exchange: " + what);
}
std::string str(long long v) { return std::to_string(v); }

struct Record {  // PeerRecord's bytes
  int magic, pid, device, world;
  unsigned long long base;
  char host[40];
  cudaIpcMemHandle_t ipc;
};
static_assert(sizeof(Record) <= sizeof(PeerRecord), "PeerRecord too small");

}  // namespace

PeerWindow::PeerWindow(int device, int rank, int world, std::size_t bytes)
    : device_(device), rank_(rank), world_(world), bytes_(std::max<std::size_t>(bytes, std::size_t{1} << 20)) {
  require(world >= 1 && world <= kMaxPeerRanks && rank >= 0 && rank < world,
          "need 1 <= world <= " + str(kMaxPeerRanks) + " and 0 <= rank < world, got rank " + str(rank) + " of " +
              str(world));
  slot_ = (bytes_ - kData) / (2 * static_cast<std::size_t>(world)) / 256 * 256;
  const ScopedDevice on_device(device_, "peer exchange");
  check(cudaMalloc(&base_, bytes_), "cudaMalloc of the window");
  check(cudaMemset(base_, 0, bytes_), "cudaMemset of the window");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // Load the kernel now (lazy loading would load it at the first call, when a peer GPU may already
  // run its half of the exchange: some driver calls then wait for every GPU of the process to drain).
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, peer_exchange_kernel), "loading the exchange kernel");
  peers_[static_cast<std::size_t>(rank_)] = base_;
}

PeerWindow::~PeerWindow() {
  int prev = -1;
  const bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
  cudaSetDevice(device_);
  for (int r = 0; r < world_; ++r)
    if (ipc_[static_cast<std::size_t>(r)]) cudaIpcCloseMemHandle(peers_[static_cast<std::size_t>(r)]);
  if (base_) cudaFree(base_);
  if (restore) cudaSetDevice(prev);
  cudaGetLastError();  // nothing to report from a destructor
}

PeerRecord PeerWindow::record() const {
  Record r{};
  r.magic = kMagic;
  r.pid = static_cast<int>(::getpid());
  r.device = device_;
  r.world = world_;
  r.base = reinterpret_cast<unsigned long long>(base_);
  ::gethostname(r.host, sizeof r.host - 1);
  const ScopedDevice on_device(device_, "peer exchange");
  check(cudaIpcGetMemHandle(&r.ipc, base_), "cudaIpcGetMemHandle");
  PeerRecord out{};
  std::memcpy(out.data(), &r, sizeof r);
  return out;
}

void PeerWindow::open(const std::vector<PeerRecord>& records) {
  require(static_cast<int>(records.size()) == world_,
          "expected " + str(world_) + " records, got " + str(static_cast<long long>(records.size())));
  const ScopedDevice on_device(device_, "peer exchange");
  Record me{};
  std::memcpy(&me, records[static_cast<std::size_t>(rank_)].data(), sizeof me);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Record r{};
    std::memcpy(&r, records[static_cast<std::size_t>(p)].data(), sizeof r);
    require(r.magic == kMagic && r.world == world_, "rank " + str(p) + "'s record is not a window of this group");
    require(std::strncmp(r.host, me.host, sizeof r.host) == 0,
            "rank " + str(p) + " is on host '" + r.host + "', this rank on '" + me.host +
                "' (windows map only within one host)");
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device_, r.device), "cudaDeviceCanAccessPeer");
    require(can == 1 || r.device == device_,
            "device " + str(device_) + " cannot access device " + str(r.device) + " (no peer access)");
    if (r.pid == me.pid) {  // threads of one process: the peer's pointer, with peer access enabled
      if (r.device != device_) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(r.device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else check(e, "cudaDeviceEnablePeerAccess");
      }
      peers_[static_cast<std::size_t>(p)] = reinterpret_cast<char*>(r.base);
    } else {
      void* ptr = nullptr;
      check(cudaIpcOpenMemHandle(&ptr, r.ipc, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      peers_[static_cast<std::size_t>(p)] = static_cast<char*>(ptr);
      ipc_[static_cast<std::size_t>(p)] = true;
    }
  }
}

void PeerWindow::launch(const void* in, void* out, std::size_t block, bool gather, void* stream) {
  require(block % 16 == 0 && block <= slot_ && reinterpret_cast<std::uintptr_t>(in) % 16 == 0 &&
              reinterpret_cast<std::uintptr_t>(out) % 16 == 0,
          "blocks must be multiples of 16 bytes up to " + str(static_cast<long long>(slot_)) +
              " at 16-byte aligned addresses, got " + str(static_cast<long long>(block)) + " bytes");
  for (int p = 0; p < world_; ++p)
    require(peers_[static_cast<std::size_t>(p)] != nullptr, "rank " + str(p) + "'s window is not open");
  Params prm{};
  prm.in = static_cast<const char*>(in);
  prm.out = static_cast<char*>(out);
  prm.block = block;
  prm.slot = slot_;
  prm.timeout_ns = timeout_ns_;
  for (int p = 0; p < world_; ++p) prm.win[p] = peers_[static_cast<std::size_t>(p)];
  prm.world = world_;
  prm.rank = rank_;
  prm.gather = gather ? 1 : 0;
  const ScopedDevice on_device(device_, "peer exchange");
  peer_exchange_kernel<<<kBlocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(prm);
  check(cudaGetLastError(), gather ? "all_gather launch" : "all_to_all launch");
}

void PeerWindow::all_gather(const void* in, void* out, std::size_t block, void* stream) {
  launch(in, out, block, true, stream);
}
void PeerWindow::all_to_all(const void* in, void* out, std::size_t block, void* stream) {
  launch(in, out, block, false, stream);
}

bool PeerWindow::timed_out() const {
  unsigned flag = 0;
  const ScopedDevice on_device(device_, "peer exchange");
  check(cudaMemcpy(&flag, base_ + kTimedOut, sizeof flag, cudaMemcpyDeviceToHost), "reading the timeout flag");
  return flag != 0;
}

}  // namespace mla::cuda_rt
