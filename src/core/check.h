// SPDX-License-Identifier: Apache-2.0
#pragma once
// Validation helpers shared by every op front end. MLA_CHECK(cond, fmt, args...) throws mla::Error
// with a formatted message; messages say what was expected and what came.
#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <type_traits>

#include "mla/error.h"
#include "mla/tensor.h"

// Not for .cu files: nvcc 13 cannot compile fmt 9's headers. Validation lives in the .cpp front ends
// (src/ops/); CUDA launchers report errors with plain std::string messages.
#define MLA_CHECK(cond, ...)                                     \
  do {                                                           \
    if (!(cond)) throw ::mla::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

namespace mla::detail {

// Each throws mla::Error naming `op` and `arg` when the view does not match.
void check_defined(const TensorView& t, const char* op, const char* arg);
void check_ndim(const TensorView& t, int ndim, const char* op, const char* arg);
void check_dtype(const TensorView& t, DType dtype, const char* op, const char* arg);
void check_float(const TensorView& t, const char* op, const char* arg);     // bf16/f16/f32/f64
void check_index(const TensorView& t, const char* op, const char* arg);     // i32 or i64
void check_inner_contiguous(const TensorView& t, const char* op, const char* arg);
void check_size(const TensorView& t, int dim, int64_t expected, const char* op, const char* arg);
// `device` is a CPU or a CUDA device with a non-negative index (not a cast integer).
void check_device_value(Device device, const char* op, const char* arg);
// `p` is one of the Precision values.
void check_precision(Precision p, const char* op);
// Every Context among `args` has a valid precision (MLA_DISPATCH runs it on each op's arguments, after
// the front end's checks and before the backend writes anything).
template <class... Args>
void check_contexts(const char* op, const Args&... args) {
  (
      [&] {
        if constexpr (std::is_same_v<Args, Context>) check_precision(args.precision, op);
      }(),
      ...);
}
// The view is defined on a valid device (check_device_value) and lives on `device`.
void check_device(const TensorView& t, Device device, const char* op, const char* arg);
// check_device for several named views at once (absent ones are skipped).
struct NamedView {
  const TensorView& t;
  const char* name;
};
void check_devices(Device device, const char* op, std::initializer_list<NamedView> views);
// Non-negative strides and no two elements aliasing each other within one output view
// (zero strides allowed only on inputs; pass is_output = true for outputs).
void check_strides(const TensorView& t, bool is_output, const char* op, const char* arg);

}  // namespace mla::detail
