// SPDX-License-Identifier: Apache-2.0
// The converter kernel over a token's top-k fp8_ds_mla records (sparse_mqa), and its small-T split build.
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"
#include "cuda/attention/sm90/convert/launch.h"

namespace mla::cuda::decode_sm90 {

void launch_convert_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  if (p.cluster_merge)
    launch_one_clustered(decode_sm90_convert_kernel<CacheFormat::fp8_ds_mla, IndexedRows, true>,
                         ConvertTraits::kSmemBytes, grid, static_cast<unsigned>(p.num_splits), stream, no_tensor_map(),
                         p, what);
  else
    launch_one(decode_sm90_convert_kernel<CacheFormat::fp8_ds_mla, IndexedRows>, ConvertTraits::kSmemBytes, grid,
               stream, no_tensor_map(), p, what);
}

int convert_ds_indexed_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_convert_kernel<CacheFormat::fp8_ds_mla, IndexedRows, true>>(
      device, splits, ConvertTraits::kSmemBytes, "sparse_mqa (sm90): cluster split");
}

}  // namespace mla::cuda::decode_sm90
