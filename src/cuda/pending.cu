// TEMPORARY: CUDA entry points not written yet. Each throws mla::Error so that a CUDA build links and
// the CPU backend works; the helper implementing an op deletes its function here. This file must be
// empty (deleted) before issue 3 is closed.
#include "cuda/cuda_ops.h"
#include "mla/error.h"

namespace mla::cuda {

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,                  DsMlaScale ds_scale, const Context& ctx) {
  throw Error("write_cache: the CUDA backend does not implement this op yet");
}
void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,                   const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  throw Error("gather_cache: the CUDA backend does not implement this op yet");
}
void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,                      const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  throw Error("cp_gather_cache: the CUDA backend does not implement this op yet");
}
void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,                       const TensorView& workspace_starts, const TensorView& seq_starts, const Context& ctx) {
  throw Error("upconvert_ds_mla: the CUDA backend does not implement this op yet");
}
void merge_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& prefix,                        const TensorView& prefix_lse, const TensorView& suffix, const TensorView& suffix_lse,                        int64_t prefill_tokens_with_context, float output_scale, const Context& ctx) {
  throw Error("merge_attn_states: the CUDA backend does not implement this op yet");
}
void convert_topk_indices(const TensorView& req_id, const TensorView& block_table, const TensorView& indices,                           const TensorView& out, int64_t page_size, int64_t block_stride_rows,                           const TensorView& prefill_request_ids, const TensorView& prefill_workspace_starts,                           const TensorView& valid_counts, const Context& ctx) {
  throw Error("convert_topk_indices: the CUDA backend does not implement this op yet");
}
void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,                 const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,                 const TensorView& workspace, const Context& ctx) {
  throw Error("mqa_decode: the CUDA backend does not implement this op yet");
}
void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,                  const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,                  int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,                  const Context& ctx) {
  throw Error("mha_prefill: the CUDA backend does not implement this op yet");
}
void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,                 const TensorView& out, const TensorView& lse, double softmax_scale, const Context& ctx) {
  throw Error("sparse_mqa: the CUDA backend does not implement this op yet");
}
void gemm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  throw Error("gemm: the CUDA backend does not implement this op yet");
}
void bmm(const TensorView& a, const TensorView& b, const TensorView& c, float alpha, float beta, const Context& ctx) {
  throw Error("bmm: the CUDA backend does not implement this op yet");
}

}  // namespace mla::cuda
