// SPDX-License-Identifier: Apache-2.0
#pragma once
// The balanced split-KV schedule of the sm90 decode kernel for <= 32 query rows per request
// (docs/design/attention_sm90.md "7. Schedules and the combine"). Pure code: compiled for the host (workspace sizing in the front end, the
// CPU unit tests in tests/unit/test_decode_balance.cpp) and, through MLA_BALANCE_HD, for the device:
// the kernel computes its own part of the schedule from the device seq_lens (src/cuda/attention/sm90/
// pipeline.cuh), so the launch needs no host sync and no schedule upload (CUDA-graph capturable).
//
// The cost line: request i costs tiles_i + kOverheadTiles positions (its 64-key tiles after a fixed
// charge for the segment's query load, epilogue and combine share), requests in order, total T. CTA k
// of C owns the window [k * per, min((k + 1) * per, T)), per = ceil(T / C): it runs, for every request
// whose tile positions meet its window, the tiles inside the window (one "segment" per request, in
// request order, each with its own online softmax), and an empty request (seq_len 0) when the
// request's start position lies in the window. So every CTA gets at most `per` positions of work
// whatever the lengths are (varlen batches, few long requests, many short ones).
//
// Whole requests: when every request fits its own CTA (b <= C) and the longest request costs at most 9/8 of
// the balanced window (near-uniform lengths), CTA k runs request k whole instead (window = request k's cost
// range, per = the longest cost; CTAs >= b idle): no request is cut, so no second segment, partial or
// combine share. Measured faster than the balanced windows on uniform batches at every length (b 128 h 16, s_k
// 512 .. 8192; docs/PERFORMANCE.md, docs/LAB.md on the balanced schedule); varlen batches (longest ~2x the
// window) stay balanced.
//
// Output: a request whose tiles all lie in one CTA's window (splits == 1) is written by that CTA as out
// / lse. A request split over CTAs first .. last writes one partial per CTA into slot req + cta
// (injective: a later CTA never serves an earlier request, so slots are < b + C) and the combine merges
// slots req + first .. req + last; the CTA that owns tile 0 records (first slot, splits) in the meta
// array for the combine.
#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define MLA_BALANCE_HD __host__ __device__ __forceinline__
#else
#define MLA_BALANCE_HD
#endif

namespace mla::balance {

inline constexpr int64_t kTileKeys = 64;       // keys per tile (the sm90 kernels' KV tile)
// Fixed cost of one segment, in tiles: the consumers' epilogue, partial write and query reload after the previous
// segment, while the producer, two stages ahead, waits. Measured with the trace build (b 128 h 16 varlen): each
// further segment of a CTA delayed its end by about 6 tiles' time, and charging 6 rather than 3 ran that row
// faster (docs/LAB.md, fixed costs of the small kernel).
inline constexpr int64_t kOverheadTiles = 6;
inline constexpr int kMaxCtas = 256;           // CTAs of one balanced launch (the combine's per-row weights)
inline constexpr int64_t kMaxRows = 32;        // query rows per request (s_q * h_q) the balanced kernel takes

MLA_BALANCE_HD constexpr int64_t tiles_of(int64_t seq_len) { return seq_len <= 0 ? 0 : (seq_len + kTileKeys - 1) / kTileKeys; }
MLA_BALANCE_HD constexpr int64_t cost_of(int64_t tiles) { return tiles + kOverheadTiles; }
inline constexpr int64_t kMinWindow = 2;       // positions per CTA at least: small batches give each CTA two
                                               // tiles (both consumer warpgroups busy, half the partials)
// Positions per CTA window: ceil(total / ctas), at least kMinWindow.
MLA_BALANCE_HD constexpr int64_t per_cta(int64_t total, int ctas) {
  return ctas <= 0 || total <= kMinWindow * ctas ? kMinWindow : (total + ctas - 1) / ctas;
}

inline constexpr int64_t kWholeNum = 9, kWholeDen = 8;  // longest cost <= 9/8 of the window: whole requests
MLA_BALANCE_HD constexpr bool whole_requests(int64_t b, int ctas, int64_t total, int64_t max_cost) {
  return b >= 1 && b <= ctas && max_cost * kWholeDen <= per_cta(total, ctas) * kWholeNum;
}

// CTA `cta`'s window [lo, hi) of the cost line and its first request `req` (the first whose cost range
// ends past lo; b when none) with that request's start position `pos`; whole: the whole-requests mode (the
// window is request `req`'s cost range, per the longest cost).
struct Window {
  int64_t lo, hi, req, pos, per;
  bool whole = false;
};

// The whole-requests window of request `req` (cost range [pos, pos + cost)); req == b with pos = total, cost 0:
// the empty window of a CTA past the batch.
MLA_BALANCE_HD constexpr Window whole_window(int64_t req, int64_t pos, int64_t cost, int64_t max_cost) {
  return Window{pos, pos + cost, req, pos, max_cost, true};
}

// One request's part in one CTA: tiles [t0, t1) (t0 == t1 == 0: an empty request, out 0 / lse -inf).
struct Segment {
  int64_t req;
  int64_t t0, t1;
  int64_t splits;      // CTAs sharing the request (1: this CTA writes out / lse itself)
  int64_t slot;        // partial slot req + cta when splits > 1, else -1
  int64_t first_slot;  // slot of the request's first CTA (meta for the combine)
};

// Walks a window's segments in request order. tiles(i): tile count of request i (the device twin reads
// the clamped seq_lens). Every role of the kernel walks its own cursor over the same window (passed to
// each next(): the kernel keeps it in shared memory, the cursor holds only its position) and sees the
// same segments.
struct Cursor {
  int64_t b, req, pos;
  int cta;

  MLA_BALANCE_HD Cursor(const Window& w, int64_t b_, int cta_) : b(b_), req(w.req), pos(w.pos), cta(cta_) {}
  MLA_BALANCE_HD Cursor(int64_t b_, int64_t req_, int64_t pos_, int cta_) : b(b_), req(req_), pos(pos_), cta(cta_) {}

  template <class Tiles>
  MLA_BALANCE_HD bool next(const Window& w, const Tiles& tiles, Segment& s) {
    while (req < b && pos < w.hi) {
      const int64_t i = req, n = tiles(i), p0 = pos, start = p0 + kOverheadTiles;
      pos += cost_of(n);
      ++req;
      if (n == 0) {  // empty: owned by the CTA whose window holds its start
        if (p0 < w.lo) continue;
        s = Segment{i, 0, 0, 1, -1, i + cta};
        return true;
      }
      const int64_t t0 = w.lo > start ? w.lo - start : 0, t1 = w.hi - start < n ? w.hi - start : n;
      if (t0 >= t1) continue;  // the window holds only the request's overhead positions
      const int64_t first = w.whole ? cta : start / w.per, last = w.whole ? cta : (start + n - 1) / w.per;
      const int64_t splits = last - first + 1;
      s = Segment{i, t0, t1, splits, splits > 1 ? i + cta : -1, i + first};
      return true;
    }
    return false;
  }
};

// Workspace of a balanced launch (bytes, each part 256-byte aligned): meta int32 [b][2] (first slot,
// splits), partial LSE fp32 [b + ctas][rows], partial O fp32 [b + ctas][rows][512].
MLA_BALANCE_HD constexpr int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }
MLA_BALANCE_HD constexpr int64_t meta_bytes(int64_t b) { return align256(b * 2 * 4); }
MLA_BALANCE_HD constexpr int64_t lse_bytes(int64_t b, int64_t rows, int ctas) { return align256((b + ctas) * rows * 4); }
MLA_BALANCE_HD constexpr int64_t workspace_bytes(int64_t b, int64_t rows, int ctas) {
  return meta_bytes(b) + lse_bytes(b, rows, ctas) + (b + ctas) * rows * 512 * 4;
}

// Whether the balanced schedule serves b requests of `rows` query rows on num_sms SMs, and with how many
// CTAs (0: not used; the uniform split-KV schedule runs). Large batches (>= 2 CTAs per SM of requests)
// keep the uniform one: the hardware's CTA scheduler balances those waves and no workspace is needed.
MLA_BALANCE_HD constexpr int ctas_for(int64_t b, int64_t rows, int num_sms) {
  if (b <= 0 || rows > kMaxRows || num_sms <= 0 || b >= 2 * static_cast<int64_t>(num_sms)) return 0;
  return num_sms < kMaxCtas ? num_sms : kMaxCtas;
}

// Host reference of the whole schedule (tests; the kernel finds its window with a block scan): the
// window of every CTA from the tile counts.
inline std::vector<Window> windows(const std::vector<int64_t>& tiles, int ctas) {
  int64_t total = 0, max_cost = 0;
  for (int64_t n : tiles) {
    total += cost_of(n);
    max_cost = std::max(max_cost, cost_of(n));
  }
  const int64_t per = per_cta(total, ctas);
  std::vector<Window> w(static_cast<std::size_t>(ctas > 0 ? ctas : 0));
  const auto b = static_cast<int64_t>(tiles.size());
  std::size_t i = 0;
  int64_t pos = 0;
  if (whole_requests(b, ctas, total, max_cost)) {
    for (int k = 0; k < ctas; ++k) {
      const int64_t c = k < b ? cost_of(tiles[static_cast<std::size_t>(k)]) : 0;
      w[static_cast<std::size_t>(k)] = k < b ? whole_window(k, pos, c, max_cost) : whole_window(b, total, 0, max_cost);
      pos += c;
    }
    return w;
  }
  for (int k = 0; k < ctas; ++k) {
    const int64_t lo = k * per, hi = lo + per < total ? lo + per : total;
    while (i < tiles.size() && pos + cost_of(tiles[i]) <= lo) pos += cost_of(tiles[i++]);
    w[static_cast<std::size_t>(k)] = Window{lo, hi < lo ? lo : hi, static_cast<int64_t>(i), pos, per};
  }
  return w;
}

}  // namespace mla::balance
