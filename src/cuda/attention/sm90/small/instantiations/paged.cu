// SPDX-License-Identifier: Apache-2.0
// The row-stationary kernel over paged bf16 keys (TMA): N 8, 16, 32.
#include "cuda/attention/sm90/small/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_small_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                        const CUtensorMap& q_map, const char* what) {
  launch_small_rows<PagedKeys>(p, grid, stream, SmallMaps{map, q_map}, what);
}

}  // namespace mla::cuda::decode_sm90
