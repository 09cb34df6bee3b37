// SPDX-License-Identifier: Apache-2.0
#pragma once
// Entry points of the code-format kernel (raw/kernel.cuh: e4m3-coded rows read as exact codes, 8 / 16 / 32 query
// rows per CTA as p.tile_rows says), one per (format, row locator), each compiled in its own file of
// raw/instantiations/. Under p.cluster_merge a token's p.num_splits CTAs run as one cluster (sparse_mqa's small-T
// split).
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/sm90/common/params.h"

namespace mla::cuda::decode_sm90 {

// mqa_decode over fp8 per-tensor / fp8_ds_mla caches (PagedRows); `map`: the rows as TMA boxes when
// p.gather.raw_tma (mqa_decode.cu raw_rows_tensor_map), else unused. instantiations/fp8_paged.cu, ds_paged.cu
void launch_raw_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                          const char* what);
void launch_raw_ds_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                         const char* what);
// sparse_mqa over fp8_ds_mla records (IndexedRows). instantiations/ds_indexed.cu
void launch_raw_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
// How many clusters of `splits` CTAs of the sparse kernel at `rows` (8, 16, 32) rows fit at once on `device`.
int raw_ds_indexed_max_clusters(int device, int rows, int splits);

}  // namespace mla::cuda::decode_sm90
