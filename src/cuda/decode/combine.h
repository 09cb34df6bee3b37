#pragma once
// The split-KV combine of mqa_decode (decode_combine_kernel, kernel.cuh) as a host call, shared by the
// decode variants that write the [b, num_splits, s_q * h_q] partials of DecodeParams' workspace layout.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode/params.h"

namespace mla::cuda::decode {

// Merges p.num_splits partials (p.ws_lse, p.ws_o) of b requests into p.rows' out / lse on `stream`.
void launch_combine(const DecodeParams& p, int64_t b, cudaStream_t stream);

}  // namespace mla::cuda::decode
