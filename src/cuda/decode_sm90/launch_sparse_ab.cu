// A/B only (docs/SPARSE.md "Coalesced gathers"; to be removed once measured): the sm90 sparse_mqa kernels
// with other gather mappings, picked by MLA_SPARSE_SM90_GATHER in launch_sparse.cu: mode 1 "lanes" (the
// first, lane-per-row mapping: GatherKeys<bf16, false>, StageMode::kLaneRows), 2 "coalesced" (the raw stage
// without the split fetch), 3 "nodequant", 4 "nocopy" (timing diagnostics of the raw stage: wrong results).
// A separate translation unit so that it compiles in parallel with the kept kernels.
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"
#include "cuda/decode_sm90/launch_kernels.cuh"

namespace mla::cuda::decode_sm90 {
namespace {

template <StageMode kMode>
void launch_staged(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                   const char* what) {
  switch (p.tile_rows) {
    case 8: launch_small<8, StagedDsMlaKeysFor<SmallTraits<8>::kOffExtra, kMode>>(p, grid, stream, map, what); break;
    case 16: launch_small<16, StagedDsMlaKeysFor<SmallTraits<16>::kOffExtra, kMode>>(p, grid, stream, map, what); break;
    case 32: launch_small<32, StagedDsMlaKeysFor<SmallTraits<32>::kOffExtra, kMode>>(p, grid, stream, map, what); break;
    default:
      launch_one(decode_sm90_seesaw_kernel<GatherKeys<CacheFormat::fp8_ds_mla>>, SeesawTraits::kSmemBytes, grid, stream,
                 map, p, what);
      break;
  }
}

}  // namespace

void run_sparse_ab(const DecodeSm90Params& p, int mode, bool bf16, unsigned grid, cudaStream_t stream, const char* what) {
  CUtensorMap unused;
  std::memset(&unused, 0, sizeof(unused));
  if (bf16) {
    if (mode == 1) launch_kernel<GatherKeys<CacheFormat::bf16, false>>(p, grid, stream, unused, what);
    else launch_kernel<GatherKeys<CacheFormat::bf16>>(p, grid, stream, unused, what);
    return;
  }
  switch (mode) {
    case 1: launch_staged<StageMode::kLaneRows>(p, grid, stream, unused, what); break;
    case 2: launch_staged<StageMode::kCoalesced>(p, grid, stream, unused, what); break;
    case 3: launch_staged<StageMode::kNoDequant>(p, grid, stream, unused, what); break;
    default: launch_staged<StageMode::kNoCopy>(p, grid, stream, unused, what); break;
  }
}

}  // namespace mla::cuda::decode_sm90
