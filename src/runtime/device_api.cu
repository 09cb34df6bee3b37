// SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/device_api.h"
#include "mla/error.h"

namespace mla::cuda_rt {
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": CUDA error " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int d) {
    cudaGetDevice(&prev);
    if (prev != d) check(cudaSetDevice(d), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    cudaGetDevice(&cur);
    if (prev >= 0 && cur != prev) cudaSetDevice(prev);
  }
};
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {
DeviceInfo read_device_info(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceInfo i;
  i.name = p.name;
  i.sm_count = p.multiProcessorCount;
  i.cc_major = p.major;
  i.cc_minor = p.minor;
  i.total_mem = p.totalGlobalMem;
  i.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  i.smem_per_block_optin = p.sharedMemPerBlockOptin;
  return i;
}
}  // namespace

const DeviceInfo& device_info(int device) {
  constexpr int kDevices = 64;
  static std::mutex mu;
  static std::array<std::unique_ptr<DeviceInfo>, kDevices> cache;
  if (device < 0 || device >= kDevices)
    throw Error("device_info: CUDA device index must be in [0, " + std::to_string(kDevices) + "), got " +
                std::to_string(device));
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[static_cast<std::size_t>(device)];
  if (!slot) slot = std::make_unique<DeviceInfo>(read_device_info(device));  // throws before caching on failure
  return *slot;
}

void* malloc(std::size_t bytes, int device) {
  DeviceGuard g(device);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}

void free(void* p, int device) noexcept {
  if (!p) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaFree(p);
  if (prev >= 0) cudaSetDevice(prev);
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), "cudaHostAlloc");
  return p;
}

void host_free(void* p) noexcept {
  if (p) cudaFreeHost(p);
}

void memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing resolves the direction
  const int dev = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  DeviceGuard g(dev);
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

void memset(void* dst, int device, int value, std::size_t bytes) {
  DeviceGuard g(device);
  check(cudaMemset(dst, value, bytes), "cudaMemset");
}

void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream, int device) {
  if (bytes == 0) return;
  DeviceGuard g(device);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
}

void memset_async(void* dst, int value, std::size_t bytes, void* stream, int device) {
  if (bytes == 0) return;
  DeviceGuard g(device);
  check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                    std::size_t height, void* stream, int device) {
  if (width == 0 || height == 0) return;
  DeviceGuard g(device);
  check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                          static_cast<cudaStream_t>(stream)),
        "cudaMemcpy2DAsync");
}

namespace {
// One thread an access of V bytes, the [n][h] rows flattened; V divides width, every stride and both addresses.
template <class V>
__global__ void __launch_bounds__(256) copy_rows_kernel(uint8_t* dst, int64_t dst_s0, int64_t dst_s1, const uint8_t* src,
                                                        int64_t src_s0, int64_t src_s1, int64_t h, int64_t per_row,
                                                        int64_t total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // a dependent launch: nothing global before it
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / per_row, k = e % per_row, t = row / h, j = row % h;
    const int64_t off = k * static_cast<int64_t>(sizeof(V));
    *reinterpret_cast<V*>(dst + t * dst_s0 + j * dst_s1 + off) =
        *reinterpret_cast<const V*>(src + t * src_s0 + j * src_s1 + off);
  }
}

template <class V>
void launch_copy_rows(uint8_t* dst, int64_t dst_s0, int64_t dst_s1, const uint8_t* src, int64_t src_s0, int64_t src_s1,
                      int64_t n, int64_t h, int64_t width, cudaStream_t stream, int device, bool pdl) {
  constexpr int kThreads = 256;
  const int64_t per_row = width / static_cast<int64_t>(sizeof(V)), total = n * h * per_row;
  const auto grid = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 4096));
  auto* kernel = &copy_rows_kernel<V>;
  if (pdl) {  // only where the image carries griddepcontrol (sm_90 code): older images start after their predecessor
    // The image's version, read once per device (0 unknown, 1 dependent launches allowed, 2 not).
    static std::array<std::atomic<int>, 64> known{};
    const bool indexed = device >= 0 && device < 64;
    int state = indexed ? known[device].load(std::memory_order_relaxed) : 0;
    if (state == 0) {
      cudaFuncAttributes a{};
      if (cudaFuncGetAttributes(&a, kernel) == cudaSuccess) state = a.ptxVersion >= 90 ? 1 : 2;
      else {
        (void)cudaGetLastError();
        state = 2;
      }
      if (indexed) known[device].store(state, std::memory_order_relaxed);
    }
    pdl = state == 1;
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, dst, dst_s0, dst_s1, src, src_s0, src_s1, h, per_row, total),
        "copy_rows_async");
}
}  // namespace

void copy_rows_async(void* dst, int64_t dst_s0, int64_t dst_s1, const void* src, int64_t src_s0, int64_t src_s1,
                     int64_t n, int64_t h, int64_t width, void* stream, int device, bool pdl) {
  if (n <= 0 || h <= 0 || width <= 0) return;
  DeviceGuard g(device);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const auto bits = static_cast<uint64_t>(width | dst_s0 | dst_s1 | src_s0 | src_s1) |
                    reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  const auto st = static_cast<cudaStream_t>(stream);
  if (bits % 16 == 0) launch_copy_rows<uint4>(d, dst_s0, dst_s1, s, src_s0, src_s1, n, h, width, st, device, pdl);
  else if (bits % 8 == 0) launch_copy_rows<uint2>(d, dst_s0, dst_s1, s, src_s0, src_s1, n, h, width, st, device, pdl);
  else if (bits % 4 == 0) launch_copy_rows<uint32_t>(d, dst_s0, dst_s1, s, src_s0, src_s1, n, h, width, st, device, pdl);
  else if (bits % 2 == 0) launch_copy_rows<uint16_t>(d, dst_s0, dst_s1, s, src_s0, src_s1, n, h, width, st, device, pdl);
  else launch_copy_rows<uint8_t>(d, dst_s0, dst_s1, s, src_s0, src_s1, n, h, width, st, device, pdl);
}

namespace {
// Per-thread side streams and join events, one per device (never destroyed: they live as long as the
// thread's CUDA context does, and destroying them at thread exit could race the context's teardown).
struct ThreadStreams {
  cudaStream_t side[64] = {};
  cudaEvent_t join[64] = {};
};
thread_local ThreadStreams t_streams;
}  // namespace

void* side_stream(int device) {
  if (device < 0 || device >= 64) throw Error("side_stream: device index out of range");
  cudaStream_t& s = t_streams.side[device];
  if (!s) {
    DeviceGuard g(device);
    int lo = 0, hi = 0;
    check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi), "cudaStreamCreateWithPriority");
  }
  return s;
}

void stream_wait(void* waiting, void* signalling, int device) {
  if (device < 0 || device >= 64) throw Error("stream_wait: device index out of range");
  // Both streams belong to `device`; a null stream names that device's legacy stream only while it is current.
  DeviceGuard g(device);
  cudaEvent_t& e = t_streams.join[device];
  if (!e) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventRecord(e, static_cast<cudaStream_t>(signalling)), "cudaEventRecord");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), e, 0), "cudaStreamWaitEvent");
}

void synchronize(int device) {
  DeviceGuard g(device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void check_last(const char* what) { check(cudaGetLastError(), what); }

ScopedDevice::ScopedDevice(int device, const char* who) {
  if (cudaGetDevice(&prev_) != cudaSuccess) {
    cudaGetLastError();
    prev_ = -1;
  }
  if (prev_ == device) return;
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string(who) + ": cannot use CUDA device " + std::to_string(device) + ": " + cudaGetErrorString(e));
  }
}

ScopedDevice::~ScopedDevice() {
  int cur = -1;
  if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
}

}  // namespace mla::cuda_rt
