// SPDX-License-Identifier: Apache-2.0
// The step upload (mla/step.h), MlaAttention (mla/layer.h) and the kernel-variant controls
// (mla/variants.h).
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <tuple>

#include "bindings.h"
#include "mla/block_ops.h"
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

// An mla.OutputQuant or its key ("none", "fp8", "fp8_group128", "fp8_group64", "nvfp4").
mla::OutputQuant to_output_quant(py::handle obj) {
  if (py::isinstance<mla::OutputQuant>(obj)) return obj.cast<mla::OutputQuant>();
  if (!py::isinstance<py::str>(obj))
    throw ArgError("expected an mla.OutputQuant or its key (none, fp8, fp8_group128, fp8_group64, nvfp4), got " +
                   py::repr(obj).cast<std::string>());
  return mla::parse_output_quant(obj.cast<std::string>());
}

// An mla.KvScales or "fixed" / "auto" (= from_first_batch, the CLI's spelling) / "from_first_batch".
mla::KvScales to_kv_scales(py::handle obj) {
  if (py::isinstance<mla::KvScales>(obj)) return obj.cast<mla::KvScales>();
  const std::string s = py::isinstance<py::str>(obj) ? obj.cast<std::string>() : std::string();
  if (s == "fixed") return mla::KvScales::fixed;
  if (s == "auto" || s == "from_first_batch") return mla::KvScales::from_first_batch;
  throw ArgError("expected an mla.KvScales or fixed / auto / from_first_batch, got " + py::repr(obj).cast<std::string>());
}

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
  py::enum_<OutputQuant>(m, "OutputQuant", "Format of the layer's output (LayerOptions.out_quant; docs/SEMANTICS.md §15).")
      .value("none", OutputQuant::none).value("fp8", OutputQuant::fp8).value("fp8_group128", OutputQuant::fp8_group128)
      .value("fp8_group64", OutputQuant::fp8_group64).value("nvfp4", OutputQuant::nvfp4);
  py::enum_<KvScales>(m, "KvScales", "Where an fp8 cache's scale comes from (LayerOptions.kv_scales; docs/SEMANTICS.md §16).")
      .value("fixed", KvScales::fixed).value("from_first_batch", KvScales::from_first_batch);
  py::class_<LayerOptions> layer_options(m, "LayerOptions", "Options of an MlaAttention layer: dims, sparse, cache format, device, dtype of weights and activations (keyword constructor).");
  layer_options
      .def(py::init(&options_from_kwargs<LayerOptions>))
      .def_readwrite("dims", &LayerOptions::dims)
      .def_readwrite("cache_format", &LayerOptions::cache_format)
      .def_readwrite("sparse", &LayerOptions::sparse)
      .def_readwrite("ds_scale", &LayerOptions::ds_scale)
      .def_readwrite("device", &LayerOptions::device)
      .def_readwrite("dtype", &LayerOptions::dtype)
      .def_property("out_quant", [](const LayerOptions& o) { return o.out_quant; },
                    [](LayerOptions& o, py::handle v) { o.out_quant = to_output_quant(v); },
                    "mla.OutputQuant or its key: the format forward() writes `out` (and `out_scales`) in.")
      .def_readwrite("out_scale", &LayerOptions::out_scale, "fp8: the static output scale; nvfp4: the global scale.")
      .def_property("kv_scales", [](const LayerOptions& o) { return o.kv_scales; },
                    [](LayerOptions& o, py::handle v) { o.kv_scales = to_kv_scales(v); },
                    "mla.KvScales, or 'fixed' / 'auto': 'auto' calibrates an fp8 cache's scale from the first batch.")
      .def_readwrite("batch_invariant", &LayerOptions::batch_invariant,
                     "Refuse plans that are not batch-invariant (PlannerConfig.batch_invariant).")
      .def_readwrite("fp8_prefill", &LayerOptions::fp8_prefill,
                     "fp8 prefill attention (docs/SEMANTICS.md §10.1; fp8 and fp8_ds_mla caches, CUDA: sm_90).");
  def_fp8_prefill_scales(layer_options, "(q, k, v) static scales of fp8_prefill (code = e4m3(x / scale)); default (1, 1, 1).");

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
      .def_property_readonly("kv_scale", &MlaAttention::kv_scale,
                             "The calibrated fp8 cache scale (kv_scales 'auto', after the first step that set it), else None.")
      .def("workspace_bytes", &MlaAttention::workspace_bytes, py::arg("plan"), "Bytes of the u8 workspace forward() needs for `plan`.")
      .def("max_workspace_bytes", &MlaAttention::max_workspace_bytes, py::arg("config"), py::arg("max_num_tokens"), "Bytes of a workspace that serves every plan of `config` with at most max_num_tokens tokens.")
      .def("forward", [](const MlaAttention& l, const Plan& plan, const PyKVCache& cache, const TensorArg& workspace,
                         const TensorArg& q, const TensorArg& kv_c, const TensorArg& k_pe, const TensorArg& slot_mapping,
                         const TensorArg& block_table, const TensorArg& seq_lens, const TensorArg& out,
                         const TensorArg& topk_indices, const TensorArg& metadata, const TensorArg& out_scales,
                         py::handle stream, Precision p) {
        const Context ctx = to_context(q.view, stream, p);
        ForwardArgs a;
        a.q = q.view;
        a.kv_c = kv_c.view;
        a.k_pe = k_pe.view;
        a.out = out.view;
        a.out_scales = out_scales.view;
        set_step_tensors(a, slot_mapping, block_table, seq_lens, topk_indices, metadata);
        py::gil_scoped_release release;
        l.forward(plan, a, cache.cache, workspace.view, ctx);
      }, py::arg("plan"), py::arg("cache"), py::arg("workspace"), py::kw_only(), py::arg("q"), py::arg("kv_c"),
         py::arg("k_pe"), py::arg("slot_mapping"), py::arg("block_table"), py::arg("seq_lens"), py::arg("out"),
         py::arg("topk_indices") = py::none(), py::arg("metadata") = py::none(), py::arg("out_scales") = py::none(),
         py::arg("stream") = py::none(), py::arg("precision") = Precision::fast,
         "Run one step (mla/layer.h ForwardArgs): writes the cache at slot_mapping and out [T, h_q * V]; with "
         "options.out_quant, out holds the codes (fp8_e4m3 / u8 [T_out, h_q * V], nvfp4 u8 [T_out, h_q * V / 2], "
         "T_out >= the actual tokens) and out_scales the scales (group keys f32 [h_q * V / G, T_out], nvfp4 e4m3 "
         "[T_out, h_q * V / 16]).");

  m.def("quantize_output", [](const TensorArg& x, py::handle key, const TensorArg& codes, const TensorArg& scales,
                              float scale, py::handle stream) {
    const OutputQuant q = to_output_quant(key);
    const Context ctx = to_context(x.view, stream, Precision::fast);
    without_gil([&] { quantize_output(x.view, q, codes.view, scales.view, scale, ctx); });
  }, py::arg("x"), py::arg("key"), py::arg("codes"), py::arg("scales") = py::none(), py::arg("scale") = 1.0f,
     py::kw_only(), py::arg("stream") = py::none(),
     "Quantise x [M, K] into codes / scales in the key's format (docs/SEMANTICS.md §15): fp8 codes [M_pad, K] "
     "with the static `scale`; fp8_group128 / fp8_group64 codes [M_pad, K] and f32 scales [K / G, M_pad]; nvfp4 "
     "u8 codes [M_pad, K / 2] and e4m3 scales [M_pad, K / 16] with the global `scale`. Rows past M are padding.");
  m.def("abs_max", [](const TensorArg& x, const TensorArg& out, py::handle stream) {
    const Context ctx = to_context(x.view, stream, Precision::fast);
    without_gil([&] { abs_max(x.view, out.view, ctx); });
  }, py::arg("x"), py::arg("out"), py::kw_only(), py::arg("stream") = py::none(),
     "out [1] f32 = max |x| over x [M, K] (NaN when any element is NaN).");

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
