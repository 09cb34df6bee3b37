// SPDX-License-Identifier: Apache-2.0
// CPU merge_attn_states (semantics §7, edge rules [PIN] in ops.h). Float accumulation, double in
// Precision::reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "cpu/cpu_ops.h"

namespace mla::cpu {
namespace {

struct View3 {
  const TensorView& t;
  char* at(int64_t i, int64_t j, int64_t k) const {
    return static_cast<char*>(t.data) +
           (i * t.stride[0] + j * t.stride[1] + k * t.stride[2]) * static_cast<int64_t>(t.element_size());
  }
};
// LSE element (h, t): fp32, or f64 when the float64 oracle carries full-precision LSEs.
inline void* lse_at(const TensorView& lse, int64_t h, int64_t t) {
  return static_cast<char*>(lse.data) + (h * lse.stride[0] + t * lse.stride[1]) * static_cast<int64_t>(lse.element_size());
}
inline double get_lse(const TensorView& lse, int64_t h, int64_t t) { return num::load(lse_at(lse, h, t), lse.dtype); }
inline void put_lse(const TensorView& lse, int64_t h, int64_t t, double v) { num::store(lse_at(lse, h, t), lse.dtype, v); }

template <class Acc>
void merge(const TensorView& out, const TensorView& out_lse, const TensorView& prefix, const TensorView& prefix_lse,
           const TensorView& suffix, const TensorView& suffix_lse, int64_t tokens_with_context, float output_scale) {
  const int64_t T = prefix.size(0), H = prefix.size(1), D = prefix.size(2);
  const View3 o{out}, p{prefix}, s{suffix};
  const bool scaled = output_scale != 0.0f;
  const Acc out_scale = static_cast<Acc>(output_scale);
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  // fp8 output (output_scale given): out / scale, saturated by the e4m3 store.
  auto put = [&](int64_t t, int64_t h, int64_t d, Acc v) {
    num::store(o.at(t, h, d), out.dtype, scaled ? v / out_scale : v);
  };
  auto get = [](const View3& v, DType dt, int64_t t, int64_t h, int64_t d) {
    return static_cast<Acc>(num::load(v.at(t, h, d), dt));
  };
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double s_raw = get_lse(suffix_lse, h, t);
      if (t >= tokens_with_context) {  // no context for this token: the suffix is the result
        for (int64_t d = 0; d < D; ++d) put(t, h, d, get(s, suffix.dtype, t, h, d));
        if (out_lse.defined()) put_lse(out_lse, h, t, s_raw);
        continue;
      }
      // Empty key sets report +inf (FA2, FlashMLA lonely queries) or -inf: both mean "no weight".
      Acc pl = static_cast<Acc>(get_lse(prefix_lse, h, t)), sl = static_cast<Acc>(s_raw);
      if (std::isinf(pl)) pl = neg_inf;
      if (std::isinf(sl)) sl = neg_inf;
      if (pl == neg_inf && sl == neg_inf) {
        for (int64_t d = 0; d < D; ++d) put(t, h, d, get(p, prefix.dtype, t, h, d));
        if (out_lse.defined()) put_lse(out_lse, h, t, -std::numeric_limits<double>::infinity());
        continue;
      }
      // NaN in either lse propagates through m, the weights and the output.
      const Acc m = std::isnan(pl) || std::isnan(sl) ? std::numeric_limits<Acc>::quiet_NaN() : std::max(pl, sl);
      const Acc wp = std::exp(pl - m), ws = std::exp(sl - m), sum = wp + ws;
      // Scale factors first, so outputs are never multiplied by raw (possibly huge) exponentials.
      const Acc fp = wp / sum, fs = ws / sum;
      for (int64_t d = 0; d < D; ++d)
        put(t, h, d, get(p, prefix.dtype, t, h, d) * fp + get(s, suffix.dtype, t, h, d) * fs);
      if (out_lse.defined()) put_lse(out_lse, h, t, static_cast<double>(std::log(sum) + m));
    }
  }
}

// combine_attn_states (§13, rules [PIN] in ops.h): parts [N, T, H, D], part_lses [N, T, H], optional sink [H]
// (one more part of value 0: it joins m and the sum, never the output).
template <class Acc>
void combine(const TensorView& out, const TensorView& out_lse, const TensorView& parts, const TensorView& lses,
             const TensorView& sink) {
  const int64_t N = parts.size(0), T = parts.size(1), H = parts.size(2), D = parts.size(3);
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  auto lse_of = [&](int64_t n, int64_t t, int64_t h) {
    const char* p = static_cast<const char*>(lses.data) +
                    (n * lses.stride[0] + t * lses.stride[1] + h * lses.stride[2]) * lses.element_size();
    return static_cast<Acc>(num::load(p, lses.dtype));
  };
  auto part_at = [&](int64_t n, int64_t t, int64_t h, int64_t d) {
    const char* p = static_cast<const char*>(parts.data) +
                    (n * parts.stride[0] + t * parts.stride[1] + h * parts.stride[2] + d * parts.stride[3]) *
                        parts.element_size();
    return static_cast<Acc>(num::load(p, parts.dtype));
  };
  const View3 o{out};
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<Acc> w(static_cast<std::size_t>(N), Acc(0));
      Acc m = -std::numeric_limits<Acc>::infinity();
      bool has_nan = false;
      for (int64_t n = 0; n < N; ++n) {
        const Acc l = lse_of(n, t, h);
        has_nan |= std::isnan(l);
        if (std::isfinite(l)) m = std::max(m, l);
      }
      // The sink: -inf is none; NaN or +inf makes the row NaN (sparse_mqa's arithmetic gives NaN for both).
      const Acc s = sink.defined() ? static_cast<Acc>(num::load(sink.ptr_at({h}), sink.dtype))
                                   : -std::numeric_limits<Acc>::infinity();
      has_nan |= std::isnan(s) || s == std::numeric_limits<Acc>::infinity();
      if (std::isfinite(s)) m = std::max(m, s);
      double lse_out;
      if (has_nan) {
        for (int64_t d = 0; d < D; ++d) num::store(o.at(t, h, d), out.dtype, nan);
        lse_out = std::numeric_limits<double>::quiet_NaN();
      } else if (std::isinf(m)) {  // every part empty
        for (int64_t d = 0; d < D; ++d) num::store(o.at(t, h, d), out.dtype, 0.0);
        lse_out = -std::numeric_limits<double>::infinity();
      } else {
        // w[n] < 0 marks an empty part: skipped, never multiplied (its out may be garbage or NaN). A
        // non-empty part whose weight underflows to 0 is still multiplied, as one kernel's P · V would.
        Acc sum = 0;
        for (int64_t n = 0; n < N; ++n) {
          const Acc l = lse_of(n, t, h);
          w[static_cast<std::size_t>(n)] = std::isfinite(l) ? std::exp(l - m) : Acc(-1);
          if (std::isfinite(l)) sum += w[static_cast<std::size_t>(n)];
        }
        if (std::isfinite(s)) sum += std::exp(s - m);  // the sink's weight: in the sum, not in the output
        for (Acc& f : w)
          if (f >= Acc(0)) f /= sum;  // factors first: outputs never meet raw exponentials
        for (int64_t d = 0; d < D; ++d) {
          Acc acc = 0;
          for (int64_t n = 0; n < N; ++n)
            if (w[static_cast<std::size_t>(n)] >= Acc(0)) acc += part_at(n, t, h, d) * w[static_cast<std::size_t>(n)];
          num::store(o.at(t, h, d), out.dtype, acc);
        }
        lse_out = static_cast<double>(std::log(sum) + m);
      }
      if (out_lse.defined()) put_lse(out_lse, t, h, lse_out);
    }
  }
}

}  // namespace

void combine_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& parts,
                         const TensorView& part_lses, const TensorView& attn_sink, const Context& ctx) {
  if (ctx.precision == Precision::reference) combine<double>(out, out_lse, parts, part_lses, attn_sink);
  else combine<float>(out, out_lse, parts, part_lses, attn_sink);
}

void merge_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& prefix,
                       const TensorView& prefix_lse, const TensorView& suffix, const TensorView& suffix_lse,
                       int64_t prefill_tokens_with_context, float output_scale, const Context& ctx) {
  const int64_t with_context = prefill_tokens_with_context < 0 ? prefix.size(0) : prefill_tokens_with_context;
  if (ctx.precision == Precision::reference)
    merge<double>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, with_context, output_scale);
  else
    merge<float>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, with_context, output_scale);
}

}  // namespace mla::cpu
