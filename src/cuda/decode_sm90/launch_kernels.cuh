// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host side shared by the sm90 launchers (launch.cu: mqa_decode, launch_sparse.cu: sparse_mqa): the row
// tiling (which kernel takes a problem) and the launch of the chosen kernel for a key source.
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "cuda/common/launch.h"
#include "core/decode_regime.h"
#include "mla/cache.h"
#include "runtime/device_api.h"
#include "cuda/decode_sm90/kernel_seesaw.cuh"
#include "cuda/decode_sm90/kernel_raw.cuh"
#include "cuda/decode_sm90/kernel_small.cuh"

namespace mla::cuda::decode_sm90 {

// SMs of a device, read once (cudaGetDeviceProperties is far too slow for every call): the balanced schedule's
// grid (launch.cu), the small-T sparse split (launch_sparse.cu).
inline int sm_count(int device) { return cuda_rt::device_info(device).sm_count; }

inline bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// p.tile_rows and p.m_tiles from the regime the host rule chose (core/decode_regime.h).
inline void set_row_tiles(DecodeSm90Params& p, const decode_regime::Regime& r) {
  p.tile_rows = r.tile_rows;
  p.m_tiles = r.m_tiles;
}

// 1 when out [groups, (s_q,) h_q, d_v] (bf16) rows take 4-byte stores: even strides, aligned base.
inline int32_t out_pairs(const TensorView& out) {
  bool ok = aligned(out.data, 4) && out.stride[out.ndim - 1] == 1;
  for (int d = 0; d + 1 < out.ndim; ++d) ok = ok && out.stride[d] % 2 == 0;
  return ok ? 1 : 0;
}

template <class Kernel>
void launch_one(Kernel kernel, int smem, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  kernel<<<grid, Traits::kThreads, smem, stream>>>(map, p);
  check_launch(what);
}

// `kernel` over `grid` CTAs in clusters of `cluster` consecutive CTAs (the seesaw's row-tile pairs and split
// merge, the raw kernel's small-T sparse split).
template <class Kernel>
void launch_one_clustered(Kernel kernel, int smem, unsigned grid, unsigned cluster, cudaStream_t stream,
                          const CUtensorMap& map, const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  launch_cluster(kernel, grid, cluster, Traits::kThreads, static_cast<std::size_t>(smem), stream, what, map, p);
}

// The small kernel with N rows and key source Src.
template <int N, class Src>
void launch_small(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                  const char* what) {
  launch_one(decode_sm90_small_kernel<N, Src>, SmallTraits<N>::template smem_bytes<Src>(), grid, stream, map, p, what);
}

// The seesaw kernel in clusters of `cluster` CTAs: the crossover's two row tiles, or the splits of p.cluster_merge
// (cluster_merge.cuh).
template <class Src>
void launch_seesaw_clusters(const DecodeSm90Params& p, unsigned grid, unsigned cluster, cudaStream_t stream,
                            const CUtensorMap& map, const char* what) {
  launch_one_clustered(decode_sm90_seesaw_next_kernel<Src>, SeesawTraits::kSmemBytes, grid, cluster, stream, map, p,
                       what);
}

// The seesaw kernel (64-row tiles) with key source Src: one CTA per unit; clusters of a request's two row tiles for
// the crossover source, of the splits under p.cluster_merge.
template <class Src>
void launch_seesaw(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                   const char* what) {
  if constexpr (CrossoverSource<Src>) {
    launch_seesaw_clusters<Src>(p, grid, Src::kClusterSize, stream, map, what);
  } else {
    if constexpr (kClusterMerged<Src>) {
      if (p.cluster_merge) {
        launch_seesaw_clusters<Src>(p, grid, static_cast<unsigned>(p.num_splits), stream, map, what);
        return;
      }
    }
    launch_one(decode_sm90_seesaw_next_kernel<Src>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
  }
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

// The seesaw kernel's (mqa_decode's split merge) and the raw kernel's (sparse_mqa's small-T split).
template <class Src>
int seesaw_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_seesaw_next_kernel<Src>>(device, splits, SeesawTraits::kSmemBytes,
                                                                  "mqa_decode (sm90): cluster merge");
}
template <int N, CacheFormat F, class Rows>
int raw_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_raw_kernel<N, F, Rows>>(device, splits, RawTraitsFor<N, F, Rows>::kSmemBytes,
                                                                 "sparse_mqa (sm90): cluster split");
}

// The small kernel for p.tile_rows (8, 16 or 32) with key source Src over `grid` CTAs (m_tiles x splits x requests).
template <class Src>
void launch_small_rows(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                       const char* what) {
  switch (p.tile_rows) {
    case 8: launch_small<8, Src>(p, grid, stream, map, what); break;
    case 16: launch_small<16, Src>(p, grid, stream, map, what); break;
    default: launch_small<32, Src>(p, grid, stream, map, what); break;
  }
}

// The cache fields of the row-copying sources and the raw kernel's producer (GatherKeys and the sources built on
// it, raw_parts.cuh): base, byte strides, pages (page_size
// also as a multiply-shift divisor: < 2^30, launch.cu / launch_sparse.cu).
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

// The raw-codes kernel (kernel_raw.cuh) with N rows for the code format F, rows located by Rows (source.cuh:
// IndexedRows for sparse_mqa, PagedRows for mqa_decode): the records staged raw, exact codes. Under
// p.cluster_merge (sparse_mqa's small-T split, launch_sparse.cu) the splits of a token as one cluster.
template <int N, CacheFormat F, class Rows>
void launch_raw_n(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                  const char* what) {
  if (p.cluster_merge)
    launch_one_clustered(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid,
                         static_cast<unsigned>(p.num_splits), stream, map, p, what);
  else
    launch_one(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid, stream, map, p, what);
}

// The code formats' kernels: the raw kernel at N 8 / 16 / 32; the seesaw kernel at 64-row tiles with the codes
// expanded in place (source_inplace.cuh InplaceKeys), or, where a request has an even number of row tiles (h 128
// at s_q 1), the crossover (source_cross.cuh CrossKeys: the two row-tile CTAs of a request expand half of every
// tile each, for both, through a cluster of two, each warp's V-half share loaded into registers before the
// release). `map`: the raw kernel's tensor map when p.gather.raw_tma (launch.cu raw_rows_tensor_map), else unused.
template <CacheFormat F, class Rows>
void launch_codes(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                  const char* what) {
  switch (p.tile_rows) {
    case 8: launch_raw_n<8, F, Rows>(p, grid, stream, map, what); break;
    case 16: launch_raw_n<16, F, Rows>(p, grid, stream, map, what); break;
    case 32: launch_raw_n<32, F, Rows>(p, grid, stream, map, what); break;
    default: {
      CUtensorMap unused;  // the seesaw sources copy rows themselves
      std::memset(&unused, 0, sizeof(unused));
      if (p.m_tiles % 2 == 0) launch_seesaw<CrossKeys<F, Rows>>(p, grid, stream, unused, what);
      else launch_seesaw<InplaceKeys<F, Rows>>(p, grid, stream, unused, what);
      break;
    }
  }
}

}  // namespace mla::cuda::decode_sm90
