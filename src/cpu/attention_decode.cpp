// SPDX-License-Identifier: Apache-2.0
// CPU mqa_decode: absorbed MQA over the paged latent cache (docs/SEMANTICS.md §6, ops.h).
//
// One group per request: its rows are every (query of the step, head) pair, row r = i * h_q + head, and
// its keys are the request's positions [0, seq_len) mapped through the block table. Causality within
// the step is a per-row key limit: query i sees positions [0, seq_len - s_q + i] (none when that is
// negative). Execution (split-KV, blocks, kernels) is mqa_split.h.
#include <algorithm>

#include "cpu/cpu_ops.h"
#include "cpu/mqa_split.h"

namespace mla::cpu {
namespace {

template <class T>
struct DecodeGroups {
  const TensorView &q, &block_table, &seq_lens, &out, &lse;
  bool causal;
  int64_t s_q, h, d, dv, page;

  int64_t keys(int64_t g) const { return index_at(seq_lens, g); }
  void visible(int64_t g, int64_t* vis) const {
    const int64_t len = keys(g);
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t v = causal ? std::clamp<int64_t>(len - s_q + i + 1, 0, len) : len;
      std::fill(vis + i * h, vis + (i + 1) * h, v);
    }
  }
  int64_t slot(int64_t g, int64_t j) const { return index_at(block_table, g, j / page) * page + j % page; }
  void load_queries(int64_t g, attn::QueryTile<T>& qt) const {
    for (int64_t i = 0; i < s_q; ++i)
      for (int64_t hh = 0; hh < h; ++hh) load_row(q.ptr_at({g, i, hh, 0}), q.dtype, qt.row(i * h + hh), d);
  }
  void store(int64_t g, int64_t r, const T* o, double l) const {
    const int64_t i = r / h, hh = r % h;
    store_row(out.ptr_at({g, i, hh, 0}), out.dtype, o, dv);
    if (lse.defined()) num::store(lse.ptr_at({g, i, hh}), lse.dtype, l);  // f32, or f64 for the oracle
  }
};

template <class T>
void decode_impl(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                 const TensorView& out, const TensorView& lse, double softmax_scale, bool causal, int64_t split_keys) {
  const DecodeGroups<T> src{q,         block_table, seq_lens,         out, lse, causal, q.size(1), q.size(2),
                            q.size(3), out.size(3), cache.page_size()};
  attn::run_split_mqa<T>(cache, q.size(0), src.s_q * src.h, src.d, src.dv, softmax_scale, src, nullptr, split_keys);
}

}  // namespace

void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                const TensorView& /*workspace: the CPU needs none*/, const Context& ctx,
                int /*num_splits: the CPU splits over its own threads (cpu/mqa_split.h)*/,
                bool /*whole_requests: a CUDA schedule hint*/, bool batch_invariant,
                bool /*fp8_compute: a permission; the CPU computes over the exact codes, within every bound*/) {
  const int64_t split_keys = batch_invariant ? kBatchInvariantKeys : 0;  // fixed ranges per request
  if (ctx.precision == Precision::reference)
    decode_impl<double>(q, cache, block_table, seq_lens, out, lse, softmax_scale, causal, split_keys);
  else
    decode_impl<float>(q, cache, block_table, seq_lens, out, lse, softmax_scale, causal, split_keys);
}

}  // namespace mla::cpu
