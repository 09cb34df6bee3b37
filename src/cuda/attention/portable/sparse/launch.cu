// SPDX-License-Identifier: Apache-2.0
// Launcher of the portable sparse_mqa (kernel.cuh): the engine's parameters (main cache, DeepSeek-V4's extra cache
// and attention sink), one CTA per (64-head tile, token), the engine instance of the activation type
// (instantiations/).
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "cuda/attention/portable/sparse/launch.h"
#include "cuda/attention/portable/sparse/traits.cuh"
#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"

namespace mla::cuda::sparse {

void run_portable(const dispatch::SparseArgs& a) {
  const TensorView &q = a.q, &indices = a.indices, &topk_length = a.topk_length, &out = a.out, &lse = a.lse;
  const KVCache& kv = a.kv;
  const double softmax_scale = a.softmax_scale;
  const Context& ctx = a.ctx;
  using sparse::Traits;
  const SparseExtraCache& ex = a.opts.extra;
  const int64_t t = q.size(0), h_q = q.size(1), topk = indices.size(1);
  const int64_t extra_topk = ex.defined() ? ex.indices.size(1) : 0;
  mqa::check_dims("sparse_mqa", q.size(2), out.size(2));
  if (h_q > (int64_t(1) << 30) || topk + extra_topk > (int64_t(1) << 30))
    throw Error("sparse_mqa: h_q or topk (+ extra_topk) too large for one launch");
  DeviceGuard guard(q.device);

  SparseParams p{};
  p.rows = mqa::make_row_params(q, out, lse, /*has_i=*/false, softmax_scale, ctx);
  p.cache = mqa::make_cache_params(kv);
  p.indices = static_cast<const int32_t*>(indices.data);
  p.indices_stride = indices.stride[0];
  p.topk = static_cast<int32_t>(topk);
  if (topk_length.defined()) {
    p.topk_length = static_cast<const int32_t*>(topk_length.data);
    p.topk_length_stride = topk_length.stride[0];
  }
  if (ex.defined()) {  // same format (records: any record format) and dims as the main cache (front end)
    const MqaCacheParams ec = mqa::make_cache_params(ex.kv);
    if (ec.record != p.cache.record || (!ec.record && ec.format != p.cache.format))
      throw Error("sparse_mqa: the extra cache's format must match the main cache's (records: any record format)");
    p.extra_format = ec.format;
    p.extra_vec16 = ec.vec16;
    if (!p.cache.record) p.cache.vec16 = p.cache.vec16 && ec.vec16;  // one loader flag for both caches
    p.extra_data = ec.data;
    p.extra_stride_block = ec.stride_block;
    p.extra_stride_row = ec.stride_row;
    p.extra_num_blocks = ec.num_blocks;
    p.extra_page_size = ec.page_size;
    p.extra_indices = static_cast<const int32_t*>(ex.indices.data);
    p.extra_indices_stride = ex.indices.stride[0];
    p.extra_topk = static_cast<int32_t>(extra_topk);
    if (ex.topk_length.defined()) {
      p.extra_topk_length = static_cast<const int32_t*>(ex.topk_length.data);
      p.extra_topk_length_stride = ex.topk_length.stride[0];
    }
  }
  if (a.opts.attn_sink.defined()) {
    p.sink = static_cast<const float*>(a.opts.attn_sink.data);
    p.sink_stride = a.opts.attn_sink.stride[0];
  }
  p.rot = dev::out_rotation_of(a.opts.out_rotation);

  const int64_t m_tiles = (h_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const unsigned grid = grid_for(m_tiles * t, 1, "sparse_mqa");
  const int smem = p.cache.direct ? Traits::kSmemBf16 : Traits::kSmemFp8;
  dispatch_activation(q.dtype, "sparse_mqa", [&](auto act) {
    using Act = decltype(act);
    if constexpr (std::is_same_v<Act, Bf16>) launch_bf16(p, grid, smem, stream_of(ctx));
    else if constexpr (std::is_same_v<Act, F16>) launch_f16(p, grid, smem, stream_of(ctx));
    else launch_f32(p, grid, smem, stream_of(ctx));
  });
}

}  // namespace mla::cuda::sparse
