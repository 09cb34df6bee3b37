// SPDX-License-Identifier: Apache-2.0
// Dense MLA: decode tokens through the absorbed MQA over the latent cache, prefill tokens through
// MHA with up-projected K/V and the chunked context merged by LSE (docs/SEMANTICS.md §2, §9).
#include <utility>

#include "layer/layer_internal.h"

namespace mla::layer_detail {

namespace {

// k_nope [n, h, P] and v [n, h, V] inside an up-projected [n, h*(P+V)] block (per head: P | V).
std::pair<TensorView, TensorView> split_kv(const TensorView& kv, const Dims& d) {
  const std::array<int64_t, 3> shape{kv.shape[0], d.h, d.P + d.V}, stride{kv.stride[0], d.P + d.V, 1};
  const TensorView heads(kv.data, kv.dtype, shape, stride, kv.device);
  return {heads.slice(2, 0, d.P), heads.slice(2, d.P, d.P + d.V)};
}

struct Partial {
  TensorView out, lse;  // [Tp, h, V], [h, Tp] f32 (f64 in the oracle layer)
};

// mha_prefill's options: fp8 compute with the layer's static scales when LayerOptions::fp8_prefill (the
// workspace region holds the largest call's quantised operands on CUDA), else the bf16 op.
PrefillOptions prefill_options(const Step& s) {
  PrefillOptions po;
  if (!s.opt.fp8_prefill) return po;
  po.fp8 = true;
  po.q_scale = s.opt.fp8_prefill_scales.q;
  po.k_scale = s.opt.fp8_prefill_scales.k;
  po.v_scale = s.opt.fp8_prefill_scales.v;
  if (s.layout.fp8_prefill.bytes > 0) po.workspace = s.view(s.layout.fp8_prefill, DType::u8, {s.layout.fp8_prefill.bytes});
  return po;
}

// DCP (§13): context chunk c's rows in request order on every rank. This rank gathers the positions it
// owns (one local range per prefill), the group all-gathers those blocks (pad_rows rows each: every
// rank calls it for every chunk with rows), and the plan's segments place each rank's turns of I rows.
void gather_dcp_chunk(const Step& s, std::size_t c, const TensorView& gathered, const TensorView& block_table) {
  const Dims& d = s.dims;
  const DcpChunk& dc = s.plan.dcp_chunks[c];
  const int64_t np = s.facts.num_prefills, w = s.plan.config.dcp.world_size, turn = w * s.plan.config.dcp.interleave;
  const DType act = s.opt.dtype;
  const int64_t mine = dc.local_cu.back();
  const TensorView local = s.view(s.layout.dcp_local, act, {dc.pad_rows, d.d_qk()});
  const TensorView recv = s.view(s.layout.dcp_recv, act, {w * dc.pad_rows, d.d_qk()});
  if (mine > 0)
    gather_cache(s.cache, local.slice(0, 0, mine), block_table, s.meta_view(s.plan.metadata.dcp_chunk_cu[c], np + 1),
                 s.meta_view(s.plan.metadata.dcp_chunk_starts[c], np), s.ctx);
  s.opt.dcp_comm->all_gather(local, recv, s.ctx);
  for (const DcpSegment& g : dc.segments) {
    // `count` blocks of `rows` contiguous rows (one wide row each): W·I rows apart in the chunk,
    // back to back in the received rows.
    const int64_t block = g.rows * d.d_qk();
    const int64_t shape[] = {g.count, 1, block};
    const int64_t dst_stride[] = {turn * d.d_qk(), block, 1}, src_stride[] = {block, block, 1};
    copy_rows(TensorView(gathered.slice(0, g.dst_row, g.dst_row + 1).data, act, shape, dst_stride, gathered.device),
              TensorView(recv.slice(0, g.src_row, g.src_row + 1).data, act, shape, src_stride, recv.device), s.ctx);
  }
}

// Non-causal attention of every prefill query against its request's context, chunk by chunk, folded
// into a running (out, lse) with merge_attn_states (prefix = accumulated, suffix = the new chunk).
// Requests with a zero-length share of a chunk get (0, -inf) from mha_prefill, which the merge treats
// as the identity.
Partial attend_context(const Step& s, const TensorView& q, const TensorView& cu_q) {
  const Dims& d = s.dims;
  const StepFacts& f = s.facts;
  const int64_t tp = q.shape[0], hpv = d.h * (d.P + d.V);
  const DType act = s.opt.dtype;
  const TensorView block_table = s.args.block_table.slice(0, f.num_decodes, f.num_reqs);
  auto acc = [&](int i) {
    return Partial{s.view(s.layout.acc_o[i], act, {tp, d.h, d.V}), s.view(s.layout.acc_lse[i], d.lse_dtype, {d.h, tp})};
  };
  int cur = 0;
  bool first = true;
  const auto& chunks = s.plan.context.chunks;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const ContextChunk& ch = chunks[c];
    if (ch.total == 0) continue;
    s.ctx.mark("context.gather");
    const TensorView cu_k = s.meta_view(s.plan.metadata.chunk_cu[c], f.num_prefills + 1);
    const TensorView gathered = s.view(s.layout.gathered, act, {ch.total, d.d_qk()});
    if (s.plan.config.dcp.world_size > 1)
      gather_dcp_chunk(s, c, gathered, block_table);
    else
      gather_cache(s.cache, gathered, block_table, cu_k, s.meta_view(s.plan.metadata.chunk_starts[c], f.num_prefills),
                   s.ctx);
    const TensorView kv = s.view(s.layout.kv_ctx, act, {ch.total, hpv});
    s.ctx.mark("context.kv_b_proj");
    gemm(gathered.slice(1, 0, d.L), s.layer.w_kv_b(), kv, 1.0f, 0.0f, s.ctx);
    const auto [k_nope, v] = split_kv(kv, d);
    const TensorView k_pe = broadcast_heads(gathered.slice(1, d.L, d.L + d.R), d.h);
    const Partial dst = acc(first ? 0 : 2);
    s.ctx.mark("context.attention");
    mha_prefill(q, k_nope, k_pe, v, cu_q, cu_k, s.plan.max_prefill_query_len, ch.max_len, dst.out, dst.lse,
                s.opt.dims.softmax_scale, /*causal=*/false, prefill_options(s), s.ctx);
    if (!first) {
      s.ctx.mark("context.merge");
      const Partial prev = acc(cur), next = acc(1 - cur);
      merge_attn_states(next.out, next.lse, prev.out, prev.lse, dst.out, dst.lse, -1, 0.0f, s.ctx);
      cur = 1 - cur;
    }
    first = false;
  }
  return acc(cur);
}

}  // namespace

void run_dense_decode(const Step& s) {
  const Dims& d = s.dims;
  const StepFacts& f = s.facts;
  if (f.t_dec == 0) return;
  const TensorView q_abs = s.view(s.layout.q_abs, s.opt.dtype, {f.t_dec, d.h, d.d_qk()});
  const TensorView o_lat = s.view(s.layout.o_lat, s.opt.dtype, {f.t_dec, d.h, d.L});
  s.ctx.mark("decode.absorb");
  absorb_queries(s, 0, f.t_dec, q_abs);
  TensorView scratch;
  if (s.layout.scratch.bytes > 0) scratch = s.view(s.layout.scratch, DType::u8, {s.layout.scratch.bytes});
  s.ctx.mark("decode.attention");
  // The plan's decode schedule: one launch per run with the planned split count; everything else
  // comes from ForwardArgs (no metadata, no host sync).
  for (const DecodeRun& r : s.plan.decode.runs) {
    const int64_t b = r.req_end - r.req_begin, t0 = r.token_begin, t1 = t0 + b * r.s_q;
    if (s.plan.config.dcp.world_size > 1) {  // §13: this rank's shard for the group's heads, then the exchange and combine
      dcp_mqa_decode(*s.opt.dcp_comm, q_abs.slice(0, t0, t1).reshape({b, r.s_q, d.h, d.d_qk()}), s.cache,
                     s.args.block_table.slice(0, r.req_begin, r.req_end).slice(1, 0, r.block_cols),
                     s.meta_view(s.plan.metadata.dcp_local_lens + t0, b * r.s_q),
                     o_lat.slice(0, t0, t1).reshape({b, r.s_q, d.h, d.L}), {}, s.opt.dims.softmax_scale, scratch, s.ctx,
                     r.num_splits);
      continue;
    }
    mqa_decode(q_abs.slice(0, t0, t1).reshape({b, r.s_q, d.h, d.d_qk()}), s.cache,
               s.args.block_table.slice(0, r.req_begin, r.req_end).slice(1, 0, r.block_cols),
               s.args.seq_lens.slice(0, r.req_begin, r.req_end),
               o_lat.slice(0, t0, t1).reshape({b, r.s_q, d.h, d.L}), {}, s.opt.dims.softmax_scale, /*causal=*/true,
               scratch, s.ctx, r.num_splits, r.whole_requests, s.plan.config.batch_invariant);
  }
  s.ctx.mark("decode.up_proj");
  up_project(s, o_lat, 0);
}

void run_dense_prefill(const Step& s) {
  const Dims& d = s.dims;
  const StepFacts& f = s.facts;
  const int64_t tp = f.t_act - f.t_dec;
  if (f.num_prefills == 0 || tp == 0) return;
  const DType act = s.opt.dtype;
  const double scale = s.opt.dims.softmax_scale;
  const TensorView q = s.args.q.slice(0, f.t_dec, f.t_act);
  const TensorView kv_new = s.view(s.layout.kv_new, act, {tp, d.h * (d.P + d.V)});
  s.ctx.mark("prefill.kv_b_proj");
  gemm(s.args.kv_c.slice(0, f.t_dec, f.t_act), s.layer.w_kv_b(), kv_new, 1.0f, 0.0f, s.ctx);
  const auto [k_nope, v] = split_kv(kv_new, d);
  const TensorView k_pe = broadcast_heads(s.args.k_pe.slice(0, f.t_dec, f.t_act), d.h);
  const TensorView cu_q = s.meta_view(s.plan.metadata.prefill_qsl, f.num_prefills + 1);
  const int64_t max_q = s.plan.max_prefill_query_len;
  const TensorView out = s.out_rows(f.t_dec, f.t_act);
  s.ctx.mark("prefill.causal");
  if (f.context_chunks == 0) {
    mha_prefill(q, k_nope, k_pe, v, cu_q, cu_q, max_q, max_q, out, {}, scale, /*causal=*/true, prefill_options(s), s.ctx);
    return;
  }
  const Partial fresh{s.view(s.layout.o_new, act, {tp, d.h, d.V}), s.view(s.layout.lse_new, d.lse_dtype, {d.h, tp})};
  mha_prefill(q, k_nope, k_pe, v, cu_q, cu_q, max_q, max_q, fresh.out, fresh.lse, scale, /*causal=*/true,
              prefill_options(s), s.ctx);
  const Partial context = attend_context(s, q, cu_q);
  s.ctx.mark("prefill.merge");
  merge_attn_states(out, {}, context.out, context.lse, fresh.out, fresh.lse, f.prefill_tokens_with_context, 0.0f,
                    s.ctx);
}

}  // namespace mla::layer_detail
