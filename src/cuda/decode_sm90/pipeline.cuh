#pragma once
// Pieces shared by the sm90 decode kernels (kernel.cuh: 64-row tiles, kernel_small.cuh: <= 32 rows):
// the CTA's unit of work and the producer warp that streams KV tiles with TMA.
#include <cuda.h>

#include <cstdint>

#include "cuda/common/ptx/mbarrier.cuh"
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

  __device__ Unit(const DecodeSm90Params& p) {
    const int64_t bid = blockIdx.x;
    row0 = static_cast<int>(bid % p.m_tiles) * p.tile_rows;
    const int64_t rest = bid / p.m_tiles;
    split = static_cast<int>(rest % p.num_splits);
    g = rest / p.num_splits;
    m_rows = p.rows.s_q * p.rows.h_q;
    const int64_t cap = p.max_blocks * p.page_size;
    const int64_t len = p.seq_lens[g * p.seq_lens_stride];
    seq_len = static_cast<int>(len < 0 ? 0 : len > cap ? cap : len);
    const int tiles = (seq_len + Traits::kBlockN - 1) / Traits::kBlockN;
    const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
    const int t0 = min(split * per_split, tiles), t1 = min(t0 + per_split, tiles);
    key_begin = t0 * Traits::kBlockN;
    key_end = min(t1 * Traits::kBlockN, seq_len);
    n_tiles = t1 - t0;
  }
};

// Producer warp: tile `it` of the unit into stage it % kStages of the layout L (kOffK, kOffMask,
// kOffBar: full[kStages] then empty[kStages]).
template <class L>
__device__ __forceinline__ void produce(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                        uint8_t* smem, int lane) {
  using T = Traits;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  uint64_t* empty = full + T::kStages;
  uint64_t* mask = reinterpret_cast<uint64_t*>(smem + L::kOffMask);
  const int32_t* table = p.block_table + u.g * p.block_table_stride;
  const int br = p.box_rows, boxes = T::kBlockN / br;
  auto page_of = [&](int key) -> int64_t {  // block id of key's page, -1 when not loadable
    if (key >= u.key_end) return -1;
    const int64_t blk = table[key / p.page_size];
    return blk >= 0 && blk < p.num_blocks ? blk : -1;
  };
  for (int it = 0; it < u.n_tiles; ++it) {
    const int stage = it % T::kStages;
    const uint32_t parity = (it / T::kStages) & 1;
    const int k0 = u.key_begin + it * T::kBlockN;
    // Boxes j = lane, lane + 32 (first key k0 + j * br); keys lane, lane + 32.
    int64_t blk[2];
    bool load[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = lane + 32 * h;
      blk[h] = j < boxes ? page_of(k0 + j * br) : -1;
      load[h] = blk[h] >= 0;
    }
    const int loaded = __popc(__ballot_sync(0xffffffffu, load[0])) + __popc(__ballot_sync(0xffffffffu, load[1]));
    const uint32_t lo = __ballot_sync(0xffffffffu, page_of(k0 + lane) >= 0);
    const uint32_t hi = __ballot_sync(0xffffffffu, page_of(k0 + lane + 32) >= 0);
    ptx::mbar_wait(&empty[stage], parity ^ 1);
    if (lane == 0) {
      mask[stage] = static_cast<uint64_t>(hi) << 32 | lo;
      ptx::mbar_arrive_expect_tx(&full[stage], static_cast<uint32_t>(loaded * T::kPanels * br * 128));
    }
    __syncwarp();
    uint8_t* dst = smem + L::kOffK + stage * T::kTileBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!load[h]) continue;
      const int j = lane + 32 * h, key = k0 + j * br;
      const int row_in_page = key % p.page_size;
#pragma unroll 1
      for (int c = 0; c < T::kPanels; ++c)
        ptx::tma_load_3d(dst + c * T::kPanelBytes + j * br * 128, map, &full[stage], c * T::kPanelCols, row_in_page,
                         static_cast<int32_t>(blk[h]));
    }
  }
}


// Shared-memory base of the CTA rounded up to 1024 bytes (128-byte-swizzled tiles need it; the kernels
// request 1 KiB of slack).
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// Initialises layout L's barriers (full: 1 arrival + the TMA bytes; empty: L::kEmptyArrivals), then
// splits the roles. Warpgroup 0 gives registers back and its warp 0 streams the tiles; it gets false
// and the kernel returns. The consumer warpgroups take the registers and get true. (setmaxnreg: one
// branch per warpgroup role; the kernels are __launch_bounds__(384, 1).)
template <class L>
__device__ __forceinline__ bool start_roles(const DecodeSm90Params& p, const CUtensorMap* map, const Unit& u,
                                            uint8_t* smem) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBar);
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&full[L::kStages + s], L::kEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (ptx::warpgroup_index() == 0) {
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx_in_warpgroup() == 0) {
      if (threadIdx.x == 0) ptx::tma_prefetch_descriptor(map);
      produce<L>(p, map, u, smem, threadIdx.x & 31);
    }
    return false;
  }
  ptx::setmaxnreg_inc<232>();
  return true;
}

}  // namespace mla::cuda::decode_sm90
