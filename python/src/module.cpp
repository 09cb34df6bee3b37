// SPDX-License-Identifier: Apache-2.0
// mla._mla: the pybind11 extension behind the `mla` package. It converts arguments (convert.h) and
// calls the public C++ API; no logic lives here. Errors: mla::Error (including VariantUnsupported)
// -> ValueError, argument conversion failures -> TypeError, both with the library's text.
#include "bindings.h"
#include "mla/error.h"
#include "mla/version.h"

PYBIND11_MODULE(_mla, m) {
  m.doc() = "mla: DeepSeek Multi-head Latent Attention (C++/CUDA) for Python; see docs/PYTHON.md";
  m.attr("__version__") = MLA_VERSION_STRING;  // project(mla VERSION ...), through mla/version.h
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mla::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const mlapy::ArgError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  mlapy::bind_tensor(m);
  mlapy::bind_plan(m);
  mlapy::bind_ops(m);
  mlapy::bind_dist(m);
  mlapy::bind_layer(m);
  mlapy::bind_indexer(m);
  mlapy::bind_block(m);
}
