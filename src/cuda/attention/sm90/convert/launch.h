// SPDX-License-Identifier: Apache-2.0
#pragma once
// Entry points of the converter kernel (convert/kernel.cuh: 64-row tiles over fp8 / fp8_ds_mla codes, a converting
// warpgroup),
// each compiled in its own file of convert/instantiations/.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/sm90/common/params.h"
#include "mla/cache_format.h"

namespace mla::cuda::decode_sm90 {

// mqa_decode over a paged fp8 per-tensor cache (rows through the block table, p.gather set by set_gather_cache),
// the uniform schedule: one CTA per (row tile, split, request). instantiations/fp8_paged.cu
void launch_convert_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
// mqa_decode over paged fp8_ds_mla records. instantiations/ds_paged.cu
void launch_convert_ds_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
// sparse_mqa over fp8_ds_mla records: a token's top-k rows through its index row (p.gather), one CTA per (row tile,
// token), or under p.cluster_merge (the small-T split) a cluster of p.num_splits CTAs per (row tile, token), merged in
// the cluster. instantiations/ds_indexed.cu
void launch_convert_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
// Clusters of `splits` CTAs of the split build resident at once on `device` (0: none; core/sparse_split.h).
int convert_ds_indexed_max_clusters(int device, int splits);
// sparse_mqa with DeepSeek-V4 options over record caches (p.gather the main list, p.extra the extra list, p.sink),
// one CTA per (row tile, token) or, under p.cluster_merge, a cluster of p.num_splits CTAs per (row tile, token):
// the format pairs convert_v4_supports names. instantiations/v4_indexed.cu
bool convert_v4_supports(CacheFormat main_format, CacheFormat extra_format);
// The output rotation (SparseOptions::out_rotation) the V4 kernels take: at most the last 64 columns (O_R's panel 7).
inline constexpr int kConvertRotMaxDim = 64;
// Whether the DeepSeek-V4 path runs p's units on the N 16 tile (one row tile of at most 16 query rows).
bool convert_v4_n16(const DecodeSm90Params& p);
// Whether the unsplit 64-row V4 kernel over main records of format `main_format` runs persistent CTAs (grid: at
// most one CTA a SM, each over units blockIdx.x, + gridDim.x, ...). Not over v4 main records: there the converter's
// loop over units made ptxas spill in its tile loop (the v4 record path fills the converter's 136 registers) and the
// T 128 rows (one unit a CTA) ran x1.06-1.14 slower, more than persistence gave the T 4096 rows (x0.97).
inline constexpr bool convert_v4_persistent(CacheFormat main_format) { return main_format != CacheFormat::v4; }
// Clusters of `splits` CTAs of the split build (the N 16 tile's when n16, else the 64-row tile's) for the pair
// resident at once on `device` (0: none; the small-T split's residency rule, core/sparse_split.h).
int convert_v4_max_clusters(CacheFormat main_format, CacheFormat extra_format, bool n16, int device, int splits);
void launch_convert_v4_indexed(CacheFormat main_format, CacheFormat extra_format, const DecodeSm90Params& p,
                               unsigned grid, cudaStream_t stream, const char* what);

}  // namespace mla::cuda::decode_sm90
