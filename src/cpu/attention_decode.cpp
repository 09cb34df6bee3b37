// CPU mqa_decode: absorbed MQA over the paged latent cache (mla_semantics.md §6, ops.h).
//
// Work item = (request, group of heads). The item's query rows (all s_q queries of its heads) meet the
// request's keys in blocks of kKeyBlock cache rows; each block is dequantised once into a T buffer and
// serves as keys (all d_qk columns) and values (first d_v columns) for every row. Causality within the
// step is a per-row key limit: query i sees positions [0, seq_len - s_q + i].
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/attention_core.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

// Heads per work item: enough items to keep every thread busy, and at most ~64 query rows per item so
// that the running outputs (rows x d_v) stay cache-resident.
int64_t heads_per_group(int64_t b, int64_t s_q, int64_t h_q) {
  int64_t hg = std::clamp<int64_t>(64 / std::max<int64_t>(s_q, 1), 1, h_q);
  const int64_t want_items = 2 * static_cast<int64_t>(omp_get_max_threads());
  while (hg > 1 && b * ((h_q + hg - 1) / hg) < want_items) hg = (hg + 1) / 2;
  return hg;
}

template <class T>
void decode_impl(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                 const TensorView& out, const TensorView& lse, double softmax_scale, bool causal) {
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), d = q.size(3), dv = out.size(3);
  const int64_t page = cache.page_size();
  const int64_t hg = heads_per_group(b, s_q, h_q);
  const int64_t groups = (h_q + hg - 1) / hg;
  const int64_t items = b * groups;
  const T scale = static_cast<T>(softmax_scale);
  const attn::CacheRowReader<T> reader(cache);

#pragma omp parallel
  {
    const int64_t max_rows = hg * s_q;
    std::vector<T> qbuf(static_cast<std::size_t>(max_rows * d));
    std::vector<T> kbuf(static_cast<std::size_t>(attn::kKeyBlock * d));
    attn::BlockScratch<T> ws;
    std::vector<T> orow(static_cast<std::size_t>(dv));
    std::vector<int64_t> visible(static_cast<std::size_t>(max_rows)), lim(static_cast<std::size_t>(max_rows));
    attn::SoftmaxTile<T> st;

#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t req = item / groups, h0 = (item % groups) * hg, nh = std::min(hg, h_q - h0);
      const int64_t rows = nh * s_q;  // row r = i * nh + head offset
      const int64_t seq_len = index_at(seq_lens, req);
      int64_t max_visible = 0;
      for (int64_t i = 0; i < s_q; ++i) {
        const int64_t vis = causal ? std::clamp<int64_t>(seq_len - s_q + i + 1, 0, seq_len) : seq_len;
        max_visible = std::max(max_visible, vis);
        for (int64_t hh = 0; hh < nh; ++hh) {
          visible[i * nh + hh] = vis;
          attn::load_row(q.ptr_at({req, i, h0 + hh, 0}), q.dtype, qbuf.data() + (i * nh + hh) * d, d);
        }
      }
      st.reset(rows, dv);
      for (int64_t j0 = 0; j0 < max_visible; j0 += attn::kKeyBlock) {
        const int64_t nk = std::min(attn::kKeyBlock, max_visible - j0);
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t pos = j0 + j;
          const int64_t slot = index_at(block_table, req, pos / page) * page + pos % page;
          reader.read(slot, kbuf.data() + j * d, d);
        }
        for (int64_t r = 0; r < rows; ++r) lim[r] = std::clamp<int64_t>(visible[r] - j0, 0, nk);
        attn::attend_block(qbuf.data(), d, rows, kbuf.data(), d, d, kbuf.data(), d, nk, scale, lim.data(), st, ws);
      }
      for (int64_t i = 0; i < s_q; ++i)
        for (int64_t hh = 0; hh < nh; ++hh) {
          const float l = st.finish(i * nh + hh, orow.data());
          attn::store_row(out.ptr_at({req, i, h0 + hh, 0}), out.dtype, orow.data(), dv);
          if (lse.defined()) *static_cast<float*>(lse.ptr_at({req, i, h0 + hh})) = l;
        }
    }
  }
}

}  // namespace

void mqa_decode(const TensorView& q, const KVCache& cache, const TensorView& block_table, const TensorView& seq_lens,
                const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                const TensorView& /*workspace: the CPU needs none*/, const Context& ctx) {
  if (ctx.precision == Precision::reference)
    decode_impl<double>(q, cache, block_table, seq_lens, out, lse, softmax_scale, causal);
  else
    decode_impl<float>(q, cache, block_table, seq_lens, out, lse, softmax_scale, causal);
}

}  // namespace mla::cpu
