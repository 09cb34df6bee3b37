// SPDX-License-Identifier: Apache-2.0
// The sparse_mqa op on CUDA: its dispatch table (one entry per shipped kernel, best first; variant_table.h picks
// the first that can run the launch on the device). No kernel here: each entry's launcher lives with its kernel
// (sm90/sparse_mqa.cu, portable/sparse/launch.cu).
#include "cuda/attention/portable/sparse/launch.h"
#include "cuda/attention/sm90/variant.h"
#include "cuda/cuda_ops.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda {

dispatch::Table<dispatch::SparseArgs>& dispatch::sparse_mqa_table() {
  static Table<SparseArgs> table(
      "sparse_mqa",
      {{{"sm90_small", 90, 90,
         "N 8 / 16 / 32 row tiles, rows gathered by cp.async, wgmma (attention/sm90/small/kernel.cuh): bf16 cache, "
         "h_q <= 32"},
        decode_sm90::supports_sparse_small, decode_sm90::run_sparse_small, decode_sm90::prefers_sparse_small},
       {{"sm90_raw", 90, 90,
         "raw records staged, exact codes into wgmma (attention/sm90/raw/kernel.cuh): fp8_ds_mla cache, h_q <= 32, "
         "small-T cluster split"},
        decode_sm90::supports_sparse_raw, decode_sm90::run_sparse_raw, decode_sm90::prefers_sparse_raw},
       {{"sm90_seesaw", 90, 90,
         "64-row tiles, two consumer warpgroups over a two-stage pipeline (attention/sm90/seesaw/kernel.cuh): bf16 and "
         "fp8_ds_mla caches"},
        decode_sm90::supports_sparse_seesaw, decode_sm90::run_sparse_seesaw, decode_sm90::prefers_sparse_seesaw},
       {{"sm90_convert", 90, 90,
         "64-row tiles, a converter warpgroup writing exact codes into a bf16 stage, an S and an O warpgroup "
         "(attention/sm90/convert/kernel.cuh): fp8_ds_mla records; DeepSeek-V4 record caches (v4, v41, v41_fp4) with "
         "a sink and an extra cache"},
        decode_sm90::supports_sparse_convert, decode_sm90::run_sparse_convert, decode_sm90::prefers_sparse_convert},
       {{"portable", 80, 0, "mma.sync MQA engine: every cache format, any top-k and h_q, DeepSeek-V4 options"}, nullptr,
        sparse::run_portable}});
  return table;
}

void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const SparseOptions& opts,
                const Context& ctx) {
  dispatch::sparse_mqa_table().run({q, kv, indices, topk_length, out, lse, softmax_scale, opts, ctx},
                                   dispatch::device_cc(q.device.index));
}

}  // namespace mla::cuda
