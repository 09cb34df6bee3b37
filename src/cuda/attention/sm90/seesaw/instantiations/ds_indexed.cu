// SPDX-License-Identifier: Apache-2.0
// The seesaw kernel over a token's top-k fp8_ds_mla records (sparse_mqa): the crossover and in-place expansions,
// and the in-place one's small-T split build (SplitKeys; an odd number of row tiles).
#include "cuda/attention/sm90/seesaw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_seesaw_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  using Inplace = InplaceKeys<CacheFormat::fp8_ds_mla, IndexedRows>;
  if (p.cluster_merge) launch_seesaw<SplitKeys<Inplace>>(p, grid, stream, no_tensor_map(), what);
  else launch_seesaw_codes<CacheFormat::fp8_ds_mla, IndexedRows>(p, grid, stream, what);
}

int seesaw_ds_indexed_max_clusters(int device, int splits) {
  using Src = SplitKeys<InplaceKeys<CacheFormat::fp8_ds_mla, IndexedRows>>;
  return max_clusters_cached<decode_sm90_seesaw_kernel<Src>>(device, splits, SeesawTraits::kSmemBytes,
                                                             "sparse_mqa (sm90): cluster split");
}

}  // namespace mla::cuda::decode_sm90
