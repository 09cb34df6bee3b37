// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pieces shared by the sm90 decode kernels (seesaw/kernel.cuh: 64-row tiles, small/kernel.cuh: <= 32 rows):
// the CTA's unit of work, its start (barriers, role split). The key sources (TMA pages, gathered rows)
// and their producer loops: source.cuh.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/griddep.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/smem.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/common/ptx/wgmma.cuh"
#include "cuda/attention/sm90/common/params.h"
#include "cuda/attention/sm90/common/traits.cuh"
#include "core/decode_balance.h"
#include "cuda/common/trace.cuh"

namespace mla::cuda::decode_sm90 {

inline constexpr int kConsumerBarrier = 1;  // named barrier id of the two consumer warpgroups

// A key source whose expansion is shared by the two CTAs of a cluster (source_cross.cuh CrossKeys): its kernels run in clusters of two, initialise and leave through cluster_sync,
// and count the peer's arrivals on their barriers.
template <class S>
concept CrossoverSource = requires { requires S::kCrossover; };

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled panel (ptx/wgmma.cuh).
__device__ __forceinline__ int swz(int row, int chunk) { return ptx::sw128_offset(row, chunk); }

// The CTA's unit: request, row tile, key range [key_begin, key_end) in whole tiles, visible limits, and
// where its result goes: ws_slot >= 0: partial slot (rows ws_slot * m_rows + row of ws_lse / ws_o), -1:
// out / lse directly.
struct Unit {
  int64_t g, ws_slot;
  int row0, m_rows, split;
  int seq_len, key_begin, key_end, n_tiles;

  Unit() = default;
  // The uniform split-KV schedule: unit blockIdx.x = (row tile, split, request), with p.cluster_merge
  // (split, row tile, request): a cluster's CTAs are consecutive in x, so its ranks are the splits.
  // gather: sparse_mqa (the key source's kIndexed): the request is a token, its length its seq_len.
  __device__ __forceinline__ Unit(const DecodeSm90Params& p, bool gather) {
    const int64_t bid = blockIdx.x;
    if (p.cluster_merge) {
      split = static_cast<int>(bid % p.num_splits);
      const int64_t rest = bid / p.num_splits;
      row0 = static_cast<int>(rest % p.m_tiles) * p.tile_rows;
      g = rest / p.m_tiles;
    } else {
      row0 = static_cast<int>(bid % p.m_tiles) * p.tile_rows;
      const int64_t rest = bid / p.m_tiles;
      split = static_cast<int>(rest % p.num_splits);
      g = rest / p.num_splits;
    }
    m_rows = p.rows.s_q * p.rows.h_q;
    seq_len = clamped_len(p, g, gather);
    const int tiles = (seq_len + Traits::kBlockN - 1) / Traits::kBlockN;
    const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
    const int t0 = min(split * per_split, tiles), t1 = min(t0 + per_split, tiles);
    set_range(t0, t1);
    ws_slot = p.num_splits > 1 && !p.cluster_merge ? g * p.num_splits + split : -1;
  }
  // A segment of the balanced schedule (one row tile: m_tiles == 1).
  __device__ __forceinline__ Unit(const DecodeSm90Params& p, const balance::Segment& s) {
    g = s.req;
    row0 = 0;
    split = 0;
    m_rows = p.rows.s_q * p.rows.h_q;
    seq_len = clamped_len(p, g, false);
    set_range(static_cast<int>(s.t0), static_cast<int>(s.t1));
    ws_slot = s.slot;
  }
  __device__ __forceinline__ void set_range(int t0, int t1) {
    key_begin = t0 * Traits::kBlockN;
    key_end = min(t1 * Traits::kBlockN, seq_len);
    n_tiles = t1 - t0;
  }
  // Request g's length clamped to what its block-table row (or top-k row) can hold.
  __device__ __forceinline__ static int clamped_len(const DecodeSm90Params& p, int64_t g, bool gather) {
    int64_t len, cap;
    if (gather) {  // sparse: the token's valid length of its index row
      cap = p.gather.topk;
      len = p.gather.topk_length != nullptr ? p.gather.topk_length[g * p.gather.topk_length_stride] : cap;
    } else {
      cap = p.max_blocks * p.page_size;
      len = p.seq_lens[g * p.seq_lens_stride];
    }
    return static_cast<int>(len < 0 ? 0 : len > cap ? cap : len);
  }
};

// Tile counts of the balanced schedule's requests (the device twin of the host's tile list).
struct RequestTiles {
  const DecodeSm90Params* p;
  __device__ __forceinline__ int64_t operator()(int64_t g) const { return balance::tiles_of(Unit::clamped_len(*p, g, false)); }
};

// The balanced schedule's window of this CTA (balance::Window, core/decode_balance.h), found by all
// threads of the CTA: the costs of every request summed in per-thread runs, a block scan of the runs,
// and the thread whose run holds the window start walks it. Result in *win (shared); `scratch`: 32 int64
// of shared memory. Ends with __syncthreads().
__device__ __forceinline__ void balanced_window(const DecodeSm90Params& p, balance::Window* win, int64_t* scratch) {
  const int64_t b = p.rows.groups;
  const int t = threadIdx.x, nt = blockDim.x, lane = t & 31, warp = t >> 5, nwarps = nt >> 5;
  const RequestTiles tiles{&p};
  const int64_t run = (b + nt - 1) / nt, i0 = min(int64_t{t} * run, b), i1 = min(i0 + run, b);
  int64_t mine = 0, top = 0;  // this run's cost and its longest request's
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t c = balance::cost_of(tiles(i));
    mine += c;
    top = max(top, c);
  }
  int64_t incl = mine;  // inclusive scan in the warp, then over the warps' totals
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
    top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
  }
  if (lane == 31) scratch[warp] = incl;
  if (lane == 0) scratch[16 + warp] = top;  // nwarps <= 16 (384 threads: 12)
  __syncthreads();
  int64_t before = 0, total = 0, max_cost = 0;
  for (int w = 0; w < nwarps; ++w) {
    before += w < warp ? scratch[w] : 0;
    total += scratch[w];
    max_cost = max(max_cost, scratch[16 + w]);
  }
  const int64_t start = before + incl - mine;  // cost position of request i0
  if (balance::whole_requests(b, static_cast<int>(gridDim.x), total, max_cost)) {  // CTA k: request k whole
    const int64_t k = blockIdx.x;
    if (t == 0 && k >= b) *win = balance::whole_window(b, total, 0, max_cost);
    if (k < b && i0 <= k && k < i1) {  // exactly one thread: its run holds request k
      int64_t pos = start;
      for (int64_t i = i0; i < k; ++i) pos += balance::cost_of(tiles(i));
      *win = balance::whole_window(k, pos, balance::cost_of(tiles(k)), max_cost);
    }
    __syncthreads();
    return;
  }
  const int64_t per = balance::per_cta(total, static_cast<int>(gridDim.x));
  const int64_t lo = blockIdx.x * per, hi = min(lo + per, total);
  if (t == 0 && lo >= total) *win = balance::Window{lo, lo, b, total, per};
  if (lo < total && start <= lo && lo < start + mine) {  // exactly one thread: its run holds position lo
    int64_t pos = start, i = i0;
    while (pos + balance::cost_of(tiles(i)) <= lo) pos += balance::cost_of(tiles(i++));
    *win = balance::Window{lo, hi, i, pos, per};
  }
  __syncthreads();
}

// The units of this CTA in order: the uniform schedule's one (blockIdx.x), or the balanced schedule's
// segments of the window in shared memory. Every role walks its own copy and sees the same units.
// State: the position of the balanced cursor (registers are scarce in the consumers; the window stays in shared
// memory and the rest comes from the parameters) and, for the uniform schedule, `one` (with `have_one`): the unit
// as the kernel already read it before the role split (its length is a global load: reading it again per role put
// one more round trip before the producer's first block-table read); without it the unit is read here.
template <bool kGather>
struct Units {
  int64_t req = 0, pos = 0;  // uniform schedule: req 1 once its unit was handed out
  Unit one{};
  bool have_one = false;
  __device__ __forceinline__ Units(const DecodeSm90Params& p, const balance::Window* win, const Unit& one_ = Unit{},
                                   bool have_one_ = false)
      : one(one_), have_one(have_one_) {
    if (p.balanced) {
      req = win->req;
      pos = win->pos;
    }
  }
  // The next unit into u (and its segment's meta for the combine); false when there is none.
  __device__ __forceinline__ bool next(const DecodeSm90Params& p, const balance::Window* win, Unit& u,
                                       balance::Segment& s) {
    if (!p.balanced) {
      if (req != 0) return false;
      req = 1;
      u = have_one ? one : Unit(p, kGather);
      s = balance::Segment{u.g, 0, 0, 1, -1, -1};
      return true;
    }
    balance::Cursor cur(p.rows.groups, req, pos, static_cast<int>(blockIdx.x));
    const bool more = cur.next(*win, RequestTiles{&p}, s);
    req = cur.req;
    pos = cur.pos;
    if (more) u = Unit(p, s);
    return more;
  }
};

// A unit without keys (a seq_len-0 request, a split past its request's tiles): out = 0 and LSE = -inf
// (or the same partial for the combine), written by the whole CTA before any role split, so that no
// barrier, TMA or query load runs for it (padding requests' query rows are never written by the
// layer: reading them would only read uninitialised memory).
__device__ __forceinline__ void write_empty_unit(const DecodeSm90Params& p, const Unit& u, int t, int nthreads) {
  const MqaRowParams& rp = p.rows;
  const int rows = min(p.tile_rows, u.m_rows - u.row0);
  const bool split = u.ws_slot >= 0;
  constexpr int kChunks = Traits::kDv / 8;  // 16-byte bf16 chunks (or 8-float halves) per row
  for (int e = t; e < rows * kChunks; e += nthreads) {
    const int row = u.row0 + e / kChunks, ch = e % kChunks;
    const int64_t ws_row = u.ws_slot * static_cast<int64_t>(u.m_rows) + row;
    if (split) {
      float* dst = p.ws_o + ws_row * Traits::kDv + ch * 8;
      for (int k = 0; k < 8; ++k) dst[k] = 0.0f;
    } else {
      uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + (row / rp.h_q) * rp.out_stride_i +
                      (row % rp.h_q) * rp.out_stride_h + ch * 8;  // bf16 out (supports() admits no other)
      for (int k = 0; k < 8; ++k) dst[k] = 0;
    }
    if (ch == 0) {
      if (split) p.ws_lse[ws_row] = -INFINITY;
      else if (rp.lse)
        rp.lse[u.g * rp.lse_stride_g + (row / rp.h_q) * rp.lse_stride_i + (row % rp.h_q) * rp.lse_stride_h] = -INFINITY;
    }
  }
}

// Shared-memory base of the CTA rounded up to 1024 bytes (128-byte-swizzled tiles need it; the kernels
// request 1 KiB of slack).
// The result is `raw` plus an offset, not an integer cast back to a pointer, so that the compiler keeps
// knowing it points into shared memory (LDS / STS rather than generic LD / ST: checked in the SASS).
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  const uint32_t a = ptx::smem_addr(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

// one_unit (uniform schedule): u is the CTA's one unit; a unit without keys is written by
// write_empty_unit and gets false. Otherwise (balanced schedule) u is unused: the consumers write the
// empty requests of their segments. Otherwise initialises layout L's
// barriers (kFullBarriers, each with the arrivals key source Src makes on it per phase: full barrier i
// carries L::kPanelsPerFull panels and, when L::mask_barrier(i), the tile's key mask; then kEmptyBarriers
// with kEmptyArrivals, from kOffBar), then splits the roles: warpgroup 0 gives registers back, runs
// produce(warp, lane) and gets false (the kernel returns); the consumer warpgroups take the registers and
// get true. (setmaxnreg: one branch per warpgroup role; the kernels are __launch_bounds__(384, 1).)
template <class L, class Src, class Produce>
__device__ __forceinline__ bool start_roles(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                            bool one_unit, uint8_t* smem, Produce&& produce_fn) {
  if (one_unit && u.n_tiles == 0) {  // uniform over the CTA: nothing below runs
    if constexpr (requires { L::kWgPartials; }) {
      if (p.wg_partials && u.ws_slot >= 0) {  // both warpgroups' partials empty: LSE -inf, their rows never read
        const int rows = min(p.tile_rows, u.m_rows - u.row0);
        for (int e = threadIdx.x; e < 2 * rows; e += blockDim.x)
          p.ws_lse[(2 * u.ws_slot + e / rows) * static_cast<int64_t>(u.m_rows) + u.row0 + e % rows] = -INFINITY;
        return false;
      }
    }
    write_empty_unit(p, u, threadIdx.x, blockDim.x);
    return false;
  }
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  if (threadIdx.x == 0) {
    for (int i = 0; i < L::kFullBarriers; ++i)
      ptx::mbar_init(&bars[i], Src::full_arrivals(L::kPanelsPerFull, L::mask_barrier(i)));
    for (int i = 0; i < L::kEmptyBarriers; ++i) {
      int arrivals = L::kEmptyArrivals;
      if constexpr (CrossoverSource<Src>)  // V-half groups are also released by the peer's consumer warps
        if (i % L::kGroups != 0) arrivals += Src::kPeerReleases;
      ptx::mbar_init(&bars[L::kFullBarriers + i], arrivals);
    }
    if constexpr (requires { L::kOffQBar; })  // the query rows' TMA barrier (small kernel, p.q_tma)
      if (p.q_tma) ptx::mbar_init(reinterpret_cast<uint64_t*>(smem + L::kOffQBar), 1);
    ptx::fence_mbarrier_init();
  }
  if constexpr (CrossoverSource<Src>) ptx::cluster_sync();  // the peer's barriers exist before any remote use
  else __syncthreads();
  MLA_DECODE_TRACE_EVENT(kTracePrologueBase + 2, 0);
  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<Src::producer_regs(L::kSeesaw)>();
    if constexpr (Src::kTma)
      if (threadIdx.x == 0) ptx::tma_prefetch_descriptor(map);
    MLA_DECODE_TRACE_EVENT(1, 0);
    produce_fn(ptx::warp_idx_in_warpgroup(), static_cast<int>(threadIdx.x & 31));
    MLA_DECODE_TRACE_EVENT(2, 0);
    if constexpr (!Src::kTma) {  // no thread leaves with its cp.async copies in flight
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
    }
    if constexpr (CrossoverSource<Src>) ptx::cluster_sync();  // the kernel's closing cluster barrier
    return false;
  }
  ptx::setmaxnreg_inc<(504 - Src::producer_regs(L::kSeesaw)) / 2>();
  return true;
}

}  // namespace mla::cuda::decode_sm90
