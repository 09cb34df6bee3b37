// SPDX-License-Identifier: Apache-2.0
#pragma once
// The row-stationary kernel's launch for a key source (the templates small/instantiations/ compile).
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/small/kernel.cuh"
#include "cuda/attention/sm90/small/launch.h"

namespace mla::cuda::decode_sm90 {

template <int N, class Src>
void launch_small(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const SmallMaps& maps,
                  const char* what) {
  launch_one(decode_sm90_small_kernel<N, Src>, SmallTraits<N>::template smem_bytes<Src>(), grid, stream, maps, p, what);
}

// p.tile_rows (8, 16 or 32) rows per CTA with key source Src.
template <class Src>
void launch_small_rows(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const SmallMaps& map,
                       const char* what) {
  switch (p.tile_rows) {
    case 8: launch_small<8, Src>(p, grid, stream, map, what); break;
    case 16: launch_small<16, Src>(p, grid, stream, map, what); break;
    default: launch_small<32, Src>(p, grid, stream, map, what); break;
  }
}

}  // namespace mla::cuda::decode_sm90
