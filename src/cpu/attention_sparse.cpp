// CPU sparse_mqa: MQA of each query token over its own top-k cache rows (FlashMLA-sparse semantics,
// mla_semantics.md §11, ops.h).
//
// Work item = (token, group of heads). The token's valid indices (in [0, num_slots), positions below
// topk_length) are taken in order, duplicates included (a duplicated row counts twice in the softmax,
// like the upstream kernels); rows are dequantised kKeyBlock at a time and shared by the group's heads.
// A token without a valid index (a "lonely" row) gives out 0 and lse -inf [PIN].
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/attention_core.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

template <class T>
void sparse_impl(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                 const TensorView& out, const TensorView& lse, double softmax_scale) {
  const int64_t n_tok = q.size(0), h_q = q.size(1), d = q.size(2), dv = out.size(2), topk = indices.size(1);
  const int64_t num_slots = kv.num_slots();
  // At most 64 heads per item (bounded running state); at least two items per thread when tokens are few.
  int64_t hg = std::min<int64_t>(h_q, 64);
  const int64_t want_items = 2 * static_cast<int64_t>(omp_get_max_threads());
  while (hg > 1 && n_tok * ((h_q + hg - 1) / hg) < want_items) hg = (hg + 1) / 2;
  const int64_t groups = (h_q + hg - 1) / hg;
  const int64_t items = n_tok * groups;
  const T scale = static_cast<T>(softmax_scale);
  const attn::CacheRowReader<T> reader(kv);

#pragma omp parallel
  {
    std::vector<T> qbuf(static_cast<std::size_t>(hg * d));
    std::vector<T> kbuf(static_cast<std::size_t>(attn::kKeyBlock * d));
    attn::BlockScratch<T> ws;
    std::vector<T> orow(static_cast<std::size_t>(dv));
    std::vector<int64_t> lim(static_cast<std::size_t>(hg));
    std::vector<int64_t> rows;  // valid cache rows of the current token, in index order
    rows.reserve(static_cast<std::size_t>(topk));
    attn::SoftmaxTile<T> st;

#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / groups, h0 = (item % groups) * hg, nh = std::min(hg, h_q - h0);
      const int64_t len = topk_length.defined() ? std::clamp<int64_t>(index_at(topk_length, t), 0, topk) : topk;
      rows.clear();
      for (int64_t x = 0; x < len; ++x) {
        const int64_t r = index_at(indices, t, x);
        if (r >= 0 && r < num_slots) rows.push_back(r);
      }
      for (int64_t hh = 0; hh < nh; ++hh)
        attn::load_row(q.ptr_at({t, h0 + hh, 0}), q.dtype, qbuf.data() + hh * d, d);
      st.reset(nh, dv);
      const int64_t n_rows = static_cast<int64_t>(rows.size());
      for (int64_t j0 = 0; j0 < n_rows; j0 += attn::kKeyBlock) {
        const int64_t nk = std::min(attn::kKeyBlock, n_rows - j0);
        for (int64_t j = 0; j < nk; ++j) reader.read(rows[static_cast<std::size_t>(j0 + j)], kbuf.data() + j * d, d);
        std::fill(lim.begin(), lim.begin() + nh, nk);
        attn::attend_block(qbuf.data(), d, nh, kbuf.data(), d, d, kbuf.data(), d, nk, scale, lim.data(), st, ws);
      }
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float l = st.finish(hh, orow.data());
        attn::store_row(out.ptr_at({t, h0 + hh, 0}), out.dtype, orow.data(), dv);
        if (lse.defined()) *static_cast<float*>(lse.ptr_at({t, h0 + hh})) = l;
      }
    }
  }
}

}  // namespace

void sparse_mqa(const TensorView& q, const KVCache& kv, const TensorView& indices, const TensorView& topk_length,
                const TensorView& out, const TensorView& lse, double softmax_scale, const Context& ctx) {
  if (ctx.precision == Precision::reference)
    sparse_impl<double>(q, kv, indices, topk_length, out, lse, softmax_scale);
  else
    sparse_impl<float>(q, kv, indices, topk_length, out, lse, softmax_scale);
}

}  // namespace mla::cpu
