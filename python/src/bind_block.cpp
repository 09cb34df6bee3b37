// SPDX-License-Identifier: Apache-2.0
// Checkpoints (mla/safetensors.h), the whole DeepSeek attention block (mla/deepseek.h) and the DeepSeek-V4 one
// (mla/deepseek_v4.h).
#include <pybind11/stl.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "mla/deepseek.h"
#include "mla/deepseek_v4.h"
#include "mla/safetensors.h"

namespace mlapy {

#define MLA_RW(cls, f) .def_readwrite(#f, &cls::f)

namespace {

// A block's weights given as a dict of name -> tensor: "<name>.weight" or "<name>.weight_scale_inv" for each of
// `weights` (linears, or norms the V3 block also takes by these suffixes) and the exact names of `exact`; any other
// name is refused naming `op`. Holds the converted tensors alive while the block's constructor reads them.
class WeightDict {
 public:
  WeightDict(const py::dict& d, const char* op, std::initializer_list<const char*> weights,
             std::initializer_list<const char*> exact = {})
      : d_(d) {
    keep_.reserve(d.size());  // views into the kept tensors stay valid
    for (auto item : d) {
      const std::string k = py::str(item.first);
      bool ok = false;
      for (const char* n : exact) ok = ok || k == n;
      for (const char* n : weights) ok = ok || k == std::string(n) + ".weight" || k == std::string(n) + ".weight_scale_inv";
      if (!ok) throw ArgError(std::string(op) + ": unknown weight '" + k + "'");
    }
  }
  // The tensor of this name, undefined when absent.
  mla::TensorView get(const std::string& name) {
    if (!d_.contains(name)) return {};
    keep_.push_back(d_[py::str(name)].cast<TensorArg>());
    return keep_.back().view;
  }
  // "<n>.weight" with its "<n>.weight_scale_inv" (fp8), each undefined when absent.
  mla::DeepseekLinear linear(const std::string& n) { return {get(n + ".weight"), get(n + ".weight_scale_inv")}; }

 private:
  const py::dict& d_;
  std::vector<TensorArg> keep_;
};

}  // namespace

void bind_block(py::module_& m) {
  using namespace mla;
  py::class_<DeepseekConfig>(m, "DeepseekConfig",
                             "DeepSeek V2 / V3 attention configuration (config.json): from_file, from_json, preset.")
      .def(py::init([](const py::kwargs& kw) { return from_kwargs<DeepseekConfig>(kw); }))
      .def_static("from_file", &DeepseekConfig::from_file, py::arg("path"))
      .def_static("from_json", [](const std::string& text) { return DeepseekConfig::from_json(text); }, py::arg("text"))
      .def_static("preset", &DeepseekConfig::preset, py::arg("name"))
      MLA_RW(DeepseekConfig, model_type) MLA_RW(DeepseekConfig, hidden_size) MLA_RW(DeepseekConfig, num_attention_heads)
      MLA_RW(DeepseekConfig, q_lora_rank) MLA_RW(DeepseekConfig, kv_lora_rank) MLA_RW(DeepseekConfig, qk_nope_head_dim)
      MLA_RW(DeepseekConfig, qk_rope_head_dim) MLA_RW(DeepseekConfig, v_head_dim) MLA_RW(DeepseekConfig, rope_theta)
      MLA_RW(DeepseekConfig, rms_norm_eps) MLA_RW(DeepseekConfig, rope_interleave) MLA_RW(DeepseekConfig, has_yarn)
      MLA_RW(DeepseekConfig, yarn_factor) MLA_RW(DeepseekConfig, yarn_original_max_position_embeddings)
      MLA_RW(DeepseekConfig, yarn_beta_fast) MLA_RW(DeepseekConfig, yarn_beta_slow) MLA_RW(DeepseekConfig, yarn_mscale)
      MLA_RW(DeepseekConfig, yarn_mscale_all_dim) MLA_RW(DeepseekConfig, fp8_weights)
      MLA_RW(DeepseekConfig, weight_block_rows) MLA_RW(DeepseekConfig, weight_block_cols)
      MLA_RW(DeepseekConfig, index_topk)
      .def("softmax_scale", &DeepseekConfig::softmax_scale, "qk_head_dim^-0.5 times yarn_mscale(factor, mscale_all_dim)^2 (the correction only when mscale_all_dim is set).")
      .def("dims", &DeepseekConfig::dims, py::arg("tp") = 1, "The MLA ModelDims of one tensor-parallel rank of `tp`.");

  py::class_<Checkpoint>(m, "Checkpoint",
                         "A checkpoint directory (model.safetensors.index.json or its *.safetensors), read-only.")
      .def(py::init<const std::string&>(), py::arg("dir"))
      .def_property_readonly("dir", &Checkpoint::dir)
      .def("has", &Checkpoint::has, py::arg("name"), "Whether the checkpoint has a tensor of this name.")
      .def("names", &Checkpoint::names, "Every tensor name of the checkpoint.")
      .def("shape", [](const Checkpoint& c, const std::string& n) { return c.info(n).shape; }, py::arg("name"), "The shape of a tensor (list of ints).")
      .def("dtype", [](const Checkpoint& c, const std::string& n) { return std::string(to_string(c.info(n).dtype)); },
           py::arg("name"), "The dtype name of a tensor as stored (e.g. 'bf16', 'fp8_e4m3').")
      .def("load", [](const Checkpoint& c, const std::string& n, py::handle dtype) {
             return wrap(c.load(n, to_dtype(dtype)));
           }, py::arg("name"), py::arg("dtype"), "A host copy of the tensor converted to dtype (mla.Tensor).");

  py::class_<DeepseekOptions> deepseek_options(m, "DeepseekOptions", "Options of a DeepseekAttention block: tp and rank, cache format, sparse, ds_scale, device, dtype (bf16, f32 or f64; CUDA bf16), fp8_activations, fp8_prefill and fp8_prefill_scales (keyword constructor).");
  deepseek_options
      .def(py::init(&options_from_kwargs<DeepseekOptions>))
      MLA_RW(DeepseekOptions, tp) MLA_RW(DeepseekOptions, rank) MLA_RW(DeepseekOptions, cache_format)
      MLA_RW(DeepseekOptions, sparse) MLA_RW(DeepseekOptions, ds_scale) MLA_RW(DeepseekOptions, device)
      MLA_RW(DeepseekOptions, dtype) MLA_RW(DeepseekOptions, fp8_activations) MLA_RW(DeepseekOptions, fp8_prefill);
  def_fp8_prefill_scales(deepseek_options,
                         "(q, k, v) static scales of fp8_prefill (the layer's LayerOptions.fp8_prefill_scales); default "
                         "(1, 1, 1).");

  py::class_<DeepseekAttention>(m, "DeepseekAttention",
                                "The whole DeepSeek attention block of one layer (hidden states in, the rank's o_proj "
                                "output out); docs/BLOCK.md.")
      .def(py::init([](const DeepseekConfig& config, const py::dict& weights, const DeepseekOptions& options) {
             // weights: "<name>.weight" (and "<name>.weight_scale_inv" for fp8) -> tensor, names as in the
             // checkpoints' self_attn module (q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
             // kv_a_layernorm, kv_b_proj, o_proj).
             WeightDict d(weights, "DeepseekAttention",
                          {"q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                           "q_a_layernorm", "kv_a_layernorm"});
             DeepseekWeights w;
             w.q_a_proj = d.linear("q_a_proj");
             w.q_b_proj = d.linear("q_b_proj");
             w.q_proj = d.linear("q_proj");
             w.kv_a_proj_with_mqa = d.linear("kv_a_proj_with_mqa");
             w.kv_b_proj = d.linear("kv_b_proj");
             w.o_proj = d.linear("o_proj");
             w.q_a_layernorm = d.get("q_a_layernorm.weight");
             w.kv_a_layernorm = d.get("kv_a_layernorm.weight");
             py::gil_scoped_release release;
             return std::make_unique<DeepseekAttention>(config, w, options);
           }),
           py::arg("config"), py::arg("weights"), py::arg("options") = DeepseekOptions{})
      .def_static("load", [](const Checkpoint& ck, const DeepseekConfig& config, int layer, const DeepseekOptions& o) {
             py::gil_scoped_release release;
             return std::make_unique<DeepseekAttention>(DeepseekAttention::load(ck, config, layer, o));
           }, py::arg("checkpoint"), py::arg("config"), py::arg("layer"), py::arg("options") = DeepseekOptions{})
      .def_property_readonly("config", &DeepseekAttention::config)
      .def_property_readonly("options", &DeepseekAttention::options)
      .def_property_readonly("layer_options", &DeepseekAttention::layer_options)
      .def("planner_config", &DeepseekAttention::planner_config, "Planner settings matching the block (one rank's dims, cache format, sparse; on CUDA the device's SM count and compute capability); set the serving limits (page size, max_model_len, ...) yourself.")
      .def("projection_is_fp8", &DeepseekAttention::projection_is_fp8, py::arg("name"),
           "True when the projection runs w8a8 (fp8_activations and a block-aligned rank slice).")
      .def("workspace_bytes", &DeepseekAttention::workspace_bytes, py::arg("plan"), "Bytes of the u8 workspace forward() needs for `plan`.")
      .def("max_workspace_bytes", &DeepseekAttention::max_workspace_bytes, py::arg("config"), py::arg("max_num_tokens"), "Bytes of a workspace that serves every plan of `config` with at most max_num_tokens tokens.")
      .def("forward", [](const DeepseekAttention& b, const Plan& plan, const PyKVCache& cache, const TensorArg& workspace,
                         const TensorArg& hidden, const TensorArg& positions, const TensorArg& slot_mapping,
                         const TensorArg& block_table, const TensorArg& seq_lens, const TensorArg& out,
                         const TensorArg& topk_indices, const TensorArg& metadata, Precision p) {
        const Context ctx = to_context(hidden.view, py::none(), p);
        DeepseekForwardArgs a;
        a.hidden = hidden.view;
        a.positions = positions.view;
        a.out = out.view;
        set_step_tensors(a, slot_mapping, block_table, seq_lens, topk_indices, metadata);
        py::gil_scoped_release release;
        b.forward(plan, a, cache.cache, workspace.view, ctx);
      }, py::arg("plan"), py::arg("cache"), py::arg("workspace"), py::kw_only(), py::arg("hidden"), py::arg("positions"),
         py::arg("slot_mapping"), py::arg("block_table"), py::arg("seq_lens"), py::arg("out"),
         py::arg("topk_indices") = py::none(), py::arg("metadata") = py::none(), py::arg("precision") = Precision::fast,
         "Run one step: writes the cache at slot_mapping and out [T, hidden_size] (this rank's o_proj partial sum).");

  py::class_<DeepseekV4Config>(m, "DeepseekV4Config",
                               "DeepSeek-V4 / V4.1 attention configuration (config.json): from_file, from_json, preset "
                               "('v4-flash', 'v4-pro', 'v41-flash'); docs/SEMANTICS.md section 17.")
      .def(py::init([](const py::kwargs& kw) { return from_kwargs<DeepseekV4Config>(kw); }))
      .def_static("from_file", &DeepseekV4Config::from_file, py::arg("path"))
      .def_static("from_json", [](const std::string& text) { return DeepseekV4Config::from_json(text); },
                  py::arg("text"))
      .def_static("preset", &DeepseekV4Config::preset, py::arg("name"))
      .def_static("is_v4_file", &DeepseekV4Config::is_v4_file, py::arg("path"),
                  "Whether a config.json file describes a DeepSeek-V4 model (model_type deepseek_v4*).")
      MLA_RW(DeepseekV4Config, model_type) MLA_RW(DeepseekV4Config, hidden_size)
      MLA_RW(DeepseekV4Config, num_attention_heads) MLA_RW(DeepseekV4Config, head_dim)
      MLA_RW(DeepseekV4Config, qk_rope_head_dim) MLA_RW(DeepseekV4Config, q_lora_rank) MLA_RW(DeepseekV4Config, o_groups)
      MLA_RW(DeepseekV4Config, o_lora_rank) MLA_RW(DeepseekV4Config, sliding_window) MLA_RW(DeepseekV4Config, index_topk)
      MLA_RW(DeepseekV4Config, rms_norm_eps) MLA_RW(DeepseekV4Config, q_head_norm) MLA_RW(DeepseekV4Config, rope_theta)
      MLA_RW(DeepseekV4Config, compress_rope_theta) MLA_RW(DeepseekV4Config, compress_yarn)
      MLA_RW(DeepseekV4Config, yarn_factor) MLA_RW(DeepseekV4Config, yarn_original_max_position_embeddings)
      MLA_RW(DeepseekV4Config, yarn_beta_fast) MLA_RW(DeepseekV4Config, yarn_beta_slow)
      MLA_RW(DeepseekV4Config, compress_ratios) MLA_RW(DeepseekV4Config, fp8_weights)
      MLA_RW(DeepseekV4Config, weight_block_rows) MLA_RW(DeepseekV4Config, weight_block_cols)
      .def("compress_ratio", &DeepseekV4Config::compress_ratio, py::arg("layer"),
           "The layer's compression ratio: 0 (sliding window only), 4 (top-k picks), 128 (every causal entry).")
      .def("softmax_scale", &DeepseekV4Config::softmax_scale, "head_dim^-0.5.")
      .def("validate", &DeepseekV4Config::validate, "Raises on inconsistent dimensions.");

  py::class_<DeepseekV4Options>(m, "DeepseekV4Options",
                                "Options of a DeepseekV4Attention block: tp and rank, cache_format (the window cache) and "
                                "extra_cache_format (the compressed cache), device, dtype (bf16, f32 or f64; CUDA bf16) "
                                "(keyword constructor).")
      .def(py::init(&options_from_kwargs<DeepseekV4Options>))
      MLA_RW(DeepseekV4Options, tp) MLA_RW(DeepseekV4Options, rank) MLA_RW(DeepseekV4Options, cache_format)
      MLA_RW(DeepseekV4Options, extra_cache_format) MLA_RW(DeepseekV4Options, device) MLA_RW(DeepseekV4Options, dtype);

  py::class_<DeepseekV4Attention>(m, "DeepseekV4Attention",
                                  "The whole DeepSeek-V4 / V4.1 attention block of one layer (hidden states in, the "
                                  "rank's o_b_proj output out); docs/SEMANTICS.md section 17.")
      .def(py::init([](const DeepseekV4Config& config, int layer, const py::dict& weights,
                       const DeepseekV4Options& options) {
             // weights: "<name>.weight" (and "<name>.weight_scale_inv" for fp8) -> tensor, names as in the
             // checkpoints' self_attn module (q_a_proj, q_a_norm, q_b_proj, kv_proj, kv_norm, o_a_proj, o_b_proj),
             // and "sinks".
             WeightDict d(weights, "DeepseekV4Attention", {"q_a_proj", "q_b_proj", "kv_proj", "o_a_proj", "o_b_proj"},
                          {"q_a_norm.weight", "kv_norm.weight", "sinks"});
             DeepseekV4Weights w;
             w.q_a_proj = d.linear("q_a_proj");
             w.q_b_proj = d.linear("q_b_proj");
             w.kv_proj = d.linear("kv_proj");
             w.o_a_proj = d.linear("o_a_proj");
             w.o_b_proj = d.linear("o_b_proj");
             w.q_a_norm = d.get("q_a_norm.weight");
             w.kv_norm = d.get("kv_norm.weight");
             w.sinks = d.get("sinks");
             py::gil_scoped_release release;
             return std::make_unique<DeepseekV4Attention>(config, layer, w, options);
           }),
           py::arg("config"), py::arg("layer"), py::arg("weights"), py::arg("options") = DeepseekV4Options{})
      .def_static("load", [](const Checkpoint& ck, const DeepseekV4Config& config, int layer,
                             const DeepseekV4Options& o) {
             py::gil_scoped_release release;
             return std::make_unique<DeepseekV4Attention>(DeepseekV4Attention::load(ck, config, layer, o));
           }, py::arg("checkpoint"), py::arg("config"), py::arg("layer"), py::arg("options") = DeepseekV4Options{})
      .def_property_readonly("config", &DeepseekV4Attention::config)
      .def_property_readonly("options", &DeepseekV4Attention::options)
      .def_property_readonly("layer", &DeepseekV4Attention::layer)
      .def_property_readonly("compress_ratio", &DeepseekV4Attention::compress_ratio)
      .def_property_readonly("heads", &DeepseekV4Attention::heads, "Query heads of this rank.")
      .def("workspace_bytes", &DeepseekV4Attention::workspace_bytes, py::arg("num_tokens"), py::arg("extra_topk") = 0,
           "Bytes of the u8 workspace forward() needs for num_tokens tokens with extra_topk rows extra_topk wide.")
      .def("forward", [](const DeepseekV4Attention& b, const PyKVCache& cache, const py::object& extra_cache,
                         const TensorArg& workspace, const TensorArg& hidden, const TensorArg& positions,
                         const TensorArg& req_id, const TensorArg& block_table, const TensorArg& slot_mapping,
                         const TensorArg& out, const TensorArg& extra_kv, const TensorArg& extra_slot_mapping,
                         const TensorArg& extra_block_table, const TensorArg& extra_topk, Precision p) {
        const Context ctx = to_context(hidden.view, py::none(), p);
        DeepseekV4ForwardArgs a;
        a.hidden = hidden.view;
        a.positions = positions.view;
        a.req_id = req_id.view;
        a.block_table = block_table.view;
        a.slot_mapping = slot_mapping.view;
        a.out = out.view;
        a.extra_kv = extra_kv.view;
        a.extra_slot_mapping = extra_slot_mapping.view;
        a.extra_block_table = extra_block_table.view;
        a.extra_topk = extra_topk.view;
        const KVCache extra = extra_cache.is_none() ? KVCache{} : extra_cache.cast<const PyKVCache&>().cache;
        py::gil_scoped_release release;
        b.forward(a, cache.cache, extra, workspace.view, ctx);
      }, py::arg("cache"), py::arg("extra_cache"), py::arg("workspace"), py::kw_only(), py::arg("hidden"),
         py::arg("positions"), py::arg("req_id"), py::arg("block_table"), py::arg("slot_mapping"), py::arg("out"),
         py::arg("extra_kv") = py::none(), py::arg("extra_slot_mapping") = py::none(),
         py::arg("extra_block_table") = py::none(), py::arg("extra_topk") = py::none(),
         py::arg("precision") = Precision::fast,
         "Run one step: writes the window cache at slot_mapping, the extra cache's compressed rows extra_kv at "
         "extra_slot_mapping, and out [T, hidden_size] (this rank's o_b_proj partial sum). extra_cache: None for a "
         "layer of ratio 0.");
}

#undef MLA_RW

}  // namespace mlapy
