// SPDX-License-Identifier: Apache-2.0
// mla.Tensor (owning or keep-alive buffers, exported through DLPack and as NumPy views), the enums,
// devices, and the cache descriptor / allocation of mla/cache.h.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.h"
#include "convert.h"
#include "mla/cache.h"
#include "mla/dlpack.h"

namespace mlapy {

namespace {

void capsule_destructor(PyObject* cap) {
  // A consumer renames the capsule once it owns the tensor; an unconsumed one is freed here.
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m->deleter != nullptr) m->deleter(m);
  }
}

py::object to_capsule(const Buffer& b) {
  DLManagedTensor* m = mla::to_dlpack(b.view, b.owner);
  PyObject* cap = PyCapsule_New(m, "dltensor", capsule_destructor);
  if (cap == nullptr) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

// NumPy has no bf16 / fp8: those come back as their bits (uint16 / uint8).
py::dtype numpy_dtype(mla::DType t) {
  switch (t) {
    case mla::DType::f32: return py::dtype::of<float>();
    case mla::DType::f64: return py::dtype::of<double>();
    case mla::DType::f16: return py::dtype("float16");
    case mla::DType::bf16: return py::dtype::of<uint16_t>();
    case mla::DType::fp8_e4m3:
    case mla::DType::u8: return py::dtype::of<uint8_t>();
    case mla::DType::i32: return py::dtype::of<int32_t>();
    case mla::DType::i64: return py::dtype::of<int64_t>();
  }
  throw ArgError("unknown dtype");
}

std::vector<int64_t> shape_of(const mla::TensorView& v) { return {v.shape.begin(), v.shape.begin() + v.ndim}; }

Buffer own(const mla::Tensor& t) { return {t.view(), std::make_shared<mla::Tensor>(t)}; }

}  // namespace

py::object wrap(const mla::Tensor& t) { return py::cast(own(t)); }
py::object wrap_view(const mla::TensorView& v, std::shared_ptr<void> owner) { return py::cast(Buffer{v, std::move(owner)}); }

mla::DType to_dtype(py::handle obj) {
  if (py::isinstance<mla::DType>(obj)) return obj.cast<mla::DType>();
  const std::string s = py::str(obj).cast<std::string>();
  for (auto t : {mla::DType::f32, mla::DType::f64, mla::DType::bf16, mla::DType::f16, mla::DType::fp8_e4m3,
                 mla::DType::u8, mla::DType::i32, mla::DType::i64})
    if (s == mla::to_string(t)) return t;
  throw ArgError("expected an mla.DType or its name (f32, f64, bf16, f16, fp8_e4m3, u8, i32, i64), got '" + s + "'");
}

void bind_tensor(py::module_& m) {
  py::enum_<mla::DType>(m, "DType")
      .value("f32", mla::DType::f32).value("f64", mla::DType::f64).value("bf16", mla::DType::bf16)
      .value("f16", mla::DType::f16).value("fp8_e4m3", mla::DType::fp8_e4m3).value("u8", mla::DType::u8)
      .value("i32", mla::DType::i32).value("i64", mla::DType::i64);
  py::enum_<mla::Precision>(m, "Precision")
      .value("fast", mla::Precision::fast).value("reference", mla::Precision::reference);
  py::enum_<mla::CacheFormat>(m, "CacheFormat")
      .value("bf16", mla::CacheFormat::bf16).value("fp8", mla::CacheFormat::fp8)
      .value("fp8_ds_mla", mla::CacheFormat::fp8_ds_mla).value("f64", mla::CacheFormat::f64)
      .value("v4", mla::CacheFormat::v4).value("v41", mla::CacheFormat::v41)
      .value("v41_fp4", mla::CacheFormat::v41_fp4);
  py::enum_<mla::DsMlaScale>(m, "DsMlaScale").value("amax", mla::DsMlaScale::amax).value("pow2", mla::DsMlaScale::pow2);

  py::class_<mla::Device>(m, "Device", "A device: mla.Device('cpu'), mla.Device('cuda:1'); equal to another of the same type and index.")
      .def(py::init([](py::handle spec) { return to_device(spec); }), py::arg("spec"))
      .def_readonly("index", &mla::Device::index)
      .def_property_readonly("type", [](const mla::Device& d) { return d.is_cuda() ? "cuda" : "cpu"; })
      .def("__str__", [](const mla::Device& d) { return mla::to_string(d); })
      .def("__repr__", [](const mla::Device& d) { return "mla.Device('" + mla::to_string(d) + "')"; })
      .def("__eq__", [](const mla::Device& a, const mla::Device& b) { return a == b; });

  py::class_<Buffer>(m, "Tensor",
                     "A tensor the library owns (or a view that keeps its owner alive). Zero-copy export: "
                     "torch.from_dlpack(t), numpy.from_dlpack(t) or t.numpy() (CPU).")
      .def_property_readonly("shape", [](const Buffer& b) { return py::tuple(py::cast(shape_of(b.view))); })
      .def_property_readonly("strides", [](const Buffer& b) {
        return py::tuple(py::cast(std::vector<int64_t>(b.view.stride.begin(), b.view.stride.begin() + b.view.ndim)));
      })
      .def_property_readonly("dtype", [](const Buffer& b) { return b.view.dtype; })
      .def_property_readonly("device", [](const Buffer& b) { return b.view.device; })
      .def_property_readonly("nbytes", [](const Buffer& b) { return b.view.numel() * int64_t(b.view.element_size()); })
      .def_property_readonly("data_ptr", [](const Buffer& b) { return reinterpret_cast<uintptr_t>(b.view.data); })
      .def("numel", [](const Buffer& b) { return b.view.numel(); }, "Number of elements.")
      .def("__dlpack__", [](const Buffer& b, py::handle /*stream*/) { return to_capsule(b); }, py::arg("stream") = py::none(),
           "DLPack capsule (no copy). The library enqueues work only on the streams callers pass, so no "
           "stream synchronisation is needed here.")
      .def("__dlpack_device__", [](const Buffer& b) {
        return py::make_tuple(static_cast<int>(b.view.device.type), b.view.device.index);
      })
      .def("numpy", [](py::object self) {
        const Buffer& b = self.cast<const Buffer&>();
        if (!b.view.device.is_cpu()) throw ArgError("Tensor.numpy(): the tensor is on " + mla::to_string(b.view.device));
        std::vector<py::ssize_t> strides;
        for (int i = 0; i < b.view.ndim; ++i) strides.push_back(b.view.stride[i] * py::ssize_t(b.view.element_size()));
        return py::array(numpy_dtype(b.view.dtype), shape_of(b.view), strides, b.view.data, self);
      }, "Zero-copy NumPy view of a CPU tensor (bf16 as uint16 bits, fp8 as uint8 bits).")
      .def("__repr__", [](const Buffer& b) { return "mla.Tensor(" + b.view.describe() + ")"; });

  m.def("empty", [](const std::vector<int64_t>& shape, py::handle dtype, py::handle device) {
    return own(mla::Tensor::empty(shape, to_dtype(dtype), to_device(device)));
  }, py::arg("shape"), py::arg("dtype"), py::arg("device") = "cpu", "A new uninitialised mla.Tensor of `shape` (list of ints), `dtype` (mla.DType or its name: f32, f64, bf16, f16, fp8_e4m3, u8, i32, i64) on `device` ('cpu', 'cuda', 'cuda:N', torch.device or mla.Device); a CUDA device that is not present raises ValueError ('no CUDA device').");
  m.def("zeros", [](const std::vector<int64_t>& shape, py::handle dtype, py::handle device) {
    return own(mla::Tensor::zeros(shape, to_dtype(dtype), to_device(device)));
  }, py::arg("shape"), py::arg("dtype"), py::arg("device") = "cpu", "As empty(shape, dtype, device), filled with zeros.");
  m.def("copy", [](const TensorArg& dst, const TensorArg& src) { mla::copy(dst.view, src.view); }, py::arg("dst"), py::arg("src"),
        "Copy src into dst (same shape and dtype; synchronous).");
  m.def("fill", [](const TensorArg& dst, double v) { mla::fill(dst.view, v); }, py::arg("dst"), py::arg("value"), "Set every element of dst (any dtype and device) to value.");
  m.def("cuda_device_count", &mla::cuda_device_count, "CUDA devices this process sees (0 without a driver, a device or a CUDA build).");
  m.def("built_with_cuda", &mla::built_with_cuda, "Whether this build of mla has the CUDA backend.");
  m.def("dtype_size", &mla::dtype_size, py::arg("dtype"), "Bytes per element of an mla.DType.");

  // ---- cache (mla/cache.h) ----
  py::class_<PyKVCache>(m, "KVCache", "Descriptor of one layer's paged latent cache; holds its tensor alive.")
      .def(py::init([](const TensorArg& data, mla::CacheFormat format, float scale, int d_qk, int d_rope) {
             PyKVCache c;
             c.cache = {data.view, format, scale, d_qk, d_rope};
             c.keep = data.keep;
             c.source = data.source;
             return c;
           }),
           py::arg("data"), py::arg("format") = mla::CacheFormat::bf16, py::arg("scale") = 1.0f, py::arg("d_qk") = 576,
           py::arg("d_rope") = 64)
      .def_property_readonly("format", [](const PyKVCache& c) { return c.cache.format; })
      .def_property_readonly("scale", [](const PyKVCache& c) { return c.cache.scale; })
      .def_property_readonly("d_qk", [](const PyKVCache& c) { return c.cache.d_qk; })
      .def_property_readonly("d_rope", [](const PyKVCache& c) { return c.cache.d_rope; })
      .def_property_readonly("d_latent", [](const PyKVCache& c) { return c.cache.d_latent(); })
      .def_property_readonly("num_blocks", [](const PyKVCache& c) { return c.cache.num_blocks(); })
      .def_property_readonly("page_size", [](const PyKVCache& c) { return c.cache.page_size(); })
      .def_property_readonly("num_slots", [](const PyKVCache& c) { return c.cache.num_slots(); })
      .def_property_readonly("data", [](const PyKVCache& c) { return c.source; }, "The tensor the descriptor was made from.")
      .def("validate", [](const PyKVCache& c) { mla::validate_cache(c.cache); }, "Check the descriptor against its tensor (shape [blocks, page, row], dtype, strides); raises ValueError.");

  m.def("allocate_cache", [](mla::CacheFormat format, int64_t num_blocks, int64_t page_size, py::handle device, float scale,
                             int d_qk, int d_rope) {
    mla::CacheBuffer cb = mla::allocate_cache(format, num_blocks, page_size, to_device(device), scale, d_qk, d_rope);
    PyKVCache c;
    c.cache = cb.cache;
    c.keep = c.source = wrap(cb.storage);
    return c;
  }, py::arg("format"), py::arg("num_blocks"), py::arg("page_size"), py::arg("device") = "cpu", py::arg("scale") = 1.0f,
     py::arg("d_qk") = 576, py::arg("d_rope") = 64,
     "Allocate a cache (contents undefined); .data is the mla.Tensor holding it.");
  m.def("cache_entry_bytes", &mla::cache_entry_bytes, py::arg("format"), py::arg("d_qk") = 576, py::arg("d_rope") = 64, "Bytes of one cache row (token) of `format` for d_qk / d_rope (bf16 576 x 2, fp8 576, fp8_ds_mla 656).");
  m.def("cache_entry_elems", &mla::cache_entry_elems, py::arg("format"), py::arg("d_qk") = 576, py::arg("d_rope") = 64, "Elements of one cache row of `format` in its tensor's dtype.");
  m.def("cache_dtype", &mla::cache_dtype, py::arg("format"), "The dtype of a cache tensor of `format` (bf16, fp8_e4m3, u8 for fp8_ds_mla, f64).");
}

}  // namespace mlapy
