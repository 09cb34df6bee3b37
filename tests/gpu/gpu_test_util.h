// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the GPU tests of the data-movement ops: mirrored host/device buffers (the CPU backend
// runs on the host copy as the oracle, the CUDA backend on the device copy, both through the same
// views), raw byte comparisons, and the reference-precision context.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mla::test {

inline Context reference_ctx() { return Context{nullptr, Precision::reference}; }

// The same view (offset, shape, strides) over another storage of the same size: a host view turned
// into its device twin after the storage was copied.
inline TensorView rebase(const TensorView& v, const Tensor& from, const Tensor& to) {
  TensorView r = v;
  const auto off = static_cast<const char*>(v.data) - static_cast<const char*>(from.data());
  r.data = static_cast<char*>(to.data()) + off;
  r.device = to.device();
  return r;
}

// A host storage and its device copy (made by sync()).
struct Mirror {
  Tensor host, dev;
  explicit Mirror(Tensor h) : host(std::move(h)) { sync(); }
  Mirror(std::initializer_list<int64_t> shape, DType t) : host(Tensor::empty(shape, t)) {}
  // Empty tensors are allocated, not copied: core's copy() refuses empty views (their default strides
  // do not count as contiguous).
  void sync() {
    dev = host.numel() == 0
              ? Tensor::empty(std::span<const int64_t>(host.view().shape.data(), host.view().ndim), host.dtype(),
                              Device::cuda(0))
              : host.to(Device::cuda(0));
  }
  TensorView on_dev(const TensorView& host_view) const { return rebase(host_view, host, dev); }
};

inline std::vector<uint8_t> host_bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  if (t.device().is_cpu()) {
    if (!b.empty()) std::memcpy(b.data(), t.data(), b.size());
  } else {
    Tensor h = t.to(Device::cpu());
    if (!b.empty()) std::memcpy(b.data(), h.data(), b.size());
  }
  return b;
}

// "" when equal, else the first differing byte (and `unit`-byte element index, for reading).
inline std::string byte_diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int unit = 1) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return "byte " + std::to_string(i) + " (element " + std::to_string(i / unit) + "): got " +
             std::to_string(got[i]) + " want " + std::to_string(want[i]);
  return "";
}

}  // namespace mla::test
