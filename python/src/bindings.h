#pragma once
// Shared declarations of the binding's translation units: one bind_* function per public header
// group, the cache descriptor with its keep-alive, and wrappers that hand C++ tensors to Python.
#include <pybind11/pybind11.h>

#include <memory>

#include "convert.h"
#include "mla/cache.h"

namespace mlapy {

// mla.KVCache: the descriptor plus the Python object that owns (or exported) its memory.
struct PyKVCache {
  mla::KVCache cache;
  py::object keep;    // keeps the memory alive (a DLPack capsule or the owning object)
  py::object source;  // the tensor the caller gave (mla.KVCache.data)
};

// Keyword construction of a plain struct: T() with each keyword set through its bound attribute
// (unknown keywords raise TypeError). `T` must be bound already.
template <class T>
T from_kwargs(const py::kwargs& kw) {
  py::object o = py::cast(T{});
  for (auto item : kw) {
    if (!py::hasattr(o, item.first)) {
      throw ArgError(py::str("{}() got an unexpected keyword argument '{}'")
                         .format(py::type::of(o).attr("__name__"), item.first)
                         .cast<std::string>());
    }
    py::setattr(o, item.first, item.second);
  }
  return o.cast<T>();
}

// Runs f with the GIL released (every op call: other Python threads run meanwhile).
template <class F>
void without_gil(F&& f) {
  py::gil_scoped_release release;
  f();
}

py::object wrap(const mla::Tensor& t);                                      // mla.Tensor sharing t's storage
py::object wrap_view(const mla::TensorView& v, std::shared_ptr<void> owner);  // mla.Tensor keeping owner alive
mla::DType to_dtype(py::handle obj);                                        // mla.DType or its name

void bind_tensor(py::module_& m);
void bind_ops(py::module_& m);
void bind_plan(py::module_& m);
void bind_layer(py::module_& m);
void bind_indexer(py::module_& m);

}  // namespace mlapy
