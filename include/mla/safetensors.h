// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checkpoint reading (docs/BLOCK.md "Checkpoints"): safetensors files, sharded checkpoint
// directories and DeepSeek's config.json.
//
// safetensors layout: u64 little-endian N | N bytes of JSON header | byte buffer. The header maps
// each tensor name to {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} (offsets
// relative to the byte buffer) plus an optional "__metadata__" string map. SafetensorsFile::open
// validates everything before any tensor is handed out and throws mla::Error naming the file and
// the problem: the header length (at least 2, at most 100 MB, inside the file), the JSON (strict
// RFC 8259, nesting of at most 3 levels, no duplicate keys), the dtype (a known name), the shape
// (non-negative integers, element count representable), the offsets (begin <= end <= buffer size,
// end - begin = elements x element size) and the buffer coverage (tensors sorted by offset tile the
// buffer exactly: no overlap, no hole, as the format's reference implementation requires). Nothing
// past the mapped file is ever read: every accessor works from the validated offsets.
//
// The file is memory-mapped read-only (MAP_PRIVATE, PROT_READ): views of its tensors must never be
// written. Data in a safetensors file need not be aligned; view() refuses a tensor whose start is not
// aligned to its element size, load() copies (and converts) from any alignment.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// Element types of the safetensors format (whole-byte types; sub-byte F4 / F6 are refused).
enum class StDType : uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };
const char* to_string(StDType t);
int st_dtype_bytes(StDType t);
// The mla DType with the same bytes and meaning, if there is one (BF16, F16, F32, F64, F8_E4M3, U8, I32, I64).
std::optional<DType> to_mla_dtype(StDType t);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;  // empty = scalar
  int64_t numel = 1;
  uint64_t begin = 0, end = 0;  // byte range inside the data buffer (validated)
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws mla::Error "<path>: <problem>" on anything malformed.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory file image (the same checks; the bytes must outlive the object). For tests
  // and fuzzing.
  static SafetensorsFile from_bytes(std::span<const std::byte> bytes, const std::string& what);

  const std::string& path() const;
  // Tensors in data-offset order.
  const std::vector<StTensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;
  const StTensorInfo* find(std::string_view name) const;  // nullptr when absent
  const StTensorInfo& info(std::string_view name) const;  // throws naming the file when absent
  std::span<const std::byte> bytes(const StTensorInfo& t) const;

  // Zero-copy read-only view (CPU) of a tensor whose dtype has an mla DType; throws otherwise, or when
  // the data is not aligned to the element size. A scalar becomes shape [1].
  TensorView view(std::string_view name) const;
  // Owning contiguous copy converted to `dtype` (floating -> any floating dtype: bf16, f16, f32, f64,
  // fp8_e4m3 with the library's rounding; integer -> i32 / i64 with range checks; same dtype = bit copy).
  Tensor load(std::string_view name, DType dtype) const;

  struct Impl;  // the mapping and the parsed header (src/io/safetensors.cpp)

 private:
  std::shared_ptr<const Impl> impl_;
};

// A checkpoint directory: model.safetensors.index.json ("weight_map": tensor name -> shard file) when
// present, else every *.safetensors file of the directory (a tensor name in two files is refused).
// Shards are opened (mapped and validated) when first used; a name the index maps to a shard that
// does not hold it is an error.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // The shard holding `name` (opened on first use); throws when the name is absent.
  const SafetensorsFile& file_of(const std::string& name) const;
  const StTensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  Tensor load(const std::string& name, DType dtype) const { return file_of(name).load(name, dtype); }

 private:
  std::string dir_;
  std::map<std::string, std::string> weight_map_;  // name -> shard file name
  mutable std::map<std::string, SafetensorsFile> shards_;
};

// DeepSeek V2 / V3 attention configuration (config.json of the checkpoint). Missing optional fields
// take DeepSeek's defaults; a present field of the wrong type, a non-positive dimension or an
// unsupported rope_scaling type throws mla::Error naming the field.
struct DeepseekConfig {
  std::string model_type;      // "deepseek_v2", "deepseek_v3", ... (informational)
  int hidden_size = 0;
  int num_attention_heads = 0;
  int q_lora_rank = 0;         // 0 = null: q_proj (V2-Lite); else q_a_proj -> norm -> q_b_proj
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool rope_interleave = true;  // the checkpoints' interleaved (x0,x1),(x2,x3).. rope pairs
  // rope_scaling (YaRN); has_yarn = false: plain RoPE with rope_theta.
  bool has_yarn = false;
  double yarn_factor = 1.0;
  int64_t yarn_original_max_position_embeddings = 4096;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double yarn_mscale = 1.0, yarn_mscale_all_dim = 0.0;
  // quantization_config: fp8 with block-scaled weights (weight_scale_inv per block).
  bool fp8_weights = false;
  int weight_block_rows = 128, weight_block_cols = 128;
  int index_topk = 0;  // DeepSeek V3.2 (DSA) top-k; 0 for dense models

  static DeepseekConfig from_json(std::string_view text, const std::string& what = "config.json");
  // The published configurations' attention fields: "v3" / "r1" (hidden 7168, 128 heads, q_lora 1536,
  // fp8 128 x 128 weights), "v3.2" (v3 + index_topk 2048), "v2-lite" (hidden 2048, 16 heads, q_proj,
  // bf16, mscale 0.707); all yarn factor 40 over 4096 positions, beta 32 / 1, rope_theta 10000.
  static DeepseekConfig preset(const std::string& name);
  static DeepseekConfig from_file(const std::string& path);
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // qk_head_dim^-0.5 * yarn_mscale(factor, mscale_all_dim)^2 (the mscale correction applies only when
  // mscale_all_dim is set, as DeepSeek's and transformers' code do).
  double softmax_scale() const;
  // Dimensions of one tensor-parallel rank (num_attention_heads / tp heads; tp must divide them).
  ModelDims dims(int tp = 1) const;
};

// The attention fields of a DeepSeek-V4 config.json (transformers' DeepseekV4Config names; the legacy
// names compress_ratios / compress_rate_csa / compress_rate_hca / qk_rope_head_dim are read too).
struct DeepseekV4Config {
  std::string model_type;  // "deepseek_v4" (informational)
  int hidden_size = 4096;
  int num_attention_heads = 64;
  int head_dim = 512;          // query / key / value width per head (K = V)
  int qk_rope_head_dim = 64;   // rope columns at the end of each head
  int q_lora_rank = 1024;
  int o_groups = 8;            // groups of heads of the grouped o projection
  int o_lora_rank = 1024;      // o_a_proj's output width per group
  int sliding_window = 128;    // positions of the window, the token's own included
  int index_topk = 512;        // the lightning indexer's picks per token (ratio-4 layers)
  double rms_norm_eps = 1e-6;
  bool q_head_norm = true;     // V4: unweighted RMSNorm of each query head; V4.1 drops it
  // RoPE: sliding-only layers ("main") plain with rope_theta; layers with a compressor ("compress") use
  // compress_rope_theta with YaRN (cos / sin not scaled: attention factor 1).
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  bool compress_yarn = true;
  double yarn_factor = 16.0;
  int64_t yarn_original_max_position_embeddings = 65536;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  // Per layer: 0 (sliding window only), or the compression ratio of its extra cache (4: CSA with the
  // indexer's top-k; 128: HCA, every causal entry).
  std::vector<int> compress_ratios;
  // quantization_config: fp8 with block-scaled weights.
  bool fp8_weights = false;
  int weight_block_rows = 128, weight_block_cols = 128;

  static DeepseekV4Config from_json(std::string_view text, const std::string& what = "config.json");
  static DeepseekV4Config from_file(const std::string& path);
  // "v4-flash" (hidden 4096, 64 heads, q_lora 1024, 8 groups), "v4-pro" (hidden 7168, 128 heads, q_lora
  // 1536, 16 groups, index_topk 1024), "v41-flash" (v4-flash without the query head norm); 4 layers with
  // ratios 0, 4, 128, 4.
  static DeepseekV4Config preset(const std::string& name);
  // Whether a config.json text describes a DeepSeek-V4 model (model_type "deepseek_v4*").
  static bool is_v4_json(std::string_view text);
  // The same for a config.json file (false when it cannot be read or parsed: from_file says why).
  static bool is_v4_file(const std::string& path);
  int compress_ratio(int layer) const;  // throws mla::Error for a layer outside compress_ratios
  double softmax_scale() const;         // head_dim^-0.5
  void validate() const;                // throws mla::Error on inconsistent dimensions
};

}  // namespace mla
