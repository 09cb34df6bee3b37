// SPDX-License-Identifier: Apache-2.0
#include "support/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numeric.h"
#include "fmt/format.h"

namespace mla::test {

std::mt19937_64& rng() {
  static std::mt19937_64 g(0x5eed);
  return g;
}
void reseed(uint64_t seed) { rng().seed(seed); }

void fill_random(const TensorView& t, double lo, double hi) {
  auto u = [lo, hi](std::mt19937_64&) { return uniform(lo, hi); };
  if (t.device.is_cpu()) {
    // Visit elements through strides.
    const int64_t n = t.numel();
    std::array<int64_t, kMaxDims> idx{};
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0;
      for (int d = 0; d < t.ndim; ++d) off += idx[d] * t.stride[d];
      num::store(static_cast<char*>(t.data) + off * static_cast<int64_t>(t.element_size()), t.dtype, u(rng()));
      for (int d = t.ndim - 1; d >= 0; --d) {
        if (++idx[d] < t.shape[d]) break;
        idx[d] = 0;
      }
    }
    return;
  }
  Tensor host = Tensor::empty(std::span<const int64_t>(t.shape.data(), t.ndim), t.dtype, Device::cpu());
  fill_random(host.view(), lo, hi);
  copy(t, host.view());
}

Tensor random_tensor(std::initializer_list<int64_t> shape, DType dtype, Device device, double lo, double hi) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_random(t.view(), lo, hi);
  return t;
}

Tensor int_tensor(const std::vector<int32_t>& values, Device device) {
  Tensor h = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i32);
  if (!values.empty()) std::memcpy(h.data(), values.data(), values.size() * 4);
  return device.is_cpu() ? h : h.to(device);
}

Varlen varlen(const std::vector<std::pair<int32_t, int32_t>>& lens) {
  std::vector<int32_t> cq = {0}, ck = {0};
  Varlen v;
  for (auto [sq, sk] : lens) {
    cq.push_back(cq.back() + sq);
    ck.push_back(ck.back() + sk);
    v.max_q = std::max<int64_t>(v.max_q, sq);
    v.max_k = std::max<int64_t>(v.max_k, sk);
  }
  v.total_q = cq.back();
  v.total_k = ck.back();
  v.cu_q = int_tensor(cq);
  v.cu_k = int_tensor(ck);
  return v;
}

Tensor int_tensor_2d(const std::vector<std::vector<int32_t>>& rows, Device device) {
  const int64_t r = static_cast<int64_t>(rows.size()), c = r ? static_cast<int64_t>(rows[0].size()) : 0;
  Tensor h = Tensor::empty({r, c}, DType::i32);
  for (int64_t i = 0; i < r; ++i) {
    EXPECT_EQ(static_cast<int64_t>(rows[i].size()), c) << "ragged int_tensor_2d";
    if (c) std::memcpy(static_cast<int32_t*>(h.data()) + i * c, rows[i].data(), c * 4);
  }
  return device.is_cpu() ? h : h.to(device);
}

Tensor int64_tensor(const std::vector<int64_t>& values, Device device) {
  Tensor h = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i64);
  if (!values.empty()) std::memcpy(h.data(), values.data(), values.size() * 8);
  return device.is_cpu() ? h : h.to(device);
}

std::vector<double> to_doubles(const TensorView& t) {
  TensorView v = t;
  Tensor host;
  if (t.device.is_cuda()) {
    host = Tensor::empty(std::span<const int64_t>(t.shape.data(), t.ndim), t.dtype, Device::cpu());
    copy(host.view(), t);
    v = host.view();
  }
  std::vector<double> out(static_cast<std::size_t>(v.numel()));
  std::array<int64_t, kMaxDims> idx{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    int64_t off = 0;
    for (int d = 0; d < v.ndim; ++d) off += idx[d] * v.stride[d];
    out[i] = num::load(static_cast<const char*>(v.data) + off * static_cast<int64_t>(v.element_size()), v.dtype);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<int32_t> to_ints(const TensorView& t) {
  std::vector<double> d = to_doubles(t);
  return std::vector<int32_t>(d.begin(), d.end());
}

Tensor poisoned(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  // Integers have no NaN: their poison is the largest value (u8 0xff is also an e4m3 NaN code; i32 / i64
  // maxima are no valid index, position or length).
  switch (dtype) {
    case DType::u8: fill(t.view(), 255.0); break;
    case DType::i32: fill(t.view(), 2147483647.0); break;
    case DType::i64: fill(t.view(), std::ldexp(1.0, 62)); break;
    default: fill(t.view(), NAN);
  }
  return t;
}

namespace {
double round_to(double x, DType storage) {
  switch (storage) {
    case DType::bf16: return num::round_bf16(static_cast<float>(x));
    case DType::f16: return num::f16_to_float(num::float_to_f16(static_cast<float>(x)));
    case DType::f32: return static_cast<float>(x);
    case DType::fp8_e4m3: return num::round_e4m3(static_cast<float>(x));
    default: return x;
  }
}
// One rounding quantum (unit in the last place) of storage at magnitude |x|, floored at the
// smallest normal's quantum so that values near zero are not held to an absurd bound.
double quantum(double x, DType storage) {
  int mant_bits = 52, min_exp = -1022;
  switch (storage) {
    case DType::bf16: mant_bits = 7; min_exp = -126; break;
    case DType::f16: mant_bits = 10; min_exp = -14; break;
    case DType::f32: mant_bits = 23; min_exp = -126; break;
    case DType::fp8_e4m3: mant_bits = 3; min_exp = -6; break;
    default: break;
  }
  const double a = std::fabs(x);
  int e = a > 0 ? std::ilogb(a) : min_exp;
  if (e < min_exp) e = min_exp;
  return std::ldexp(1.0, e - mant_bits);
}
}  // namespace

std::string check_close(const std::vector<double>& got, const std::vector<double>& ref, DType storage,
                        double extra_rel) {
  if (got.size() != ref.size()) return fmt::format("size mismatch: got {} ref {}", got.size(), ref.size());
  double max_ref = 0;
  for (double r : ref)
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
  double worst_ratio = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(r) || std::isnan(g)) {
      if (std::isnan(r) != std::isnan(g)) return fmt::format("NaN mismatch at {}: got {} ref {}", i, g, r);
      continue;
    }
    if (std::isinf(r) || std::isinf(g)) {
      if (g != r) return fmt::format("inf mismatch at {}: got {} ref {}", i, g, r);
      continue;
    }
    const double bound = 2.0 * std::fabs(round_to(r, storage) - r) + quantum(r, storage) + extra_rel * max_ref;
    const double err = std::fabs(g - r);
    const double ratio = err / bound;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio > 1.0)
    return fmt::format("element {} off by {:.3g} (got {:.9g}, ref {:.9g}); error/bound = {:.3g}", worst,
                       std::fabs(got[worst] - ref[worst]), got[worst], ref[worst], worst_ratio);
  return "";
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) continue;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool have_gpu() { return cuda_device_count() > 0; }

}  // namespace mla::test
