// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fragment of a wgmma m64nNk16 fp32 accumulator that one thread holds, where the kernels keep the 64 A rows
// (keys for S^T, value columns for O^T) as the M side and the N query rows as the N side (the row-stationary
// kernels: small/, raw/). Thread (warp w of its warpgroup, g8 = lane / 4, t4 = lane % 4) holds N / 2 registers;
// register i is
//   A row   16 w + g8 + 8 ((i >> 1) & 1)          (rho_lo for (i >> 1) even, rho_hi = rho_lo + 8 for odd)
//   N row   8 (i / 4) + 2 t4 + (i & 1)
// so the thread sees N / 4 query rows ("row slots" rr), each in two registers: lo(rr) at A row rho_lo and
// hi(rr) = lo(rr) + 2 at rho_hi. Written once here: raw/kernel.cuh indexes its fragments through it (small/ and
// tile_io.cuh's epilogues hold the same layout).
namespace mla::cuda::decode_sm90 {

template <int N>
struct AccFrag {
  static_assert(N % 8 == 0, "wgmma N of 8, 16, 24, ...");
  static constexpr int kRegs = N / 2;  // registers per thread
  static constexpr int kRows = N / 4;  // query row slots per thread
  // The register of row slot rr at A row rho_lo, and at rho_hi.
  __device__ static constexpr int lo(int rr) { return 4 * (rr / 2) + rr % 2; }
  __device__ static constexpr int hi(int rr) { return lo(rr) + 2; }
  // The query row (0 .. N - 1) of row slot rr for the thread's t4.
  __device__ static constexpr int row(int rr, int t4) { return 8 * (rr / 2) + 2 * t4 + rr % 2; }
  // Whether register i lies at A row rho_hi.
  __device__ static constexpr bool at_hi(int i) { return ((i >> 1) & 1) != 0; }
};

}  // namespace mla::cuda::decode_sm90
