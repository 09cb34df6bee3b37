// SPDX-License-Identifier: Apache-2.0
// ModelDims (mla/types.h) and the planner (mla/plan.h): plain structs with keyword constructors and
// attribute access, the planner functions with the C++ argument names.
#include <pybind11/stl.h>

#include "bindings.h"
#include "mla/plan.h"
#include "mla/types.h"

namespace mlapy {

#define MLA_RW(cls, f) .def_readwrite(#f, &cls::f)
#define MLA_RO(cls, f) .def_readonly(#f, &cls::f)

template <class T>
py::class_<T> plain(py::module_& m, const char* name, const char* doc = "") {
  py::class_<T> c(m, name, doc);
  c.def(py::init([](const py::kwargs& kw) { return from_kwargs<T>(kw); }));
  return c;
}

void bind_plan(py::module_& m) {
  using namespace mla;
  plain<ModelDims>(m, "ModelDims", "DeepSeek MLA dimensions for one tensor-parallel rank.")
      MLA_RW(ModelDims, kv_lora_rank) MLA_RW(ModelDims, qk_rope_head_dim) MLA_RW(ModelDims, qk_nope_head_dim)
      MLA_RW(ModelDims, v_head_dim) MLA_RW(ModelDims, num_heads) MLA_RW(ModelDims, softmax_scale)
      MLA_RW(ModelDims, index_topk) MLA_RW(ModelDims, name)
      .def("d_qk", &ModelDims::d_qk, "Query / key width of the absorbed (MQA) path: kv_lora_rank + qk_rope_head_dim (576).").def("d_v", &ModelDims::d_v, "Value width of the absorbed path: kv_lora_rank (512).").def("d_qk_mha", &ModelDims::d_qk_mha, "Query / key width of the MHA prefill path: qk_nope_head_dim + qk_rope_head_dim (192).")
      .def("validate", &ModelDims::validate, "Check the dimensions; raises ValueError naming the bad one.")
      .def_static("deepseek_v2_lite", &ModelDims::deepseek_v2_lite, py::arg("tp") = 1)
      .def_static("deepseek_v3", &ModelDims::deepseek_v3, py::arg("tp") = 1)
      .def_static("deepseek_v32", &ModelDims::deepseek_v32, py::arg("tp") = 1)
      .def_static("preset", &ModelDims::preset, py::arg("name"), py::arg("tp") = 1);
  m.def("yarn_mscale", &yarn_mscale, py::arg("factor"), py::arg("mscale_all_dim"), "YaRN attention scale factor: 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1).");

  // §8 batch reorder, split, thresholds
  py::enum_<RequestRegion>(m, "RequestRegion")
      .value("decode", RequestRegion::decode).value("extend", RequestRegion::extend).value("prefill", RequestRegion::prefill);
  m.def("classify_request", &classify_request, py::arg("num_computed_tokens"), py::arg("num_scheduled_tokens"),
        py::arg("decode_threshold"), "RequestRegion of one request: prefill (nothing computed), decode (computed > 0 and scheduled <= decode_threshold) or extend.");
  plain<ReorderResult>(m, "ReorderResult", "reorder_decodes_first's result: order (request indices, decodes first) and moved (whether any request moved).") MLA_RW(ReorderResult, order) MLA_RW(ReorderResult, moved);
  m.def("reorder_decodes_first", &reorder_decodes_first, py::arg("num_computed_tokens"), py::arg("num_scheduled_tokens"),
        py::arg("decode_threshold"), "vLLM's batch reorder: per-request counts [R] -> ReorderResult (order with decodes first, and whether anything moved).");
  plain<Split>(m, "Split", "split_decodes_and_prefills' result: request and token counts of the decode and prefill parts.") MLA_RW(Split, num_decodes) MLA_RW(Split, num_prefills) MLA_RW(Split, num_decode_tokens)
      MLA_RW(Split, num_prefill_tokens)
      .def("__eq__", [](const Split& a, const Split& b) { return a == b; })
      .def("__repr__", [](const Split& s) {
        return py::str("Split(num_decodes={}, num_prefills={}, num_decode_tokens={}, num_prefill_tokens={})")
            .format(s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens);
      });
  m.def("split_decodes_and_prefills", &split_decodes_and_prefills, py::arg("query_start_loc"),
        py::arg("decode_threshold"), py::arg("require_uniform"), py::arg("num_tokens") = -1, "Split a batch ordered decodes first: query_start_loc [R + 1] -> Split (decode / prefill request and token counts); num_tokens -1 = query_start_loc[-1].");
  py::enum_<QueryLenSupport>(m, "QueryLenSupport")
      .value("single_only", QueryLenSupport::single_only).value("uniform", QueryLenSupport::uniform)
      .value("varlen", QueryLenSupport::varlen);
  m.def("dense_decode_threshold", &dense_decode_threshold, py::arg("support"), py::arg("num_speculative_tokens"),
        py::arg("parallel_drafting"), py::arg("dcp_world_size"), py::arg("supports_dcp_varlen"), "The query length up to which a dense MLA backend treats a request as a decode (vLLM's rule: spec decode, DCP).");
  m.def("sparse_decode_threshold", &sparse_decode_threshold, py::arg("num_heads"), py::arg("sm100"),
        py::arg("num_speculative_tokens"), py::arg("parallel_drafting"), py::arg("dcp_world_size"),
        py::arg("supports_dcp_varlen"), "The query length up to which the sparse backend treats a request as a decode (per head count and device).");

  // §9 chunked context
  m.def("chunked_prefill_workspace_rows", &chunked_prefill_workspace_rows, py::arg("max_model_len"),
        py::arg("max_num_seqs"), py::arg("page_size"), py::arg("sparse_topk") = 0, "Rows of the chunked-context prefill workspace (vLLM's formula from max_model_len, max_num_seqs, page_size, sparse_topk).");
  plain<ContextChunk>(m, "ContextChunk", "One chunk of chunked-context prefill: per prefill, seq_starts and lens of the context rows it gathers.") MLA_RW(ContextChunk, seq_starts) MLA_RW(ContextChunk, lens)
      MLA_RW(ContextChunk, cu_seq_lens) MLA_RW(ContextChunk, total) MLA_RW(ContextChunk, max_len);
  plain<ContextPlan>(m, "ContextPlan", "plan_context_chunks' result: chunk_size and the chunks.") MLA_RW(ContextPlan, chunk_size) MLA_RW(ContextPlan, chunks);
  m.def("plan_context_chunks", &plan_context_chunks, py::arg("context_lens"), py::arg("workspace_rows"),
        py::arg("page_size"), py::arg("round_to_page") = true, "Chunks of the prefills' contexts (context_lens [P]) that fit workspace_rows rows each -> ContextPlan.");

  // §11 sparse
  m.def("req_id_per_token", &req_id_per_token, py::arg("query_start_loc"), "query_start_loc [R + 1] -> the request of every token [T].");
  m.def("split_prefill_chunks", &split_prefill_chunks, py::arg("seq_lens"), py::arg("workspace_rows"),
        py::arg("request_offset") = 0, "Greedy request ranges [(start, end)] whose seq_lens sum to at most workspace_rows (offset added).");
  m.def("prefill_workspace_starts", &prefill_workspace_starts, py::arg("seq_lens"), py::arg("chunks"), "Each prefill's first workspace row [P]: the exclusive cumsum of seq_lens, restarted at every chunk.");
  m.def("sparse_use_mixed_batch", &sparse_use_mixed_batch, py::arg("num_heads"), py::arg("hisparse") = false,
        py::arg("pcp_and_dcp") = false, "vLLM's rule for running sparse prefills in the mixed batch (by head count, HiSparse, PCP + DCP).");
  py::enum_<SparsePrefillMode>(m, "SparsePrefillMode",
                                "How a sparse fp8_ds_mla step runs its prefill tokens (PlannerConfig.sparse_prefill_mode)")
      .value("automatic", SparsePrefillMode::automatic)
      .value("mixed_batch", SparsePrefillMode::mixed_batch)
      .value("separate", SparsePrefillMode::separate);
  m.def("sparse_mixed_batch_for", &sparse_mixed_batch_for, py::arg("mode"), py::arg("num_heads"),
        py::arg("compute_capability") = 0, py::arg("dcp_world_size") = 1, "Whether SparsePrefillMode `mode` runs prefills in the mixed batch for num_heads on a device of compute_capability in a DCP group of dcp_world_size.");
  m.def("sparse_fp8_decode_padded_heads", &sparse_fp8_decode_padded_heads, py::arg("num_heads"), "Heads the sparse fp8 decode kernel is padded to: 64 if num_heads <= 64, else a multiple of 128.");
  m.def("sparse_prefill_padded_heads", &sparse_prefill_padded_heads, py::arg("num_heads"), py::arg("sm100"), "Heads the sparse prefill kernel is padded to (64 / 128, a multiple of 128 beyond).");
  m.def("sparse_prefill_workspace_rows", &sparse_prefill_workspace_rows, py::arg("max_model_len"), "Rows of the separate sparse prefill's bf16 workspace for max_model_len.");

  // §6 decode schedule
  m.attr("DECODE_MAX_SPLITS") = kDecodeMaxSplits;
  m.def("decode_num_splits", &decode_num_splits, py::arg("b"), py::arg("s_q"), py::arg("h_q"), py::arg("max_seq_len"),
        py::arg("num_sms"), "The planner's split-KV count for a decode of b requests x s_q tokens x h_q heads up to max_seq_len keys on num_sms SMs (1 when num_sms <= 0).");
  plain<DecodeRun>(m, "DecodeRun", "One run of a decode schedule: requests req_begin .. req_end with s_q query tokens each.") MLA_RW(DecodeRun, req_begin) MLA_RW(DecodeRun, req_end) MLA_RW(DecodeRun, s_q)
      MLA_RW(DecodeRun, token_begin) MLA_RW(DecodeRun, block_cols) MLA_RW(DecodeRun, num_splits)
      MLA_RW(DecodeRun, whole_requests)
      .def("__eq__", [](const DecodeRun& a, const DecodeRun& b) { return a == b; });
  plain<DecodeSchedule>(m, "DecodeSchedule", "plan_decode_schedule's result: the runs of the decode part.") MLA_RW(DecodeSchedule, runs);
  m.def("plan_decode_schedule", &plan_decode_schedule, py::arg("query_start_loc"), py::arg("seq_lens"),
        py::arg("num_decodes"), py::arg("page_size"), py::arg("num_heads"), py::arg("num_sms"),
        py::arg("seq_len_bound") = 0, "The decode part's runs of equal query length: query_start_loc [R + 1], seq_lens [R], the first num_decodes requests -> DecodeSchedule.");

  // the step plan
  py::class_<StepMetadata>(m, "StepMetadata", "The packed int32 metadata of a step (what upload_step_metadata copies to the device).") MLA_RO(StepMetadata, data) MLA_RO(StepMetadata, prefill_qsl)
      MLA_RO(StepMetadata, chunk_cu) MLA_RO(StepMetadata, chunk_starts) MLA_RO(StepMetadata, req_id)
      MLA_RO(StepMetadata, prefill_ids) MLA_RO(StepMetadata, workspace_starts)
      .def("bytes", &StepMetadata::bytes, "Bytes of the packed metadata.");
  plain<DcpLayout>(m, "DcpLayout", "This rank's place in a DCP group (mla/dcp.h).")
      MLA_RW(DcpLayout, world_size) MLA_RW(DcpLayout, rank) MLA_RW(DcpLayout, interleave);
  plain<PlannerConfig>(m, "PlannerConfig", "What the planner needs to know about the layer and device: dims, cache format, page size, thresholds, num_sms, compute capability, DCP layout (keyword constructor).") MLA_RW(PlannerConfig, dims) MLA_RW(PlannerConfig, cache_format)
      MLA_RW(PlannerConfig, page_size) MLA_RW(PlannerConfig, max_model_len) MLA_RW(PlannerConfig, max_num_seqs)
      MLA_RW(PlannerConfig, sparse) MLA_RW(PlannerConfig, decode_threshold) MLA_RW(PlannerConfig, require_uniform)
      MLA_RW(PlannerConfig, context_workspace_rows) MLA_RW(PlannerConfig, sparse_workspace_rows)
      MLA_RW(PlannerConfig, sparse_prefill_mode) MLA_RW(PlannerConfig, num_sms)
      MLA_RW(PlannerConfig, compute_capability) MLA_RW(PlannerConfig, dcp) MLA_RW(PlannerConfig, batch_invariant)
      .def("validate", &PlannerConfig::validate, "Check the configuration; raises ValueError naming the bad field.").def("sparse_mixed_batch", &PlannerConfig::sparse_mixed_batch, "Whether sparse prefills run in the mixed batch for this configuration.");
  plain<BatchDesc>(m, "BatchDesc", "One step's batch as the scheduler gives it: query_start_loc [R + 1] and seq_lens [R] (requests ordered decodes first), num_tokens, decode_seq_len_bound.") MLA_RW(BatchDesc, query_start_loc) MLA_RW(BatchDesc, seq_lens)
      MLA_RW(BatchDesc, num_tokens) MLA_RW(BatchDesc, decode_seq_len_bound);
  py::class_<SparsePrefillChunk>(m, "SparsePrefillChunk", "One chunk of the separate sparse prefill: requests req_begin .. req_end and their workspace rows.") MLA_RO(SparsePrefillChunk, req_begin)
      MLA_RO(SparsePrefillChunk, req_end) MLA_RO(SparsePrefillChunk, token_begin) MLA_RO(SparsePrefillChunk, token_end)
      MLA_RO(SparsePrefillChunk, total_rows) MLA_RO(SparsePrefillChunk, workspace_starts);
  py::class_<Plan>(m, "Plan", "One step's plan (make_plan); read-only. Nested objects (config, split, context, ...) are "
                           "references: editing them voids the seal and MlaAttention.forward refuses the plan.")
      MLA_RO(Plan, config) MLA_RO(Plan, num_reqs) MLA_RO(Plan, num_tokens) MLA_RO(Plan, num_actual_tokens)
      MLA_RO(Plan, query_start_loc) MLA_RO(Plan, seq_lens) MLA_RO(Plan, split) MLA_RO(Plan, decode_query_len)
      MLA_RO(Plan, max_decode_seq_len) MLA_RO(Plan, prefill_query_start_loc) MLA_RO(Plan, prefill_seq_lens)
      MLA_RO(Plan, prefill_context_lens) MLA_RO(Plan, max_prefill_query_len) MLA_RO(Plan, max_prefill_seq_len)
      MLA_RO(Plan, prefill_tokens_with_context) MLA_RO(Plan, context) MLA_RO(Plan, req_id_per_token)
      MLA_RO(Plan, sparse_mixed_batch) MLA_RO(Plan, prefill_request_id) MLA_RO(Plan, sparse_chunks)
      MLA_RO(Plan, decode) MLA_RO(Plan, metadata) MLA_RO(Plan, seal)
      .def("has_decode", &Plan::has_decode, "Whether the step has decode tokens.").def("has_prefill", &Plan::has_prefill, "Whether the step has prefill tokens.");
  m.def("batch_invariant_splits", &batch_invariant_splits, py::arg("config"), py::arg("s_q"),
        "The split-KV count of every decode run of s_q-token requests in a batch-invariant plan: decode_num_splits for "
        "the config's full batch (max_num_seqs requests of max_model_len keys); a function of the config and s_q only.");
  m.def("make_plan", &make_plan, py::arg("batch"), py::arg("config"), "Plan one step: BatchDesc and PlannerConfig -> a sealed Plan (host decisions and packed metadata) for MlaAttention.forward.");
  m.def("same_launches", &same_launches, py::arg("a"), py::arg("b"), "Whether two plans make the same launches (every host decision equal; lengths and tables may differ): one captured CUDA graph serves both.");
  m.def("plan_digest", &plan_digest, py::arg("plan"), "FNV-1a digest of every field of the plan (never 0): the seal forward() checks.");
  m.def("max_step_metadata_bytes", &max_step_metadata_bytes, py::arg("config"), py::arg("max_num_tokens"), "Upper bound of the step metadata's bytes for any plan of `config` with at most max_num_tokens tokens (size the staging buffers once).");
}

#undef MLA_RW
#undef MLA_RO

}  // namespace mlapy
