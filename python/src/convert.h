// SPDX-License-Identifier: Apache-2.0
#pragma once
// Argument conversion of the Python binding (no logic beyond conversion):
//   * TensorArg: any tensor argument. Accepted: mla.Tensor (the binding's own buffers), torch.Tensor
//     (through torch.utils.dlpack.to_dlpack: no stream synchronisation, the caller's stream orders the
//     work; float8_e4m3fn tensors travel as uint8 and are reinterpreted), a "dltensor" PyCapsule, and
//     any object with __dlpack__ (numpy arrays, CuPy, JAX...). Zero copy: the TensorView points at the
//     producer's memory, and the producer's capsule is held until the call returns. None = absent
//     (optional arguments).
//   * Device: "cpu", "cuda", "cuda:N", torch.device or mla.Device.
//   * Context: the stream (None -> torch's current stream of the tensors' device when torch is
//     loaded, else the legacy default stream; an int handle; an object with .cuda_stream such as
//     torch.cuda.Stream; or one with __cuda_stream__) and the precision (fast / reference).
// Conversion failures raise TypeError (ArgError); mla::Error from the library raises ValueError with
// the same text (module.cpp).
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mlapy {
namespace py = pybind11;

// A conversion failure (wrong Python type, dtype or device DLPack cannot carry): TypeError.
class ArgError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorArg {
  mla::TensorView view;
  py::object keep;    // what keeps the memory reachable for the duration of the call
  py::object source;  // the Python object the caller passed
};

// A tensor the binding owns or borrows with a keep-alive (mla.Tensor in Python): cache buffers,
// pinned staging, layer weights, and views of them.
struct Buffer {
  mla::TensorView view;
  std::shared_ptr<void> owner;
};

TensorArg to_tensor_arg(py::handle obj);
mla::Device to_device(py::handle obj);
// `main`: a tensor of the call (its device picks torch's current stream).
mla::Context to_context(const mla::TensorView& main, py::handle stream, mla::Precision precision);

}  // namespace mlapy

namespace pybind11::detail {
template <>
struct type_caster<mlapy::TensorArg> {
  PYBIND11_TYPE_CASTER(mlapy::TensorArg, const_name("Tensor"));
  bool load(handle src, bool) {
    value = mlapy::to_tensor_arg(src);
    return true;
  }
};
}  // namespace pybind11::detail
