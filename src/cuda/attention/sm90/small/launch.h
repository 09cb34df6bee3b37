// SPDX-License-Identifier: Apache-2.0
#pragma once
// Entry points of the row-stationary kernel (small/kernel.cuh: bf16 keys, 8 / 16 / 32 query rows per CTA as
// p.tile_rows says), one per key source, each compiled in its own file of small/instantiations/. `grid` CTAs:
// m_tiles x splits x requests (uniform), or the balanced schedule's CTA count.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/sm90/common/params.h"

namespace mla::cuda::decode_sm90 {

// mqa_decode over a bf16 cache: paged keys by TMA through `map` (PagedKeys), and the query rows through `q_map`
// when p.q_tma. instantiations/paged.cu
void launch_small_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                        const CUtensorMap& q_map, const char* what);
// sparse_mqa over bf16 rows: a token's top-k rows gathered by cp.async (GatherKeys<bf16>). instantiations/gathered.cu
void launch_small_gathered(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);

}  // namespace mla::cuda::decode_sm90
