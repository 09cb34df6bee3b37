// SPDX-License-Identifier: Apache-2.0
// Sparse (DSA) MLA: every token through sparse MQA over its top-k rows (docs/SEMANTICS.md §11).
//   bf16 / fp8 cache, or fp8_ds_mla in mixed-batch mode: one sparse_mqa over the cache for all tokens.
//   fp8_ds_mla separate mode (h >= 32): decode tokens on the cache; each prefill chunk's requests are
//   upconverted whole (context + new tokens, already written by step 1) into a bf16 workspace and
//   their tokens attend over it, indices converted to chunk-local workspace rows.
#include "layer/layer_internal.h"

namespace mla::layer_detail {

void run_sparse(const Step& s) {
  const Dims& d = s.dims;
  const StepFacts& f = s.facts;
  const int64_t t = f.t_act, topk = s.opt.dims.index_topk;
  if (t == 0) return;
  const double scale = s.opt.dims.softmax_scale;
  const TensorView q_abs = s.view(s.layout.q_abs, s.opt.dtype, {t, d.h, d.d_qk()});
  const TensorView o_lat = s.view(s.layout.o_lat, s.opt.dtype, {t, d.h, d.L});
  const TensorView indices = s.view(s.layout.indices, DType::i32, {t, topk});
  absorb_queries(s, 0, t, q_abs);

  if (s.plan.config.dcp.world_size > 1) {  // §13: positions localized to this shard, then the group op
    const TensorView req_id = s.meta_view(s.plan.metadata.req_id, t);
    const TensorView local = s.view(s.layout.dcp_topk, DType::i32, {t, topk});
    dcp_localize_topk(req_id, s.args.seq_lens, s.args.topk_indices.slice(0, 0, t), local, s.plan.config.dcp, s.ctx);
    convert_topk_indices(req_id, s.args.block_table, local, indices, s.cache.page_size(), 0, {}, {}, {}, {}, s.ctx);
    TensorView scratch;
    if (s.layout.scratch.bytes > 0) scratch = s.view(s.layout.scratch, DType::u8, {s.layout.scratch.bytes});
    dcp_sparse_mqa(*s.opt.dcp_comm, q_abs, s.cache, indices, {}, o_lat, {}, scale, scratch, s.ctx);
    up_project(s, o_lat, 0);
    return;
  }
  SparseOptions opts;  // a batch-invariant plan: each token's result whatever else the step holds
  opts.batch_invariant = s.plan.config.batch_invariant;
  TensorView prefill_ids, workspace_starts;
  if (f.sparse_separate) {
    prefill_ids = s.meta_view(s.plan.metadata.prefill_ids, t);
    workspace_starts = s.meta_view(s.plan.metadata.workspace_starts, f.num_prefills);
  }
  convert_topk_indices(s.meta_view(s.plan.metadata.req_id, t), s.args.block_table, s.args.topk_indices.slice(0, 0, t), indices,
                       s.cache.page_size(), 0, prefill_ids, workspace_starts, {}, s.args.seq_lens, s.ctx);

  if (!f.sparse_separate) {
    sparse_mqa(q_abs, s.cache, indices, {}, o_lat, {}, scale, opts, s.ctx);
  } else {
    if (f.t_dec > 0)
      sparse_mqa(q_abs.slice(0, 0, f.t_dec), s.cache, indices.slice(0, 0, f.t_dec), {}, o_lat.slice(0, 0, f.t_dec), {},
                 scale, opts, s.ctx);
    for (const SparsePrefillChunk& c : s.plan.sparse_chunks) {
      if (c.token_end == c.token_begin) continue;
      const TensorView rows = s.view(s.layout.upconv, DType::bf16, {c.total_rows, d.d_qk()});
      upconvert_ds_mla(s.cache, rows,
                       s.args.block_table.slice(0, f.num_decodes + c.req_begin, f.num_decodes + c.req_end),
                       workspace_starts.slice(0, c.req_begin, c.req_end), {}, s.ctx);
      const KVCache kv{rows.reshape({1, c.total_rows, d.d_qk()}), CacheFormat::bf16, 1.0f,
                       static_cast<int>(d.d_qk()), static_cast<int>(d.R)};
      sparse_mqa(q_abs.slice(0, c.token_begin, c.token_end), kv, indices.slice(0, c.token_begin, c.token_end), {},
                 o_lat.slice(0, c.token_begin, c.token_end), {}, scale, opts, s.ctx);
    }
  }
  up_project(s, o_lat, 0);
}

}  // namespace mla::layer_detail
