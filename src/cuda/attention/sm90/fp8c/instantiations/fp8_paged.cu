// SPDX-License-Identifier: Apache-2.0
// The fp8-compute kernel over paged fp8 per-tensor rows (mqa_decode).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/fp8c/kernel.cuh"
#include "cuda/attention/sm90/fp8c/launch.h"

namespace mla::cuda::decode_sm90 {

void launch_fp8c_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                       const char* what) {
  launch_one(decode_sm90_fp8c_kernel<CacheFormat::fp8>, Fp8cTraits::kSmemBytes, grid, stream, map, p, what);
}

}  // namespace mla::cuda::decode_sm90
