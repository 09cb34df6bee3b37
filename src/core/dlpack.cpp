// SPDX-License-Identifier: Apache-2.0
// DLPack import/export. The header comes from Debian's libdlpack-dev (<dlpack/dlpack.h>) or, on
// machines without it, from PyTorch's copy (<ATen/dlpack.h>); CMake picks one (MLA_DLPACK_ATEN).
#include "mla/dlpack.h"

#include "core/check.h"
#include "core/checked.h"

#include <cstdint>
#include <cstring>
#include <limits>

namespace mla {

namespace {
DType dtype_from_dl(DLDataType t) {
  MLA_CHECK(t.lanes == 1, "from_dlpack: vector dtypes (lanes={}) are not supported", t.lanes);
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DType::f32;
      if (t.bits == 64) return DType::f64;
      if (t.bits == 16) return DType::f16;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::bf16;
      break;
    case kDLInt:
      if (t.bits == 32) return DType::i32;
      if (t.bits == 64) return DType::i64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::u8;
      break;
    default:
      // DLPack >= 1.0 has kDLFloat8_e4m3fn (code 10); Debian's 0.6 header does not.
      if (t.code == 10 && t.bits == 8) return DType::fp8_e4m3;
      break;
  }
  throw Error(fmt::format("from_dlpack: unsupported dtype code={} bits={}", static_cast<int>(t.code),
                          static_cast<int>(t.bits)));
}

DLDataType dtype_to_dl(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::fp8_e4m3: return {static_cast<uint8_t>(10), 8, 1};
  }
  throw Error("to_dlpack: unknown dtype");
}

struct Holder {
  DLManagedTensor managed{};
  std::array<int64_t, kMaxDims> shape{}, strides{};
  std::shared_ptr<void> owner;
};
}  // namespace

TensorView from_dlpack(const DLTensor& t) {
  MLA_CHECK(t.ndim >= 1 && t.ndim <= kMaxDims, "from_dlpack: rank must be 1..{}, got {}", kMaxDims, t.ndim);
  MLA_CHECK(t.shape != nullptr, "from_dlpack: shape is null for a {}-dim tensor", t.ndim);
  // The device type is read as an integer: a value outside DLDeviceType must not be loaded as the enum.
  int32_t device_type;
  static_assert(sizeof(t.device.device_type) == sizeof(device_type));
  std::memcpy(&device_type, &t.device.device_type, sizeof(device_type));
  Device dev;
  if (device_type == static_cast<int32_t>(kDLCPU)) dev = Device::cpu();
  else if (device_type == static_cast<int32_t>(kDLCUDA)) dev = Device::cuda(t.device.device_id);
  else throw Error(fmt::format("from_dlpack: unsupported device type {} (expected 1 CPU or 2 CUDA)", device_type));
  MLA_CHECK(dev.is_cpu() || t.device.device_id >= 0, "from_dlpack: negative CUDA device id {}", t.device.device_id);
  const DType dt = dtype_from_dl(t.dtype);
  MLA_CHECK(t.byte_offset <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
            "from_dlpack: byte_offset {} is past any address", t.byte_offset);
  MLA_CHECK(t.data != nullptr || t.byte_offset == 0, "from_dlpack: null data with a non-zero byte_offset {}",
            t.byte_offset);
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  MLA_CHECK(base <= std::numeric_limits<uintptr_t>::max() - t.byte_offset,
            "from_dlpack: data + byte_offset ({}) wraps the address space", t.byte_offset);
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  std::span<const int64_t> shape(t.shape, static_cast<std::size_t>(t.ndim));
  TensorView v = t.strides == nullptr
                     ? TensorView(data, dt, shape, dev)
                     : TensorView(data, dt, shape, std::span<const int64_t>(t.strides, static_cast<std::size_t>(t.ndim)), dev);
  MLA_CHECK(data != nullptr || v.numel() == 0, "from_dlpack: null data for a tensor of {} elements", v.numel());
  // The addressed bytes must not wrap the address space (found by fuzz_dlpack: a pointer near 2^64
  // with a few hundred bytes of extent was accepted). Exact in 128 bits: the view's element reach
  // below and above data is representable (TensorView checked it).
  if (v.numel() > 0) {
    __int128 lo = 0, hi = 0;
    for (int d = 0; d < v.ndim; ++d) {
      const __int128 reach = static_cast<__int128>(v.shape[d] - 1) * v.stride[d];
      (reach < 0 ? lo : hi) += reach;
    }
    const __int128 e = static_cast<__int128>(dtype_size(dt)), at = static_cast<__int128>(reinterpret_cast<uintptr_t>(data));
    MLA_CHECK(at + lo * e >= 0 && at + (hi + 1) * e - 1 <= static_cast<__int128>(std::numeric_limits<uintptr_t>::max()),
              "from_dlpack: the tensor's bytes wrap the address space ({} at {})", v.describe(), data);
    // Lowest to highest byte within int64, so that every pointer difference in the ops is representable
    // (also found by fuzz_dlpack: strides of both signs reaching 2^62 each way).
    MLA_CHECK((hi - lo + 1) * e <= static_cast<__int128>(std::numeric_limits<int64_t>::max()),
              "from_dlpack: the tensor spans more than 2^63 bytes ({})", v.describe());
  }
  return v;
}

TensorView from_dlpack(const DLManagedTensor& t) { return from_dlpack(t.dl_tensor); }

DLManagedTensor* to_dlpack(const TensorView& v, std::shared_ptr<void> owner) {
  MLA_CHECK(v.defined(), "to_dlpack: cannot export an absent tensor");
  auto* h = new Holder();
  h->owner = std::move(owner);
  for (int i = 0; i < v.ndim; ++i) {
    h->shape[i] = v.shape[i];
    h->strides[i] = v.stride[i];
  }
  DLTensor& t = h->managed.dl_tensor;
  t.data = v.data;
  t.device = {v.device.is_cuda() ? kDLCUDA : kDLCPU, v.device.index};
  t.ndim = v.ndim;
  t.dtype = dtype_to_dl(v.dtype);
  t.shape = h->shape.data();
  t.strides = h->strides.data();
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Holder*>(self->manager_ctx); };
  return &h->managed;
}

}  // namespace mla
