#pragma once
// Shared core of the CPU attention ops (mqa_decode, mha_prefill, sparse_mqa).
//
// Every op reduces to the same step: a tile of query rows (converted once to the accumulation type T)
// meets a block of key rows (dequantised / converted once into a T buffer) and folds the block into a
// per-row online softmax (running max m, running sum l, unnormalised output o). T is float in
// Precision::fast and double in Precision::reference; inputs and outputs keep their own dtypes and are
// converted at the edges only. Key blocks are reused by every query row of the tile, so a cache row is
// dequantised once per (request, head group), not once per head.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "cpu/cache_row.h"
#include "cpu/index_view.h"
#include "mla/cache.h"
#include "mla/tensor.h"

namespace mla::cpu::attn {

// Key rows per block: a [64, 576] float block (144 KiB) stays in L2 while every query row of the tile
// passes over it.
inline constexpr int64_t kKeyBlock = 64;

// ---- activations ----------------------------------------------------------------------------

// n contiguous elements of a floating dtype -> T.
template <class T>
inline void load_row(const void* src, DType dt, T* dst, int64_t n) {
  switch (dt) {
    case DType::f32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::f64: {
      const double* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(num::bf16_to_float(s[i]));
      return;
    }
    default: {  // f16 (validated callers pass floating dtypes only)
      const char* s = static_cast<const char*>(src);
      const int64_t es = static_cast<int64_t>(dtype_size(dt));
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(num::load(s + i * es, dt));
      return;
    }
  }
}

// double -> float rounded *to odd* (truncate, then set the last bit if anything was lost). float keeps
// at least 13 more bits than bf16 / f16, so rounding this float to nearest even gives the same result as
// rounding the double directly: reference-mode outputs are correctly rounded, not rounded twice.
inline float to_float_odd(double x) {
  float f = static_cast<float>(x);
  if (std::isfinite(f) && static_cast<double>(f) != x) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::fabs(static_cast<double>(f)) > std::fabs(x)) --u;  // magnitude toward zero, same sign
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return f;
}
inline float to_float_odd(float x) { return x; }

// n values of T -> contiguous elements of dtype dt, rounded to nearest even.
template <class T>
inline void store_row(void* dst, DType dt, const T* src, int64_t n) {
  switch (dt) {
    case DType::f32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(src[i]);
      return;
    }
    case DType::f64: {
      double* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(src[i]);
      return;
    }
    default: {  // bf16 / f16
      char* d = static_cast<char*>(dst);
      const int64_t es = static_cast<int64_t>(dtype_size(dt));
      for (int64_t i = 0; i < n; ++i) num::store(d + i * es, dt, to_float_odd(src[i]));
      return;
    }
  }
}

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
    const uint8_t* row = cache_row_ptr(c_, slot);
    switch (c_.format) {
      case CacheFormat::bf16:
        bf16_to(row, out, cols);
        return;
      case CacheFormat::fp8: {
        const T s = static_cast<T>(c_.scale);
        for (int64_t i = 0; i < cols; ++i) out[i] = e4m3_[row[i]] * s;
        return;
      }
      case CacheFormat::fp8_ds_mla: {
        float scales[ds_mla::kNumTiles];
        std::memcpy(scales, row + ds_mla::kScaleOffset, sizeof(scales));
        const int64_t nope = std::min(cols, ds_mla::kNopeDim);
        for (int64_t t = 0; t * ds_mla::kTile < nope; ++t) {
          const T s = static_cast<T>(scales[t]);
          const int64_t end = std::min(nope, (t + 1) * ds_mla::kTile);
          for (int64_t i = t * ds_mla::kTile; i < end; ++i) out[i] = e4m3_[row[i]] * s;
        }
        if (cols > nope) bf16_to(row + ds_mla::kRopeOffset, out + nope, cols - nope);
        return;
      }
    }
  }

 private:
  static void bf16_to(const uint8_t* src, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      out[i] = static_cast<T>(f);
    }
  }

  const KVCache& c_;
  std::array<T, 256> e4m3_{};
};

// ---- online softmax -------------------------------------------------------------------------

// Running softmax state of `rows` query rows with value width dv. Scores are already multiplied by the
// softmax scale, so lse = m + ln(l) is the natural-log LSE of the scaled logits.
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

  // Normalised output row r and its lse. A row that saw no key (l == 0) yields zeros and -inf: the
  // empty-key-set rule of the contract, never 0/0.
  float finish(int64_t r, T* out_row) const {
    const T* src = o.data() + r * dv;
    if (!(l[r] > T(0))) {
      std::fill(out_row, out_row + dv, T(0));
      return -std::numeric_limits<float>::infinity();
    }
    const T inv = T(1) / l[r];
    for (int64_t x = 0; x < dv; ++x) out_row[x] = src[x] * inv;
    return static_cast<float>(m[r] + std::log(l[r]));
  }
};

// Per-thread scratch of attend_block (grown on demand, reused across blocks): the transposed key block
// and the scores / probabilities of the tile.
template <class T>
struct BlockScratch {
  std::vector<T> kt, scores;
};

// Folds one key block into the tile. q: [nq, d] (row stride ldq); k: [nk, d] (ldk); v: [nk, dv] (ldv;
// may alias k's first dv columns, as in MQA where values are the latent part of the key row). Row r sees
// keys j < lim[r] (lim[r] in [0, nk]). Defined in attention_kernels.cpp, which compiles it for several
// x86 ISA levels and picks the widest the CPU supports at run time.
void attend_block(const float* q, int64_t ldq, int64_t nq, const float* k, int64_t ldk, int64_t d, const float* v,
                  int64_t ldv, int64_t nk, float scale, const int64_t* lim, SoftmaxTile<float>& st,
                  BlockScratch<float>& ws);
void attend_block(const double* q, int64_t ldq, int64_t nq, const double* k, int64_t ldk, int64_t d,
                  const double* v, int64_t ldv, int64_t nk, double scale, const int64_t* lim, SoftmaxTile<double>& st,
                  BlockScratch<double>& ws);

}  // namespace mla::cpu::attn
