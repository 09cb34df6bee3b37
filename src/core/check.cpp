// SPDX-License-Identifier: Apache-2.0
#include "core/check.h"

#include <algorithm>
#include <numeric>

namespace mla::detail {

void check_defined(const TensorView& t, const char* op, const char* arg) {
  MLA_CHECK(t.defined(), "{}: {} is required but was not given", op, arg);
  MLA_CHECK(t.data != nullptr || t.numel() == 0, "{}: {} {} has a null data pointer", op, arg, t.describe());
}
void check_ndim(const TensorView& t, int ndim, const char* op, const char* arg) {
  check_defined(t, op, arg);
  MLA_CHECK(t.ndim == ndim, "{}: {} must have {} dims, got {}", op, arg, ndim, t.describe());
}
void check_dtype(const TensorView& t, DType dtype, const char* op, const char* arg) {
  MLA_CHECK(t.dtype == dtype, "{}: {} must be {}, got {}", op, arg, to_string(dtype), t.describe());
}
void check_float(const TensorView& t, const char* op, const char* arg) {
  MLA_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f32 || t.dtype == DType::f64,
            "{}: {} must be bf16, f16, f32 or f64, got {}", op, arg, t.describe());
}
void check_index(const TensorView& t, const char* op, const char* arg) {
  MLA_CHECK(t.dtype == DType::i32 || t.dtype == DType::i64, "{}: {} must be i32 or i64, got {}", op, arg,
            t.describe());
}
void check_inner_contiguous(const TensorView& t, const char* op, const char* arg) {
  MLA_CHECK(t.ndim == 0 || t.shape[t.ndim - 1] <= 1 || t.stride[t.ndim - 1] == 1,
            "{}: {} must have a unit stride in its last dim, got {}", op, arg, t.describe());
}
void check_size(const TensorView& t, int dim, int64_t expected, const char* op, const char* arg) {
  MLA_CHECK(t.size(dim) == expected, "{}: {} dim {} must be {}, got {}", op, arg, dim, expected, t.describe());
}
void check_device_value(Device device, const char* op, const char* arg) {
  MLA_CHECK(device.is_cpu() || (device.is_cuda() && device.index >= 0),
            "{}: {} has an unknown device {} (expected cpu, or cuda with index >= 0)", op, arg, to_string(device));
}
void check_precision(Precision p, const char* op) {
  MLA_CHECK(p == Precision::fast || p == Precision::reference,
            "{}: unknown Precision value {} in the Context (expected 0 fast or 1 reference)", op, static_cast<int>(p));
}
void check_device(const TensorView& t, Device device, const char* op, const char* arg) {
  if (!t.defined()) return;
  check_device_value(t.device, op, arg);
  MLA_CHECK(t.device == device, "{}: {} must be on {} like the other tensors, got {}", op, arg, to_string(device),
            t.describe());
}
void check_devices(Device device, const char* op, std::initializer_list<NamedView> views) {
  check_device_value(device, op, "the op's device");
  for (const NamedView& v : views) check_device(v.t, device, op, v.name);
}

void check_strides(const TensorView& t, bool is_output, const char* op, const char* arg) {
  if (!t.defined() || t.numel() == 0) return;
  for (int d = 0; d < t.ndim; ++d)
    MLA_CHECK(t.stride[d] >= 0, "{}: {} must have non-negative strides, got {}", op, arg, t.describe());
  if (!is_output) return;
  // Sort dims by stride; a view is non-aliasing if each stride covers the extent of the smaller ones.
  std::array<int, kMaxDims> order{};
  std::iota(order.begin(), order.begin() + t.ndim, 0);
  for (int i = 1; i < t.ndim; ++i)  // insertion sort by stride (ndim <= kMaxDims)
    for (int j = i; j > 0 && t.stride[order[j]] < t.stride[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  int64_t extent = 1;
  for (int i = 0; i < t.ndim; ++i) {
    const int d = order[i];
    if (t.shape[d] == 1) continue;
    MLA_CHECK(t.stride[d] >= extent, "{}: output {} has overlapping elements (strides), got {}", op, arg,
              t.describe());
    extent = t.stride[d] * t.shape[d];
  }
}

}  // namespace mla::detail
