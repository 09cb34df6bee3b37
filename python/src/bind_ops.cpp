// SPDX-License-Identifier: Apache-2.0
// The functional ops of mla/ops.h, argument for argument (the C++ comments there are the reference).
// Each op takes keyword-only `stream` and `precision` (the Context); the GIL is released while it runs.
#include <pybind11/stl.h>

#include <tuple>

#include "bindings.h"
#include "mla/ops.h"

namespace mlapy {

namespace {

using A = TensorArg;
using K = PyKVCache;
using mla::Precision;

}  // namespace

void bind_ops(py::module_& m) {
  const auto stream = py::arg("stream") = py::none();
  const auto precision = py::arg("precision") = Precision::fast;

  m.def("write_cache", [](const A& kv_c, const A& k_pe, const A& slot_mapping, const K& cache, mla::DsMlaScale ds_scale,
                          py::handle s, Precision p) {
    const mla::Context ctx = to_context(kv_c.view, s, p);
    without_gil([&] { mla::write_cache(kv_c.view, k_pe.view, slot_mapping.view, cache.cache, ds_scale, ctx); });
  }, py::arg("kv_c"), py::arg("k_pe"), py::arg("slot_mapping"), py::arg("cache"), py::arg("ds_scale") = mla::DsMlaScale::amax,
     py::kw_only(), stream, precision, "Write kv_c | k_pe rows into the cache at slot_mapping (vLLM concat_and_cache_mla). kv_c [T, L] (L = 512), "
     "k_pe [T, R] (R = 64), any float dtype, any row stride; slot_mapping [T'] int64 or int32, T' <= T tokens "
     "written, slot < 0 skipped. bf16 cache: exact copy; fp8: x / scale saturated; fp8_ds_mla: per-128 tile scales "
     "(ds_scale), rope as bf16.");

  // gather_cache and cp_gather_cache share their signature (mla/ops.h §5.1, §5.2).
  using GatherFn = void (*)(const mla::KVCache&, const mla::TensorView&, const mla::TensorView&,
                            const mla::TensorView&, const mla::TensorView&, const mla::Context&);
  for (auto [name, fn, doc] : {std::tuple<const char*, GatherFn, const char*>{
                                   "gather_cache", &mla::gather_cache,
                                   "Gather each request's cache rows into dst, dequantised: dst [TOT, D] bf16 / f16 / f32 (CPU: f64 too), "
                                   "D = d_qk (whole row) or the latent width; block_table [B, max_blocks] int32; cu_seq_lens "
                                   "[B + 1] int32 (request b fills rows cu[b] .. cu[b + 1]); seq_starts [B] int32 optional "
                                   "(first logical position of each request)."},
                               {"cp_gather_cache", &mla::cp_gather_cache, "Raw copy of each request's cache rows, no conversion: dst [TOT, E] in the "
                                   "cache tensor's dtype and row width; block_table [B, max_blocks], cu_seq_lens [B + 1], "
                                   "seq_starts [B] optional, all int32."}}) {
    m.def(name, [fn](const K& cache, const A& dst, const A& block_table, const A& cu_seq_lens, const A& seq_starts,
                     py::handle s, Precision p) {
      const mla::Context ctx = to_context(dst.view, s, p);
      without_gil([&] { fn(cache.cache, dst.view, block_table.view, cu_seq_lens.view, seq_starts.view, ctx); });
    }, py::arg("cache"), py::arg("dst"), py::arg("block_table"), py::arg("cu_seq_lens"),
       py::arg("seq_starts") = py::none(), py::kw_only(), stream, precision, doc);
  }

  m.def("upconvert_ds_mla", [](const K& cache, const A& dst, const A& block_table, const A& workspace_starts,
                               const A& seq_starts, py::handle s, Precision p) {
    const mla::Context ctx = to_context(dst.view, s, p);
    without_gil([&] {
      mla::upconvert_ds_mla(cache.cache, dst.view, block_table.view, workspace_starts.view, seq_starts.view, ctx);
    });
  }, py::arg("cache"), py::arg("dst"), py::arg("block_table"), py::arg("workspace_starts"),
     py::arg("seq_starts") = py::none(), py::kw_only(), stream, precision,
     "fp8_ds_mla cache rows -> dst [TOT, 576] bf16 (CUDA: bf16 / f16 / f32; CPU: any float dtype). block_table "
     "[B, max_blocks] int32; workspace_starts [B] int32: request b fills rows starts[b] .. starts[b + 1] (the last "
     "ends at TOT); seq_starts [B] int32 optional.");

  m.def("merge_attn_states", [](const A& out, const A& out_lse, const A& prefix, const A& prefix_lse, const A& suffix,
                                const A& suffix_lse, int64_t prefill_tokens_with_context, float output_scale,
                                py::handle s, Precision p) {
    const mla::Context ctx = to_context(out.view, s, p);
    without_gil([&] {
      mla::merge_attn_states(out.view, out_lse.view, prefix.view, prefix_lse.view, suffix.view, suffix_lse.view,
                             prefill_tokens_with_context, output_scale, ctx);
    });
  }, py::arg("out"), py::arg("out_lse"), py::arg("prefix"), py::arg("prefix_lse"), py::arg("suffix"),
     py::arg("suffix_lse"), py::arg("prefill_tokens_with_context") = -1, py::arg("output_scale") = 0.0f,
     py::kw_only(), stream, precision, "out = the LSE-weighted merge of two partial attentions (vLLM merge_attn_states). out, prefix, suffix "
     "[T, H, D] (bf16 / f16 / f32; CPU: f64 too); prefix_lse, suffix_lse [H, T] fp32 (a transposed [T, H] view "
     "works); out_lse [H, T] fp32 or None. Tokens t >= prefill_tokens_with_context (>= 0) take the suffix; "
     "output_scale > 0: out is fp8_e4m3 and receives out / output_scale.");

  m.def("convert_topk_indices", [](const A& req_id, const A& block_table, const A& indices, const A& out,
                                   int64_t page_size, int64_t block_stride_rows, const A& prefill_request_ids,
                                   const A& prefill_workspace_starts, const A& valid_counts, const A& seq_lens,
                                   py::handle s, Precision p) {
    const mla::Context ctx = to_context(out.view, s, p);
    without_gil([&] {
      mla::convert_topk_indices(req_id.view, block_table.view, indices.view, out.view, page_size, block_stride_rows,
                                prefill_request_ids.view, prefill_workspace_starts.view, valid_counts.view,
                                seq_lens.view, ctx);
    });
  }, py::arg("req_id"), py::arg("block_table"), py::arg("indices"), py::arg("out"), py::arg("page_size"),
     py::arg("block_stride_rows") = 0, py::arg("prefill_request_ids") = py::none(),
     py::arg("prefill_workspace_starts") = py::none(), py::arg("valid_counts") = py::none(),
     py::arg("seq_lens") = py::none(), py::kw_only(), stream, precision,
     "Request-local top-k positions -> global cache rows (block_table[req, i // page_size] * block_stride_rows + "
     "i % page_size) or prefill workspace rows. req_id [T], block_table [R, max_blocks], indices [T, topk], out "
     "[T, topk], prefill_request_ids [T], prefill_workspace_starts [P], valid_counts [T], seq_lens [R]: all int32; "
     "-1 = invalid (positions >= seq_lens[req] too).");

  m.def("mqa_decode", [](const A& q, const K& cache, const A& block_table, const A& seq_lens, const A& out, const A& lse,
                         double softmax_scale, bool causal, const A& workspace, int num_splits, bool whole_requests,
                         py::handle s, Precision p, bool batch_invariant, bool fp8_compute) {
    const mla::Context ctx = to_context(q.view, s, p);
    without_gil([&] {
      mla::mqa_decode(q.view, cache.cache, block_table.view, seq_lens.view, out.view, lse.view, softmax_scale, causal,
                      workspace.view, ctx, num_splits, whole_requests, batch_invariant, fp8_compute);
    });
  }, py::arg("q"), py::arg("cache"), py::arg("block_table"), py::arg("seq_lens"), py::arg("out"), py::arg("lse"),
     py::arg("softmax_scale"), py::arg("causal") = true, py::arg("workspace") = py::none(), py::arg("num_splits") = 0,
     py::arg("whole_requests") = false, py::kw_only(), stream, precision, py::arg("batch_invariant") = false,
     py::arg("fp8_compute") = false,
     "Absorbed MQA decode over the paged cache. q [b, s_q, h_q, d_qk] (d_qk = cache.d_qk = 576; CUDA: bf16, f16 or "
     "f32, rounded to bf16), block_table [b, max_blocks] int32, seq_lens [b] int32, out [b, s_q, h_q, d_v] "
     "(d_v <= 512, q's dtype family), lse [b, s_q, h_q] fp32 natural log or None (-inf where no key is visible; "
     "FlashMLA's is [b, h_q, s_q]). causal: query i sees keys up to seq_len - s_q + i. workspace: u8 "
     "[mqa_decode_workspace_bytes(...)] on CUDA, None on the CPU; num_splits 0 = the planner's policy; "
     "whole_requests: a hint that the lengths are near-uniform (one CTA per request; same result either way); "
     "batch_invariant: each request's result bit-identical whatever else is in the batch (needs num_splits >= 1, "
     "e.g. batch_invariant_splits(config, s_q)). fp8_compute: an fp8 per-tensor cache may be read with e4m3 "
     "products (q and the softmax weights rounded to e4m3; docs/SEMANTICS.md 14.10's bound); a permission, exact "
     "where no such kernel runs.");
  m.def("mqa_decode_workspace_bytes", [](int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, py::handle device,
                                         int num_splits) {
    return mla::mqa_decode_workspace_bytes(b, s_q, h_q, max_seq_len, to_device(device), num_splits);
  }, py::arg("b"), py::arg("s_q"), py::arg("h_q"), py::arg("max_seq_len"), py::arg("device"), py::arg("num_splits") = 0,
     "Bytes of the u8 workspace mqa_decode needs for these sizes and num_splits on `device` (0 on the CPU).");
  m.def("multiprocessor_count", [](py::handle device) { return mla::multiprocessor_count(to_device(device)); },
        py::arg("device"), "Streaming multiprocessors of a CUDA device (0 for the CPU): PlannerConfig.num_sms.");
  m.def("compute_capability", [](py::handle device) { return mla::compute_capability(to_device(device)); },
        py::arg("device"), "major * 10 + minor of a CUDA device (0 for the CPU): PlannerConfig.compute_capability");

  m.def("mha_prefill", [](const A& q, const A& k_nope, const A& k_pe, const A& v, const A& cu_seqlens_q,
                          const A& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, const A& out, const A& lse,
                          double softmax_scale, bool causal, py::handle s, Precision p, bool fp8, float q_scale,
                          float k_scale, float v_scale, const A& workspace) {
    const mla::Context ctx = to_context(q.view, s, p);
    mla::PrefillOptions o;
    o.fp8 = fp8;
    o.q_scale = q_scale;
    o.k_scale = k_scale;
    o.v_scale = v_scale;
    o.workspace = workspace.view;
    without_gil([&] {
      mla::mha_prefill(q.view, k_nope.view, k_pe.view, v.view, cu_seqlens_q.view, cu_seqlens_k.view, max_seqlen_q,
                       max_seqlen_k, out.view, lse.view, softmax_scale, causal, o, ctx);
    });
  }, py::arg("q"), py::arg("k_nope"), py::arg("k_pe"), py::arg("v"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
     py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("out"), py::arg("lse"), py::arg("softmax_scale"),
     py::arg("causal"), py::kw_only(), stream, precision, py::arg("fp8") = false, py::arg("q_scale") = 1.0f,
     py::arg("k_scale") = 1.0f, py::arg("v_scale") = 1.0f, py::arg("workspace") = py::none(),
     "Varlen MHA prefill over up-projected K/V. q [Tq, h, d_nope + d_rope], k_nope [Tk, h, d_nope], k_pe "
     "[Tk, h, d_rope] (head stride 0 allowed: one shared rope row), v [Tk, h, d_v] (CUDA: bf16); cu_seqlens_q / "
     "cu_seqlens_k [B + 1] int32; out [Tq, h, d_v]; lse [h, Tq] fp32 or None. causal: bottom-right aligned. "
     "fp8: q, k, v quantised with the static q_scale / k_scale / v_scale (code = e4m3(x / scale)) and P as e4m3 "
     "(docs/SEMANTICS.md §10.1; CUDA: sm_90, d_nope 128, d_rope 64, d_v 128, workspace u8 "
     "[mha_prefill_workspace_bytes(...)]; the CPU computes it in float64 over the codes).");
  m.def("mha_prefill_workspace_bytes", [](int64_t total_q, int64_t total_k, int64_t heads, int64_t batch, bool fp8,
                                          py::handle device) {
    return mla::mha_prefill_workspace_bytes(total_q, total_k, heads, batch, fp8, to_device(device));
  }, py::arg("total_q"), py::arg("total_k"), py::arg("heads"), py::arg("batch"), py::arg("fp8"), py::arg("device"),
     "Bytes of the u8 workspace an fp8 mha_prefill needs on `device` (0 without fp8 or on the CPU).");

  m.def("sparse_mqa", [](const A& q, const K& kv, const A& indices, const A& topk_length, const A& out, const A& lse,
                         double softmax_scale, py::handle s, Precision p, const A& attn_sink, py::handle extra_kv,
                         const A& extra_indices, const A& extra_topk_length, bool values_include_rope,
                         bool batch_invariant, const A& out_rotation_positions, const A& out_rotation_inv_freq,
                         int64_t out_rotation_dim) {
    const mla::Context ctx = to_context(q.view, s, p);
    mla::SparseOptions o =
        sparse_options(attn_sink, extra_kv, extra_indices, extra_topk_length, values_include_rope, batch_invariant);
    o.out_rotation = {out_rotation_positions.view, out_rotation_inv_freq.view, out_rotation_dim};
    without_gil([&] {
      mla::sparse_mqa(q.view, kv.cache, indices.view, topk_length.view, out.view, lse.view, softmax_scale, o, ctx);
    });
  }, py::arg("q"), py::arg("kv"), py::arg("indices"), py::arg("topk_length"), py::arg("out"), py::arg("lse"),
     py::arg("softmax_scale"), py::kw_only(), stream, precision, py::arg("attn_sink") = py::none(),
     py::arg("extra_kv") = py::none(), py::arg("extra_indices") = py::none(), py::arg("extra_topk_length") = py::none(),
     py::arg("values_include_rope") = false, py::arg("batch_invariant") = false,
     py::arg("out_rotation_positions") = py::none(), py::arg("out_rotation_inv_freq") = py::none(),
     py::arg("out_rotation_dim") = 0,
     "Sparse MQA over top-k cache rows (FlashMLA-sparse semantics). q [T, h_q, d_qk] (CUDA: bf16), kv any cache "
     "format (row r = block r // page, offset r % page), indices [T, topk] int32 (< 0 invalid), topk_length [T] "
     "int32 or None, out [T, h_q, d_v], lse [T, h_q] fp32 or None (no valid index: out 0, lse -inf). "
     "DeepSeek-V4 inputs (SEMANTICS §11.8): attn_sink [h_q] f32, "
     "extra_kv / extra_indices [T, k_e] / extra_topk_length [T] (a second cache in the same softmax), "
     "values_include_rope (d_v up to d_qk), out_rotation_positions [T] int32 / int64 + out_rotation_inv_freq "
     "[R / 2] f64 + out_rotation_dim R (the output's last R columns turned pairwise by position * inv_freq before "
     "the store: the V4 block's inverse rope). batch_invariant: each token's result bit-identical whatever else is "
     "in the call.");

  m.def("gemm", [](const A& a, const A& b, const A& c, float alpha, float beta, py::handle s, Precision p) {
    const mla::Context ctx = to_context(c.view, s, p);
    without_gil([&] { mla::gemm(a.view, b.view, c.view, alpha, beta, ctx); });
  }, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::kw_only(), stream,
     precision, "c = alpha * a @ b + beta * c: a [m, k], b [k, n], c [m, n] (CUDA: a, b bf16, c bf16 or f32; CPU: any float "
     "dtype); fp32 accumulation (fp64 with precision=reference).");
  m.def("bmm", [](const A& a, const A& b, const A& c, float alpha, float beta, py::handle s, Precision p) {
    const mla::Context ctx = to_context(c.view, s, p);
    without_gil([&] { mla::bmm(a.view, b.view, c.view, alpha, beta, ctx); });
  }, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::kw_only(), stream,
     precision, "Batched c = alpha * a @ b + beta * c: a [batch, m, k], b [batch, k, n], c [batch, m, n] (CUDA: a, b bf16, c "
     "bf16 or f32; CPU: any float dtype).");
}

}  // namespace mlapy
