// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "resolve rows, then stream chunks" block schedule shared by the memory-bound row kernels
// (cache write, gathers, upconvert, merge).
//
// Each block owns kRows consecutive rows. Phase 1: one thread per row resolves what the row needs
// from small metadata (slot, request search and block-table read, merge weights) into shared memory;
// these dependent loads of different rows overlap instead of each warp waiting on its own chain, and
// costly index arithmetic (a slot's 64-bit division into block and offset) is done once per row.
// Phase 2: the block walks the rows' chunks row-major, so consecutive threads touch consecutive
// addresses (coalesced); each thread issues kUnroll independent chunk loads before its first store so
// that enough bytes are in flight to saturate HBM. (Resolving per chunk instead, with the loads issued
// next to the metadata load, was measured slower: docs/PERFORMANCE.md.)
//
// An Op provides:
//   using RowInfo = ...;                               trivially copyable, lives in shared memory
//   RowInfo resolve(int64_t row) const;               phase 1
//   bool active(const RowInfo&) const;                false: the row is skipped (never read, never written)
//   int chunks_per_row() const;
//   using Chunk = ...;                                registers held between load and store
//   void load(const RowInfo&, int64_t row, int c, Chunk&) const;
//   void store(const RowInfo&, int64_t row, int c, const Chunk&) const;
#include <cstdint>

namespace mla::cuda::dev {

template <int kRows, int kThreads, int kUnroll, class Op>
__device__ __forceinline__ void stream_rows(const Op& op, int64_t num_rows) {
  __shared__ typename Op::RowInfo info[kRows];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int nrows = static_cast<int>(num_rows - row0 < kRows ? num_rows - row0 : kRows);
  for (int r = threadIdx.x; r < nrows; r += kThreads) info[r] = op.resolve(row0 + r);
  __syncthreads();

  const int cpr = op.chunks_per_row();
  const int items = nrows * cpr;  // kRows * chunks_per_row fits easily in 32 bits
  for (int base = threadIdx.x; base < items; base += kUnroll * kThreads) {
    typename Op::Chunk v[kUnroll];
    int rr[kUnroll], cc[kUnroll];
    bool act[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int it = base + u * kThreads;
      act[u] = it < items;
      rr[u] = act[u] ? it / cpr : 0;
      cc[u] = it - rr[u] * cpr;
      act[u] = act[u] && op.active(info[rr[u]]);
      if (act[u]) op.load(info[rr[u]], row0 + rr[u], cc[u], v[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (act[u]) op.store(info[rr[u]], row0 + rr[u], cc[u], v[u]);
  }
}

}  // namespace mla::cuda::dev
