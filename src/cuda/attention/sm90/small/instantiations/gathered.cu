// SPDX-License-Identifier: Apache-2.0
// The row-stationary kernel over gathered bf16 rows (sparse_mqa): N 8, 16, 32.
#include "cuda/attention/sm90/small/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_small_gathered(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_small_rows<GatherKeys<CacheFormat::bf16>>(p, grid, stream, SmallMaps{no_tensor_map(), no_tensor_map()}, what);
}

}  // namespace mla::cuda::decode_sm90
