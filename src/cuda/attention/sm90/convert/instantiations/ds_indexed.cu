// SPDX-License-Identifier: Apache-2.0
// The converter kernel over fp8_ds_mla records through index rows (sparse_mqa).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"
#include "cuda/attention/sm90/convert/launch.h"

namespace mla::cuda::decode_sm90 {

void launch_convert_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_one(decode_sm90_convert_kernel<CacheFormat::fp8_ds_mla, IndexedRows>, ConvertTraits::kSmemBytes, grid, stream,
             no_tensor_map(), p, what);
}

}  // namespace mla::cuda::decode_sm90
