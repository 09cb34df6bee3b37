// SPDX-License-Identifier: Apache-2.0
#include "mla/tensor.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/checked.h"
#include "core/numeric.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla {

namespace {
int norm_dim(int d, int ndim, const char* what) {
  const int r = d < 0 ? d + ndim : d;
  MLA_CHECK(r >= 0 && r < ndim, "{}: dim {} out of range for a {}-dim tensor", what, d, ndim);
  return r;
}
void set_shape(TensorView& v, std::span<const int64_t> shape) {
  MLA_CHECK(shape.size() >= 1 && shape.size() <= static_cast<std::size_t>(kMaxDims),
            "tensor: rank must be 1..{}, got {}", kMaxDims, shape.size());
  v.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < v.ndim; ++i) {
    MLA_CHECK(shape[i] >= 0, "tensor: negative extent {} in dim {}", shape[i], i);
    v.shape[i] = shape[i];
  }
}
// The address of index `at` along dim d (at <= shape[d]). A non-empty view's elements lie inside its
// representable span, so the offset is exact; an empty view addresses nothing and keeps its pointer
// (its extents may be near 2^62, where start * stride * element size would overflow).
void* offset_data(const TensorView& v, int d, int64_t at) {
  if (v.numel() == 0 || at == 0) return v.data;
  const int64_t off = detail::checked_mul(detail::checked_mul(at, v.stride[d], "tensor: element offset"),
                                          static_cast<int64_t>(v.element_size()), "tensor: byte offset");
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(v.data) + static_cast<uintptr_t>(off));
}
// Elements of a strided view with data must not lie below address 0 or wrap past the top of the
// address space (negative strides reach below data): pointer arithmetic on them would overflow.
void check_address_range(const TensorView& v) {
  if (v.data == nullptr || v.numel() == 0) return;
  __int128 lo = 0, hi = 0;
  for (int i = 0; i < v.ndim; ++i) {
    const __int128 reach = static_cast<__int128>(v.shape[i] - 1) * v.stride[i];
    (reach < 0 ? lo : hi) += reach;
  }
  const __int128 es = static_cast<__int128>(v.element_size());
  const __int128 base = static_cast<__int128>(reinterpret_cast<uintptr_t>(v.data));
  const __int128 top = static_cast<__int128>(~uintptr_t(0));
  MLA_CHECK(base + lo * es >= 0 && base + (hi + 1) * es - 1 <= top,
            "tensor: the elements of a {} view at {} reach outside the address space", v.shape_str(), v.data);
}
// numel * element size, checked (numel() itself is checked).
int64_t byte_count(const TensorView& v) {
  return detail::checked_mul(v.numel(), static_cast<int64_t>(dtype_size(v.dtype)), "tensor: size in bytes");
}
}  // namespace

TensorView::TensorView(void* d, DType t, std::span<const int64_t> shp, Device dev) : data(d), dtype(t), device(dev) {
  set_shape(*this, shp);
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    stride[i] = s;
    s = detail::checked_mul(s, shape[i] == 0 ? 1 : shape[i], "tensor: contiguous strides");
  }
  (void)byte_count(*this);  // rejects shapes whose element or byte count overflows int64
}

TensorView::TensorView(void* d, DType t, std::span<const int64_t> shp, std::span<const int64_t> str, Device dev)
    : data(d), dtype(t), device(dev) {
  set_shape(*this, shp);
  MLA_CHECK(str.size() == shp.size(), "tensor: {} strides given for {} dims", str.size(), shp.size());
  for (int i = 0; i < ndim; ++i) stride[i] = str[i];
  (void)byte_count(*this);
  (void)span_bytes();  // the farthest element's byte offset must be representable
  check_address_range(*this);
}

int64_t TensorView::size(int d) const { return shape[norm_dim(d, ndim, "size")]; }
int64_t TensorView::stride_of(int d) const { return stride[norm_dim(d, ndim, "stride")]; }

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n = detail::checked_mul(n, shape[i], "tensor: element count");
  return n;
}

bool TensorView::is_contiguous() const {
  if (ndim > 0 && numel() == 0) return true;  // nothing to lay out: any strides describe it
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

int64_t TensorView::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < ndim; ++i)
    last = detail::checked_add(last, detail::checked_mul(shape[i] - 1, stride[i], "tensor: element offset"),
                               "tensor: element offset");
  return detail::checked_mul(detail::checked_add(last, 1, "tensor: span"), static_cast<int64_t>(element_size()),
                             "tensor: span in bytes");
}

void* TensorView::ptr_at(std::initializer_list<int64_t> idx) const {
  int64_t off = 0;
  int i = 0;
  for (int64_t x : idx) off += x * stride[i++];
  return static_cast<char*>(data) + off * static_cast<int64_t>(element_size());
}

TensorView TensorView::slice(int dim, int64_t start, int64_t end) const {
  const int d = norm_dim(dim, ndim, "slice");
  MLA_CHECK(0 <= start && start <= end && end <= shape[d], "slice: [{}, {}) out of range for dim {} of {}", start,
            end, d, describe());
  TensorView v = *this;
  v.data = offset_data(*this, d, start);
  v.shape[d] = end - start;
  return v;
}

TensorView TensorView::select(int dim, int64_t index) const {
  const int d = norm_dim(dim, ndim, "select");
  MLA_CHECK(ndim >= 2, "select: needs at least 2 dims, got {}", describe());
  MLA_CHECK(0 <= index && index < shape[d], "select: index {} out of range for dim {} of {}", index, d, describe());
  TensorView v = *this;
  v.data = offset_data(*this, d, index);
  for (int i = d; i + 1 < ndim; ++i) {
    v.shape[i] = shape[i + 1];
    v.stride[i] = stride[i + 1];
  }
  v.ndim = ndim - 1;
  v.shape[v.ndim] = 0;
  v.stride[v.ndim] = 0;
  return v;
}

TensorView TensorView::transpose(int d0, int d1) const {
  const int a = norm_dim(d0, ndim, "transpose"), b = norm_dim(d1, ndim, "transpose");
  TensorView v = *this;
  std::swap(v.shape[a], v.shape[b]);
  std::swap(v.stride[a], v.stride[b]);
  return v;
}

TensorView TensorView::reshape(std::span<const int64_t> shp) const {
  MLA_CHECK(is_contiguous(), "reshape: needs a contiguous view, got {}", describe());
  TensorView v(data, dtype, shp, device);
  MLA_CHECK(v.numel() == numel(), "reshape: {} elements cannot take shape of {} elements ({})", numel(), v.numel(),
            v.shape_str());
  return v;
}

TensorView TensorView::unsqueeze(int dim) const {
  MLA_CHECK(ndim < kMaxDims, "unsqueeze: rank limit {} reached", kMaxDims);
  const int d = dim < 0 ? dim + ndim + 1 : dim;
  MLA_CHECK(d >= 0 && d <= ndim, "unsqueeze: dim {} out of range", dim);
  TensorView v = *this;
  for (int i = ndim; i > d; --i) {
    v.shape[i] = shape[i - 1];
    v.stride[i] = stride[i - 1];
  }
  v.shape[d] = 1;
  v.stride[d] = d < ndim ? shape[d] * stride[d] : 1;
  v.ndim = ndim + 1;
  return v;
}

TensorView TensorView::as_dtype(DType t) const {
  MLA_CHECK(dtype_size(t) == element_size(), "as_dtype: cannot view {} as {} (element sizes differ)", describe(),
            to_string(t));
  TensorView v = *this;
  v.dtype = t;
  return v;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

std::string TensorView::describe() const {
  if (!defined()) return "<absent>";
  std::string st;
  for (int i = 0; i < ndim; ++i) st += fmt::format("{}{}", i ? ", " : "", stride[i]);
  return fmt::format("{}{} on {} strides ({})", to_string(dtype), shape_str(), to_string(device), st);
}

// ------------------------------------------------------------------------------------------------

int cuda_device_count() {
#if MLA_WITH_CUDA
  return cuda_rt::device_count();
#else
  return 0;
#endif
}

bool built_with_cuda() { return MLA_WITH_CUDA != 0; }

Tensor Tensor::empty(std::span<const int64_t> shape, DType dtype, Device device) {
  // An out-of-range DeviceType must not reach the CUDA allocator, which would take it for device `index`.
  detail::check_device_value(device, "Tensor::empty", "device");
  Tensor t;
  t.view_ = TensorView(nullptr, dtype, shape, device);
  const std::size_t bytes = detail::checked_size(byte_count(t.view_), "Tensor::empty");
  if (device.is_cpu()) {
    // 64-byte alignment: vector loads in the CPU backend and DLPack consumers like it.
    void* p = std::aligned_alloc(64, detail::checked_round_up(bytes, 64, 64, "Tensor::empty"));
    MLA_CHECK(p != nullptr, "Tensor::empty: host allocation of {} bytes failed", bytes);
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
#if MLA_WITH_CUDA
    // Without a device the CUDA runtime's own error names the driver ("driver version is insufficient").
    const int devices = cuda_rt::device_count();
    MLA_CHECK(device.index < devices,
              "Tensor::empty: no CUDA device: cuda:{} was asked for and {} (`mla info` lists the devices)",
              device.index, devices == 0 ? std::string("the CUDA runtime finds none (no GPU, or no driver)")
                                         : fmt::format("{} is present (cuda:0 .. cuda:{})", devices, devices - 1));
    void* p = cuda_rt::malloc(bytes, device.index);
    const int dev = device.index;
    t.storage_ = std::shared_ptr<void>(p, [dev](void* q) { cuda_rt::free(q, dev); });
#else
    throw Error("Tensor::empty: this build of mla has no CUDA backend (configure with MLA_WITH_CUDA=ON)");
#endif
  }
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(std::span<const int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.data(), 0, t.nbytes());
  } else {
#if MLA_WITH_CUDA
    cuda_rt::memset(t.data(), device.index, 0, t.nbytes());
#endif
  }
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(std::span<const int64_t>(view_.shape.data(), view_.ndim), view_.dtype, device);
  copy(t.view(), view_);
  return t;
}

namespace {
// Visit every multi-index of `shape` (row-major), calling f(offset_a, offset_b) with element offsets
// under two stride sets.
template <class F>
void for_each_index(const TensorView& a, const TensorView& b, F&& f) {
  const int64_t n = a.numel();
  if (n == 0) return;
  std::array<int64_t, kMaxDims> idx{};
  for (int64_t i = 0; i < n; ++i) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < a.ndim; ++d) {
      oa += idx[d] * a.stride[d];
      ob += idx[d] * b.stride[d];
    }
    f(oa, ob);
    for (int d = a.ndim - 1; d >= 0; --d) {
      if (++idx[d] < a.shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

void copy(const TensorView& dst, const TensorView& src) {
  MLA_CHECK(dst.ndim == src.ndim && dst.shape == src.shape, "copy: shapes differ: dst {} src {}", dst.describe(),
            src.describe());
  MLA_CHECK(dst.dtype == src.dtype, "copy: dtypes differ: dst {} src {}", dst.describe(), src.describe());
  const std::size_t es = dst.element_size();
  if (dst.device.is_cpu() && src.device.is_cpu()) {
    if (dst.is_contiguous() && src.is_contiguous()) {
      std::memcpy(dst.data, src.data, static_cast<std::size_t>(dst.numel()) * es);
      return;
    }
    auto* d = static_cast<char*>(dst.data);
    const auto* s = static_cast<const char*>(src.data);
    // Signed byte offsets: an element offset times an unsigned size would wrap for negative strides.
    const auto ses = static_cast<int64_t>(es);
    for_each_index(dst, src, [&](int64_t od, int64_t os) { std::memcpy(d + od * ses, s + os * ses, es); });
    return;
  }
#if MLA_WITH_CUDA
  MLA_CHECK(dst.is_contiguous() && src.is_contiguous(),
            "copy: copies involving a CUDA tensor need contiguous views: dst {} src {}", dst.describe(),
            src.describe());
  cuda_rt::memcpy(dst.data, dst.device, src.data, src.device, static_cast<std::size_t>(dst.numel()) * es);
#else
  throw Error("copy: this build of mla has no CUDA backend");
#endif
}

void fill(const TensorView& dst, double value) {
  // An integer dtype takes only values it can hold (a float -> int conversion out of range is
  // undefined): NaN, infinities and values past the type's range are refused.
  double lo = 0, hi = -1;  // [lo, hi): the representable range (empty for float dtypes)
  if (dst.dtype == DType::u8) lo = 0, hi = 256;
  if (dst.dtype == DType::i32) lo = -2147483648.0, hi = 2147483648.0;
  if (dst.dtype == DType::i64) lo = -9223372036854775808.0, hi = 9223372036854775808.0;
  MLA_CHECK(hi < lo || (value >= lo && value < hi), "fill: {} does not fit the {} view {} (range [{}, {}))", value,
            to_string(dst.dtype), dst.describe(), lo, hi);
  if (dst.numel() == 0) return;
  if (dst.device.is_cpu()) {
    std::array<unsigned char, 8> bytes{};
    num::store(bytes.data(), dst.dtype, value);
    const std::size_t es = dst.element_size();
    auto* d = static_cast<char*>(dst.data);
    const auto ses = static_cast<int64_t>(es);  // signed: negative strides give negative offsets
    for_each_index(dst, dst, [&](int64_t o, int64_t) { std::memcpy(d + o * ses, bytes.data(), es); });
    return;
  }
  MLA_CHECK(dst.is_contiguous(), "fill: CUDA views must be contiguous, got {}", dst.describe());
  Tensor host = Tensor::empty(std::span<const int64_t>(dst.shape.data(), dst.ndim), dst.dtype, Device::cpu());
  fill(host.view(), value);
  copy(dst, host.view());
}

}  // namespace mla
