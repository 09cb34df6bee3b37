// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the DeepSeek attention blocks (block_util.h).
#include "block/block_util.h"

#include <cmath>

#include "core/check.h"
#include "core/checked.h"
#include "core/numeric.h"

namespace mla::block {

std::size_t region_bytes(int64_t rows, int64_t cols, DType t, const char* what) {
  const int64_t n = detail::checked_mul(detail::checked_mul(rows, cols, what), static_cast<int64_t>(dtype_size(t)), what);
  return detail::checked_round_up(detail::checked_size(n, what), kAlign, 0, what);
}

bool bytes_overlap(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + static_cast<uintptr_t>(b.span_bytes()) && b0 < a0 + static_cast<uintptr_t>(a.span_bytes());
}

void check_token_rows(const TensorView& v, int64_t T, int64_t H, DType dtype, Device device, const char* op,
                      const char* name) {
  detail::check_defined(v, op, name);
  detail::check_ndim(v, 2, op, name);
  detail::check_size(v, 0, T, op, name);
  detail::check_size(v, 1, H, op, name);
  detail::check_dtype(v, dtype, op, name);
  detail::check_device(v, device, op, name);
  MLA_CHECK(v.stride[1] == 1, "{}: {} needs unit inner stride, got {}", op, name, v.describe());
}

void check_weight_shape(const DeepseekLinear& w, int64_t out, int64_t in, const char* op, const std::string& what) {
  MLA_CHECK(w.weight.defined(), "{}: weight {} is missing", op, what);
  MLA_CHECK(w.weight.ndim == 2 && w.weight.shape[0] == out && w.weight.shape[1] == in,
            "{}: weight {} must be [{}, {}], got {}", op, what, out, in, w.weight.describe());
  MLA_CHECK(w.weight.device.is_cpu(), "{}: weight {} must be a host tensor, got {}", op, what, w.weight.describe());
}

Tensor rank_weight_t(const DeepseekLinear& w, int block_rows, int block_cols, int64_t row0, int64_t rows, int64_t col0,
                     int64_t cols, DType dtype, const std::string& what) {
  const Tensor slice = dequantize_block_fp8(w, block_rows, block_cols, row0, rows, col0, cols, DType::f64, what);
  Tensor t = Tensor::empty({cols, rows}, dtype);
  const auto* src = static_cast<const double*>(slice.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) num::store(t.view().ptr_at({j, i}), dtype, src[i * cols + j]);
  return t;
}

Tensor norm_weight(const TensorView& w, int64_t n, const char* op, const char* what) {
  MLA_CHECK(w.defined() && w.ndim == 1 && w.shape[0] == n && w.device.is_cpu() && is_floating(w.dtype) &&
                w.dtype != DType::fp8_e4m3,
            "{}: {} must be a float host tensor [{}], got {}", op, what, n, w.describe());
  Tensor t = Tensor::empty({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) {
    const double x = num::load(w.ptr_at({i}), w.dtype);
    MLA_CHECK(std::isfinite(x), "{}: {}[{}] = {} is not finite", op, what, i, x);
    static_cast<double*>(t.data())[i] = x;
  }
  return t;
}

Tensor norm_on_device(Tensor f64, Device dev) {
  if (dev.is_cpu()) return f64;
  const int64_t n = f64.size(0);
  Tensor f32 = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    static_cast<float*>(f32.data())[i] = static_cast<float>(static_cast<const double*>(f64.data())[i]);
  return f32.to(dev);
}

LayerTensors::LayerTensors(const Checkpoint& ck, int layer, const char* op)
    : ck_(ck), pre_(fmt::format("model.layers.{}.self_attn.", layer)), op_(op) {
  MLA_CHECK(layer >= 0, "{}: layer must be >= 0, got {}", op, layer);
}

TensorView LayerTensors::tensor(const std::string& n) {
  const std::string name = pre_ + n;
  const StTensorInfo& info = ck_.info(name);
  const auto dt = to_mla_dtype(info.dtype);
  MLA_CHECK(dt && is_floating(*dt), "{}: checkpoint tensor '{}' has dtype {}, expected a float type", op_, name,
            to_string(info.dtype));
  keep_.push_back(ck_.load(name, *dt));
  return keep_.back().view();
}

DeepseekLinear LayerTensors::linear(const std::string& n) {
  DeepseekLinear l;
  l.weight = tensor(n + ".weight");
  const std::string s = pre_ + n + ".weight_scale_inv";
  if (l.weight.dtype == DType::fp8_e4m3) {
    MLA_CHECK(ck_.has(s), "{}: '{}' is fp8_e4m3 but the checkpoint has no '{}'", op_, pre_ + n + ".weight", s);
    l.weight_scale_inv = tensor(n + ".weight_scale_inv");
  }
  return l;
}

}  // namespace mla::block
