// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host side shared by the sm90 attention launchers: the op launchers (mqa_decode.cu, sparse_mqa.cu) and each
// kernel's launch code (small/, raw/, seesaw/ launch.cuh, compiled in their instantiations/ files): the row tiling
// the host rule chose, parameter helpers, and the launch of one kernel, plain or in clusters.
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "cuda/common/launch.h"
#include "core/decode_regime.h"
#include "core/fast_div.h"
#include "mla/cache.h"
#include "runtime/device_api.h"
#include "cuda/attention/sm90/common/cluster_merge.cuh"
#include "cuda/attention/sm90/common/params.h"
#include "cuda/attention/sm90/common/traits.cuh"

namespace mla::cuda::decode_sm90 {

// SMs of a device (the one device-info cache, runtime/device_api.h): the balanced schedule's grid
// (mqa_decode.cu), the small-T sparse split (sparse_mqa.cu).
inline int sm_count(int device) { return cuda_rt::device_info(device).sm_count; }

inline bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// p.tile_rows and p.m_tiles from the regime the host rule chose (core/decode_regime.h).
inline void set_row_tiles(DecodeSm90Params& p, const decode_regime::Regime& r) {
  p.tile_rows = r.tile_rows;
  p.m_tiles = r.m_tiles;
}

// How out [groups, (s_q,) h_q, d_v] (bf16) rows may be stored (params.h kOutPairs / kOutRows16): 4-byte pairs with
// even strides and a 4-byte aligned base, 16-byte chunks with strides multiples of 8 and a 16-byte aligned base.
inline int32_t out_pairs(const TensorView& out) {
  bool pairs = aligned(out.data, 4) && out.stride[out.ndim - 1] == 1, rows16 = pairs && aligned(out.data, 16);
  for (int d = 0; d + 1 < out.ndim; ++d) {
    pairs = pairs && out.stride[d] % 2 == 0;
    rows16 = rows16 && out.stride[d] % 8 == 0;
  }
  return rows16 ? kOutRows16 : pairs ? kOutPairs : 0;
}

// The cache fields of the row-copying sources and the raw kernel's producer (GatherKeys and the sources built on
// it, raw/parts.cuh): base, byte strides, pages (page_size also as a multiply-shift divisor: < 2^30, checked by
// the op launchers' supports).
inline void set_gather_cache(DecodeSm90Params::Gather& g, const KVCache& c) {
  const int64_t eb = static_cast<int64_t>(c.data.element_size());
  g.cache = static_cast<const uint8_t*>(c.data.data);
  g.stride_block_bytes = c.data.stride[0] * eb;
  g.stride_row_bytes = c.data.stride[1] * eb;
  g.num_slots = c.num_blocks() * c.page_size();
  g.page_size = static_cast<int32_t>(c.page_size());
  g.page_div = make_fast_divisor(static_cast<uint32_t>(g.page_size));
  g.scale = c.scale;
}

// The tensor-map argument of the kernels whose key source issues no TMA (the gathering and code sources).
inline CUtensorMap no_tensor_map() {
  CUtensorMap unused;
  std::memset(&unused, 0, sizeof(unused));
  return unused;
}

// `map`: the kernel's first parameter, one CUtensorMap or a struct of them (convert/kernel.cuh V4Maps).
template <class Kernel, class Map>
void launch_one(Kernel kernel, int smem, unsigned grid, cudaStream_t stream, const Map& map,
                const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  launch_kernel(kernel, grid, Traits::kThreads, static_cast<std::size_t>(smem), stream, p.rows.pdl != 0, what, map, p);
}

// `kernel` over `grid` CTAs in clusters of `cluster` consecutive CTAs (the seesaw's row-tile pairs and split
// merge, the raw kernel's small-T sparse split).
template <class Kernel, class Map>
void launch_one_clustered(Kernel kernel, int smem, unsigned grid, unsigned cluster, cudaStream_t stream,
                          const Map& map, const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  launch_cluster_pdl(kernel, grid, cluster, Traits::kThreads, static_cast<std::size_t>(smem), stream, p.rows.pdl != 0,
                     what, map, p);
}

// How many clusters of `splits` CTAs of `Kernel` (`smem` bytes of dynamic shared memory: one CTA per SM; a cluster
// within one GPC) can be resident at once on `device`: cudaOccupancyMaxActiveClusters, once per (kernel, device,
// size); 0 where none fit. The cluster merges run only where all of a grid's clusters are resident together (a
// second wave of clusters measured twice the time: docs/design/attention_sm90.md "7. Schedules and the combine").
template <auto Kernel>
int max_clusters_cached(int device, int splits, int smem, const char* what) {
  static std::array<std::array<std::atomic<int>, ClusterMerge::kMaxSplits + 1>, 64> cached{};  // count + 1; 0 unknown
  if (device < 0 || device >= 64 || splits < 2 || splits > ClusterMerge::kMaxSplits) return 0;
  std::atomic<int>& slot = cached[static_cast<std::size_t>(device)][static_cast<std::size_t>(splits)];
  int v = slot.load(std::memory_order_relaxed);
  if (v == 0) {
    check_cuda(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
    v = max_active_clusters(Kernel, static_cast<unsigned>(splits), Traits::kThreads, static_cast<std::size_t>(smem)) + 1;
    slot.store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

}  // namespace mla::cuda::decode_sm90
