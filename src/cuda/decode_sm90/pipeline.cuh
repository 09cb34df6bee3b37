#pragma once
// Pieces shared by the sm90 decode kernels (kernel_seesaw.cuh: 64-row tiles, kernel_small.cuh: <= 32 rows):
// the CTA's unit of work, its start (barriers, role split). The key sources (TMA pages, gathered rows)
// and their producer loops: source.cuh.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/ptx/cp_async.cuh"
#include "cuda/common/ptx/mbarrier.cuh"
#include "cuda/common/ptx/smem.cuh"
#include "cuda/common/ptx/setmaxnreg.cuh"
#include "cuda/common/ptx/tma.cuh"
#include "cuda/common/ptx/warpgroup.cuh"
#include "cuda/decode_sm90/params.h"
#include "cuda/decode_sm90/traits.cuh"

namespace mla::cuda::decode_sm90 {

inline constexpr int kConsumerBarrier = 1;  // named barrier id of the two consumer warpgroups

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled panel.
__device__ __forceinline__ int swz(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// The CTA's unit: request, row tile, key range [key_begin, key_end) in whole tiles, visible limits.
struct Unit {
  int64_t g;
  int row0, m_rows, split;
  int seq_len, key_begin, key_end, n_tiles;

  // gather: sparse_mqa (the key source's kTma is false): the request is a token, its length its seq_len.
  __device__ Unit(const DecodeSm90Params& p, bool gather) {
    const int64_t bid = blockIdx.x;
    row0 = static_cast<int>(bid % p.m_tiles) * p.tile_rows;
    const int64_t rest = bid / p.m_tiles;
    split = static_cast<int>(rest % p.num_splits);
    g = rest / p.num_splits;
    m_rows = p.rows.s_q * p.rows.h_q;
    int64_t len, cap;
    if (gather) {  // sparse: the token's valid length of its index row
      cap = p.gather.topk;
      len = p.gather.topk_length != nullptr ? p.gather.topk_length[g * p.gather.topk_length_stride] : cap;
    } else {
      cap = p.max_blocks * p.page_size;
      len = p.seq_lens[g * p.seq_lens_stride];
    }
    seq_len = static_cast<int>(len < 0 ? 0 : len > cap ? cap : len);
    const int tiles = (seq_len + Traits::kBlockN - 1) / Traits::kBlockN;
    const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
    const int t0 = min(split * per_split, tiles), t1 = min(t0 + per_split, tiles);
    key_begin = t0 * Traits::kBlockN;
    key_end = min(t1 * Traits::kBlockN, seq_len);
    n_tiles = t1 - t0;
  }
};

// A unit without keys (a seq_len-0 request, a split past its request's tiles): out = 0 and LSE = -inf
// (or the same partial for the combine), written by the whole CTA before any role split, so that no
// barrier, TMA or query load runs for it (padding requests' query rows are never written by the
// layer: reading them would only read uninitialised memory).
__device__ __forceinline__ void write_empty_unit(const DecodeSm90Params& p, const Unit& u) {
  const MqaRowParams& rp = p.rows;
  const int rows = min(p.tile_rows, u.m_rows - u.row0);
  const bool split = p.num_splits > 1;
  constexpr int kChunks = Traits::kDv / 8;  // 16-byte bf16 chunks (or 8-float halves) per row
  for (int e = threadIdx.x; e < rows * kChunks; e += blockDim.x) {
    const int row = u.row0 + e / kChunks, ch = e % kChunks;
    const int64_t ws_row = (u.g * p.num_splits + u.split) * static_cast<int64_t>(u.m_rows) + row;
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
// knowing it points into shared memory (LDS / STS instead of generic LD / ST: measured, docs/DECODE.md).
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  const uint32_t a = ptx::smem_addr(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

// Units without keys are written by write_empty_unit and get false. Otherwise initialises layout L's
// barriers (kFullBarriers, each with the arrivals key source Src makes on it per phase: full barrier i
// carries L::kPanelsPerFull panels and, when L::mask_barrier(i), the tile's key mask; then kEmptyBarriers
// with kEmptyArrivals, from kOffBar), then splits the roles: warpgroup 0 gives registers back, runs
// produce(warp, lane) and gets false (the kernel returns); the consumer warpgroups take the registers and
// get true. (setmaxnreg: one branch per warpgroup role; the kernels are __launch_bounds__(384, 1).)
template <class L, class Src, class Produce>
__device__ __forceinline__ bool start_roles(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                            uint8_t* smem, Produce&& produce_fn) {
  if (u.n_tiles == 0) {  // uniform over the CTA: nothing below runs
    write_empty_unit(p, u);
    return false;
  }
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  if (threadIdx.x == 0) {
    for (int i = 0; i < L::kFullBarriers; ++i)
      ptx::mbar_init(&bars[i], Src::full_arrivals(L::kPanelsPerFull, L::mask_barrier(i)));
    for (int i = 0; i < L::kEmptyBarriers; ++i) ptx::mbar_init(&bars[L::kFullBarriers + i], L::kEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<Src::producer_regs(L::kSeesaw)>();
    if constexpr (Src::kTma)
      if (threadIdx.x == 0) ptx::tma_prefetch_descriptor(map);
    produce_fn(ptx::warp_idx_in_warpgroup(), static_cast<int>(threadIdx.x & 31));
    if constexpr (!Src::kTma) {  // no thread leaves with its cp.async copies in flight
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
    }
    return false;
  }
  ptx::setmaxnreg_inc<(504 - Src::producer_regs(L::kSeesaw)) / 2>();
  return true;
}

}  // namespace mla::cuda::decode_sm90
