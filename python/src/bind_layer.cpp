// SPDX-License-Identifier: Apache-2.0
// The step upload (mla/step.h), MlaAttention (mla/layer.h) and the kernel-variant controls
// (mla/variants.h).
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "bindings.h"
#include "mla/comm.h"
#include "mla/layer.h"
#include "mla/step.h"
#include "mla/variants.h"

namespace mlapy {

namespace {

// mla.force_variant(family, variant): a context manager around mla::ForceVariant.
class ForceVariantCM {
 public:
  ForceVariantCM(std::string family, std::string variant) : family_(std::move(family)), variant_(std::move(variant)) {}
  void enter() { guard_.emplace(family_, variant_); }
  void exit(const py::args&) { guard_.reset(); }

 private:
  std::string family_, variant_;
  std::optional<mla::ForceVariant> guard_;
};

}  // namespace

void bind_layer(py::module_& m) {
  using namespace mla;
  // ---- step upload ----
  m.def("pinned_buffer", [](std::size_t bytes) {
    auto buf = std::make_shared<PinnedBuffer>(bytes);
    return wrap_view(buf->view(), buf);
  }, py::arg("bytes"),
     "Page-locked host staging buffer (u8 [bytes]; ordinary memory without a CUDA device) as an mla.Tensor.");
  m.def("write_step_metadata", [](const Plan& plan, const TensorArg& staging) { write_step_metadata(plan, staging.view); },
        py::arg("plan"), py::arg("staging"), "Write the plan's packed metadata into staging (u8 [>= plan.metadata.bytes()], host memory).");
  m.def("upload_step_metadata", [](const Plan& plan, const TensorArg& staging, const TensorArg& device_metadata,
                                   py::handle stream) {
    const Context ctx = to_context(device_metadata.view, stream, Precision::fast);
    upload_step_metadata(plan, staging.view, device_metadata.view, ctx);
  }, py::arg("plan"), py::arg("staging"), py::arg("device_metadata"), py::kw_only(), py::arg("stream") = py::none(),
     "Write the plan's metadata into the pinned staging buffer and copy it to device_metadata on the stream.");

  // ---- layer ----
  py::class_<LayerOptions>(m, "LayerOptions", "Options of an MlaAttention layer: dims, sparse, cache format, device, dtype of weights and activations (keyword constructor).")
      .def(py::init(&options_from_kwargs<LayerOptions>))
      .def_readwrite("dims", &LayerOptions::dims)
      .def_readwrite("cache_format", &LayerOptions::cache_format)
      .def_readwrite("sparse", &LayerOptions::sparse)
      .def_readwrite("ds_scale", &LayerOptions::ds_scale)
      .def_readwrite("device", &LayerOptions::device)
      .def_readwrite("dtype", &LayerOptions::dtype);

  py::class_<MlaAttention>(m, "MlaAttention",
                           "One MLA attention layer (RoPE'd q, kv_c, k_pe in; attention output before o_proj out).")
      .def(py::init([](const LayerOptions& options, const TensorArg& kv_b_proj_weight,
                       const std::shared_ptr<Communicator>& dcp_comm) {
             LayerOptions o = options;
             o.dcp_comm = dcp_comm.get();  // kept alive by the layer (keep_alive below)
             py::gil_scoped_release release;
             return std::make_unique<MlaAttention>(o, kv_b_proj_weight.view);
           }),
           py::arg("options"), py::arg("kv_b_proj_weight"), py::arg("dcp_comm") = py::none(), py::keep_alive<1, 4>(),
           "dcp_comm: this rank's mla.Communicator of a DCP group (docs/SCALE.md): options.dims.num_heads are the "
           "rank's heads, kv_b_proj_weight their rows, and plans come from a PlannerConfig with dcp set.")
      .def_property_readonly("options", &MlaAttention::options)
      .def_property_readonly("w_uk_t", [](const MlaAttention& l) { return wrap(l.w_uk_t()); })
      .def_property_readonly("w_uv", [](const MlaAttention& l) { return wrap(l.w_uv()); })
      .def_property_readonly("w_kv_b", [](const MlaAttention& l) { return wrap(l.w_kv_b()); })
      .def("workspace_bytes", &MlaAttention::workspace_bytes, py::arg("plan"), "Bytes of the u8 workspace forward() needs for `plan`.")
      .def("max_workspace_bytes", &MlaAttention::max_workspace_bytes, py::arg("config"), py::arg("max_num_tokens"), "Bytes of a workspace that serves every plan of `config` with at most max_num_tokens tokens.")
      .def("forward", [](const MlaAttention& l, const Plan& plan, const PyKVCache& cache, const TensorArg& workspace,
                         const TensorArg& q, const TensorArg& kv_c, const TensorArg& k_pe, const TensorArg& slot_mapping,
                         const TensorArg& block_table, const TensorArg& seq_lens, const TensorArg& out,
                         const TensorArg& topk_indices, const TensorArg& metadata, py::handle stream, Precision p) {
        const Context ctx = to_context(q.view, stream, p);
        ForwardArgs a;
        a.q = q.view;
        a.kv_c = kv_c.view;
        a.k_pe = k_pe.view;
        a.out = out.view;
        set_step_tensors(a, slot_mapping, block_table, seq_lens, topk_indices, metadata);
        py::gil_scoped_release release;
        l.forward(plan, a, cache.cache, workspace.view, ctx);
      }, py::arg("plan"), py::arg("cache"), py::arg("workspace"), py::kw_only(), py::arg("q"), py::arg("kv_c"),
         py::arg("k_pe"), py::arg("slot_mapping"), py::arg("block_table"), py::arg("seq_lens"), py::arg("out"),
         py::arg("topk_indices") = py::none(), py::arg("metadata") = py::none(), py::arg("stream") = py::none(),
         py::arg("precision") = Precision::fast,
         "Run one step (mla/layer.h ForwardArgs): writes the cache at slot_mapping and out [T, h_q * V].");

  // ---- kernel variants ----
  py::class_<VariantInfo>(m, "VariantInfo", "One kernel variant: name, min_cc / max_cc (compute capability x 10), description.")
      .def_readonly("name", &VariantInfo::name).def_readonly("min_cc", &VariantInfo::min_cc)
      .def_readonly("max_cc", &VariantInfo::max_cc).def_readonly("description", &VariantInfo::description);
  m.def("variant_families", &variant_families, "The kernel families that have variants (mqa_decode, sparse_mqa, mha_prefill, indexer_logits).");
  m.def("list_variants", &list_variants, py::arg("family"), "The variants of a family, best first (name, compute-capability range, description).");
  m.def("variant_runs_on_device", &variant_runs_on_device, py::arg("family"), py::arg("variant"), py::arg("device"), "Whether the variant can run on CUDA device `device` (its compute capability).");
  m.def("last_variant", &last_variant, py::arg("family"), "The variant that ran the family's last launch in this thread ('' before any).");
  m.def("forced_variant", &forced_variant, py::arg("family"), "The variant forced for the family ('' = automatic selection).");
  py::class_<ForceVariantCM>(m, "force_variant", "with mla.force_variant(family, variant): ... (\"\" = automatic)")
      .def(py::init<std::string, std::string>(), py::arg("family"), py::arg("variant"))
      .def("__enter__", [](ForceVariantCM& c) { c.enter(); return &c; }, py::return_value_policy::reference)
      .def("__exit__", &ForceVariantCM::exit);
}

}  // namespace mlapy
