// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-KV combine of mqa_decode (decode_combine_kernel, kernel.cuh) as a host call, shared by the
// decode variants that write the [b, num_splits, s_q * h_q] partials of DecodeParams' workspace layout.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode/params.h"

namespace mla::cuda::decode {

// Merges p.num_splits partials (p.ws_lse, p.ws_o) of b requests into p.rows' out / lse on `stream`.
// dependent: a programmatic dependent launch (launch_dependent in cuda/common/launch.h): its CTAs may be
// scheduled while the attention kernel still runs and wait for it on the device.
void launch_combine(const DecodeParams& p, int64_t b, cudaStream_t stream, bool dependent = false);

}  // namespace mla::cuda::decode
