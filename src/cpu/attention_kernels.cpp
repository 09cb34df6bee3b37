// SPDX-License-Identifier: Apache-2.0
// Hot loops of the CPU attention ops (declared in attention_core.h): the scores of a key block against
// the query tile, the online-softmax update and the probability-weighted sum of value rows.
//
// Layout. Scores and probabilities are key-major, p[j][r] (r over the padded query rows). The score tile
// broadcasts one key element against vectors of consecutive queries from the transposed query tile,
// R keys x C query vectors of accumulators in registers, no horizontal reductions; the softmax update
// then runs across queries, vector-wide. Tiles with fewer queries than one vector fall back to dot
// products (reductions over the head dim). The value sum is a register tile of 4 query rows x 2 value
// vectors, each probability broadcast against value-row vectors.
//
// ISA. The library is compiled for baseline x86-64 (SSE2), which leaves most of a modern core idle. The
// kernels are written with GCC vector extensions of a width VB chosen per instantiation, and instantiated
// three times: AVX-512 (VB 64), AVX2+FMA (VB 32) and baseline (VB 16), each under its own target
// attribute; the widest the CPU supports is used (set_isa lowers it for tests). Float contraction into
// FMA is enabled in this file only (it changes each product-sum by less than one rounding).
//
// Masking. A key a row may not see (j >= lim[r]) gets probability exactly 0 by selection, and value
// tiles only cover the keys every row of the tile sees (the rest goes row by row), so such a key never
// reaches the row's output even when it holds inf or NaN.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "cpu/attention_core.h"
#include "mla/error.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif
#define MLA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace mla::cpu::attn {
namespace {

// ---- exp for the float path ---------------------------------------------------------------------

// e^x for x <= 0 (a score minus its row's running max), vectorisable: n = round(x / ln2),
// r = x - n ln2 (two-part ln2), e^r by the Cephes minimax polynomial (about 1 ulp), 2^n from exponent
// bits. Below -87 the result would be subnormal and is flushed to 0.
MLA_ALWAYS_INLINE float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float t = xc * 1.44269504088896341f;
  // Round to nearest by adding 1.5 * 2^23: n then sits in the low mantissa bits of `big` (integer
  // arithmetic on the bits keeps even a NaN input well defined; its result is NaN through p).
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
// Reference mode keeps libm's exp.
MLA_ALWAYS_INLINE double exp_nonpos(double x) { return std::exp(x); }

// ---- register-tiled kernels ---------------------------------------------------------------------

template <class T, int VB>
struct Kernels {
  typedef T V __attribute__((vector_size(VB)));
  static constexpr int64_t L = VB / static_cast<int64_t>(sizeof(T));  // lanes
  static constexpr T kNegInf = -std::numeric_limits<T>::infinity();

  // Vectors never cross a function boundary by value (their ABI depends on the ISA); unaligned loads and
  // stores go through memcpy, which compiles to single vector moves. `x - V{}` broadcasts x (and, unlike
  // 0 + x, folds away).
  static MLA_ALWAYS_INLINE void load(V& v, const T* p) { std::memcpy(&v, p, sizeof(V)); }
  static MLA_ALWAYS_INLINE void store(T* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

  // p[j][c*L ..] = scale * <k_j, q_{c*L ..}> for keys j < nkr (<= R) of the tile, C query vectors.
  // k points at the tile's first key row, qt at its first query column, p at p[j0][first column].
  template <int R, int C>
  static MLA_ALWAYS_INLINE void score_tile(const T* k, int64_t ldk, int64_t nkr, const T* qt, int64_t nqp, int64_t d,
                                           T scale, T* p) {
    V acc[R][C];
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c) acc[j][c] = V{};
    const T* kr[R];
    for (int j = 0; j < R; ++j) kr[j] = k + std::min<int64_t>(j, nkr - 1) * ldk;  // tail keys repeat
    for (int64_t x = 0; x < d; ++x) {
      V qv[C];
      for (int c = 0; c < C; ++c) load(qv[c], qt + x * nqp + c * L);
      for (int j = 0; j < R; ++j) {
        const V kb = kr[j][x] - V{};
        for (int c = 0; c < C; ++c) acc[j][c] += kb * qv[c];
      }
    }
    for (int j = 0; j < R; ++j) {
      if (j >= nkr) break;
      for (int c = 0; c < C; ++c) {
        const V scaled = acc[j][c] * scale;
        store(p + j * nqp + c * L, scaled);
      }
    }
  }

  // Scores of keys [0, jmax) against every query row.
  static MLA_ALWAYS_INLINE void scores(const QueryTile<T>& q, const T* k, int64_t ldk, int64_t jmax, T scale, T* p) {
    const int64_t nqp = q.nqp, d = q.d;
    if (q.nq >= L) {
      const int64_t nqv = (q.nq + L - 1) / L;  // query vectors holding real rows
      int64_t c0 = 0;
      for (; c0 + 2 <= nqv; c0 += 2)
        for (int64_t j0 = 0; j0 < jmax; j0 += 4)
          score_tile<4, 2>(k + j0 * ldk, ldk, std::min<int64_t>(4, jmax - j0), q.qt.data() + c0 * L, nqp, d, scale,
                           p + j0 * nqp + c0 * L);
      if (c0 < nqv)
        for (int64_t j0 = 0; j0 < jmax; j0 += 8)
          score_tile<8, 1>(k + j0 * ldk, ldk, std::min<int64_t>(8, jmax - j0), q.qt.data() + c0 * L, nqp, d, scale,
                           p + j0 * nqp + c0 * L);
      return;
    }
    // Fewer queries than one vector: dot products over the head dim, 4 rows x 2 keys per pass.
    for (int64_t r0 = 0; r0 < q.nq; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, q.nq - r0);
      const T* q0 = q.q.data() + r0 * d;
      const T* q1 = q0 + (nr > 1 ? d : 0);  // tail rows repeat; their results are not stored
      const T* q2 = q0 + (nr > 2 ? 2 * d : 0);
      const T* q3 = q0 + (nr > 3 ? 3 * d : 0);
      for (int64_t j = 0; j < jmax; j += 2) {
        const T* k0 = k + j * ldk;
        const T* k1 = j + 1 < jmax ? k0 + ldk : k0;
        T a00 = 0, a01 = 0, a10 = 0, a11 = 0, a20 = 0, a21 = 0, a30 = 0, a31 = 0;
#pragma omp simd reduction(+ : a00, a01, a10, a11, a20, a21, a30, a31)
        for (int64_t x = 0; x < d; ++x) {
          const T kx0 = k0[x], kx1 = k1[x];
          a00 += q0[x] * kx0;
          a01 += q0[x] * kx1;
          a10 += q1[x] * kx0;
          a11 += q1[x] * kx1;
          a20 += q2[x] * kx0;
          a21 += q2[x] * kx1;
          a30 += q3[x] * kx0;
          a31 += q3[x] * kx1;
        }
        const T acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int64_t r = 0; r < nr; ++r) {
          p[j * nqp + r0 + r] = acc[r][0] * scale;
          if (j + 1 < jmax) p[(j + 1) * nqp + r0 + r] = acc[r][1] * scale;
        }
      }
    }
  }

  // o_r[x0 .. x0 + 2L) += sum_{j < nk} p[j][r] v_j[...] for the rows r0 .. r0 + nr (nr <= 4).
  static MLA_ALWAYS_INLINE void value_tile(SoftmaxTile<T>& st, int64_t r0, int64_t nr, const T* p, int64_t nqp,
                                           const T* v, int64_t ldv, int64_t nk, int64_t x0) {
    constexpr int R = 4, C = 2;
    V acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        acc[r][c] = V{};
        if (r < nr) load(acc[r][c], st.orow(r0 + r) + x0 + c * L);
      }
    const T* pr[R];
    for (int r = 0; r < R; ++r) pr[r] = p + r0 + std::min<int64_t>(r, nr - 1);
    for (int64_t j = 0; j < nk; ++j) {
      V vv[C];
      for (int c = 0; c < C; ++c) load(vv[c], v + j * ldv + x0 + c * L);
      for (int r = 0; r < R; ++r) {
        const V pb = pr[r][j * nqp] - V{};
        for (int c = 0; c < C; ++c) acc[r][c] += pb * vv[c];
      }
    }
    for (int r = 0; r < R; ++r) {
      if (r >= nr) break;
      for (int c = 0; c < C; ++c) store(st.orow(r0 + r) + x0 + c * L, acc[r][c]);
    }
  }

  // o[x0 ..] += sum_{j in [j0, j1)} p[j][r] v_j[x0 ..] for one row.
  static MLA_ALWAYS_INLINE void value_row(T* o, const T* pr, int64_t nqp, const T* v, int64_t ldv, int64_t j0,
                                          int64_t j1, int64_t x0, int64_t dv) {
    for (int64_t j = j0; j < j1; ++j) {
      const T pj = pr[j * nqp];
      const T* vj = v + j * ldv;
#pragma omp simd
      for (int64_t x = x0; x < dv; ++x) o[x] += pj * vj[x];
    }
  }

  static MLA_ALWAYS_INLINE void attend(const QueryTile<T>& q, const T* k, int64_t ldk, const T* v, int64_t ldv,
                                       int64_t nk, T scale, const int64_t* lim, SoftmaxTile<T>& st,
                                       BlockScratch<T>& ws) {
    const int64_t nq = q.nq, nqp = q.nqp, dv = st.dv;
    const int64_t jmax = *std::max_element(lim, lim + nq);
    if (jmax <= 0) return;
    if (ws.p.size() < static_cast<std::size_t>(nk * nqp)) ws.p.resize(static_cast<std::size_t>(nk * nqp));
    ws.mnew.resize(static_cast<std::size_t>(nqp));
    ws.lsum.resize(static_cast<std::size_t>(nqp));
    ws.limf.resize(static_cast<std::size_t>(nqp));
    T* p = ws.p.data();
    T* mnew = ws.mnew.data();
    T* lsum = ws.lsum.data();  // per row: sum of this block's probabilities
    T* limf = ws.limf.data();
    for (int64_t r = 0; r < nqp; ++r) {
      limf[r] = r < nq ? static_cast<T>(lim[r]) : T(0);  // padded rows see nothing
      mnew[r] = r < nq ? st.m[r] : kNegInf;
      lsum[r] = T(0);
    }

    scores(q, k, ldk, jmax, scale, p);

    // Online softmax across rows, vector-wide: new running max, then probabilities (exactly 0 where the
    // key is masked or the row has seen no finite logit) and their row sums.
    for (int64_t j = 0; j < jmax; ++j) {
      const T jf = static_cast<T>(j);
      const T* pj = p + j * nqp;
#pragma omp simd
      for (int64_t r = 0; r < nqp; ++r)  // a NaN score becomes the max and stays (NaN > x is false)
        mnew[r] = ((jf < limf[r]) & ((pj[r] > mnew[r]) | (pj[r] != pj[r]))) ? pj[r] : mnew[r];
    }
    for (int64_t j = 0; j < jmax; ++j) {
      const T jf = static_cast<T>(j);
      T* pj = p + j * nqp;
#pragma omp simd
      for (int64_t r = 0; r < nqp; ++r) {
        // & not &&: no branch, so it vectorises. != (not >): a NaN max propagates into every p.
        const bool seen = (jf < limf[r]) & (mnew[r] != kNegInf);
        const T e = exp_nonpos(seen ? pj[r] - mnew[r] : T(0));
        const T pv = seen ? e : T(0);
        pj[r] = pv;
        lsum[r] += pv;
      }
    }
    for (int64_t r = 0; r < nq; ++r) {
      if (mnew[r] == kNegInf) continue;             // nothing seen yet: state unchanged
      const T alpha = std::exp(st.m[r] - mnew[r]);  // 0 on the row's first visible block (m = -inf)
      st.l[r] = st.l[r] * alpha + lsum[r];
      st.m[r] = mnew[r];
      if (alpha != T(1)) {
        T* o = st.orow(r);
#pragma omp simd
        for (int64_t x = 0; x < dv; ++x) o[x] *= alpha;
      }
    }

    // Values: keys every row of a 4-row tile sees go through the register tile; the few beyond the
    // tile's smallest limit (causal diagonals) row by row.
    const int64_t xt = dv / (2 * L) * (2 * L);
    for (int64_t r0 = 0; r0 < nq; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, nq - r0);
      const int64_t jmin = *std::min_element(lim + r0, lim + r0 + nr);
      if (jmin > 0) {
        for (int64_t x0 = 0; x0 < xt; x0 += 2 * L) value_tile(st, r0, nr, p, nqp, v, ldv, jmin, x0);
        if (xt < dv)
          for (int64_t r = 0; r < nr; ++r) value_row(st.orow(r0 + r), p + r0 + r, nqp, v, ldv, 0, jmin, xt, dv);
      }
      for (int64_t r = 0; r < nr; ++r)
        if (lim[r0 + r] > jmin)
          value_row(st.orow(r0 + r), p + r0 + r, nqp, v, ldv, std::max<int64_t>(jmin, 0), lim[r0 + r], 0, dv);
    }
  }
};

// One instantiation per ISA level; each inlines the whole kernel under its own target.
template <class T>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512cd,avx2,fma"))) void attend_avx512(
    const QueryTile<T>& q, const T* k, int64_t ldk, const T* v, int64_t ldv, int64_t nk, T scale, const int64_t* lim,
    SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 64>::attend(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
}
template <class T>
__attribute__((target("avx2,fma"))) void attend_avx2(const QueryTile<T>& q, const T* k, int64_t ldk, const T* v,
                                                     int64_t ldv, int64_t nk, T scale, const int64_t* lim,
                                                     SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 32>::attend(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
}
template <class T>
void attend_base(const QueryTile<T>& q, const T* k, int64_t ldk, const T* v, int64_t ldv, int64_t nk, T scale,
                 const int64_t* lim, SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  Kernels<T, 16>::attend(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
}

Isa detect_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::base;
}

std::atomic<int>& isa_level() {
  static std::atomic<int> level{static_cast<int>(detect_isa())};
  return level;
}

template <class T>
void attend_dispatch(const QueryTile<T>& q, const T* k, int64_t ldk, const T* v, int64_t ldv, int64_t nk, T scale,
                     const int64_t* lim, SoftmaxTile<T>& st, BlockScratch<T>& ws) {
  switch (static_cast<Isa>(isa_level().load(std::memory_order_relaxed))) {
    case Isa::avx512:
      return attend_avx512(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
    case Isa::avx2:
      return attend_avx2(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
    case Isa::base:
      return attend_base(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
  }
}

}  // namespace

Isa best_isa() {
  static const Isa best = detect_isa();
  return best;
}
Isa current_isa() { return static_cast<Isa>(isa_level().load()); }
void set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_isa()))
    throw Error("attention kernels: ISA level " + std::to_string(static_cast<int>(isa)) +
                " requested, but this CPU supports at most level " + std::to_string(static_cast<int>(best_isa())));
  isa_level().store(static_cast<int>(isa));
}

void attend_block(const QueryTile<float>& q, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t nk,
                  float scale, const int64_t* lim, SoftmaxTile<float>& st, BlockScratch<float>& ws) {
  attend_dispatch(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
}

void attend_block(const QueryTile<double>& q, const double* k, int64_t ldk, const double* v, int64_t ldv, int64_t nk,
                  double scale, const int64_t* lim, SoftmaxTile<double>& st, BlockScratch<double>& ws) {
  attend_dispatch(q, k, ldk, v, ldv, nk, scale, lim, st, ws);
}

}  // namespace mla::cpu::attn
