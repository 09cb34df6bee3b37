// SPDX-License-Identifier: Apache-2.0
// CPU sparse_mqa: MQA of each query token over its own top-k cache rows (FlashMLA-sparse semantics,
// docs/SEMANTICS.md §11, ops.h).
//
// One group per token: its rows are the heads, its keys the valid indices (in [0, num_slots), at
// positions below topk_length) in index order, duplicates included (a duplicated row counts twice in
// the softmax, like the upstream kernels). A token without a valid index (a "lonely" row) gives out 0
// and lse -inf [PIN]. Execution (split-KV, blocks, kernels) is mqa_split.h.
//
// DeepSeek-V4 options (SparseOptions, SEMANTICS §11.8): the valid rows of the extra cache follow the main
// rows in the token's key list (stored as -1 - row, mqa_split.h's tag for the extra cache); the per-head
// sink enters each row's softmax state after its last key (SoftmaxTile::add_sink).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/mqa_split.h"

namespace mla::cpu {
namespace {

template <class T>
struct SparseGroups {
  const TensorView &q, &out, &lse;
  int64_t h, d, dv;
  const TensorView& sink_h;  // [h] or undefined
  int64_t rot_dim;           // SparseOutRotation::rope_dim (0: none)
  std::vector<double> rot_cs;         // token t's pair i: cos at [t][2i], sin at [t][2i + 1] ([T][rot_dim])
  std::vector<int64_t> offset, rows;  // token t's valid cache rows: rows[offset[t] .. offset[t + 1])

  int64_t keys(int64_t t) const { return offset[t + 1] - offset[t]; }
  void visible(int64_t t, int64_t* vis) const { std::fill(vis, vis + h, keys(t)); }
  int64_t slot(int64_t t, int64_t j) const { return rows[static_cast<std::size_t>(offset[t] + j)]; }
  void load_queries(int64_t t, attn::QueryTile<T>& qt) const {
    for (int64_t hh = 0; hh < h; ++hh) load_row(q.ptr_at({t, hh, 0}), q.dtype, qt.row(hh), d);
  }
  T sink(int64_t, int64_t hh) const {
    return sink_h.defined() ? static_cast<T>(num::load(sink_h.ptr_at({hh}), sink_h.dtype))
                            : -std::numeric_limits<T>::infinity();
  }
  void store(int64_t t, int64_t hh, const T* o, double l) const {
    // The last rot_dim columns turned pairwise by the token's angles (rot_cs) before the rounding.
    const int64_t c0 = dv - rot_dim;
    store_row(out.ptr_at({t, hh, 0}), out.dtype, o, c0);
    const double* cs = rot_cs.data() + t * rot_dim;
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
      const double c = cs[2 * i], s = cs[2 * i + 1], a = o[c0 + 2 * i], b = o[c0 + 2 * i + 1];
      const T pair[2] = {static_cast<T>(a * c - b * s), static_cast<T>(b * c + a * s)};
      store_row(out.ptr_at({t, hh, c0 + 2 * i}), out.dtype, pair, 2);
    }
    if (lse.defined()) num::store(lse.ptr_at({t, hh}), lse.dtype, l);  // f32, or f64 for the oracle
  }
};

// Appends token t's valid entries of one index list (the extra cache's rows tagged as -1 - row).
void append_rows(std::vector<int64_t>& rows, const TensorView& indices, const TensorView& topk_length, int64_t t,
                 int64_t num_slots, bool extra) {
  const int64_t topk = indices.size(1);
  const int64_t len = topk_length.defined() ? std::clamp<int64_t>(index_at(topk_length, t), 0, topk) : topk;
  for (int64_t x = 0; x < len; ++x) {
    const int64_t r = index_at(indices, t, x);
    if (r >= 0 && r < num_slots) rows.push_back(extra ? -1 - r : r);
  }
}

template <class T>
void sparse_impl(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                 const TensorView& out, const TensorView& lse, double softmax_scale, const SparseOptions& opts) {
  const int64_t n_tok = q.size(0);
  const SparseExtraCache& ex = opts.extra;
  const SparseOutRotation& rot = opts.out_rotation;
  SparseGroups<T> src{q, out, lse, q.size(1), q.size(2), out.size(2), opts.attn_sink, rot.rope_dim, {}, {0}, {}};
  // The output rotation's cos / sin once per (token, pair), float64 (apply_rope's arithmetic).
  src.rot_cs.resize(static_cast<std::size_t>(n_tok * rot.rope_dim));
  for (int64_t t = 0; t < n_tok && rot.rope_dim > 0; ++t) {
    const auto pos = static_cast<double>(num::load_index(rot.positions.ptr_at({t}), rot.positions.dtype));
    for (int64_t i = 0; i < rot.rope_dim / 2; ++i) {
      const double ang = pos * num::load(rot.inv_freq.ptr_at({i}), rot.inv_freq.dtype);
      src.rot_cs[static_cast<std::size_t>(t * rot.rope_dim + 2 * i)] = std::cos(ang);
      src.rot_cs[static_cast<std::size_t>(t * rot.rope_dim + 2 * i + 1)] = std::sin(ang);
    }
  }
  src.offset.reserve(static_cast<std::size_t>(n_tok + 1));
  for (int64_t t = 0; t < n_tok; ++t) {
    append_rows(src.rows, indices, topk_length, t, kv.num_slots(), false);
    if (ex.defined()) append_rows(src.rows, ex.indices, ex.topk_length, t, ex.kv.num_slots(), true);
    src.offset.push_back(static_cast<int64_t>(src.rows.size()));
  }
  attn::run_split_mqa<T>(kv, n_tok, src.h, src.d, src.dv, softmax_scale, src, ex.defined() ? &ex.kv : nullptr,
                         opts.batch_invariant ? kBatchInvariantKeys : 0);  // batch-invariant: fixed ranges per token
}

}  // namespace

void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const SparseOptions& opts,
                const Context& ctx) {
  if (ctx.precision == Precision::reference)
    sparse_impl<double>(q, kv, indices, topk_length, out, lse, softmax_scale, opts);
  else
    sparse_impl<float>(q, kv, indices, topk_length, out, lse, softmax_scale, opts);
}

}  // namespace mla::cpu
