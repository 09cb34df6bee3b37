// SPDX-License-Identifier: Apache-2.0
// Checkpoint directories (index JSON / shards) and DeepSeek config.json (mla/safetensors.h).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/check.h"
#include "io/json_util.h"
#include "mla/safetensors.h"

namespace mla {

namespace {

constexpr std::size_t kMaxJsonFile = 64ull << 20;

// A shard name from an index: a plain file name inside the directory.
void check_shard_name(const std::string& what, const std::string& file) {
  MLA_CHECK(!file.empty() && file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                file != "." && file != "..",
            "{}: shard '{}' is not a plain file name inside the checkpoint directory", what, file);
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  MLA_CHECK(fs::is_directory(dir, ec), "checkpoint '{}' is not a directory", dir);
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  // Any entry of that name (a symlink too, even a broken or looping one) is the index: read_text_file
  // refuses what is not a readable regular file. No std::filesystem call below may throw.
  if (fs::exists(fs::symlink_status(index, ec))) {
    const std::string what = index.string();
    const nlohmann::json j = io::parse_json_strict(io::read_text_file(what, kMaxJsonFile), what, 4);
    MLA_CHECK(j.is_object(), "{}: not a JSON object", what);
    const auto wm = j.find("weight_map");
    MLA_CHECK(wm != j.end() && wm->is_object(), "{}: \"weight_map\" must be an object of tensor name -> shard", what);
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      MLA_CHECK(it->is_string(), "{}: weight_map entry '{}' is not a string", what, it.key());
      const std::string file = it->get<std::string>();
      check_shard_name(what, file);
      weight_map_[it.key()] = file;
    }
    return;
  }
  // No index: every *.safetensors file of the directory.
  // Every entry named *.safetensors must resolve to a regular file: a symlink loop, a dangling link,
  // a FIFO or a directory of that name is refused by name (error codes throughout: a directory
  // iterator's increment or an entry's status would otherwise throw std::filesystem_error).
  std::vector<std::string> files;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() != ".safetensors") continue;
    std::error_code sec;
    const fs::file_status st = fs::status(p, sec);
    MLA_CHECK(!sec && fs::is_regular_file(st), "checkpoint '{}': {} is not a readable regular file{}", dir,
              p.filename().string(), sec ? " (" + sec.message() + ")" : std::string());
    files.push_back(p.filename().string());
  }
  MLA_CHECK(!ec, "checkpoint '{}': cannot list the directory: {}", dir, ec.message());
  MLA_CHECK(!files.empty(), "checkpoint '{}' has neither model.safetensors.index.json nor *.safetensors files", dir);
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const SafetensorsFile& f = shards_.emplace(file, SafetensorsFile::open((fs::path(dir) / file).string())).first->second;
    for (const auto& t : f.tensors()) {
      const auto [it, inserted] = weight_map_.emplace(t.name, file);
      MLA_CHECK(inserted, "checkpoint '{}': tensor '{}' is in both {} and {}", dir, t.name, it->second, file);
    }
  }
}

bool Checkpoint::has(const std::string& name) const { return weight_map_.count(name) != 0; }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : weight_map_) n.push_back(k);
  return n;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  const auto it = weight_map_.find(name);
  MLA_CHECK(it != weight_map_.end(), "checkpoint '{}' has no tensor '{}'", dir_, name);
  auto s = shards_.find(it->second);
  if (s == shards_.end())
    s = shards_.emplace(it->second, SafetensorsFile::open((std::filesystem::path(dir_) / it->second).string())).first;
  MLA_CHECK(s->second.find(name) != nullptr, "checkpoint '{}': the index maps '{}' to {}, which does not hold it", dir_,
            name, it->second);
  return s->second;
}

// ---- config.json ----------------------------------------------------------------------------

namespace {

struct Fields {
  const nlohmann::json& j;
  const std::string& what;
  const std::string prefix;

  const nlohmann::json* get(const char* key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int integer(const char* key, int def, bool required = false) const {
    const nlohmann::json* v = get(key);
    if (!v) {
      MLA_CHECK(!required, "{}: \"{}{}\" is required", what, prefix, key);
      return def;
    }
    MLA_CHECK(v->is_number_integer() && v->get<int64_t>() > 0 && v->get<int64_t>() <= (1 << 24),
              "{}: \"{}{}\" must be a positive integer (at most 2^24), got {}", what, prefix, key, v->dump());
    return static_cast<int>(v->get<int64_t>());
  }
  double number(const char* key, double def, bool positive = true) const {
    const nlohmann::json* v = get(key);
    if (!v) return def;
    MLA_CHECK(v->is_number() && std::isfinite(v->get<double>()) && (!positive || v->get<double>() > 0) &&
                  (positive || v->get<double>() >= 0),
              "{}: \"{}{}\" must be a {} finite number, got {}", what, prefix, key,
              positive ? "positive" : "non-negative", v->dump());
    return v->get<double>();
  }
};

// A rope parameters object: its type ("default" or "yarn", under "type" or "rope_type") and, for yarn,
// factor (required), original_max_position_embeddings and beta_fast / beta_slow. Returns whether it
// is yarn; `r`'s prefix names it in errors, `model` in the unsupported-type message.
bool read_yarn(const Fields& r, const std::string& what, const char* model, double& factor, int64_t& orig,
               double& beta_fast, double& beta_slow) {
  std::string type = "default";
  for (const char* key : {"type", "rope_type"})
    if (const auto* t = r.get(key)) {
      MLA_CHECK(t->is_string(), "{}: \"{}{}\" must be a string", what, r.prefix, key);
      type = t->get<std::string>();
    }
  MLA_CHECK(type == "yarn" || type == "default", "{}: {}type '{}' is not supported ({} uses 'yarn')", what, r.prefix,
            type, model);
  if (type != "yarn") return false;
  factor = r.number("factor", 0.0);
  MLA_CHECK(factor > 0, "{}: \"{}factor\" is required for yarn", what, r.prefix);
  orig = r.integer("original_max_position_embeddings", static_cast<int>(orig));
  beta_fast = r.number("beta_fast", 32.0);
  beta_slow = r.number("beta_slow", 1.0);
  return true;
}

// quantization_config: fp8 (e4m3) weights with block scales of weight_block_size.
void read_fp8_quantization(const Fields& f, const std::string& what, bool& fp8, int& block_rows, int& block_cols) {
  if (const auto* q = f.get("quantization_config")) {
    MLA_CHECK(q->is_object(), "{}: \"quantization_config\" must be an object", what);
    const auto m = q->find("quant_method");
    MLA_CHECK(m != q->end() && m->is_string() && m->get<std::string>() == "fp8",
              "{}: quantization_config.quant_method must be \"fp8\" (block-scaled e4m3 weights), got {}", what,
              m == q->end() ? std::string("nothing") : m->dump());
    if (const auto fmt_it = q->find("fmt"); fmt_it != q->end())
      MLA_CHECK(fmt_it->is_string() && fmt_it->get<std::string>() == "e4m3",
                "{}: quantization_config.fmt must be \"e4m3\", got {}", what, fmt_it->dump());
    const auto b = q->find("weight_block_size");
    MLA_CHECK(b != q->end() && b->is_array() && b->size() == 2 && (*b)[0].is_number_integer() &&
                  (*b)[1].is_number_integer() && (*b)[0].get<int64_t>() > 0 && (*b)[1].get<int64_t>() > 0 &&
                  (*b)[0].get<int64_t>() <= 65536 && (*b)[1].get<int64_t>() <= 65536,
              "{}: quantization_config.weight_block_size must be two positive integers", what);
    fp8 = true;
    block_rows = static_cast<int>((*b)[0].get<int64_t>());
    block_cols = static_cast<int>((*b)[1].get<int64_t>());
  }
}

}  // namespace

DeepseekConfig DeepseekConfig::from_json(std::string_view text, const std::string& what) {
  const nlohmann::json j = io::parse_json_strict(text, what, 8);
  MLA_CHECK(j.is_object(), "{}: not a JSON object", what);
  const Fields f{j, what, ""};
  DeepseekConfig c;
  if (const auto* v = f.get("model_type")) {
    MLA_CHECK(v->is_string(), "{}: \"model_type\" must be a string", what);
    c.model_type = v->get<std::string>();
  }
  c.hidden_size = f.integer("hidden_size", 0, true);
  c.num_attention_heads = f.integer("num_attention_heads", 0, true);
  c.q_lora_rank = f.integer("q_lora_rank", 0);  // null / absent: q_proj
  c.kv_lora_rank = f.integer("kv_lora_rank", 512);
  c.qk_nope_head_dim = f.integer("qk_nope_head_dim", 128);
  c.qk_rope_head_dim = f.integer("qk_rope_head_dim", 64);
  c.v_head_dim = f.integer("v_head_dim", 128);
  MLA_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: \"qk_rope_head_dim\" must be even (rope pairs), got {}", what,
            c.qk_rope_head_dim);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (const auto* v = f.get("rope_interleave")) {
    MLA_CHECK(v->is_boolean(), "{}: \"rope_interleave\" must be true or false", what);
    c.rope_interleave = v->get<bool>();
  }
  if (const auto* v = f.get("index_topk")) {
    MLA_CHECK(v->is_number_integer() && v->get<int64_t>() >= 0 && v->get<int64_t>() <= (1 << 24),
              "{}: \"index_topk\" must be a non-negative integer", what);
    c.index_topk = static_cast<int>(v->get<int64_t>());
  }
  // rope: rope_theta at the top (V2 / V3 configs) or inside rope_parameters (newer transformers).
  c.rope_theta = f.number("rope_theta", 10000.0);
  const nlohmann::json* rs = f.get("rope_scaling");
  if (!rs) rs = f.get("rope_parameters");
  if (rs) {
    MLA_CHECK(rs->is_object(), "{}: \"rope_scaling\" must be an object or null", what);
    const Fields r{*rs, what, "rope_scaling."};
    c.rope_theta = r.number("rope_theta", c.rope_theta);
    if (read_yarn(r, what, "DeepSeek", c.yarn_factor, c.yarn_original_max_position_embeddings, c.yarn_beta_fast,
                  c.yarn_beta_slow)) {
      c.has_yarn = true;
      c.yarn_mscale = r.number("mscale", 1.0, false);
      c.yarn_mscale_all_dim = r.number("mscale_all_dim", 0.0, false);
    }
  }
  read_fp8_quantization(f, what, c.fp8_weights, c.weight_block_rows, c.weight_block_cols);
  return c;
}

DeepseekConfig DeepseekConfig::preset(const std::string& name) {
  DeepseekConfig c;
  c.has_yarn = true;
  c.yarn_factor = 40.0;
  c.yarn_original_max_position_embeddings = 4096;
  if (name == "v2-lite" || name == "deepseek-v2-lite") {
    c.model_type = "deepseek_v2";
    c.hidden_size = 2048;
    c.num_attention_heads = 16;
    c.q_lora_rank = 0;
    c.yarn_mscale = c.yarn_mscale_all_dim = 0.707;
    return c;
  }
  const bool v32 = name == "v3.2" || name == "deepseek-v3.2";
  MLA_CHECK(v32 || name == "v3" || name == "r1" || name == "deepseek-v3" || name == "deepseek-r1",
            "unknown model preset '{}': expected v2-lite, v3, r1 or v3.2", name);
  c.model_type = v32 ? "deepseek_v32" : "deepseek_v3";
  c.hidden_size = 7168;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.yarn_mscale = c.yarn_mscale_all_dim = 1.0;
  c.fp8_weights = true;
  c.index_topk = v32 ? 2048 : 0;
  return c;
}

DeepseekConfig DeepseekConfig::from_file(const std::string& path) {
  return from_json(io::read_text_file(path, kMaxJsonFile), path);
}

double DeepseekConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (has_yarn && yarn_mscale_all_dim != 0.0) {
    const double m = ::mla::yarn_mscale(yarn_factor, yarn_mscale_all_dim);
    s *= m * m;
  }
  return s;
}

ModelDims DeepseekConfig::dims(int tp) const {
  MLA_CHECK(tp >= 1 && num_attention_heads % tp == 0,
            "tensor-parallel size {} must divide the {} attention heads", tp, num_attention_heads);
  ModelDims d;
  d.name = model_type.empty() ? "checkpoint" : model_type;
  d.kv_lora_rank = kv_lora_rank;
  d.qk_rope_head_dim = qk_rope_head_dim;
  d.qk_nope_head_dim = qk_nope_head_dim;
  d.v_head_dim = v_head_dim;
  d.num_heads = num_attention_heads / tp;
  d.softmax_scale = softmax_scale();
  d.index_topk = index_topk;
  return d;
}


// ---- DeepSeek-V4 config.json ----------------------------------------------------------------

namespace {

// A per-layer type of transformers' DeepseekV4Config (layer_types) as its compression ratio.
int v4_ratio_of_type(const std::string& type, int csa, int hca, const std::string& what) {
  if (type == "sliding_attention") return 0;
  if (type == "compressed_sparse_attention") return csa;
  if (type == "heavily_compressed_attention") return hca;
  throw Error(fmt::format("{}: layer_types entry '{}' is not one of sliding_attention, compressed_sparse_attention, "
                          "heavily_compressed_attention",
                          what, type));
}

}  // namespace

bool DeepseekV4Config::is_v4_json(std::string_view text) {
  try {
    const nlohmann::json j = io::parse_json_strict(text, "config.json", 8);
    const auto it = j.find("model_type");
    return j.is_object() && it != j.end() && it->is_string() && it->get<std::string>().rfind("deepseek_v4", 0) == 0;
  } catch (const Error&) {
    return false;
  }
}

bool DeepseekV4Config::is_v4_file(const std::string& path) {
  try {
    return is_v4_json(io::read_text_file(path, kMaxJsonFile));
  } catch (const Error&) {
    return false;
  }
}

DeepseekV4Config DeepseekV4Config::from_json(std::string_view text, const std::string& what) {
  const nlohmann::json j = io::parse_json_strict(text, what, 8);
  MLA_CHECK(j.is_object(), "{}: not a JSON object", what);
  const Fields f{j, what, ""};
  DeepseekV4Config c;
  if (const auto* v = f.get("model_type")) {
    MLA_CHECK(v->is_string(), "{}: \"model_type\" must be a string", what);
    c.model_type = v->get<std::string>();
  }
  c.hidden_size = f.integer("hidden_size", 0, true);
  c.num_attention_heads = f.integer("num_attention_heads", 0, true);
  c.head_dim = f.integer("head_dim", c.head_dim);
  c.q_lora_rank = f.integer("q_lora_rank", c.q_lora_rank);
  c.o_groups = f.integer("o_groups", c.o_groups);
  c.o_lora_rank = f.integer("o_lora_rank", c.o_lora_rank);
  c.sliding_window = f.integer("sliding_window", c.sliding_window);
  c.index_topk = f.integer("index_topk", c.index_topk);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (const auto* v = f.get("num_key_value_heads"))
    MLA_CHECK(v->is_number_integer() && v->get<int64_t>() == 1,
              "{}: DeepSeek-V4 attention has one shared key/value head, got num_key_value_heads {}", what, v->dump());
  if (f.get("qk_rope_head_dim")) {
    c.qk_rope_head_dim = f.integer("qk_rope_head_dim", 64);
  } else if (f.get("partial_rotary_factor")) {
    const double p = f.number("partial_rotary_factor", 0.125);
    const double r = p * c.head_dim;
    MLA_CHECK(r == std::floor(r) && r >= 2 && r <= c.head_dim, "{}: partial_rotary_factor {} of head_dim {} is not a "
              "whole number of rope columns", what, p, c.head_dim);
    c.qk_rope_head_dim = static_cast<int>(r);
  } else {
    c.qk_rope_head_dim = 64;
  }
  if (const auto* v = f.get("q_head_norm")) {
    MLA_CHECK(v->is_boolean(), "{}: \"q_head_norm\" must be true or false", what);
    c.q_head_norm = v->get<bool>();
  }
  c.rope_theta = f.number("rope_theta", c.rope_theta);
  c.compress_rope_theta = f.number("compress_rope_theta", c.compress_rope_theta);
  // rope_parameters: nested {"main": {...}, "compress": {...}} (transformers), or the flat YaRN
  // parameters of the compressed layers (rope_scaling, the published configs).
  c.compress_yarn = false;
  const nlohmann::json* rs = f.get("rope_parameters");
  if (!rs) rs = f.get("rope_scaling");
  if (rs) {
    MLA_CHECK(rs->is_object(), "{}: \"rope_parameters\" must be an object or null", what);
    const nlohmann::json* yarn = rs;
    if (const auto m = rs->find("main"); m != rs->end()) {
      MLA_CHECK(m->is_object(), "{}: \"rope_parameters.main\" must be an object", what);
      c.rope_theta = Fields{*m, what, "rope_parameters.main."}.number("rope_theta", c.rope_theta);
      const auto t = m->find("rope_type");
      MLA_CHECK(t == m->end() || (t->is_string() && t->get<std::string>() == "default"),
                "{}: rope_parameters.main.rope_type must be \"default\" (plain RoPE)", what);
      const auto cm = rs->find("compress");
      MLA_CHECK(cm != rs->end() && cm->is_object(), "{}: \"rope_parameters.compress\" must be an object", what);
      yarn = &*cm;
      c.compress_rope_theta = Fields{*cm, what, "rope_parameters.compress."}.number("rope_theta", c.compress_rope_theta);
    }
    const Fields r{*yarn, what, yarn == rs ? "rope_parameters." : "rope_parameters.compress."};
    if (read_yarn(r, what, "DeepSeek-V4", c.yarn_factor, c.yarn_original_max_position_embeddings, c.yarn_beta_fast,
                  c.yarn_beta_slow)) {
      c.compress_yarn = true;
      // transformers scales V4's cos / sin by nothing (attention_factor 1.0); another value is not V4.
      if (const auto* a = r.get("attention_factor"))
        MLA_CHECK(a->is_number() && a->get<double>() == 1.0,
                  "{}: rope attention_factor must be 1.0 for DeepSeek-V4, got {}", what, a->dump());
    }
  }
  // Compression ratio of each layer: layer_types (transformers) or compress_ratios (legacy).
  int csa = 4, hca = 128;
  if (const auto* r = f.get("compress_rates")) {
    MLA_CHECK(r->is_object(), "{}: \"compress_rates\" must be an object", what);
    const Fields rf{*r, what, "compress_rates."};
    csa = rf.integer("compressed_sparse_attention", csa);
    hca = rf.integer("heavily_compressed_attention", hca);
  }
  csa = f.integer("compress_rate_csa", csa);
  hca = f.integer("compress_rate_hca", hca);
  const int layers = f.integer("num_hidden_layers", 1);
  if (const auto* lt = f.get("layer_types")) {
    MLA_CHECK(lt->is_array(), "{}: \"layer_types\" must be an array of strings", what);
    for (const auto& e : *lt) {
      MLA_CHECK(e.is_string(), "{}: \"layer_types\" entries must be strings, got {}", what, e.dump());
      c.compress_ratios.push_back(v4_ratio_of_type(e.get<std::string>(), csa, hca, what));
    }
  } else if (const auto* cr = f.get("compress_ratios")) {
    MLA_CHECK(cr->is_array(), "{}: \"compress_ratios\" must be an array of integers", what);
    for (const auto& e : *cr) {
      MLA_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() <= (1 << 20),
                "{}: \"compress_ratios\" entries must be integers in [0, 2^20], got {}", what, e.dump());
      c.compress_ratios.push_back(static_cast<int>(e.get<int64_t>()));
    }
  } else {
    // transformers' default schedule: two HCA layers, then CSA / HCA alternating.
    for (int i = 0; i < layers; ++i) c.compress_ratios.push_back(i < 2 ? hca : (i - 2) % 2 ? csa : hca);
  }
  if (static_cast<int>(c.compress_ratios.size()) > layers) c.compress_ratios.resize(static_cast<std::size_t>(layers));
  read_fp8_quantization(f, what, c.fp8_weights, c.weight_block_rows, c.weight_block_cols);
  c.validate();
  return c;
}

DeepseekV4Config DeepseekV4Config::from_file(const std::string& path) {
  return from_json(io::read_text_file(path, kMaxJsonFile), path);
}

DeepseekV4Config DeepseekV4Config::preset(const std::string& name) {
  DeepseekV4Config c;
  c.model_type = "deepseek_v4";
  c.compress_ratios = {0, 4, 128, 4};
  if (name == "v4-flash" || name == "v41-flash") {
    c.q_head_norm = name == "v4-flash";
  } else {
    MLA_CHECK(name == "v4-pro", "unknown DeepSeek-V4 preset '{}': expected v4-flash, v4-pro or v41-flash", name);
    c.hidden_size = 7168;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.o_groups = 16;
    c.index_topk = 1024;
  }
  c.fp8_weights = true;
  c.validate();
  return c;
}

int DeepseekV4Config::compress_ratio(int layer) const {
  MLA_CHECK(layer >= 0 && layer < static_cast<int>(compress_ratios.size()),
            "DeepSeek-V4 config: layer {} is outside the {} layers of compress_ratios / layer_types", layer,
            compress_ratios.size());
  return compress_ratios[static_cast<std::size_t>(layer)];
}

double DeepseekV4Config::softmax_scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

void DeepseekV4Config::validate() const {
  MLA_CHECK(hidden_size > 0 && num_attention_heads > 0 && q_lora_rank > 0 && o_lora_rank > 0 && sliding_window > 0,
            "DeepSeek-V4 config: hidden_size {}, num_attention_heads {}, q_lora_rank {}, o_lora_rank {} and "
            "sliding_window {} must be positive",
            hidden_size, num_attention_heads, q_lora_rank, o_lora_rank, sliding_window);
  MLA_CHECK(qk_rope_head_dim > 0 && qk_rope_head_dim % 2 == 0 && qk_rope_head_dim < head_dim,
            "DeepSeek-V4 config: the rope columns ({}) must be even, positive and fewer than head_dim {}",
            qk_rope_head_dim, head_dim);
  MLA_CHECK(o_groups > 0 && num_attention_heads % o_groups == 0,
            "DeepSeek-V4 config: o_groups {} must divide num_attention_heads {}", o_groups, num_attention_heads);
  MLA_CHECK(rms_norm_eps >= 0 && std::isfinite(rms_norm_eps), "DeepSeek-V4 config: rms_norm_eps must be finite, >= 0");
}

}  // namespace mla
