// SPDX-License-Identifier: Apache-2.0
// The seesaw kernel over a token's top-k bf16 rows, copied a release group at a time (sparse_mqa): GroupRows, and
// its small-T split build (SplitKeys).
#include "cuda/attention/sm90/seesaw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_seesaw_group_rows(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  if (p.cluster_merge) launch_seesaw<SplitKeys<GroupRows<>>>(p, grid, stream, no_tensor_map(), what);
  else launch_seesaw<GroupRows<>>(p, grid, stream, no_tensor_map(), what);
}

int seesaw_group_rows_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_seesaw_kernel<SplitKeys<GroupRows<>>>>(device, splits, SeesawTraits::kSmemBytes,
                                                                       "sparse_mqa (sm90): cluster split");
}

}  // namespace mla::cuda::decode_sm90
