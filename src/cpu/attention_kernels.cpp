// Hot loops of the CPU attention ops (declared in attention_core.h): the scores of a query tile against
// a key block, the online-softmax update and the probability-weighted sum of value rows.
//
// Layout. The key block is transposed once into chunks kt[c][x][0..NJ) (NJ keys side by side, zero
// padded), so the score tile is an outer-product accumulation: for each column x, NJ keys times a
// broadcast query element, R query rows at a time, with R x C vector accumulators held in registers and
// no horizontal reductions. The value sum is the same register tile over (rows, value columns).
//
// ISA. The library is compiled for baseline x86-64 (SSE2), which leaves most of a modern core idle. The
// kernels are therefore written with GCC vector extensions of a width VB chosen per instantiation, and
// instantiated three times: AVX-512 (VB 64), AVX2+FMA (VB 32) and baseline (VB 16), each under its own
// target attribute; the widest the CPU supports is picked once at run time. Float contraction into FMA
// is enabled in this file only (it changes each product-sum by less than one rounding).
//
// Exactness: masked keys (j >= lim[r]) get probability exactly 0 and are never multiplied into a row's
// output, so a key a row may not see cannot leak into it even when it holds inf or NaN.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/attention_core.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif
#define MLA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace mla::cpu::attn {
namespace {

constexpr int kRows = 4;  // query rows per register tile
constexpr int kCols = 2;  // vectors per row in a register tile (kRows * kCols = 8 accumulators)

// ---- exp for the float path ---------------------------------------------------------------------

// e^x for x <= 0 (scores minus their running max), vectorisable: n = round(x / ln2), r = x - n ln2
// (two-part ln2), e^r by the Cephes minimax polynomial (about 1 ulp), 2^n by exponent bits. Below -87
// the result would be subnormal and is flushed to 0. NaN propagates through r.
MLA_ALWAYS_INLINE float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float t = xc * 1.44269504088896341f;
  // Round to nearest by adding 1.5 * 2^23: n sits in the low mantissa bits of `big` (integer arithmetic on
  // the bits, so even a NaN input stays well defined).
  const float big = t + 12582912.0f;
  const float n = big - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(big) - 0x4B400000;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float two_n = std::bit_cast<float>(static_cast<uint32_t>(ni + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_n;
}

// s[j] = exp(s[j] - mx) for j < n; returns the sum. double (reference mode) keeps libm's exp.
MLA_ALWAYS_INLINE float exp_shift_sum(float* s, int64_t n, float mx) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_nonpos(s[j] - mx);
    sum += s[j];
  }
  return sum;
}
MLA_ALWAYS_INLINE double exp_shift_sum(double* s, int64_t n, double mx) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// ---- register-tiled kernels ---------------------------------------------------------------------

template <class T, int VB>
struct Kernels {
  typedef T V __attribute__((vector_size(VB)));
  static constexpr int64_t L = VB / static_cast<int64_t>(sizeof(T));  // lanes
  static constexpr int64_t NJ = kCols * L;                             // keys per transposed chunk

  // Vectors never cross a function boundary by value (their ABI depends on the ISA): unaligned loads and
  // stores go through memcpy, which compiles to single vector moves.
  static MLA_ALWAYS_INLINE void load(V& v, const T* p) { std::memcpy(&v, p, sizeof(V)); }
  static MLA_ALWAYS_INLINE void store(T* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

  // kt[c][x][jj] = k[c * NJ + jj][x], zero for keys >= nk.
  static MLA_ALWAYS_INLINE void transpose(const T* k, int64_t ldk, int64_t nk, int64_t d, T* kt) {
    const int64_t chunks = (nk + NJ - 1) / NJ;
    for (int64_t c = 0; c < chunks; ++c) {
      T* dst = kt + c * d * NJ;
      for (int64_t jj = 0; jj < NJ; ++jj) {
        const int64_t j = c * NJ + jj;
        if (j < nk) {
          const T* src = k + j * ldk;
          for (int64_t x = 0; x < d; ++x) dst[x * NJ + jj] = src[x];
        } else {
          for (int64_t x = 0; x < d; ++x) dst[x * NJ + jj] = T(0);
        }
      }
    }
  }

  // s[r][c * NJ + jj] = scale * <q_r, k_{c*NJ+jj}> for the rows r0 .. r0 + nr (nr <= kRows) and chunk c.
  static MLA_ALWAYS_INLINE void score_tile(const T* q, int64_t ldq, int64_t nr, const T* ktc, int64_t d, T scale,
                                           T* s, int64_t lds) {
    V acc[kRows][kCols];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c] = V{};
    const T* qr[kRows];
    for (int r = 0; r < kRows; ++r) qr[r] = q + std::min<int64_t>(r, nr - 1) * ldq;  // tail rows repeat
    for (int64_t x = 0; x < d; ++x) {
      V kv[kCols];
      for (int c = 0; c < kCols; ++c) load(kv[c], ktc + x * NJ + c * L);
      for (int r = 0; r < kRows; ++r) {
        const V qb = qr[r][x] - V{};  // broadcast (x - 0 folds to x, unlike 0 + x)
        for (int c = 0; c < kCols; ++c) acc[r][c] += qb * kv[c];
      }
    }
    for (int r = 0; r < kRows; ++r) {
      if (r >= nr) break;
      for (int c = 0; c < kCols; ++c) {
        const V scaled = acc[r][c] * scale;
        store(s + r * lds + c * L, scaled);
      }
    }
  }

  // o_r[x0 .. x0 + kCols*L) += sum_{j < nk} p_r[j] v_j[...] for rows r < nr (nr <= kRows).
  static MLA_ALWAYS_INLINE void value_tile(T* const* o, const T* const* p, int64_t nr, const T* v, int64_t ldv,
                                           int64_t nk, int64_t x0) {
    V acc[kRows][kCols];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) {
        acc[r][c] = V{};
        if (r < nr) load(acc[r][c], o[r] + x0 + c * L);
      }
    const T* pr[kRows];
    for (int r = 0; r < kRows; ++r) pr[r] = p[std::min<int64_t>(r, nr - 1)];
    for (int64_t j = 0; j < nk; ++j) {
      V vv[kCols];
      for (int c = 0; c < kCols; ++c) load(vv[c], v + j * ldv + x0 + c * L);
      for (int r = 0; r < kRows; ++r) {
        const V pb = pr[r][j] - V{};
        for (int c = 0; c < kCols; ++c) acc[r][c] += pb * vv[c];
      }
    }
    for (int r = 0; r < kRows; ++r) {
      if (r >= nr) break;
      for (int c = 0; c < kCols; ++c) store(o[r] + x0 + c * L, acc[r][c]);
    }
  }

  // o[x] += sum_{j in [j0, j1)} p[j] v_j[x] for one row, all dv columns.
  static MLA_ALWAYS_INLINE void value_row(T* o, const T* p, const T* v, int64_t ldv, int64_t j0, int64_t j1,
                                          int64_t dv) {
    for (int64_t j = j0; j < j1; ++j) {
      const T pj = p[j];
      const T* vj = v + j * ldv;
#pragma omp simd
      for (int64_t x = 0; x < dv; ++x) o[x] += pj * vj[x];
    }
  }

  static MLA_ALWAYS_INLINE void attend(const T* q, int64_t ldq, int64_t nq, const T* k, int64_t ldk, int64_t d,
                                       const T* v, int64_t ldv, int64_t nk, T scale, const int64_t* lim,
                                       SoftmaxTile<T>& st, BlockScratch<T>& ws) {
    const int64_t nkp = (nk + NJ - 1) / NJ * NJ;
    if (ws.kt.size() < static_cast<std::size_t>(d * nkp)) ws.kt.resize(static_cast<std::size_t>(d * nkp));
    if (ws.scores.size() < static_cast<std::size_t>(nq * nkp)) ws.scores.resize(static_cast<std::size_t>(nq * nkp));
    T* kt = ws.kt.data();
    T* s = ws.scores.data();
    transpose(k, ldk, nk, d, kt);

    // Scores, only for the chunks some row of the tile can see.
    for (int64_t r0 = 0; r0 < nq; r0 += kRows) {
      const int64_t nr = std::min<int64_t>(kRows, nq - r0);
      const int64_t jmax = *std::max_element(lim + r0, lim + r0 + nr);
      for (int64_t c = 0; c * NJ < jmax; ++c)
        score_tile(q + r0 * ldq, ldq, nr, kt + c * d * NJ, d, scale, s + r0 * nkp + c * NJ, nkp);
    }

    // Online softmax per row: probabilities in place of the scores (exactly 0 past the row's limit).
    for (int64_t r = 0; r < nq; ++r) {
      T* sr = s + r * nkp;
      const int64_t n = lim[r];
      T mx = st.m[r];
      for (int64_t j = 0; j < n; ++j) mx = sr[j] > mx ? sr[j] : mx;
      if (n <= 0 || mx == -std::numeric_limits<T>::infinity()) {  // nothing visible (or only -inf logits)
        std::fill(sr, sr + nk, T(0));
        continue;
      }
      const T alpha = std::exp(st.m[r] - mx);  // 0 on the first visible block (m = -inf)
      const T sum = exp_shift_sum(sr, n, mx);
      std::fill(sr + n, sr + nk, T(0));
      if (alpha != T(1)) {
        T* o = st.orow(r);
#pragma omp simd
        for (int64_t x = 0; x < st.dv; ++x) o[x] *= alpha;
      }
      st.l[r] = st.l[r] * alpha + sum;
      st.m[r] = mx;
    }

    // Values: the keys every row of a tile sees go through the register tile; the few beyond the
    // tile's smallest limit (causal diagonals) row by row, so zero probabilities never meet values.
    const int64_t dv = st.dv, xt = dv / (kCols * L) * (kCols * L);
    for (int64_t r0 = 0; r0 < nq; r0 += kRows) {
      const int64_t nr = std::min<int64_t>(kRows, nq - r0);
      T* o[kRows] = {};
      const T* p[kRows] = {};
      for (int64_t r = 0; r < nr; ++r) {
        o[r] = st.orow(r0 + r);
        p[r] = s + (r0 + r) * nkp;
      }
      const int64_t jmin = *std::min_element(lim + r0, lim + r0 + nr);
      if (jmin > 0) {
        for (int64_t x0 = 0; x0 < xt; x0 += kCols * L) value_tile(o, p, nr, v, ldv, jmin, x0);
        if (xt < dv)
          for (int64_t r = 0; r < nr; ++r) value_row(o[r] + xt, p[r], v + xt, ldv, 0, jmin, dv - xt);
      }
      for (int64_t r = 0; r < nr; ++r)
        if (lim[r0 + r] > jmin) value_row(o[r], p[r], v, ldv, std::max<int64_t>(jmin, 0), lim[r0 + r], dv);
    }
  }
};

// One instantiation per ISA level; each inlines the whole kernel under its own target.
template <class T>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512cd,avx2,fma"))) void attend_avx512(
    const T* q, int64_t ldq, int64_t nq, const T* k, int64_t ldk, int64_t d, const T* v, int64_t ldv, int64_t nk,
    T scale, const int64_t* lim, SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 64>::attend(q, ldq, nq, k, ldk, d, v, ldv, nk, scale, lim, st, ws);
}
template <class T>
__attribute__((target("avx2,fma"))) void attend_avx2(const T* q, int64_t ldq, int64_t nq, const T* k, int64_t ldk,
                                                     int64_t d, const T* v, int64_t ldv, int64_t nk, T scale,
                                                     const int64_t* lim, SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 32>::attend(q, ldq, nq, k, ldk, d, v, ldv, nk, scale, lim, st, ws);
}
template <class T>
void attend_base(const T* q, int64_t ldq, int64_t nq, const T* k, int64_t ldk, int64_t d, const T* v, int64_t ldv,
                 int64_t nk, T scale, const int64_t* lim, SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 16>::attend(q, ldq, nq, k, ldk, d, v, ldv, nk, scale, lim, st, ws);
}

template <class T>
using AttendFn = void (*)(const T*, int64_t, int64_t, const T*, int64_t, int64_t, const T*, int64_t, int64_t, T,
                          const int64_t*, SoftmaxTile<T>&, BlockScratch<T>&);

template <class T>
AttendFn<T> pick() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma"))
    return &attend_avx512<T>;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &attend_avx2<T>;
#endif
  return &attend_base<T>;
}

}  // namespace

void attend_block(const float* q, int64_t ldq, int64_t nq, const float* k, int64_t ldk, int64_t d, const float* v,
                  int64_t ldv, int64_t nk, float scale, const int64_t* lim, SoftmaxTile<float>& st,
                  BlockScratch<float>& ws) {
  static const AttendFn<float> fn = pick<float>();
  fn(q, ldq, nq, k, ldk, d, v, ldv, nk, scale, lim, st, ws);
}

void attend_block(const double* q, int64_t ldq, int64_t nq, const double* k, int64_t ldk, int64_t d,
                  const double* v, int64_t ldv, int64_t nk, double scale, const int64_t* lim, SoftmaxTile<double>& st,
                  BlockScratch<double>& ws) {
  static const AttendFn<double> fn = pick<double>();
  fn(q, ldq, nq, k, ldk, d, v, ldv, nk, scale, lim, st, ws);
}

}  // namespace mla::cpu::attn
