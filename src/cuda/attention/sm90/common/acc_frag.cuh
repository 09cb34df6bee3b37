// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fragment of a wgmma m64nNk16 fp32 accumulator that one thread holds (warp w of its warpgroup, g8 = lane / 4,
// t4 = lane % 4): N / 2 registers; register i is at
//   A row (M)   16 w + g8 + 8 ((i >> 1) & 1)          (rho_lo for (i >> 1) even, rho_hi = rho_lo + 8 for odd)
//   N index     8 (i / 4) + 2 t4 + (i & 1)
// so the thread sees N / 4 N indices ("slots" rr), each in two registers: lo(rr) at A row rho_lo and hi(rr) =
// lo(rr) + 2 at rho_hi. The row-stationary kernels (small/, raw/) keep the 64 A rows as keys (S^T) or value columns
// (O^T) and the query rows as N (row()); the seesaw (seesaw/) keeps the query rows as M (at_hi: r_hi) and the keys
// (S) or value columns (O) as N. Written once here: the kernels index their fragments through it (tile_io.cuh's
// epilogues and 64-row softmax steps hold the same layout).
namespace mla::cuda::decode_sm90 {

template <int N>
struct AccFrag {
  static_assert(N % 8 == 0, "wgmma N of 8, 16, 24, ...");
  static constexpr int kRegs = N / 2;  // registers per thread
  static constexpr int kRows = N / 4;  // slots (N indices) per thread
  // The register of slot rr at A row rho_lo, and at rho_hi.
  __device__ static constexpr int lo(int rr) { return 4 * (rr / 2) + rr % 2; }
  __device__ static constexpr int hi(int rr) { return lo(rr) + 2; }
  // The N index (0 .. N - 1) of slot rr for the thread's t4 (the row-stationary kernels' query row).
  __device__ static constexpr int row(int rr, int t4) { return 8 * (rr / 2) + 2 * t4 + rr % 2; }
  // Whether register i lies at A row rho_hi.
  __device__ static constexpr bool at_hi(int i) { return ((i >> 1) & 1) != 0; }
};

}  // namespace mla::cuda::decode_sm90
