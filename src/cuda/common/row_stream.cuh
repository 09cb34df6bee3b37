#pragma once
// The "resolve rows, then stream chunks" block schedule shared by the memory-bound row kernels
// (cache write, gathers, upconvert, merge).
//
// Each block owns kRows consecutive rows and walks their chunks row-major, so consecutive threads
// touch consecutive addresses (coalesced); each thread issues kUnroll independent chunk loads before
// its first store so that enough bytes are in flight to saturate HBM. What a row needs from small
// metadata (slot, block-table entry, merge weights) is its RowInfo, resolved in one of two ways:
//
//   Op::kEager = true   phase 1: one thread per row resolves its RowInfo into shared memory (the
//                       dependent metadata loads of different rows overlap), then phase 2 streams;
//                       chunk loads depend on the RowInfo (gathers: the source address).
//   Op::kEager = false  each chunk resolves its row's RowInfo itself (an L1-cached load shared by the
//                       row's threads) alongside its data loads, which must not depend on it (cache
//                       write: the source row is known, only the destination needs the slot); the
//                       store waits for both. No barrier, no serial metadata phase.
//
// An Op provides:
//   static constexpr bool kEager;
//   using RowInfo = ...;                               trivially copyable
//   RowInfo resolve(int64_t row) const;
//   bool active(const RowInfo&) const;                false: the row is skipped (never written; with
//                                                      kEager also never read)
//   int chunks_per_row() const;
//   using Chunk = ...;                                registers held between load and store
//   void load(const RowInfo&, int64_t row, int c, Chunk&) const;   (kEager = false: RowInfo unused)
//   void store(const RowInfo&, int64_t row, int c, const Chunk&) const;
#include <cstdint>

namespace mla::cuda::dev {

template <int kRows, int kThreads, int kUnroll, class Op>
__device__ __forceinline__ void stream_rows(const Op& op, int64_t num_rows) {
  using Info = typename Op::RowInfo;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int nrows = static_cast<int>(num_rows - row0 < kRows ? num_rows - row0 : kRows);
  const int cpr = op.chunks_per_row();
  const int items = nrows * cpr;  // kRows * chunks_per_row fits easily in 32 bits

  if constexpr (Op::kEager) {
    __shared__ Info info[kRows];
    for (int r = threadIdx.x; r < nrows; r += kThreads) info[r] = op.resolve(row0 + r);
    __syncthreads();
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
  } else {
    for (int base = threadIdx.x; base < items; base += kUnroll * kThreads) {
      typename Op::Chunk v[kUnroll];
      Info inf[kUnroll];
      int rr[kUnroll], cc[kUnroll];
      bool act[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int it = base + u * kThreads;
        act[u] = it < items;
        rr[u] = act[u] ? it / cpr : 0;
        cc[u] = it - rr[u] * cpr;
        if (act[u]) {
          inf[u] = op.resolve(row0 + rr[u]);
          op.load(inf[u], row0 + rr[u], cc[u], v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (act[u] && op.active(inf[u])) op.store(inf[u], row0 + rr[u], cc[u], v[u]);
    }
  }
}

}  // namespace mla::cuda::dev
