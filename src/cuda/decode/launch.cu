// SPDX-License-Identifier: Apache-2.0
// Launcher of the CUDA mqa_decode (kernel.cuh) and its workspace sizing (declared in cuda/cuda_ops.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>

#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"
#include "cuda/cuda_ops.h"
#include "cuda/decode/kernel.cuh"
#include "cuda/attention/combine/split_kv.h"
#include "cuda/attention/sm90/variant.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda {

std::size_t decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int num_splits) {
  return static_cast<std::size_t>(combine::ws_bytes(b, s_q, h_q, num_splits));
}

namespace {

// The "portable" variant: the mma.sync MQA engine (src/cuda/common/mqa_core.cuh), sm_80+, every format,
// page size, head count and s_q.
void run_portable(const dispatch::DecodeArgs& a) {
  const TensorView &q = a.q, &block_table = a.block_table, &seq_lens = a.seq_lens, &out = a.out, &lse = a.lse,
                   &workspace = a.workspace;
  const KVCache& cache = a.cache;
  const double softmax_scale = a.softmax_scale;
  const bool causal = a.causal;
  const Context& ctx = a.ctx;
  const int num_splits = a.num_splits;
  using decode::Traits;
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  mqa::check_dims("mqa_decode", q.size(3), out.size(3));
  if (s_q * h_q > (int64_t(1) << 30)) throw Error("mqa_decode: s_q * h_q too large for one launch");
  DeviceGuard guard(q.device);
  cudaStream_t stream = stream_of(ctx);

  DecodeParams p{};
  p.rows = mqa::make_row_params(q, out, lse, /*has_i=*/true, softmax_scale);
  p.cache = mqa::make_cache_params(cache);
  p.block_table = static_cast<const int32_t*>(block_table.data);
  p.block_table_stride = block_table.stride[0];
  p.max_blocks = block_table.size(1);
  p.seq_lens = static_cast<const int32_t*>(seq_lens.data);
  p.seq_lens_stride = seq_lens.stride[0];
  p.causal = causal ? 1 : 0;

  // Split-KV into the caller's workspace: the splits the caller planned (mla/plan.h's decode schedule
  // or the front end's default), fewer when the workspace holds fewer (none given or too small: one
  // split, the kernel writes out / lse itself). Nothing about the device is read here.
  int splits = std::max(1, std::min(num_splits, decode::kMaxSplits));
  const int64_t have = workspace.defined() && mqa::aligned16(workspace.data)
                           ? workspace.numel() * static_cast<int64_t>(workspace.element_size())
                           : 0;
  while (splits > 1 && combine::ws_bytes(b, s_q, h_q, splits) > have) --splits;
  if (a.batch_invariant && splits != std::max(1, num_splits))  // the front end checks this first
    throw Error("mqa_decode: batch_invariant needs a workspace that holds the " + std::to_string(num_splits) +
                " planned splits");
  p.num_splits = splits;
  if (splits > 1) {
    auto* base = static_cast<uint8_t*>(workspace.data);
    p.ws_lse = reinterpret_cast<float*>(base);
    p.ws_o = reinterpret_cast<float*>(base + combine::ws_lse_bytes(b, s_q, h_q, splits));
  }

  const unsigned grid = grid_for(decode::m_tiles(s_q, h_q) * b * splits, 1, "mqa_decode");
  const int smem = p.cache.direct ? Traits::kSmemBf16 : Traits::kSmemFp8;
  // One engine instance per activation type (q and out share it); the cache format is a run-time value.
  dispatch_activation(q.dtype, "mqa_decode", [&](auto act) {
    using Act = decltype(act);
    auto* kernel = mqa::mqa_attention_kernel<decode::DecodeKeys, Act>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "mqa_decode: shared-memory limit");
    kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
    check_launch("mqa_decode");
  });
  if (splits > 1) combine::launch_split_kv({p.rows, p.num_splits, p.ws_lse, p.ws_o, nullptr}, b, stream);
}

}  // namespace

// Variants best first (variant_table.h); the first that can run the launch on the device runs it.
dispatch::Table<dispatch::DecodeArgs>& dispatch::mqa_decode_table() {
  static Table<DecodeArgs> table(
      "mqa_decode", {{{"sm90_small", 90, 90,
                       "N 8 / 16 / 32 row tiles, TMA + wgmma, balanced split-KV schedule (attention/sm90/small/kernel.cuh): "
                       "bf16 cache, s_q * h_q <= 32"},
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
                       "64-row tiles, a converter warpgroup writing exact codes into a bf16 stage, an S and an O "
                       "warpgroup (attention/sm90/convert/kernel.cuh): fp8 and fp8_ds_mla caches"},
                      decode_sm90::supports_convert, decode_sm90::run_convert, decode_sm90::prefers_convert},
                     {{"portable", 80, 0, "mma.sync MQA engine: every cache format, page size, h_q and s_q"},
                      nullptr, run_portable}});
  return table;
}

void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                const TensorView& workspace, const Context& ctx, int num_splits, bool whole_requests,
                bool batch_invariant) {
  dispatch::mqa_decode_table().run({q, cache, block_table, seq_lens, out, lse, softmax_scale, causal, workspace, ctx,
                                    num_splits, whole_requests, batch_invariant},
                                   dispatch::device_cc(q.device.index));
}

}  // namespace mla::cuda
