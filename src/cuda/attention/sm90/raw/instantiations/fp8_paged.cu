// SPDX-License-Identifier: Apache-2.0
// The code-format kernel over paged fp8 per-tensor rows (mqa_decode): N 8, 16, 32.
#include "cuda/attention/sm90/raw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_raw_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                      const char* what) {
  launch_raw<CacheFormat::fp8, PagedRows>(p, grid, stream, map, what);
}

}  // namespace mla::cuda::decode_sm90
