// SPDX-License-Identifier: Apache-2.0
// The seesaw kernel over paged fp8 per-tensor rows (mqa_decode): the crossover and in-place expansions.
#include "cuda/attention/sm90/seesaw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_seesaw_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_seesaw_codes<CacheFormat::fp8, PagedRows>(p, grid, stream, what);
}

}  // namespace mla::cuda::decode_sm90
