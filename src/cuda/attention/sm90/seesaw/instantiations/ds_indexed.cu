// SPDX-License-Identifier: Apache-2.0
// The seesaw kernel over a token's top-k fp8_ds_mla records (sparse_mqa): the crossover and in-place expansions
// (no small-T split: the converter kernel's takes those calls, convert/instantiations/ds_indexed.cu).
#include "cuda/attention/sm90/seesaw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_seesaw_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_seesaw_codes<CacheFormat::fp8_ds_mla, IndexedRows>(p, grid, stream, what);
}

}  // namespace mla::cuda::decode_sm90
