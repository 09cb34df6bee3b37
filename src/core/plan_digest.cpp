// SPDX-License-Identifier: Apache-2.0
// plan_digest: a 64-bit FNV-1a digest of every field of a Plan (except its seal), so that
// MlaAttention::forward can refuse a plan edited after make_plan before it writes anything.
//
// Every struct is taken apart with a structured binding that names all of its members: adding a
// field to Plan or to any struct it holds without hashing it here fails to compile ("type has N
// members"), including a field that would fit into existing padding (which a sizeof check misses).
//
// The hash runs over 64-bit words (h = (h ^ w) * prime): each step is a bijection of the state for a
// fixed word, so any single changed word always changes the digest. int32 arrays are packed two per
// word; every array and string contributes its length first, so moved boundaries change it too.
#include <bit>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mla/plan.h"

namespace mla {

namespace {

class Fnv {
 public:
  void word(uint64_t w) { h_ = (h_ ^ w) * kPrime; }
  uint64_t value() const { return h_ == 0 ? 1 : h_; }  // 0 means "not sealed"

  template <class T>
    requires std::is_integral_v<T> || std::is_enum_v<T>
  void add(T v) {
    if constexpr (std::is_enum_v<T>)
      word(static_cast<uint64_t>(static_cast<std::underlying_type_t<T>>(v)));
    else
      word(static_cast<uint64_t>(v));
  }
  void add(double v) { word(std::bit_cast<uint64_t>(v)); }
  void add(const std::string& s) {
    word(s.size());
    for (std::size_t i = 0; i < s.size(); i += 8) {
      uint64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<std::size_t>(8, s.size() - i));
      word(w);
    }
  }
  void add(const std::vector<int32_t>& v) {
    word(v.size());
    const std::size_t n = v.size();
    std::size_t i = 0;
    for (; i + 1 < n; i += 2)
      word(static_cast<uint64_t>(static_cast<uint32_t>(v[i])) | (static_cast<uint64_t>(static_cast<uint32_t>(v[i + 1])) << 32));
    if (i < n) word(static_cast<uint32_t>(v[i]));
  }
  void add(const std::vector<int64_t>& v) {
    word(v.size());
    for (int64_t x : v) add(x);
  }
  template <class T>
    requires std::is_class_v<T>
  void add(const std::vector<T>& v) {
    word(v.size());
    for (const T& x : v) add(x);
  }
  template <class... T>
  void all(const T&... v) {
    (add(v), ...);
  }

  // One overload per struct: the structured binding must name every member.
  void add(const ModelDims& d) {
    const auto& [kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, num_heads, softmax_scale, index_topk,
                 name] = d;
    all(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, num_heads, softmax_scale, index_topk, name);
  }
  void add(const DcpLayout& l) {
    const auto& [world_size, rank, interleave] = l;
    all(world_size, rank, interleave);
  }
  void add(const PlannerConfig& c) {
    const auto& [dims, cache_format, page_size, max_model_len, max_num_seqs, sparse, decode_threshold,
                 require_uniform, context_workspace_rows, sparse_workspace_rows, sparse_prefill_mode, num_sms,
                 compute_capability, dcp, batch_invariant] = c;
    all(dims, cache_format, page_size, max_model_len, max_num_seqs, sparse, decode_threshold, require_uniform,
        context_workspace_rows, sparse_workspace_rows, sparse_prefill_mode, num_sms, compute_capability, dcp,
        batch_invariant);
  }
  void add(const Split& s) {
    const auto& [num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens] = s;
    all(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens);
  }
  void add(const ContextChunk& c) {
    const auto& [seq_starts, lens, cu_seq_lens, total, max_len] = c;
    all(seq_starts, lens, cu_seq_lens, total, max_len);
  }
  void add(const ContextPlan& c) {
    const auto& [chunk_size, chunks] = c;
    all(chunk_size, chunks);
  }
  void add(const SparsePrefillChunk& c) {
    const auto& [req_begin, req_end, token_begin, token_end, total_rows, workspace_starts] = c;
    all(req_begin, req_end, token_begin, token_end, total_rows, workspace_starts);
  }
  void add(const DecodeRun& r) {
    const auto& [req_begin, req_end, s_q, token_begin, block_cols, num_splits, whole_requests] = r;
    all(req_begin, req_end, s_q, token_begin, block_cols, num_splits, whole_requests);
  }
  void add(const DcpSegment& g) {
    const auto& [dst_row, src_row, rows, count] = g;
    all(dst_row, src_row, rows, count);
  }
  void add(const DcpChunk& c) {
    const auto& [local_cu, local_starts, pad_rows, segments] = c;
    all(local_cu, local_starts, pad_rows, segments);
  }
  void add(const DecodeSchedule& s) {
    const auto& [runs] = s;
    all(runs);
  }
  void add(const StepMetadata& m) {
    const auto& [data, prefill_qsl, chunk_cu, chunk_starts, req_id, prefill_ids, workspace_starts, dcp_local_lens,
                 dcp_chunk_cu, dcp_chunk_starts] = m;
    all(data, prefill_qsl, chunk_cu, chunk_starts, req_id, prefill_ids, workspace_starts, dcp_local_lens, dcp_chunk_cu,
        dcp_chunk_starts);
  }

 private:
  static constexpr uint64_t kOffset = 0xcbf29ce484222325ull, kPrime = 0x100000001b3ull;
  uint64_t h_ = kOffset;
};

}  // namespace

uint64_t plan_digest(const Plan& plan) {
  const auto& [config, num_reqs, num_tokens, num_actual_tokens, query_start_loc, seq_lens, split, decode_query_len,
               max_decode_seq_len, prefill_query_start_loc, prefill_seq_lens, prefill_context_lens,
               max_prefill_query_len, max_prefill_seq_len, prefill_tokens_with_context, context, req_id_per_token,
               sparse_mixed_batch, prefill_request_id, sparse_chunks, decode, dcp_local_lens, dcp_chunks, metadata, seal] = plan;
  static_cast<void>(seal);  // the digest covers everything but the seal itself
  Fnv h;
  h.all(config, num_reqs, num_tokens, num_actual_tokens, query_start_loc, seq_lens, split, decode_query_len,
        max_decode_seq_len, prefill_query_start_loc, prefill_seq_lens, prefill_context_lens, max_prefill_query_len,
        max_prefill_seq_len, prefill_tokens_with_context, context, req_id_per_token, sparse_mixed_batch,
        prefill_request_id, sparse_chunks, decode, dcp_local_lens, dcp_chunks, metadata);
  return h.value();
}

}  // namespace mla
