// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host-side helpers shared by the CUDA launchers (.cu files; no fmt, no core/check.h): the device
// guard, the stream of a Context, launch-error checks and grid sizing.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "mla/error.h"
#include "mla/types.h"

namespace mla::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string(what) + ": CUDA error " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Throws when the launch just made on this thread failed (bad configuration, missing image).
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Makes `device` current for the lifetime of the guard: kernels must launch on the device that holds
// the tensors (and ctx.stream belongs to that device).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != d.index) check_cuda(cudaSetDevice(d.index), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Blocks needed for `n` work items of `per_block` each, as a launchable grid.x (throws past 2^31-1).
inline unsigned int grid_for(int64_t n, int64_t per_block, const char* what) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  if (blocks > 0x7fffffffLL) throw Error(std::string(what) + ": problem too large for one launch");
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

// The cudaLaunchKernelEx configuration of a 1-D launch with `num_attrs` attributes (attrs must outlive the launch
// call).
inline cudaLaunchConfig_t launch_config(unsigned grid, unsigned block, std::size_t smem, cudaStream_t stream,
                                        cudaLaunchAttribute* attrs, unsigned num_attrs = 1) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = num_attrs;
  return cfg;
}

inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}

// Programmatic dependent launch (PDL; docs/DESIGN.md "Programmatic dependent launch"). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once the previous kernel of the stream triggered
// (ptx::launch_dependents in every CTA, or completion). The invariant that makes every trigger point safe, kept by
// every kernel the library launches this way (cuda/common/ptx/griddep.cuh):
//   every thread calls ptx::grid_dependency_wait() before its first global-memory read or write other than its
//   kernel parameters, and every CTA calls it before it exits.
// The wait returns once the previous grid has completed and its writes are visible; since that grid waited the
// same way before completing, completion is transitive down the stream, and a trigger placed anywhere (the
// kernels trigger at their start) lets the next grid occupy free SMs early but never read early.
//
// Whether `kernel` goes out as a dependent launch: asked for (Context::pdl) and the image the device runs was
// compiled from sm_90 or later code (griddepcontrol exists only there: an image from older PTX, JIT-compiled
// for a newer GPU, has no wait and must not overlap its predecessor).
// The image's version is read once per (kernel, device) (cudaFuncGetAttributes; a failed query means no PDL).
inline bool pdl_image(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  cudaFuncAttributes a{};
  bool ok = false;
  if (cudaFuncGetAttributes(&a, kernel) == cudaSuccess) ok = a.ptxVersion >= 90;
  else (void)cudaGetLastError();
  known.emplace(key, ok);
  return ok;
}

template <class... Params>
bool pdl_for(void (*kernel)(Params...), bool requested) {
  return requested && pdl_image(reinterpret_cast<const void*>(kernel));
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch when `pdl` and the
// image allows it (pdl_for): the kernel keeps the invariant above. Capturable in CUDA graphs (programmatic edges).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), unsigned grid, unsigned block, std::size_t smem, cudaStream_t stream,
                   bool pdl, const char* what, Args&&... args) {
  if (!pdl_for(kernel, pdl)) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    check_launch(what);
    return;
  }
  cudaLaunchAttribute attr = pdl_attribute();
  const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, stream, &attr);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

// launch_kernel with PDL asked for (the image check still applies): kernels and tests that are always dependent.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), unsigned grid, unsigned block, std::size_t smem, cudaStream_t stream,
                      const char* what, Args&&... args) {
  launch_kernel(kernel, grid, block, smem, stream, true, what, std::forward<Args>(args)...);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster` CTAs
// along x (cudaLaunchAttributeClusterDimension; grid a multiple of `cluster`): CTAs
// cluster * k .. cluster * k + cluster - 1 are co-scheduled and share distributed shared memory
// (cuda/common/ptx/cluster.cuh). Capturable in CUDA graphs. launch_cluster_pdl: also a programmatic dependent
// launch when `pdl` and pdl_for allow it.
inline cudaLaunchAttribute cluster_attribute(unsigned cluster) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

template <class... Params, class... Args>
void launch_cluster_pdl(void (*kernel)(Params...), unsigned grid, unsigned cluster, unsigned block, std::size_t smem,
                        cudaStream_t stream, bool pdl, const char* what, Args&&... args) {
  if (cluster == 0 || grid % cluster != 0) throw Error(std::string(what) + ": grid is not a whole number of clusters");
  cudaLaunchAttribute attrs[2] = {cluster_attribute(cluster), pdl_attribute()};
  const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, stream, attrs, pdl_for(kernel, pdl) ? 2 : 1);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

template <class... Params, class... Args>
void launch_cluster(void (*kernel)(Params...), unsigned grid, unsigned cluster, unsigned block, std::size_t smem,
                    cudaStream_t stream, const char* what, Args&&... args) {
  launch_cluster_pdl(kernel, grid, cluster, block, smem, stream, false, what, std::forward<Args>(args)...);
}

// How many clusters of `cluster` CTAs of `kernel` (block threads, smem dynamic bytes, which the kernel's attribute
// must already allow) can be resident at once on the current device (cudaOccupancyMaxActiveClusters); 0 where none
// fit or the query is refused (a refusal means "does not fit" here, not a failure).
template <class... Params>
int max_active_clusters(void (*kernel)(Params...), unsigned cluster, unsigned block, std::size_t smem) {
  cudaLaunchAttribute attr = cluster_attribute(cluster);
  const cudaLaunchConfig_t cfg = launch_config(cluster, block, smem, nullptr, &attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

}  // namespace mla::cuda
