// SPDX-License-Identifier: Apache-2.0
// Launcher of the split-KV combine (split_kv.h).
#include <cuda_runtime.h>

#include "cuda/attention/combine/split_kv.h"
#include "cuda/attention/combine/split_kv_kernel.cuh"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"

namespace mla::cuda::combine {

void launch_split_kv(const SplitKvParams& p, int64_t b, cudaStream_t stream) {
  const int64_t rows = b * p.rows.s_q * p.rows.h_q;
  const unsigned grid = grid_for(rows, 1, "mqa_decode combine");
  const bool wide = combine_batch(p.num_splits, p.ws_meta != nullptr) == 16;
  dispatch_activation(p.rows.act, "mqa_decode combine", [&](auto act) {
    using Act = decltype(act);
    launch_kernel(wide ? split_kv_kernel<Act, 16> : split_kv_kernel<Act, 8>, grid, kThreads, 0, stream, p.rows.pdl != 0,
                  "mqa_decode combine", p);
  });
}

}  // namespace mla::cuda::combine
