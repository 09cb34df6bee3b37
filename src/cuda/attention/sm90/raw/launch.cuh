// SPDX-License-Identifier: Apache-2.0
#pragma once
// The code-format kernel's launch for a (format, row locator) (the templates raw/instantiations/ compile).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/raw/kernel.cuh"
#include "cuda/attention/sm90/raw/launch.h"

namespace mla::cuda::decode_sm90 {

// N rows per CTA; under p.cluster_merge the splits of a token as one cluster.
template <int N, CacheFormat F, class Rows>
void launch_raw_n(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                  const char* what) {
  if (p.cluster_merge)
    launch_one_clustered(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid,
                         static_cast<unsigned>(p.num_splits), stream, map, p, what);
  else
    launch_one(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid, stream, map, p, what);
}

// p.tile_rows (8, 16 or 32) rows per CTA.
template <CacheFormat F, class Rows>
void launch_raw(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                const char* what) {
  switch (p.tile_rows) {
    case 8: launch_raw_n<8, F, Rows>(p, grid, stream, map, what); break;
    case 16: launch_raw_n<16, F, Rows>(p, grid, stream, map, what); break;
    default: launch_raw_n<32, F, Rows>(p, grid, stream, map, what); break;
  }
}

template <int N, CacheFormat F, class Rows>
int raw_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_raw_kernel<N, F, Rows>>(device, splits, RawTraitsFor<N, F, Rows>::kSmemBytes,
                                                                 "sparse_mqa (sm90): cluster split");
}

}  // namespace mla::cuda::decode_sm90
