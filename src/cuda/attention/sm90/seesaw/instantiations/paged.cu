// SPDX-License-Identifier: Apache-2.0
// The seesaw kernel over paged bf16 keys (TMA): PagedKeys and PagedPanelKeys.
#include "cuda/attention/sm90/seesaw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_seesaw_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                         bool stage1_panels, const char* what) {
  if (stage1_panels) launch_seesaw<PagedPanelKeys>(p, grid, stream, map, what);
  else launch_seesaw<PagedKeys>(p, grid, stream, map, what);
}

int seesaw_paged_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_seesaw_kernel<PagedKeys>>(device, splits, SeesawTraits::kSmemBytes,
                                                                       "mqa_decode (sm90): cluster merge");
}

}  // namespace mla::cuda::decode_sm90
