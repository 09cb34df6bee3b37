// SPDX-License-Identifier: Apache-2.0
#pragma once
// The exact-codes oracle of fp8 mha_prefill (SEMANTICS §10.1) and its element-wise bound, shared by the CPU tests
// (tests/unit/test_attention_prefill_fp8.cpp) and the GPU tests (tests/gpu/test_prefill_fp8_gpu.cpp).
//   out, lse  the CPU backend's fp8 mha_prefill in reference precision (float64 over the codes)
//   w         [Tq, h, dv] s_v sum_j p_j |v8_j| / sum_j p_j: the bf16 op in float64 over the dequantised codes,
//             with |v|
//   a         [h, Tq] an upper bound of tau s_q s_k max_j sum_c |q8_c k8_jc|: the lse of the op over |q|, |k|
//   n         [h, Tq] visible keys of the row
// check_fp8 compares a result with it: |out - oracle| <= w (2^-3 + 2^-10 (1 + a)) + 2^-17 n s_v max|v8| + 2^-8
// |oracle| + 1e-6 and |lse - oracle| <= 2^-11 a + 1e-5 |oracle| + 1e-6, with NaN and inf in the same places.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mla/ops.h"
#include "mla/tensor.h"
#include "support/test_util.h"

namespace mla::test {

struct Fp8PrefillCase {
  TensorView q, k_nope, k_pe, v, cu_q, cu_k;  // host tensors (k_pe's head stride may be 0)
  int64_t max_q = 0, max_k = 0;
  double scale = 0.07;
  bool causal = true;
  PrefillOptions opts;  // fp8 with its scales
};

struct Fp8Oracle {
  std::vector<double> out, lse, w, a, n;
  int64_t tq = 0, h = 0, dv = 0;
  double v_scale = 1.0, max_v8 = 0.0;
};

// Dequantised codes of a [T, h, d] view (any strides) as a contiguous f64 tensor: e4m3(float(x) / s) * s,
// absolute values when `abs`.
inline Tensor dequantised(const TensorView& t, float s, bool abs, double* max_code = nullptr) {
  const int64_t n0 = t.size(0), n1 = t.size(1), n2 = t.size(2);
  Tensor out = Tensor::empty({n0, n1, n2}, DType::f64);
  const std::vector<double> x = to_doubles(t);
  double* o = static_cast<double*>(out.data());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double c = num::e4m3_to_float(num::float_to_e4m3(static_cast<float>(x[i]) / s));
    if (max_code && std::isfinite(c)) *max_code = std::max(*max_code, std::fabs(c));
    o[i] = (abs ? std::fabs(c) : c) * s;
  }
  return out;
}

inline Fp8Oracle fp8_oracle(const Fp8PrefillCase& c) {
  Fp8Oracle o;
  o.tq = c.q.size(0);
  o.h = c.q.size(1);
  o.dv = c.v.size(2);
  o.v_scale = c.opts.v_scale;
  const Context ref{nullptr, Precision::reference};
  Tensor out = Tensor::empty({o.tq, o.h, o.dv}, DType::f64), lse = Tensor::empty({o.h, o.tq}, DType::f64);
  fill(out.view(), NAN);
  fill(lse.view(), NAN);
  PrefillOptions cpu_opts = c.opts;
  cpu_opts.workspace = {};
  mha_prefill(c.q, c.k_nope, c.k_pe, c.v, c.cu_q, c.cu_k, c.max_q, c.max_k, out.view(), lse.view(), c.scale, c.causal,
              cpu_opts, ref);
  o.out = to_doubles(out.view());
  o.lse = to_doubles(lse.view());
  // w: the unquantised-P attention over the codes with |v|; a: the lse over |q|, |k|.
  const Tensor qd = dequantised(c.q, c.opts.q_scale, false), knd = dequantised(c.k_nope, c.opts.k_scale, false);
  const Tensor ped = dequantised(c.k_pe, c.opts.k_scale, false);
  const Tensor vabs = dequantised(c.v, c.opts.v_scale, true, &o.max_v8);
  Tensor w = Tensor::empty({o.tq, o.h, o.dv}, DType::f64);
  fill(w.view(), 0.0);
  mha_prefill(qd.view(), knd.view(), ped.view(), vabs.view(), c.cu_q, c.cu_k, c.max_q, c.max_k, w.view(), {}, c.scale,
              c.causal, ref);
  o.w = to_doubles(w.view());
  const Tensor qa = dequantised(c.q, c.opts.q_scale, true), kna = dequantised(c.k_nope, c.opts.k_scale, true);
  const Tensor pea = dequantised(c.k_pe, c.opts.k_scale, true);
  Tensor a = Tensor::empty({o.h, o.tq}, DType::f64), junk = Tensor::empty({o.tq, o.h, o.dv}, DType::f64);
  fill(a.view(), 0.0);
  mha_prefill(qa.view(), kna.view(), pea.view(), vabs.view(), c.cu_q, c.cu_k, c.max_q, c.max_k, junk.view(), a.view(),
              c.scale, c.causal, ref);
  o.a = to_doubles(a.view());
  for (double& x : o.a) x = std::isfinite(x) ? std::max(x, 0.0) : 0.0;
  o.n.assign(static_cast<std::size_t>(o.h * o.tq), 0.0);
  const std::vector<int32_t> cq = to_ints(c.cu_q), ck = to_ints(c.cu_k);
  for (std::size_t r = 0; r + 1 < cq.size(); ++r) {
    const int64_t sq = cq[r + 1] - cq[r], sk = ck[r + 1] - ck[r];
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t vis = c.causal ? std::clamp<int64_t>(sk - sq + i + 1, 0, sk) : sk;
      for (int64_t hh = 0; hh < o.h; ++hh) o.n[static_cast<std::size_t>(hh * o.tq + cq[r] + i)] = static_cast<double>(vis);
    }
  }
  return o;
}

// "" when out [Tq, h, dv] and lse [h, Tq] (empty: not checked) meet the bound; else the worst element.
inline std::string check_fp8(const Fp8Oracle& o, const std::vector<double>& out, const std::vector<double>& lse) {
  auto same_special = [](double g, double r) {
    if (std::isnan(r) || std::isnan(g)) return std::isnan(r) && std::isnan(g);
    if (std::isinf(r) || std::isinf(g)) return g == r;
    return true;
  };
  std::string bad;
  double worst = 0.0;
  for (int64_t t = 0; t < o.tq; ++t)
    for (int64_t hh = 0; hh < o.h; ++hh) {
      const std::size_t rl = static_cast<std::size_t>(hh * o.tq + t);
      for (int64_t d = 0; d < o.dv; ++d) {
        const std::size_t i = static_cast<std::size_t>((t * o.h + hh) * o.dv + d);
        const double g = out[i], r = o.out[i];
        if (!same_special(g, r)) return "out[" + std::to_string(t) + ", " + std::to_string(hh) + ", " +
                                        std::to_string(d) + "] = " + std::to_string(g) + ", oracle " + std::to_string(r);
        if (!std::isfinite(r)) continue;
        const double tol = o.w[i] * (0.125 + std::ldexp(1.0 + o.a[rl], -10)) +
                           std::ldexp(o.n[rl] * o.v_scale * o.max_v8, -17) + std::ldexp(std::fabs(r), -8) + 1e-6;
        const double ratio = std::fabs(g - r) / tol;
        if (ratio > 1.0 && ratio > worst) {
          worst = ratio;
          bad = "out[" + std::to_string(t) + ", " + std::to_string(hh) + ", " + std::to_string(d) + "] = " +
                std::to_string(g) + ", oracle " + std::to_string(r) + ", bound " + std::to_string(tol);
        }
      }
      if (lse.empty()) continue;
      const double g = lse[rl], r = o.lse[rl];
      if (!same_special(g, r)) return "lse[" + std::to_string(hh) + ", " + std::to_string(t) + "] = " +
                                      std::to_string(g) + ", oracle " + std::to_string(r);
      if (!std::isfinite(r)) continue;
      const double tol = std::ldexp(o.a[rl], -11) + 1e-5 * std::fabs(r) + 1e-6;
      const double ratio = std::fabs(g - r) / tol;
      if (ratio > 1.0 && ratio > worst) {
        worst = ratio;
        bad = "lse[" + std::to_string(hh) + ", " + std::to_string(t) + "] = " + std::to_string(g) + ", oracle " +
              std::to_string(r) + ", bound " + std::to_string(tol);
      }
    }
  return bad;
}

}  // namespace mla::test
