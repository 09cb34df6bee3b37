// SPDX-License-Identifier: Apache-2.0
// The code-format kernel over a token's top-k fp8_ds_mla records (sparse_mqa): N 8, 16, 32.
#include "cuda/attention/sm90/raw/launch.cuh"

namespace mla::cuda::decode_sm90 {

void launch_raw_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what) {
  launch_raw<CacheFormat::fp8_ds_mla, IndexedRows>(p, grid, stream, no_tensor_map(), what);
}

int raw_ds_indexed_max_clusters(int device, int rows, int splits) {
  constexpr CacheFormat F = CacheFormat::fp8_ds_mla;
  return rows == 8 ? raw_max_clusters<8, F, IndexedRows>(device, splits)
         : rows == 16 ? raw_max_clusters<16, F, IndexedRows>(device, splits)
                      : raw_max_clusters<32, F, IndexedRows>(device, splits);
}

}  // namespace mla::cuda::decode_sm90
