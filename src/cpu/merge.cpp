// CPU merge_attn_states (semantics §7, edge rules [PIN] in ops.h). Float accumulation, double in
// Precision::reference.
#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace

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
