// SPDX-License-Identifier: Apache-2.0
// Launcher of the portable mqa_decode (kernel.cuh): the engine's parameters, the split-KV count the
// workspace holds, the engine instance of the activation type (instantiations/), then the split-KV combine.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "cuda/attention/combine/split_kv.h"
#include "cuda/attention/portable/decode/launch.h"
#include "cuda/attention/portable/decode/traits.cuh"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"

namespace mla::cuda::decode {

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
  p.rows = mqa::make_row_params(q, out, lse, /*has_i=*/true, softmax_scale, ctx);
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
    if constexpr (std::is_same_v<Act, Bf16>) launch_bf16(p, grid, smem, stream);
    else if constexpr (std::is_same_v<Act, F16>) launch_f16(p, grid, smem, stream);
    else launch_f32(p, grid, smem, stream);
  });
  if (splits > 1) combine::launch_split_kv({p.rows, p.num_splits, p.ws_lse, p.ws_o, nullptr}, b, stream);
}

}  // namespace mla::cuda::decode
