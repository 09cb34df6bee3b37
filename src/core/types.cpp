// SPDX-License-Identifier: Apache-2.0
#include "mla/types.h"

#include <cmath>

#include "core/check.h"

namespace mla {

std::size_t dtype_size(DType t) {
  const int n = dtype_bytes(t);
  if (n == 0) throw Error(fmt::format("dtype_size: unknown DType value {}", static_cast<int>(t)));
  return static_cast<std::size_t>(n);
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16 || t == DType::fp8_e4m3;
}

std::string to_string(const Device& d) {
  if (d.is_cuda()) return fmt::format("cuda:{}", d.index);
  if (d.is_cpu()) return "cpu";
  return fmt::format("<invalid device type {}>", static_cast<int32_t>(d.type));
}

double yarn_mscale(double factor, double mscale_all_dim) {
  if (factor <= 1.0) return 1.0;
  return 0.1 * mscale_all_dim * std::log(factor) + 1.0;
}

namespace {
ModelDims deepseek(const char* name, int total_heads, int tp, double mscale_all_dim, int topk) {
  MLA_CHECK(tp >= 1 && total_heads % tp == 0,
            "{}: tensor-parallel size must divide the {} heads, got tp={}", name, total_heads, tp);
  ModelDims d;
  d.name = name;
  d.num_heads = total_heads / tp;
  const double m = yarn_mscale(40.0, mscale_all_dim);  // rope_scaling factor 40 in all DeepSeek V2/V3 configs
  d.softmax_scale = m * m / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  d.index_topk = topk;
  return d;
}
}  // namespace

ModelDims ModelDims::deepseek_v2_lite(int tp) { return deepseek("deepseek-v2-lite", 16, tp, 0.707, 0); }
ModelDims ModelDims::deepseek_v3(int tp) { return deepseek("deepseek-v3", 128, tp, 1.0, 0); }
ModelDims ModelDims::deepseek_v32(int tp) { return deepseek("deepseek-v3.2", 128, tp, 1.0, 2048); }

ModelDims ModelDims::preset(const std::string& name, int tp) {
  if (name == "v2-lite" || name == "deepseek-v2-lite") return deepseek_v2_lite(tp);
  if (name == "v3" || name == "r1" || name == "deepseek-v3" || name == "deepseek-r1") return deepseek_v3(tp);
  if (name == "v3.2" || name == "deepseek-v3.2") return deepseek_v32(tp);
  throw Error(fmt::format("unknown model preset '{}': expected v2-lite, v3, r1 or v3.2", name));
}

void ModelDims::validate() const {
  MLA_CHECK(kv_lora_rank > 0 && qk_rope_head_dim > 0 && qk_nope_head_dim > 0 && v_head_dim > 0 && num_heads > 0,
            "model dims must be positive, got L={} R={} P={} V={} heads={}", kv_lora_rank, qk_rope_head_dim,
            qk_nope_head_dim, v_head_dim, num_heads);
  MLA_CHECK(softmax_scale > 0 && std::isfinite(softmax_scale), "softmax_scale must be positive and finite, got {}",
            softmax_scale);
  MLA_CHECK(index_topk >= 0, "index_topk must be >= 0, got {}", index_topk);
}

}  // namespace mla
