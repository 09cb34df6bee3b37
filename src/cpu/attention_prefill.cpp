// SPDX-License-Identifier: Apache-2.0
// CPU mha_prefill: varlen multi-head attention over up-projected K/V (docs/SEMANTICS.md §9-10, ops.h).
//
// Work item = (request, head, span of up to kTilesPerItem tiles of kQueryTile query rows). Each tile's
// queries are converted (and transposed) once; keys ([k_nope | k_pe], the head stride of k_pe possibly 0)
// and values are converted block by block and shared by the item's tiles. K/V rows of one head are
// strided by the head count, so their conversion is latency-bound: sharing it across several tiles keeps
// it small next to the arithmetic, while every buffer of an item stays in L2 however long the request is.
// Causal masking is bottom-right aligned: query i of a request with lengths (sq, sk) sees keys
// j <= sk - sq + i.
#include <algorithm>
#include <vector>

#include "cpu/attention_core.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

inline constexpr int64_t kQueryTile = 64;
inline constexpr int64_t kTilesPerItem = 4;
inline constexpr int64_t kItemRows = kQueryTile * kTilesPerItem;

struct Item {
  int64_t req, head, q0;
};

template <class T>
void prefill_impl(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                  const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, const TensorView& out,
                  const TensorView& lse, double softmax_scale, bool causal) {
  const int64_t h = q.size(1), dn = k_nope.size(2), dr = k_pe.size(2), d = dn + dr, dv = v.size(2);
  const int64_t nreq = static_cast<int64_t>(cu_q.size()) - 1;
  const T scale = static_cast<T>(softmax_scale);

  // Longest (most keys) tiles first so that dynamic scheduling ends with short ones.
  std::vector<Item> items;
  for (int64_t r = 0; r < nreq; ++r)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t q0 = 0; q0 < cu_q[r + 1] - cu_q[r]; q0 += kItemRows) items.push_back({r, hh, q0});
  auto keys_of = [&](const Item& it) {
    const int64_t sq = cu_q[it.req + 1] - cu_q[it.req], sk = cu_k[it.req + 1] - cu_k[it.req];
    const int64_t last = std::min(sq, it.q0 + kItemRows) - 1;
    return causal ? std::clamp<int64_t>(sk - sq + last + 1, 0, sk) : sk;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) { return keys_of(a) > keys_of(b); });
  const int64_t n_items = static_cast<int64_t>(items.size());

#pragma omp parallel
  {
    std::vector<attn::QueryTile<T>> qt(kTilesPerItem);
    std::vector<attn::SoftmaxTile<T>> st(kTilesPerItem);
    std::vector<T> kbuf(static_cast<std::size_t>(attn::kKeyBlock * d));
    std::vector<T> vbuf(static_cast<std::size_t>(attn::kKeyBlock * dv));
    attn::BlockScratch<T> ws;
    std::vector<T> orow(static_cast<std::size_t>(dv));
    std::vector<int64_t> visible(kItemRows), lim(kQueryTile);

#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < n_items; ++n) {
      const Item it = items[static_cast<std::size_t>(n)];
      const int64_t sq = cu_q[it.req + 1] - cu_q[it.req], sk = cu_k[it.req + 1] - cu_k[it.req];
      const int64_t rows = std::min(kItemRows, sq - it.q0), tiles = (rows + kQueryTile - 1) / kQueryTile;
      const int64_t qrow0 = cu_q[it.req] + it.q0, krow0 = cu_k[it.req];
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t nr = std::min(kQueryTile, rows - t * kQueryTile);
        qt[t].resize(nr, d);
        for (int64_t r = 0; r < nr; ++r)
          load_row(q.ptr_at({qrow0 + t * kQueryTile + r, it.head, 0}), q.dtype, qt[t].row(r), d);
        qt[t].transpose();
        st[t].reset(nr, dv);
      }
      for (int64_t r = 0; r < rows; ++r) visible[r] = causal ? std::clamp<int64_t>(sk - sq + it.q0 + r + 1, 0, sk) : sk;
      const int64_t max_visible = visible[rows - 1];  // non-decreasing in r
      for (int64_t j0 = 0; j0 < max_visible; j0 += attn::kKeyBlock) {
        const int64_t nk = std::min(attn::kKeyBlock, max_visible - j0);
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t row = krow0 + j0 + j;
          load_row(k_nope.ptr_at({row, it.head, 0}), k_nope.dtype, kbuf.data() + j * d, dn);
          load_row(k_pe.ptr_at({row, it.head, 0}), k_pe.dtype, kbuf.data() + j * d + dn, dr);
          load_row(v.ptr_at({row, it.head, 0}), v.dtype, vbuf.data() + j * dv, dv);
        }
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t nr = qt[t].nq;
          if (visible[t * kQueryTile + nr - 1] <= j0) continue;  // the tile sees none of this block
          for (int64_t r = 0; r < nr; ++r) lim[r] = std::clamp<int64_t>(visible[t * kQueryTile + r] - j0, 0, nk);
          attn::attend_block(qt[t], kbuf.data(), d, vbuf.data(), dv, nk, scale, lim.data(), st[t], ws);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const double l = st[r / kQueryTile].finish(r % kQueryTile, orow.data());
        store_row(out.ptr_at({qrow0 + r, it.head, 0}), out.dtype, orow.data(), dv);
        if (lse.defined()) num::store(lse.ptr_at({it.head, qrow0 + r}), lse.dtype, l);  // f32, or f64 for the oracle
      }
    }
  }
}

std::vector<int64_t> read_cu(const TensorView& t) {
  std::vector<int64_t> v(static_cast<std::size_t>(t.size(0)));
  for (int64_t i = 0; i < t.size(0); ++i) v[static_cast<std::size_t>(i)] = index_at(t, i);
  return v;
}

}  // namespace

void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t /*max_seqlen_q*/,
                 int64_t /*max_seqlen_k*/, const TensorView& out, const TensorView& lse, double softmax_scale,
                 bool causal, const Context& ctx) {
  const std::vector<int64_t> cu_q = read_cu(cu_seqlens_q), cu_k = read_cu(cu_seqlens_k);
  if (ctx.precision == Precision::reference)
    prefill_impl<double>(q, k_nope, k_pe, v, cu_q, cu_k, out, lse, softmax_scale, causal);
  else
    prefill_impl<float>(q, k_nope, k_pe, v, cu_q, cu_k, out, lse, softmax_scale, causal);
}

}  // namespace mla::cpu
