// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared declarations of the binding's translation units: one bind_* function per public header
// group, the cache descriptor with its keep-alive, and wrappers that hand C++ tensors to Python.
#include <pybind11/pybind11.h>

#include <memory>
#include <tuple>

#include "convert.h"
#include "mla/cache.h"
#include "mla/ops.h"

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

// The DeepSeek-V4 inputs of sparse_mqa and dcp_sparse_mqa (mla::SparseOptions) from their keyword arguments
// (extra_kv: an mla.KVCache or None).
inline mla::SparseOptions sparse_options(const TensorArg& attn_sink, py::handle extra_kv, const TensorArg& extra_indices,
                                         const TensorArg& extra_topk_length, bool values_include_rope,
                                         bool batch_invariant) {
  mla::SparseOptions o;
  o.attn_sink = attn_sink.view;
  o.values_include_rope = values_include_rope;
  o.batch_invariant = batch_invariant;
  o.extra.indices = extra_indices.view;
  o.extra.topk_length = extra_topk_length.view;
  if (!extra_kv.is_none()) o.extra.kv = extra_kv.cast<const PyKVCache&>().cache;
  return o;
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

// Keyword construction of an options struct (from_kwargs) whose `device` and `dtype` also take their
// names ("cuda:0", "bf16", torch.device).
template <class T>
T options_from_kwargs(const py::kwargs& kw) {
  py::kwargs rest;
  T o;
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    if (k == "device") o.device = to_device(item.second);
    else if (k == "dtype") o.dtype = to_dtype(item.second);
    else rest[item.first] = item.second;
  }
  T r = from_kwargs<T>(rest);
  r.device = o.device;
  r.dtype = o.dtype;
  return r;
}

// The (q, k, v) tuple property over an options struct's fp8_prefill_scales (LayerOptions, DeepseekOptions).
template <class T>
void def_fp8_prefill_scales(py::class_<T>& c, const char* doc) {
  c.def_property(
      "fp8_prefill_scales",
      [](const T& o) { return py::make_tuple(o.fp8_prefill_scales.q, o.fp8_prefill_scales.k, o.fp8_prefill_scales.v); },
      [](T& o, const std::tuple<float, float, float>& s) {
        o.fp8_prefill_scales = {std::get<0>(s), std::get<1>(s), std::get<2>(s)};
      },
      doc);
}

// The step tensors MlaAttention and DeepseekAttention share (ForwardArgs / DeepseekForwardArgs).
template <class A>
void set_step_tensors(A& a, const TensorArg& slot_mapping, const TensorArg& block_table, const TensorArg& seq_lens,
                      const TensorArg& topk_indices, const TensorArg& metadata) {
  a.slot_mapping = slot_mapping.view;
  a.block_table = block_table.view;
  a.seq_lens = seq_lens.view;
  a.topk_indices = topk_indices.view;
  a.metadata = metadata.view;
}

void bind_tensor(py::module_& m);
void bind_ops(py::module_& m);
void bind_plan(py::module_& m);
void bind_layer(py::module_& m);
void bind_indexer(py::module_& m);
void bind_dist(py::module_& m);
void bind_block(py::module_& m);  // checkpoints and the DeepSeek block

}  // namespace mlapy
