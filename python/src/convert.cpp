// SPDX-License-Identifier: Apache-2.0
// Argument conversion (convert.h): DLPack import of any tensor-like Python object, devices, streams.
#include "convert.h"

#include <cstring>

#include "mla/dlpack.h"
#include "mla/error.h"

namespace mlapy {

namespace {

// torch's module when the caller has imported it (never imported here: torch stays optional).
py::object loaded_torch() {
  py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return py::none();
  return modules["torch"];
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

// The view of a "dltensor" capsule (the capsule still owns the DLManagedTensor: its destructor calls
// the producer's deleter because the name is left unchanged, so the caller only keeps it alive).
mla::TensorView view_of_capsule(py::handle cap) {
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw ArgError("expected a \"dltensor\" DLPack capsule (an unconsumed one)");
  }
  try {
    return mla::from_dlpack(*managed);
  } catch (const mla::Error& e) {
    throw ArgError(e.what());
  }
}

}  // namespace

TensorArg to_tensor_arg(py::handle obj) {
  TensorArg a;
  a.source = py::reinterpret_borrow<py::object>(obj);
  if (obj.is_none()) return a;
  if (py::isinstance<Buffer>(obj)) {
    a.view = obj.cast<const Buffer&>().view;
    a.keep = py::reinterpret_borrow<py::object>(obj);
    return a;
  }
  if (PyCapsule_CheckExact(obj.ptr())) {
    a.view = view_of_capsule(obj);
    a.keep = py::reinterpret_borrow<py::object>(obj);
    return a;
  }
  py::object torch = loaded_torch();
  if (!torch.is_none() && py::isinstance(obj, torch.attr("Tensor"))) {
    py::object t = py::reinterpret_borrow<py::object>(obj);
    // DLPack before 1.0 has no fp8 code: carry e4m3 bytes as uint8 and reinterpret.
    const bool fp8 = py::hasattr(torch, "float8_e4m3fn") && t.attr("dtype").equal(torch.attr("float8_e4m3fn"));
    if (fp8) t = t.attr("view")(torch.attr("uint8"));
    if (t.attr("requires_grad").cast<bool>()) t = t.attr("detach")();
    a.keep = torch.attr("utils").attr("dlpack").attr("to_dlpack")(t);
    a.view = view_of_capsule(a.keep);
    if (fp8) a.view = a.view.as_dtype(mla::DType::fp8_e4m3);
    return a;
  }
  if (py::hasattr(obj, "__dlpack__")) {
    try {
      a.keep = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      throw ArgError("cannot import a " + type_name(obj) + " through DLPack: " + std::string(e.what()));
    }
    a.view = view_of_capsule(a.keep);
    return a;
  }
  throw ArgError("expected a tensor (torch.Tensor, numpy.ndarray, mla.Tensor or any object with __dlpack__), got " +
                 type_name(obj));
}

mla::Device to_device(py::handle obj) {
  if (py::isinstance<mla::Device>(obj)) return obj.cast<mla::Device>();
  const std::string s = py::str(obj).cast<std::string>();  // str, torch.device
  if (s == "cpu") return mla::Device::cpu();
  if (s == "cuda") return mla::Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.find_first_not_of("0123456789", 5) == std::string::npos)
    return mla::Device::cuda(std::stoi(s.substr(5)));
  throw ArgError("expected a device (\"cpu\", \"cuda\", \"cuda:N\", torch.device or mla.Device), got '" + s + "'");
}

mla::Context to_context(const mla::TensorView& main, py::handle stream, mla::Precision precision) {
  mla::Context ctx;
  ctx.precision = precision;
  if (!main.device.is_cuda()) return ctx;
  py::object s = py::reinterpret_borrow<py::object>(stream);
  if (s.is_none()) {
    py::object torch = loaded_torch();
    if (torch.is_none()) return ctx;  // the legacy default stream
    s = torch.attr("cuda").attr("current_stream")(main.device.index);
  }
  if (py::isinstance<py::int_>(s)) {
    ctx.stream = reinterpret_cast<void*>(s.cast<uintptr_t>());
  } else if (py::hasattr(s, "cuda_stream")) {
    ctx.stream = reinterpret_cast<void*>(s.attr("cuda_stream").cast<uintptr_t>());
  } else if (py::hasattr(s, "__cuda_stream__")) {
    ctx.stream = reinterpret_cast<void*>(s.attr("__cuda_stream__")()[py::int_(1)].cast<uintptr_t>());
  } else {
    throw ArgError("expected a CUDA stream (int handle, torch.cuda.Stream or an object with __cuda_stream__), got " +
                   type_name(s));
  }
  return ctx;
}

}  // namespace mlapy
