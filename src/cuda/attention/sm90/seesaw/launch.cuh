// SPDX-License-Identifier: Apache-2.0
#pragma once
// The seesaw kernel's launch for a key source (the templates seesaw/instantiations/ compile).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/seesaw/kernel.cuh"
#include "cuda/attention/sm90/seesaw/launch.h"

namespace mla::cuda::decode_sm90 {

// In clusters of `cluster` CTAs: the crossover's two row tiles, or the splits of p.cluster_merge (cluster_merge.cuh).
template <class Src>
void launch_seesaw_clusters(const DecodeSm90Params& p, unsigned grid, unsigned cluster, cudaStream_t stream,
                            const CUtensorMap& map, const char* what) {
  launch_one_clustered(decode_sm90_seesaw_kernel<Src>, SeesawTraits::kSmemBytes, grid, cluster, stream, map, p,
                       what);
}

// One CTA per unit; clusters of a request's two row tiles for the crossover source, of the splits under
// p.cluster_merge.
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
    launch_one(decode_sm90_seesaw_kernel<Src>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
  }
}

// The code formats: the crossover where a request has an even number of row tiles, else in place.
template <CacheFormat F, class Rows>
void launch_seesaw_codes(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  if (p.m_tiles % 2 == 0) launch_seesaw<CrossKeys<F, Rows>>(p, grid, stream, no_tensor_map(), what);
  else launch_seesaw<InplaceKeys<F, Rows>>(p, grid, stream, no_tensor_map(), what);
}

}  // namespace mla::cuda::decode_sm90
