// SPDX-License-Identifier: Apache-2.0
#pragma once
// Entry point of the fp8-compute kernel (fp8c/kernel.cuh: 64-row tiles, e4m3 products), compiled in
// fp8c/instantiations/.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/sm90/common/params.h"

namespace mla::cuda::decode_sm90 {

// mqa_decode over a paged fp8 per-tensor cache, the uniform schedule: one CTA per (row tile, split, request). `map`:
// the cache as [num_blocks][page_size][576] bytes, boxes of 128 bytes x p.box_rows rows, 128-byte swizzle
// (mqa_decode.cu paged_tensor_map). instantiations/fp8_paged.cu
void launch_fp8c_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                       const char* what);

}  // namespace mla::cuda::decode_sm90
