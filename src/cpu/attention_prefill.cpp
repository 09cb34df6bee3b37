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
#include <cmath>
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

// fp8 compute (SEMANTICS §10.1), the exact-codes oracle: q, k, v quantised with the per-tensor scales, then
// float64 over the codes: S = (q8 . k8) s_q s_k tau, m the row's max over its visible keys, p = exp(S - m),
// l = sum 256 p, P8 = e4m3(256 p), out = s_v sum P8 v8 / l, lse = m + ln(l / 256). Work item = (request, head,
// span of kItemRows query rows); the item's key and value codes are decoded once.
void prefill_fp8(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, const TensorView& out,
                 const TensorView& lse, double softmax_scale, bool causal, const PrefillOptions& o) {
  const int64_t h = q.size(1), dn = k_nope.size(2), dr = k_pe.size(2), d = dn + dr, dv = v.size(2);
  const int64_t nreq = static_cast<int64_t>(cu_q.size()) - 1;
  const double s_scale = static_cast<double>(o.q_scale) * o.k_scale * softmax_scale, sv = o.v_scale;
  // code = e4m3(float(x) / scale), as a double (every e4m3 value is exact in double).
  auto codes = [](const void* src, DType t, int64_t n, float scale, double* dst, std::vector<float>& tmp) {
    tmp.resize(static_cast<std::size_t>(n));
    load_row(src, t, tmp.data(), n);
    for (int64_t i = 0; i < n; ++i) dst[i] = num::e4m3_to_float(num::float_to_e4m3(tmp[static_cast<std::size_t>(i)] / scale));
  };
  std::vector<Item> items;
  for (int64_t r = 0; r < nreq; ++r)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t q0 = 0; q0 < cu_q[r + 1] - cu_q[r]; q0 += kItemRows) items.push_back({r, hh, q0});
  const int64_t n_items = static_cast<int64_t>(items.size());

#pragma omp parallel
  {
    std::vector<double> kc, vc, qc(static_cast<std::size_t>(d)), sc, orow(static_cast<std::size_t>(dv));
    std::vector<float> tmp;
    std::vector<int64_t> p8;
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < n_items; ++n) {
      const Item it = items[static_cast<std::size_t>(n)];
      const int64_t sq = cu_q[it.req + 1] - cu_q[it.req], sk = cu_k[it.req + 1] - cu_k[it.req];
      const int64_t rows = std::min(kItemRows, sq - it.q0);
      const int64_t qrow0 = cu_q[it.req] + it.q0, krow0 = cu_k[it.req];
      const int64_t nk = causal ? std::clamp<int64_t>(sk - sq + it.q0 + rows, 0, sk) : sk;  // keys the item sees
      kc.resize(static_cast<std::size_t>(nk * d));
      vc.resize(static_cast<std::size_t>(nk * dv));
      sc.resize(static_cast<std::size_t>(nk));
      for (int64_t j = 0; j < nk; ++j) {
        codes(k_nope.ptr_at({krow0 + j, it.head, 0}), k_nope.dtype, dn, o.k_scale, kc.data() + j * d, tmp);
        codes(k_pe.ptr_at({krow0 + j, it.head, 0}), k_pe.dtype, dr, o.k_scale, kc.data() + j * d + dn, tmp);
        codes(v.ptr_at({krow0 + j, it.head, 0}), v.dtype, dv, o.v_scale, vc.data() + j * dv, tmp);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = qrow0 + r;
        const int64_t vis = causal ? std::clamp<int64_t>(sk - sq + it.q0 + r + 1, 0, sk) : sk;
        codes(q.ptr_at({row, it.head, 0}), q.dtype, d, o.q_scale, qc.data(), tmp);
        double m = -INFINITY, l = 0.0, lse_v = -INFINITY;
        bool bad = false;  // a NaN or +inf score: the row is NaN (§14.6a)
        for (int64_t j = 0; j < vis; ++j) {
          double acc = 0.0;
          const double* kr = kc.data() + j * d;
          for (int64_t c = 0; c < d; ++c) acc += qc[static_cast<std::size_t>(c)] * kr[c];
          const double sj = acc * s_scale;
          sc[static_cast<std::size_t>(j)] = sj;
          if (std::isnan(sj) || sj == INFINITY) bad = true;
          m = std::max(m, sj);
        }
        std::fill(orow.begin(), orow.end(), 0.0);
        if (bad) {
          std::fill(orow.begin(), orow.end(), NAN);
          lse_v = NAN;
        } else if (vis > 0 && m > -INFINITY) {
          for (int64_t j = 0; j < vis; ++j) {
            const double p = std::exp(sc[static_cast<std::size_t>(j)] - m);
            l += 256.0 * p;
            const double p8 = num::e4m3_to_float(num::float_to_e4m3(static_cast<float>(256.0 * p)));
            const double* vr = vc.data() + j * dv;
            for (int64_t c = 0; c < dv; ++c) orow[static_cast<std::size_t>(c)] += p8 * vr[c];
          }
          for (double& x : orow) x *= sv / l;
          lse_v = m + std::log(l / 256.0);
        }
        store_row(out.ptr_at({row, it.head, 0}), out.dtype, orow.data(), dv);
        if (lse.defined()) num::store(lse.ptr_at({it.head, row}), lse.dtype, lse_v);
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
                 bool causal, const PrefillOptions& opts, const Context& ctx) {
  const std::vector<int64_t> cu_q = read_cu(cu_seqlens_q), cu_k = read_cu(cu_seqlens_k);
  if (opts.fp8) {
    prefill_fp8(q, k_nope, k_pe, v, cu_q, cu_k, out, lse, softmax_scale, causal, opts);
    return;
  }
  if (ctx.precision == Precision::reference)
    prefill_impl<double>(q, k_nope, k_pe, v, cu_q, cu_k, out, lse, softmax_scale, causal);
  else
    prefill_impl<float>(q, k_nope, k_pe, v, cu_q, cu_k, out, lse, softmax_scale, causal);
}

}  // namespace mla::cpu
