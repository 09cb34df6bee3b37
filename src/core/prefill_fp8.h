// SPDX-License-Identifier: Apache-2.0
#pragma once
// Workspace layout of the fp8 mha_prefill on CUDA (SEMANTICS §10.1, docs/design/prefill_fp8_sm90.md): the
// quantised operands the sm90_fp8 kernel reads, written by its quantise pass. Host-only, no CUDA; shared by the
// op's front end (mha_prefill_workspace_bytes) and the launcher (no fmt: .cu files include it). Byte offsets,
// every region 256-byte aligned.
//   q8  e4m3 [h][total_q][192]          q codes, head-major (a head's rows contiguous for TMA)
//   k8  e4m3 [h][k_rows][192]           [k_nope | k_pe] codes; request b's key r at row pad_start(b) + r,
//                                       pad_start(b) = round_up(cu_k[b], 16) + 128 b; every other row (the
//                                       request's tail up to its next multiple of 128 keys, the gaps) zero codes
//   vt8 e4m3 [h][128][v_cols]           v transposed (keys contiguous), the same column per key as k8's row,
//                                       permuted within each 16 keys of a request (kernel.cuh: the P fragment
//                                       order), zero codes up to the request's next multiple of 128 keys
// pad_start(b) is 16-aligned and at least the previous request's start plus its keys rounded up to 128, so
// requests never share a 128-key tile, every tile a request reads holds its own keys or zero codes, and the
// permutation within 16 keys stays within 16-aligned groups of columns.
#include <cstdint>
#include <string>

#include "mla/error.h"

namespace mla::prefill_fp8 {

inline constexpr int64_t kDqk = 192, kDv = 128, kTile = 128, kAlign = 256;
// The workspace base: 16 bytes (TMA); the regions sit at multiples of kAlign from it.
inline constexpr int64_t kBaseAlign = 16;

struct Layout {
  int64_t q_off = 0, k_off = 0, v_off = 0, total = 0;
  int64_t k_rows = 0, v_cols = 0;

  static Layout of(int64_t total_q, int64_t total_k, int64_t heads, int64_t batch) {
    auto fail = [] { throw Error("mha_prefill fp8 workspace size overflows int64"); };
    auto mul = [&](int64_t a, int64_t b) {
      int64_t r = 0;
      if (__builtin_mul_overflow(a, b, &r)) fail();
      return r;
    };
    auto add = [&](int64_t a, int64_t b) {
      int64_t r = 0;
      if (__builtin_add_overflow(a, b, &r)) fail();
      return r;
    };
    auto up = [&](int64_t x, int64_t a) { return add(x, a - 1) / a * a; };
    Layout l;
    l.k_rows = add(up(total_k, 16), mul(kTile, batch));
    l.v_cols = l.k_rows;
    const int64_t qb = mul(mul(heads, total_q), kDqk);
    const int64_t kb = mul(mul(heads, l.k_rows), kDqk);
    const int64_t vb = mul(mul(heads, kDv), l.v_cols);
    l.q_off = 0;
    l.k_off = up(add(l.q_off, qb), kAlign);
    l.v_off = up(add(l.k_off, kb), kAlign);
    l.total = up(add(l.v_off, vb), kAlign);
    return l;
  }
};

}  // namespace mla::prefill_fp8
