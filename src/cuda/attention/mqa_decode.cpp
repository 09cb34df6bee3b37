// SPDX-License-Identifier: Apache-2.0
// The mqa_decode op on CUDA: its dispatch table (one entry per shipped kernel, best first; variant_table.h picks
// the first that can run the launch on the device) and the split-KV workspace size (declared in cuda/cuda_ops.h).
// No kernel here: each entry's launcher lives with its kernel (sm90/mqa_decode.cu, portable/decode/launch.cu).
#include <cstddef>
#include <cstdint>

#include "cuda/attention/combine/split_kv.h"
#include "cuda/attention/portable/decode/launch.h"
#include "cuda/attention/sm90/variant.h"
#include "cuda/cuda_ops.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda {

std::size_t decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int num_splits) {
  return static_cast<std::size_t>(combine::ws_bytes(b, s_q, h_q, num_splits));
}

dispatch::Table<dispatch::DecodeArgs>& dispatch::mqa_decode_table() {
  static Table<DecodeArgs> table(
      "mqa_decode", {{{"sm90_small", 90, 90,
                       "N 8 / 16 / 32 row tiles, TMA + wgmma, balanced split-KV schedule or, for small steps, uniform "
                       "splits with a partial per consumer warpgroup (attention/sm90/small/kernel.cuh): bf16 cache, "
                       "chosen at s_q * h_q <= 32, forceable above"},
                      decode_sm90::supports_small, decode_sm90::run_small, decode_sm90::prefers_small},
                     {{"sm90_raw", 90, 90,
                       "raw records staged, exact codes into wgmma (attention/sm90/raw/kernel.cuh): fp8 and fp8_ds_mla "
                       "caches, s_q * h_q <= 32"},
                      decode_sm90::supports_raw, decode_sm90::run_raw, decode_sm90::prefers_raw},
                     {{"sm90_seesaw", 90, 90,
                       "64-row tiles, two consumer warpgroups over a two-stage pipeline, cluster split merge "
                       "(attention/sm90/seesaw/kernel.cuh): bf16, fp8 and fp8_ds_mla caches"},
                      decode_sm90::supports_seesaw, decode_sm90::run_seesaw, decode_sm90::prefers_seesaw},
                     {{"sm90_convert", 90, 90,
                       "64-row tiles, a converter warpgroup writing exact codes into an f16 (fp8) or bf16 stage, an S and an O "
                       "warpgroup (attention/sm90/convert/kernel.cuh): fp8 and fp8_ds_mla caches"},
                      decode_sm90::supports_convert, decode_sm90::run_convert, decode_sm90::prefers_convert},
                     {{"sm90_fp8c", 90, 90,
                       "64-row tiles, e4m3 products on the fp8 tensor cores, a loader warpgroup writing V^T, an S and an O "
                       "warpgroup (attention/sm90/fp8c/kernel.cuh): fp8 per-tensor caches, only with fp8_compute"},
                      decode_sm90::supports_fp8c, decode_sm90::run_fp8c, decode_sm90::prefers_fp8c},
                     {{"portable", 80, 0, "mma.sync MQA engine: every cache format, page size, h_q and s_q"},
                      nullptr, decode::run_portable}});
  return table;
}

void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                const TensorView& workspace, const Context& ctx, int num_splits, bool whole_requests,
                bool batch_invariant, bool fp8_compute) {
  dispatch::mqa_decode_table().run({q, cache, block_table, seq_lens, out, lse, softmax_scale, causal, workspace, ctx,
                                    num_splits, whole_requests, batch_invariant, fp8_compute},
                                   dispatch::device_cc(q.device.index));
}

}  // namespace mla::cuda
