// SPDX-License-Identifier: Apache-2.0
#pragma once
// Split-KV execution of MQA over the latent cache, shared by mqa_decode and sparse_mqa.
//
// A group is one request (decode) or one query token (sparse): `rows` query rows (every head, and for
// decode every query of the step) sharing one sequence of cache rows. All rows of a group stay in one
// work item, so each cache row is dequantised once per group and the kernels see wide query tiles. When
// the groups are too few or too unequal to keep every thread busy, long key sequences are split into
// ranges whose partial softmax states are merged afterwards (flash-decoding); the merge is exact up to
// rounding. Each item walks its range in blocks of kKeyBlock rows dequantised into one T buffer that
// serves as keys (all d columns) and values (first dv columns).
//
// This split is the CPU backend's own parallelisation, chosen here from the OpenMP thread count at
// run time; it is not the step plan's decode schedule (mla/plan.h, DecodeSchedule), which describes
// launches of the CUDA kernel and is ignored on the CPU. Results do not depend on either choice
// beyond rounding. Batch-invariant calls (split_keys > 0) cut every group at fixed multiples of
// split_keys instead: a group's ranges, and so its bits, then depend on its own key count only (not on
// the other groups, the batch size or the thread count), and its parts merge in range order.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/attention_core.h"

namespace mla::cpu::attn {

// Below this many keys per range, splitting costs more (query setup, merge) than it saves.
inline constexpr int64_t kMinSplitKeys = 256;

// Src describes the groups (see mqa_decode / sparse_mqa):
//   int64_t keys(g)                        keys in group g's sequence
//   void visible(g, int64_t* vis)          per row: row r sees keys [0, vis[r]) (vis[r] <= keys(g))
//   int64_t slot(g, j)                     cache slot of key j; with an `extra` cache, a negative value
//                                          -1 - s names slot s of the extra cache
//   T sink(g, r)                           optional: row r's attention sink (SoftmaxTile::add_sink)
//   void load_queries(g, QueryTile<T>&)    fills the rows (q.row(r)) of group g
//   void store(g, r, const T* o, double lse) writes one finished row
template <class T, class Src>
void run_split_mqa(const KVCache& cache, int64_t groups, int64_t rows, int64_t d, int64_t dv, double softmax_scale,
                   const Src& src, const KVCache* extra = nullptr, int64_t split_keys = 0) {
  struct Item {
    int64_t g, k0, k1, part;  // part: index into `partial`, -1 when the item covers its whole group
  };
  std::vector<int64_t> n_keys(static_cast<std::size_t>(groups));
  int64_t total = 0;
  for (int64_t g = 0; g < groups; ++g) total += (n_keys[static_cast<std::size_t>(g)] = src.keys(g));
  const int64_t threads = omp_get_max_threads();
  int64_t chunk = split_keys > 0 ? split_keys : std::max(kMinSplitKeys, (total + 2 * threads - 1) / (2 * threads));
  chunk = (chunk + kKeyBlock - 1) / kKeyBlock * kKeyBlock;

  std::vector<Item> items;
  std::vector<int64_t> first_part(static_cast<std::size_t>(groups), -1),
      part_count(static_cast<std::size_t>(groups), 0);
  int64_t n_parts = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = n_keys[static_cast<std::size_t>(g)];
    const int64_t splits = std::max<int64_t>(1, (n + chunk - 1) / chunk);
    if (splits == 1) {
      items.push_back({g, 0, n, -1});
      continue;
    }
    const int64_t len =
        split_keys > 0 ? chunk : ((n + splits - 1) / splits + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    first_part[static_cast<std::size_t>(g)] = n_parts;
    for (int64_t k0 = 0; k0 < n; k0 += len) {
      items.push_back({g, k0, std::min(n, k0 + len), n_parts++});
      ++part_count[static_cast<std::size_t>(g)];
    }
  }
  std::vector<SoftmaxTile<T>> partial(static_cast<std::size_t>(n_parts));
  const int64_t n_items = static_cast<int64_t>(items.size());
  const T scale = static_cast<T>(softmax_scale);
  const CacheRowReader<T> reader(cache);
  const CacheRowReader<T> extra_reader(extra ? *extra : cache);
  // Finishes row r of group g from state st into out_row (the sink, when the source has one, last).
  auto finish = [&](int64_t g, int64_t r, SoftmaxTile<T>& st, T* out_row) {
    if constexpr (requires { src.sink(g, r); }) st.add_sink(r, src.sink(g, r));
    src.store(g, r, out_row, st.finish(r, out_row));
  };

#pragma omp parallel
  {
    QueryTile<T> q;
    std::vector<T> kbuf(static_cast<std::size_t>(kKeyBlock * d));
    std::vector<T> orow(static_cast<std::size_t>(dv));
    std::vector<int64_t> vis(static_cast<std::size_t>(rows)), lim(static_cast<std::size_t>(rows));
    SoftmaxTile<T> st;
    BlockScratch<T> ws;

#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < n_items; ++n) {
      const Item it = items[static_cast<std::size_t>(n)];
      q.resize(rows, d);
      src.load_queries(it.g, q);
      q.transpose();
      src.visible(it.g, vis.data());
      st.reset(rows, dv);
      for (int64_t j0 = it.k0; j0 < it.k1; j0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, it.k1 - j0);
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t s = src.slot(it.g, j0 + j);
          if (s >= 0) reader.read(s, kbuf.data() + j * d, d);
          else extra_reader.read(-1 - s, kbuf.data() + j * d, d);
        }
        for (int64_t r = 0; r < rows; ++r) lim[static_cast<std::size_t>(r)] = std::clamp<int64_t>(vis[r] - j0, 0, nk);
        attend_block(q, kbuf.data(), d, kbuf.data(), d, nk, scale, lim.data(), st, ws);
      }
      if (it.part < 0) {
        for (int64_t r = 0; r < rows; ++r) finish(it.g, r, st, orow.data());
      } else {
        partial[static_cast<std::size_t>(it.part)] = st;
      }
    }

    // Merge the ranges of every split group (its parts are consecutive in `partial`); the implicit
    // barrier of the loop above makes every part visible here.
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t p0 = first_part[static_cast<std::size_t>(g)];
      if (p0 < 0) continue;
      SoftmaxTile<T>& acc = partial[static_cast<std::size_t>(p0)];
      for (int64_t p = p0 + 1; p < p0 + part_count[static_cast<std::size_t>(g)]; ++p)
        acc.merge(partial[static_cast<std::size_t>(p)]);
      for (int64_t r = 0; r < rows; ++r) finish(g, r, acc, orow.data());
    }
  }
}

}  // namespace mla::cpu::attn
