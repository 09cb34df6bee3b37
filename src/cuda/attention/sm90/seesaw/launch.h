// SPDX-License-Identifier: Apache-2.0
#pragma once
// Entry points of the seesaw kernel (seesaw/kernel.cuh: 64-row tiles), one per key source family, each compiled in
// its own file of seesaw/instantiations/.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/sm90/common/params.h"

namespace mla::cuda::decode_sm90 {

// mqa_decode over a bf16 cache: paged keys by TMA through `map`; `stage1_panels`: stage 1's panels each on their own
// full barrier (PagedPanelKeys; the regime's stage1_panels), else PagedKeys. Under p.cluster_merge a request's
// p.num_splits CTAs run as one cluster and merge through distributed shared memory. instantiations/paged.cu
void launch_seesaw_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                         bool stage1_panels, const char* what);
// How many clusters of `splits` CTAs of the PagedKeys kernel fit at once on `device` (the cluster merge's condition).
int seesaw_paged_max_clusters(int device, int splits);
// sparse_mqa over bf16 rows: rows copied a release group at a time (GroupRows). instantiations/group_rows.cu
void launch_seesaw_group_rows(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
// sparse_mqa's small-T split (core/sparse_split.h): how many clusters of `splits` CTAs of the GroupRows kernel fit at
// once on `device`.
int seesaw_group_rows_max_clusters(int device, int splits);
// The code formats, rows copied by the producer warps and expanded to bf16 in shared memory: where a request has an
// even number of row tiles (p.m_tiles), the crossover (CrossKeys: the two row-tile CTAs of a request, a cluster of
// two, expand half of every tile each, for both), else in place (InplaceKeys).
//   fp8 per-tensor, paged (mqa_decode)   instantiations/fp8_paged.cu
//   fp8_ds_mla, paged (mqa_decode)       instantiations/ds_paged.cu
//   fp8_ds_mla, indexed (sparse_mqa)     instantiations/ds_indexed.cu
void launch_seesaw_fp8_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
void launch_seesaw_ds_paged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);
void launch_seesaw_ds_indexed(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const char* what);

}  // namespace mla::cuda::decode_sm90
