// SPDX-License-Identifier: Apache-2.0
#pragma once
// TensorView: a non-owning, strided view of memory on one device, the currency of every op.
// Tensor: an owning buffer (host or CUDA) that hands out views; used by the CLI, tests and layer setup.
// Strides are in elements. Kernels never see this type: launchers unpack views into POD params.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mla/types.h"

namespace mla {

inline constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = 0;  // 0 = "absent" (optional arguments); real tensors have ndim >= 1
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::span<const int64_t> shape, Device device = Device::cpu());
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu())
      : TensorView(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device) {}
  // Strided view.
  TensorView(void* data, DType dtype, std::span<const int64_t> shape, std::span<const int64_t> stride,
             Device device = Device::cpu());

  bool defined() const { return ndim > 0; }
  int64_t size(int d) const;    // negative d counts from the back
  int64_t stride_of(int d) const;
  int64_t numel() const;
  std::size_t element_size() const { return dtype_size(dtype); }
  bool is_contiguous() const;
  // Bytes spanned from data to one past the last element (0 when empty). Used for bounds in messages.
  int64_t span_bytes() const;

  template <class T>
  T* data_as() const { return static_cast<T*>(data); }
  // Element pointer at a multi-index (no bounds check; int64 offsets).
  void* ptr_at(std::initializer_list<int64_t> idx) const;

  // Views (no copies). Throw mla::Error when the request does not fit.
  TensorView slice(int dim, int64_t start, int64_t end) const;  // [start, end)
  TensorView select(int dim, int64_t index) const;              // drops dim
  TensorView transpose(int d0, int d1) const;
  TensorView reshape(std::span<const int64_t> shape) const;     // contiguous views only
  TensorView reshape(std::initializer_list<int64_t> shape) const {
    return reshape(std::span<const int64_t>(shape.begin(), shape.size()));
  }
  TensorView unsqueeze(int dim) const;
  TensorView as_dtype(DType t) const;  // reinterpret: same element size required (e.g. u8 <-> fp8_e4m3)

  std::string shape_str() const;  // "[2, 3, 576]"
  std::string describe() const;   // "bf16[2, 3, 576] on cuda:0 strides (1728, 576, 1)"
};

// Owning buffer. Memory is released when the last copy is destroyed. CUDA buffers use cudaMalloc.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::span<const int64_t> shape, DType dtype, Device device = Device::cpu());
  static Tensor empty(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu()) {
    return empty(std::span<const int64_t>(shape.begin(), shape.size()), dtype, device);
  }
  static Tensor zeros(std::span<const int64_t> shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu()) {
    return zeros(std::span<const int64_t>(shape.begin(), shape.size()), dtype, device);
  }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable wherever a view is
  bool defined() const { return view_.defined(); }
  void* data() const { return view_.data; }
  int64_t numel() const { return view_.numel(); }
  int64_t size(int d) const { return view_.size(d); }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  std::size_t nbytes() const { return static_cast<std::size_t>(view_.numel()) * view_.element_size(); }

  // Copy to another device (or a fresh host buffer). Contiguous result.
  Tensor to(Device device) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies src into dst (same shape and dtype; any strides on the CPU; contiguous across devices).
// Synchronous with respect to the host (used outside the hot path: setup, tests, CLI).
void copy(const TensorView& dst, const TensorView& src);
// Fill every element of a view with a value converted to its dtype (NaN allowed: poisoning).
void fill(const TensorView& dst, double value);

// Runtime device queries (0 devices in a build without CUDA or on a machine without a GPU).
int cuda_device_count();
bool built_with_cuda();

}  // namespace mla
