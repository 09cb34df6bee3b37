// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host reads of integer metadata views (i32 or i64, any strides). Shared by the CPU backend, the
// value-range checks of the op front ends and the layer, so all read metadata the same way.
#include <cstdint>

#include "core/numeric.h"
#include "mla/tensor.h"

namespace mla {

// Element i of a 1-D index view.
inline int64_t index_at(const TensorView& t, int64_t i) {
  return num::load_index(static_cast<const char*>(t.data) + i * t.stride[0] * static_cast<int64_t>(t.element_size()),
                         t.dtype);
}
// Element (i, j) of a 2-D index view.
inline int64_t index_at(const TensorView& t, int64_t i, int64_t j) {
  const int64_t off = i * t.stride[0] + j * t.stride[1];
  return num::load_index(static_cast<const char*>(t.data) + off * static_cast<int64_t>(t.element_size()), t.dtype);
}

}  // namespace mla
