// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DeepSeek-V4 DCP step (mla/dcp.h: dcp_compact_topk, dcp_sparse_mqa with SparseOptions) against one
// sparse_mqa over the whole caches, shared by the CPU group test (tests/unit/test_dcp_group.cpp, ranks as
// threads of the in-process group) and the NCCL test (tests/gpu/test_dcp_gpu.cpp, one GPU per rank).
//
// A problem: R requests, each with a window (main) cache of positions [0, win_lens[r]) and a compressed
// (extra) cache of entries [0, ent_lens[r]), both paged, rows written by write_cache from the same float
// rows for the whole cache and for every rank's shard (so shard rows are the whole cache's bytes, every
// format). T tokens, token t of request t % R at position win_lens[r] - 1 - t / R, with a window list
// [p − 127, p] (−1 below 0) plus 5 columns of valid positions past the valid length, and a compressed list
// of 37 entries. Roles by token (make_problem):
//   0: the plain V4 token (window length 128, random compressed picks with -1, duplicates and entries past
//      the request's count, random compressed length)
//   1: lonely by lengths: both valid lengths 0 (every column a valid position that must not be read)
//   2: lonely by entries: every window entry -1, every compressed entry past the request's count
//   3: a short window (3 rows: at most three ranks hold one), no compressed rows
//   4: compressed rows only (window entries -1)
//   5: rows of rank 0 only (positions / entries whose turn is 0 under the test's layouts), lengths shorter
//      than the rows
//   6+: random lengths, shuffled windows
// Unused cache rows are poisoned (0xff bytes: NaN in bf16 and in every record's codes or scales), so a row
// read past a valid length or from another rank's position shows as NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla::test::dcp_v4 {

inline constexpr int64_t kDqk = 512, kRope = 64, kWindow = 128, kJunk = 5, kExtraTopk = 37;

struct Problem {
  CacheFormat main_format = CacheFormat::bf16, extra_format = CacheFormat::bf16;
  int64_t page_main = 16, page_extra = 4, h = 8;  // h: the group's heads
  std::vector<int32_t> win_lens, ent_lens;        // per request
  std::vector<int32_t> req_id;                    // [T]
  std::vector<std::vector<int32_t>> win_idx, ext_idx;  // request-local positions / entries
  std::vector<int32_t> win_len, ext_len;               // valid lengths
  std::vector<int64_t> win_first, ent_first;  // request r's first source row
  Tensor main_kv, main_pe, ext_kv, ext_pe;    // f32 source rows [n, 448] / [n, 64]
  Tensor q;                                   // [T, h, 512] bf16 values (f32 storage)
  Tensor sink;                                // [h] f32: head 1 -inf, head 2 dominant (+6)
  double scale = 1.0 / std::sqrt(512.0);
  int64_t t() const { return static_cast<int64_t>(req_id.size()); }
  int64_t requests() const { return static_cast<int64_t>(win_lens.size()); }
};

// Random f32 rows of magnitudes 2^-3 .. 2^3 per row (records get a spread of block scales).
inline Tensor source_rows(int64_t n, int64_t width) {
  Tensor x = Tensor::empty({n, width}, DType::f32);
  for (int64_t r = 0; r < n; ++r) {
    const double m = std::ldexp(1.0, std::uniform_int_distribution<int>(-3, 3)(rng()));
    for (int64_t i = 0; i < width; ++i) static_cast<float*>(x.data())[r * width + i] = static_cast<float>(uniform(-m, m));
  }
  return x;
}

// `owned(r, p)`: whether position (entry) p of request r belongs to the tokens of role 5 (rank 0's turn under
// the layout the caller will use for that list).
inline Problem make_problem(CacheFormat main_format, CacheFormat extra_format, int64_t page_main, int64_t page_extra,
                            int64_t h, int64_t t, uint64_t seed, const std::function<bool(int64_t)>& main_rank0,
                            const std::function<bool(int64_t)>& extra_rank0) {
  reseed(seed);
  Problem pr;
  pr.main_format = main_format;
  pr.extra_format = extra_format;
  pr.page_main = page_main;
  pr.page_extra = page_extra;
  pr.h = h;
  pr.win_lens = {300, 9, 133};
  pr.ent_lens = {75, 2, 33};
  const int64_t R = pr.requests();
  int64_t nw = 0, ne = 0;
  for (int64_t r = 0; r < R; ++r) {
    pr.win_first.push_back(nw);
    pr.ent_first.push_back(ne);
    nw += pr.win_lens[static_cast<std::size_t>(r)];
    ne += pr.ent_lens[static_cast<std::size_t>(r)];
  }
  pr.main_kv = source_rows(nw, kDqk - kRope);
  pr.main_pe = source_rows(nw, kRope);
  pr.ext_kv = source_rows(ne, kDqk - kRope);
  pr.ext_pe = source_rows(ne, kRope);
  std::mt19937_64& g = rng();
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); };
  const int64_t wcols = kWindow + kJunk;
  for (int64_t tok = 0; tok < t; ++tok) {
    const int64_t r = tok % R, W = pr.win_lens[static_cast<std::size_t>(r)], E = pr.ent_lens[static_cast<std::size_t>(r)];
    const int64_t p = std::max<int64_t>(0, W - 1 - tok / R);
    const int64_t role = tok;
    pr.req_id.push_back(static_cast<int32_t>(r));
    std::vector<int32_t> win, ext;
    for (int64_t j = 0; j < kWindow; ++j) {
      const int64_t x = p - (kWindow - 1) + j;
      win.push_back(x >= 0 ? static_cast<int32_t>(x) : -1);
    }
    for (int64_t j = 0; j < kJunk; ++j) win.push_back(static_cast<int32_t>(uni(0, W - 1)));  // past the length
    int32_t wl = static_cast<int32_t>(kWindow), el = 0;
    for (int64_t j = 0; j < kExtraTopk; ++j) {
      const int64_t u = uni(0, 9);
      int64_t e;
      if (u == 0) e = -1;
      else if (u == 1) e = E + uni(0, 3);  // past the request's count: invalid
      else if (u == 2 && !ext.empty() && ext.back() >= 0 && ext.back() < E) e = ext.back();  // duplicate
      else e = uni(0, E - 1);
      ext.push_back(static_cast<int32_t>(e));
    }
    el = static_cast<int32_t>(uni(0, kExtraTopk));
    switch (role) {
      case 0: break;
      case 1: wl = 0; el = 0; break;
      case 2:
        std::fill(win.begin(), win.end(), -1);
        for (int32_t& e : ext) e = static_cast<int32_t>(E + uni(0, 5));
        el = static_cast<int32_t>(kExtraTopk);
        break;
      case 3:
        std::rotate(win.begin(), win.begin() + (kWindow - 3), win.begin() + kWindow);  // the last 3 first
        wl = 3;
        el = 0;
        break;
      case 4:
        std::fill(win.begin(), win.begin() + kWindow, -1);
        break;
      case 5: {
        std::vector<int32_t> w0, e0;
        for (int32_t x : win)
          if (x >= 0 && main_rank0(x)) w0.push_back(x);
        for (int32_t e : ext)
          if (e >= 0 && e < E && extra_rank0(e)) e0.push_back(e);
        wl = static_cast<int32_t>(w0.size() * 2 / 3);
        el = static_cast<int32_t>(e0.size() * 2 / 3);
        w0.resize(static_cast<std::size_t>(wcols), -1);
        e0.resize(static_cast<std::size_t>(kExtraTopk), -1);
        // Past the lengths: valid positions of any rank (must not be read).
        for (std::size_t j = static_cast<std::size_t>(wl); j < w0.size(); ++j) w0[j] = static_cast<int32_t>(uni(0, W - 1));
        for (std::size_t j = static_cast<std::size_t>(el); j < e0.size(); ++j) e0[j] = static_cast<int32_t>(uni(0, E - 1));
        win = w0;
        ext = e0;
        break;
      }
      default:
        std::shuffle(win.begin(), win.begin() + kWindow, g);
        wl = static_cast<int32_t>(uni(0, wcols));
        break;
    }
    pr.win_idx.push_back(win);
    pr.ext_idx.push_back(ext);
    pr.win_len.push_back(wl);
    pr.ext_len.push_back(el);
  }
  pr.q = Tensor::empty({t, h, kDqk}, DType::f32);
  {
    const Tensor qb = random_tensor({t, h, kDqk}, DType::bf16);
    const std::vector<double> v = to_doubles(qb.view());
    for (std::size_t i = 0; i < v.size(); ++i) static_cast<float*>(pr.q.data())[i] = static_cast<float>(v[i]);
  }
  pr.sink = Tensor::empty({h}, DType::f32);
  for (int64_t hh = 0; hh < h; ++hh)
    static_cast<float*>(pr.sink.data())[hh] =
        hh == 1 ? -INFINITY : hh == 2 ? 6.0f : static_cast<float>(uniform(-3.0, 3.0));
  return pr;
}

// One cache (the window or the compressed one) as `layout`'s rank holds it: request r's local positions in
// blocks block_base + r * mb + j (block_base pushes the rows up the address space), every other row poisoned.
struct BuiltCache {
  CacheBuffer cb;
  Tensor table;  // [R, mb] int32 on the cache's device
  int64_t mb = 0;
};
// poison(cb): fills the whole storage with 0xff bytes (the caller's: std::memset on the CPU, a device
// memset on CUDA).
inline BuiltCache build_cache(const Problem& pr, bool extra, const DcpLayout& layout, int64_t block_base, Device dev,
                              const std::function<void(CacheBuffer&)>& poison) {
  const CacheFormat f = extra ? pr.extra_format : pr.main_format;
  const int64_t page = extra ? pr.page_extra : pr.page_main, R = pr.requests();
  const std::vector<int32_t>& lens = extra ? pr.ent_lens : pr.win_lens;
  const std::vector<int64_t>& first = extra ? pr.ent_first : pr.win_first;
  const Tensor& kv = extra ? pr.ext_kv : pr.main_kv;
  const Tensor& pe = extra ? pr.ext_pe : pr.main_pe;
  BuiltCache b;
  for (int64_t r = 0; r < R; ++r)
    b.mb = std::max(b.mb, (dcp_local_length(lens[static_cast<std::size_t>(r)], layout) + page - 1) / page);
  b.mb = std::max<int64_t>(b.mb, 1);
  b.cb = allocate_cache(f, block_base + R * b.mb + 1, page, dev, 1.0f, static_cast<int>(kDqk), static_cast<int>(kRope));
  poison(b.cb);
  std::vector<std::vector<int32_t>> table(static_cast<std::size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < b.mb; ++j) table[static_cast<std::size_t>(r)].push_back(static_cast<int32_t>(block_base + r * b.mb + j));
  std::vector<int64_t> rows, slots;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t p = 0; p < lens[static_cast<std::size_t>(r)]; ++p)
      if (dcp_owner(p, layout) == layout.rank) {
        const int64_t lp = dcp_local_position(p, layout);
        rows.push_back(first[static_cast<std::size_t>(r)] + p);
        slots.push_back(int64_t(table[static_cast<std::size_t>(r)][static_cast<std::size_t>(lp / page)]) * page + lp % page);
      }
  const auto n = static_cast<int64_t>(rows.size());
  if (n > 0) {
    Tensor k = Tensor::empty({n, kDqk - kRope}, DType::f32), e = Tensor::empty({n, kRope}, DType::f32);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(static_cast<float*>(k.data()) + i * (kDqk - kRope),
                  static_cast<const float*>(kv.data()) + rows[static_cast<std::size_t>(i)] * (kDqk - kRope),
                  sizeof(float) * (kDqk - kRope));
      std::memcpy(static_cast<float*>(e.data()) + i * kRope,
                  static_cast<const float*>(pe.data()) + rows[static_cast<std::size_t>(i)] * kRope, sizeof(float) * kRope);
    }
    write_cache(k.to(dev), e.to(dev), int64_tensor(slots, dev), b.cb.cache);
  }
  b.table = int_tensor_2d(table, dev);
  return b;
}

// A contiguous host copy of `t` (host, contiguous or not) in dtype `dt`, each value rounded once.
inline Tensor as_dtype(const TensorView& t, DType dt) {
  const std::vector<double> v = to_doubles(t);
  Tensor o = Tensor::empty(std::span<const int64_t>(t.shape.data(), static_cast<std::size_t>(t.ndim)), dt);
  const std::size_t es = dtype_size(dt);
  for (std::size_t i = 0; i < v.size(); ++i) num::store(static_cast<char*>(o.data()) + i * es, dt, v[i]);
  return o;
}

inline void poison_host(CacheBuffer& cb) { std::memset(cb.storage.data(), 0xff, cb.storage.nbytes()); }

// The single-rank result: sparse_mqa with the V4 options over the whole caches for all h heads (CPU,
// float64 reference precision). out [T, h, 512] f64, lse [T, h] f64.
struct Result {
  Tensor out, lse;
};
inline Result reference(const Problem& pr, bool with_sink) {
  const DcpLayout whole{1, 0, 1};
  const BuiltCache m = build_cache(pr, false, whole, 0, Device::cpu(), poison_host);
  const BuiltCache e = build_cache(pr, true, whole, 0, Device::cpu(), poison_host);
  const int64_t t = pr.t();
  const Tensor req = int_tensor(pr.req_id), wi = int_tensor_2d(pr.win_idx), ei = int_tensor_2d(pr.ext_idx);
  Tensor wrows = Tensor::empty({t, wi.size(1)}, DType::i32), erows = Tensor::empty({t, ei.size(1)}, DType::i32);
  convert_topk_indices(req, m.table, wi, wrows, pr.page_main, 0, {}, {}, {}, int_tensor(pr.win_lens));
  convert_topk_indices(req, e.table, ei, erows, pr.page_extra, 0, {}, {}, {}, int_tensor(pr.ent_lens));
  const Tensor q64 = as_dtype(pr.q, DType::f64);
  const Tensor wl = int_tensor(pr.win_len), el = int_tensor(pr.ext_len);
  SparseOptions o;
  if (with_sink) o.attn_sink = pr.sink.view();
  o.extra = {e.cb.cache, erows.view(), el.view()};
  o.values_include_rope = true;
  Result res{poisoned({t, pr.h, kDqk}, DType::f64), poisoned({t, pr.h}, DType::f64)};
  sparse_mqa(q64, m.cb.cache, wrows, wl, res.out, res.lse, pr.scale, o, Context{nullptr, Precision::reference});
  return res;
}

// How a rank turns the global lists into its own: compacted (dcp_compact_topk, the documented path) or
// filtered in place (dcp_localize_topk: -1 for other ranks' positions, the global lengths kept).
enum class Localize { compact, filter };

// One rank's step: its shards of both caches (layouts main_layout / extra_layout, blocks from block_base),
// the lists localized on `dev`, then dcp_sparse_mqa with the V4 options; out [T, h_q, 512] in `dtype` and
// lse [T, h_q] f32 on `dev`, h_q = pr.h / W.
inline Result rank_step(Communicator& comm, const Problem& pr, const DcpLayout& main_layout,
                        const DcpLayout& extra_layout, int64_t block_base, Device dev, DType dtype, bool with_sink,
                        Localize how, const std::function<void(CacheBuffer&)>& poison, const Context& ctx = {}) {
  const int w = comm.world_size(), r = comm.rank();
  const int64_t t = pr.t(), hq = pr.h / w;
  const BuiltCache m = build_cache(pr, false, main_layout, block_base, dev, poison);
  const BuiltCache e = build_cache(pr, true, extra_layout, block_base, dev, poison);
  const Tensor req = int_tensor(pr.req_id, dev), wi = int_tensor_2d(pr.win_idx, dev), ei = int_tensor_2d(pr.ext_idx, dev);
  const Tensor wlen = int_tensor(pr.win_lens, dev), elen = int_tensor(pr.ent_lens, dev);
  const Tensor wvalid = int_tensor(pr.win_len, dev), evalid = int_tensor(pr.ext_len, dev);
  Tensor wloc = Tensor::empty({t, wi.size(1)}, DType::i32, dev), eloc = Tensor::empty({t, ei.size(1)}, DType::i32, dev);
  Tensor wrows = Tensor::empty({t, wi.size(1)}, DType::i32, dev), erows = Tensor::empty({t, ei.size(1)}, DType::i32, dev);
  Tensor wcount = wvalid, ecount = evalid;
  if (how == Localize::compact) {
    wcount = Tensor::empty({t}, DType::i32, dev);
    ecount = Tensor::empty({t}, DType::i32, dev);
    dcp_compact_topk(req, wlen, wi, wvalid, wloc, wcount, main_layout, ctx);
    dcp_compact_topk(req, elen, ei, evalid, eloc, ecount, extra_layout, ctx);
  } else {
    dcp_localize_topk(req, wlen, wi, wloc, main_layout, ctx);
    dcp_localize_topk(req, elen, ei, eloc, extra_layout, ctx);
  }
  convert_topk_indices(req, m.table, wloc, wrows, pr.page_main, 0, {}, {}, {}, {}, ctx);
  convert_topk_indices(req, e.table, eloc, erows, pr.page_extra, 0, {}, {}, {}, {}, ctx);
  const Tensor q_dev = as_dtype(pr.q.view().slice(1, r * hq, (r + 1) * hq), dtype).to(dev);
  const Tensor sink_dev = as_dtype(pr.sink.view().slice(0, r * hq, (r + 1) * hq), DType::f32).to(dev);
  SparseOptions o;
  if (with_sink) o.attn_sink = sink_dev.view();
  o.extra = {e.cb.cache, erows.view(), ecount.view()};
  o.values_include_rope = true;
  Result res{poisoned({t, hq, kDqk}, dtype, dev), poisoned({t, hq}, DType::f32, dev)};
  const auto wsb = static_cast<int64_t>(dcp_sparse_mqa_workspace_bytes(t, hq, dtype, w, kDqk, kDqk));
  const Tensor ws = Tensor::empty({wsb}, DType::u8, dev);
  dcp_sparse_mqa(comm, q_dev, m.cb.cache, wrows, wcount, res.out, res.lse, pr.scale, o, ws, ctx);
  comm.synchronize(ctx);
  return res;
}

// The ranks' outputs of their heads in the group's head order: [T, h, per_head] values.
inline std::vector<double> assemble(const std::vector<Tensor>& parts, int64_t t, int64_t per_token_rank) {
  std::vector<std::vector<double>> host;
  for (const Tensor& p : parts) host.push_back(to_doubles(p.view()));
  std::vector<double> all;
  for (int64_t x = 0; x < t; ++x)
    for (const auto& hv : host) all.insert(all.end(), hv.begin() + x * per_token_rank, hv.begin() + (x + 1) * per_token_rank);
  return all;
}

}  // namespace mla::test::dcp_v4
