// SPDX-License-Identifier: Apache-2.0
// Launchers of the indexer cache kernels (cache_kernel.cuh) and the top-k (topk_kernel.cuh). The
// logits launchers and their dispatch table are in logits.cu.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/common/act_type.cuh"
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"
#include "cuda/indexer/cache_kernel.cuh"
#include "cuda/indexer/prepare_kernel.cuh"
#include "cuda/indexer/topk_kernel.cuh"

namespace mla::cuda {

namespace indexer {
CacheRef cache_ref(const IndexerKCache& c) {
  return CacheRef{static_cast<uint8_t*>(c.data.data), c.data.stride[0], c.num_blocks(),
                  static_cast<int32_t>(c.page_size())};
}
}  // namespace indexer

void indexer_write_k(const TensorView& k, const TensorView& slot_mapping, const IndexerKCache& cache,
                     IndexerScale scale, const Context& ctx) {
  if (cache.page_size() > 0x7fffffff) throw Error("indexer_write_k: page_size must fit int32");
  DeviceGuard guard(cache.data.device);
  constexpr int kWarps = 8;
  const int64_t n = slot_mapping.size(0);
  dispatch_activation(k.dtype, "indexer_write_k", [&](auto act) {
    using Act = decltype(act);
    indexer::WriteParams<typename Act::Storage> p{};
    p.k = static_cast<const typename Act::Storage*>(k.data);
    p.k_row = k.stride[0];
    p.slots = slot_mapping.data;
    p.slot_stride = slot_mapping.stride[0];
    p.slots_i64 = slot_mapping.dtype == DType::i64;
    p.ue8m0 = scale == IndexerScale::ue8m0;
    p.num_tokens = n;
    p.cache = indexer::cache_ref(cache);
    indexer::write_k_kernel<Act><<<grid_for(n, kWarps, "indexer_write_k"), kWarps * 32, 0, stream_of(ctx)>>>(p);
    check_launch("indexer_write_k");
  });
}

void indexer_gather_k(const IndexerKCache& cache, const TensorView& dst_k, const TensorView& dst_scale,
                      const TensorView& block_table, const TensorView& cu_seq_lens, const Context& ctx) {
  if (cache.page_size() > 0x7fffffff) throw Error("indexer_gather_k: page_size must fit int32");
  DeviceGuard guard(cache.data.device);
  constexpr int kWarps = 8;
  indexer::GatherParams p{};
  p.cache = indexer::cache_ref(cache);
  p.dst_k = static_cast<uint8_t*>(dst_k.data);
  p.dst_k_row = dst_k.stride[0];
  p.dst_scale = static_cast<float*>(dst_scale.data);
  p.dst_scale_stride = dst_scale.stride[0];
  p.block_table = static_cast<const int32_t*>(block_table.data);
  p.bt_row = block_table.stride[0];
  p.max_blocks = block_table.size(1);
  p.cu = static_cast<const int32_t*>(cu_seq_lens.data);
  p.cu_stride = cu_seq_lens.stride[0];
  p.num_requests = cu_seq_lens.size(0) - 1;
  p.tot = dst_k.size(0);
  indexer::gather_k_kernel<<<grid_for(p.tot, kWarps, "indexer_gather_k"), kWarps * 32, 0, stream_of(ctx)>>>(p);
  check_launch("indexer_gather_k");
}

void indexer_prepare(const TensorView& q, const TensorView& k, const TensorView& weights_raw,
                     const TensorView& positions, const TensorView& cos_sin, const TensorView& k_norm_weight,
                     const TensorView& k_norm_bias, const TensorView& q_codes, const TensorView& weights,
                     const TensorView& k_out, double eps, bool hadamard, const Context& ctx) {
  DeviceGuard guard(q.device);
  constexpr int kWarps = 8;
  const int64_t T = q.size(0), h = q.size(1);
  dispatch_activation(q.dtype, "indexer_prepare", [&](auto act) {
    using Act = decltype(act);
    using S = typename Act::Storage;
    indexer::PrepareParams<S> p{};
    p.q = static_cast<const S*>(q.data);
    p.q_row = q.stride[0];
    p.q_head = q.stride[1];
    p.k = static_cast<const S*>(k.data);
    p.k_row = k.stride[0];
    p.w_raw = static_cast<const S*>(weights_raw.data);
    p.wr_row = weights_raw.stride[0];
    p.wr_head = weights_raw.stride[1];
    p.positions = positions.data;
    p.pos_stride = positions.stride[0];
    p.pos_i64 = positions.dtype == DType::i64;
    p.cos_sin = static_cast<const float*>(cos_sin.data);
    p.cs_row = cos_sin.stride[0];
    p.num_pos = cos_sin.size(0);
    p.ln_w = static_cast<const float*>(k_norm_weight.data);
    p.ln_w_stride = k_norm_weight.stride[0];
    p.ln_b = static_cast<const float*>(k_norm_bias.data);
    p.ln_b_stride = k_norm_bias.stride[0];
    p.q_codes = static_cast<uint8_t*>(q_codes.data);
    p.qc_row = q_codes.stride[0];
    p.qc_head = q_codes.stride[1];
    p.weights = static_cast<float*>(weights.data);
    p.w_row = weights.stride[0];
    p.w_head = weights.stride[1];
    p.k_out = static_cast<S*>(k_out.data);
    p.ko_row = k_out.stride[0];
    p.num_tokens = T;
    p.h = h;
    p.eps = static_cast<float>(eps);
    p.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)) / std::sqrt(128.0));
    p.hadamard = hadamard;
    indexer::prepare_kernel<Act>
        <<<grid_for(T * (h + 1), kWarps, "indexer_prepare"), kWarps * 32, 0, stream_of(ctx)>>>(p);
    check_launch("indexer_prepare");
  });
}

void indexer_topk_rows(const TensorView& logits, const TensorView& row_starts, const TensorView& row_ends,
                       const TensorView& seq_lens, int64_t s_q, const TensorView& out, const Context& ctx) {
  DeviceGuard guard(logits.device);
  indexer::TopkParams p{};
  p.logits = static_cast<const float*>(logits.data);
  p.lg_row = logits.stride[0];
  p.num_rows = logits.size(0);
  p.n_cols = logits.size(1);
  p.out = static_cast<int32_t*>(out.data);
  p.out_row = out.stride[0];
  p.k = out.size(1);
  if (row_starts.defined()) {
    p.row_starts = static_cast<const int32_t*>(row_starts.data);
    p.rs_stride = row_starts.stride[0];
  }
  if (row_ends.defined()) {
    p.row_ends = static_cast<const int32_t*>(row_ends.data);
    p.re_stride = row_ends.stride[0];
  }
  if (seq_lens.defined()) {
    p.seq_lens = static_cast<const int32_t*>(seq_lens.data);
    p.sl_stride = seq_lens.stride[0];
  }
  p.s_q = s_q;
  indexer::topk_kernel<<<grid_for(p.num_rows, 1, "indexer_topk"), indexer::kTopkThreads, 0, stream_of(ctx)>>>(p);
  check_launch("indexer_topk");
}

}  // namespace mla::cuda
