// SPDX-License-Identifier: Apache-2.0
// The converter kernel over paged fp8 per-tensor rows (mqa_decode).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"
#include "cuda/attention/sm90/convert/launch.h"

namespace mla::cuda::decode_sm90 {

void launch_convert_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_one(decode_sm90_convert_kernel<CacheFormat::fp8, PagedRows>, ConvertTraits::kSmemBytes, grid, stream,
             no_tensor_map(), p, what);
}

}  // namespace mla::cuda::decode_sm90
