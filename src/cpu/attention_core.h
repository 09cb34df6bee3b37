// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared core of the CPU attention ops (mqa_decode, mha_prefill, sparse_mqa).
//
// Every op reduces to the same step: a tile of query rows (converted once to the accumulation type T)
// meets a block of key rows (dequantised / converted once into a T buffer) and folds the block into a
// per-row online softmax (running max m, running sum l, unnormalised output o). T is float in
// Precision::fast and double in Precision::reference; inputs and outputs keep their own dtypes and are
// converted at the edges only. A key block is reused by every query row of the tile: a latent cache row is
// dequantised once per work item (every head and query of a request or token), not once per head.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "cpu/cache_row.h"
#include "cpu/convert.h"
#include "core/index_view.h"
#include "mla/cache.h"
#include "mla/tensor.h"

namespace mla::cpu::attn {

// Key rows per block: a [64, 576] float block (144 KiB) stays in L2 while every query row of the tile
// passes over it.
inline constexpr int64_t kKeyBlock = 64;

// ---- cache rows -----------------------------------------------------------------------------

// Dequantises cache rows into T. Produces exactly the values of load_cache_row (cache_row.h; a unit test
// compares them bit for bit): an fp8 code times a float scale is exact in double, so rounding that
// product to T once equals multiplying in T. The e4m3 decode goes through a 256-entry table instead of
// ldexp because decode reads every context row once per step and ldexp would dominate.
template <class T>
class CacheRowReader {
 public:
  explicit CacheRowReader(const KVCache& c) : c_(c) {
    for (int i = 0; i < 256; ++i) e4m3_[i] = static_cast<T>(num::e4m3_to_float(static_cast<uint8_t>(i)));
  }

  // Writes the first `cols` values of slot `slot` into out.
  void read(int64_t slot, T* out, int64_t cols) const {
    dispatch_cache_format(c_.format, [&](auto fmt) {
      if constexpr (decltype(fmt)::kRecord)
        load_record_row<decltype(fmt)>(c_, slot, out, cols);  // block-scaled records: cache_row.h
      else
        read<decltype(fmt)>(cache_row_ptr(c_, slot), out, cols);
    });
  }

 private:
  // Latent codes [i0, i1) times one scale, then the rope (cache_row.h's load_cache_row, tile by tile).
  template <class Fmt>
  void codes(const uint8_t* p, T s, T* out, int64_t n) const {
    if constexpr (Fmt::kLatentDType == DType::fp8_e4m3) {
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_[p[i]] * s;
    } else {
      load_row(p, Fmt::kLatentDType, out, n);  // bf16 or f64: unscaled (CacheScale::none)
    }
  }
  template <class Fmt>
  void read(const uint8_t* row, T* out, int64_t cols) const {
    const int64_t latent = c_.d_latent(), nl = std::min(cols, latent);
    constexpr int64_t lb = dtype_bytes(Fmt::kLatentDType);
    if constexpr (Fmt::kScale == CacheScale::per_tile) {
      for (int64_t t0 = 0; t0 < nl; t0 += Fmt::kTile) {
        float s;
        std::memcpy(&s, row + Fmt::scale_offset(latent) + 4 * (t0 / Fmt::kTile), 4);
        codes<Fmt>(row + lb * t0, static_cast<T>(s), out + t0, std::min<int64_t>(Fmt::kTile, nl - t0));
      }
    } else {
      codes<Fmt>(row, static_cast<T>(Fmt::kScale == CacheScale::per_tensor ? c_.scale : 1.0f), out, nl);
    }
    if (cols <= nl) return;
    const uint8_t* rope = row + Fmt::rope_offset(latent);
    if constexpr (Fmt::kRopeDType == DType::fp8_e4m3) {
      const T s = static_cast<T>(Fmt::rope_scaled() ? c_.scale : 1.0f);
      for (int64_t i = 0; i < cols - nl; ++i) out[nl + i] = e4m3_[rope[i]] * s;
    } else {
      load_row(rope, Fmt::kRopeDType, out + nl, cols - nl);
    }
  }

  const KVCache& c_;
  std::array<T, 256> e4m3_{};
};

// ---- query tile, online softmax, block kernel ---------------------------------------------------

// Query rows of one work item in the accumulation type: as rows q [nq, d] (filled by the caller) and,
// after transpose(), as columns qt [d, nqp] with nqp = nq rounded up to kQueryPad (zero padding). The
// kernels broadcast key elements against vectors of consecutive queries, so the transposed copy is made
// once per work item rather than per key block.
inline constexpr int64_t kQueryPad = 16;  // a multiple of every kernel vector width (16 floats / 8 doubles)

template <class T>
struct QueryTile {
  int64_t nq = 0, d = 0, nqp = 0;
  std::vector<T> q, qt;

  void resize(int64_t rows, int64_t cols) {
    nq = rows;
    d = cols;
    nqp = (rows + kQueryPad - 1) / kQueryPad * kQueryPad;
    q.resize(static_cast<std::size_t>(nq * d));
  }
  T* row(int64_t r) { return q.data() + r * d; }
  void transpose() {
    qt.assign(static_cast<std::size_t>(d * nqp), T(0));
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t x = 0; x < d; ++x)
        qt[static_cast<std::size_t>(x * nqp + r)] = q[static_cast<std::size_t>(r * d + x)];
  }
};

// Running softmax state of `rows` query rows with value width dv: running max m, running sum l and the
// unnormalised output o. Scores are already multiplied by the softmax scale, so lse = m + ln(l) is the
// natural-log LSE of the scaled logits.
template <class T>
struct SoftmaxTile {
  int64_t rows = 0, dv = 0;
  std::vector<T> m, l, o;  // o: [rows, dv]

  void reset(int64_t r, int64_t d) {
    rows = r;
    dv = d;
    m.assign(static_cast<std::size_t>(r), -std::numeric_limits<T>::infinity());
    l.assign(static_cast<std::size_t>(r), T(0));
    o.assign(static_cast<std::size_t>(r * d), T(0));
  }
  T* orow(int64_t r) { return o.data() + r * dv; }
  const T* orow(int64_t r) const { return o.data() + r * dv; }

  // Normalised output row r and its lse. A row that saw no key (l == 0) yields zeros and -inf: the
  // empty-key-set rule of the contract, never 0/0. A NaN score makes l (and so the row and its lse)
  // NaN: it propagates, as on the GPU (SEMANTICS.md §14.6a), and is never mistaken for an empty row.
  // The lse keeps the accumulation precision (double in reference mode) until it is stored.
  T finish(int64_t r, T* out_row) const {
    const T* src = orow(r);
    if (l[r] == T(0)) {
      std::fill(out_row, out_row + dv, T(0));
      return -std::numeric_limits<T>::infinity();
    }
    const T inv = T(1) / l[r];
    for (int64_t x = 0; x < dv; ++x) out_row[x] = src[x] * inv;
    return m[r] + std::log(l[r]);
  }

  // Adds an attention sink (a logit entering the denominator only: a key of value 0) to row r; call it
  // once, after the last key and merge. sink -inf changes nothing; a row without keys then gets l = 1,
  // m = sink (out 0, lse = sink); a NaN sink makes the row NaN.
  void add_sink(int64_t r, T sink) {
    const T mx = std::isnan(m[r]) || std::isnan(sink) ? std::numeric_limits<T>::quiet_NaN() : std::max(m[r], sink);
    if (mx == -std::numeric_limits<T>::infinity()) return;
    const T f = std::exp(m[r] - mx);  // 0 for a row without keys
    T* o_r = orow(r);
    for (int64_t x = 0; x < dv; ++x) o_r[x] *= f;
    l[r] = l[r] * f + std::exp(sink - mx);
    m[r] = mx;
  }

  // Folds another partial state of the same rows (a disjoint key range) into this one.
  void merge(const SoftmaxTile& b) {
    for (int64_t r = 0; r < rows; ++r) {
      // NaN on either side stays NaN (std::max would drop a NaN second argument).
      const T mx = std::isnan(m[r]) || std::isnan(b.m[r]) ? std::numeric_limits<T>::quiet_NaN() : std::max(m[r], b.m[r]);
      if (mx == -std::numeric_limits<T>::infinity()) continue;  // neither side saw a key
      const T fa = std::exp(m[r] - mx), fb = std::exp(b.m[r] - mx);
      T* o_a = orow(r);
      const T* o_b = b.orow(r);
      for (int64_t x = 0; x < dv; ++x) o_a[x] = o_a[x] * fa + o_b[x] * fb;
      l[r] = l[r] * fa + b.l[r] * fb;
      m[r] = mx;
    }
  }
};

// Per-thread scratch of attend_block, grown on demand and reused across blocks: the scores, then
// probabilities, of a block, key-major p [nk, nqp], and per-row vectors (new running max, block sum,
// key limit as T) over the padded rows.
template <class T>
struct BlockScratch {
  std::vector<T> p, mnew, lsum, limf;
};

// Folds one key block into the tile's softmax state. k: [nk, d] (row stride ldk); v: [nk, dv] (ldv; may
// alias k's first dv columns, as in MQA where values are the latent part of the key row). Query row r sees
// keys j < lim[r] (lim[r] in [0, nk]); a key a row may not see never touches that row, even if it holds
// inf or NaN. Defined in attention_kernels.cpp, which compiles it for several x86 ISA levels and picks
// the widest the CPU supports at run time.
// Instruction-set level of the attention kernels: the widest the CPU supports by default. Tests lower it
// to run the AVX2 and baseline builds of the kernels on a machine that has AVX-512.
enum class Isa : int { base = 0, avx2 = 1, avx512 = 2 };
Isa best_isa();
Isa current_isa();
void set_isa(Isa isa);  // throws mla::Error above best_isa()

void attend_block(const QueryTile<float>& q, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t nk,
                  float scale, const int64_t* lim, SoftmaxTile<float>& st, BlockScratch<float>& ws);
void attend_block(const QueryTile<double>& q, const double* k, int64_t ldk, const double* v, int64_t ldv, int64_t nk,
                  double scale, const int64_t* lim, SoftmaxTile<double>& st, BlockScratch<double>& ws);

}  // namespace mla::cpu::attn
