// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element types (dtype.h), cache formats (cache_format.h), devices, execution context and model-dimension presets.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mla/cache_format.h"
#include "mla/dtype.h"

namespace mla {

// CacheFormat and its description: mla/cache_format.h.

enum class DeviceType : int32_t { cpu = 1, cuda = 2 };  // values match DLPack's kDLCPU / kDLCUDA

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};
std::string to_string(const Device& d);

// CPU backend accumulation mode. `reference` accumulates every dot product, softmax and GEMM in
// float64: it is the oracle GPU kernels are tested against. `fast` accumulates in float32.
enum class Precision : uint8_t { fast = 0, reference = 1 };

// Where and how an op runs. `stream` is a cudaStream_t (nullptr = legacy default stream); the CPU
// backend ignores it. Ops never synchronise the stream themselves.
struct Context {
  void* stream = nullptr;
  Precision precision = Precision::fast;
  // Optional phase marks, for profiling only: MlaAttention::forward calls mark(name) on the host after
  // it has enqueued the previous phase's work and before the named phase's (names are static strings:
  // "write_cache", "decode", "prefill.kv_b_proj", ...; "end" closes the step). The benchmark records a
  // stream event there (bench/layer_bench.cu: per-phase times). nullptr: no calls.
  void (*phase_mark)(void* user, const char* phase) = nullptr;
  void* phase_user = nullptr;
  // Programmatic dependent launch (docs/DESIGN.md "Programmatic dependent launch"): the library's kernels of a
  // step may start while the previous kernel of the stream still runs, and wait for it on the device before
  // they touch global memory. Used where the kernel image is sm_90 or later; elsewhere, and with false, every
  // kernel starts after the previous one completed (for debugging). Graph captures keep the choice.
  bool pdl = true;
  void mark(const char* phase) const {
    if (phase_mark) phase_mark(phase_user, phase);
  }
};

// DeepSeek MLA dimensions for one tensor-parallel rank.
//   d_qk = kv_lora_rank + qk_rope_head_dim (576), d_v = kv_lora_rank (512) in the absorbed (MQA) form;
//   the prefill (MHA) form uses qk_nope_head_dim + qk_rope_head_dim (192) and v_head_dim (128).
struct ModelDims {
  int kv_lora_rank = 512;      // L
  int qk_rope_head_dim = 64;   // R
  int qk_nope_head_dim = 128;  // P
  int v_head_dim = 128;        // V
  int num_heads = 128;         // h_q: query heads on this rank (any value >= 1)
  double softmax_scale = 0.0;  // 1/sqrt(P+R) * yarn mscale^2
  int index_topk = 0;          // sparse (DSA) top-k; 0 for dense models
  std::string name = "custom";

  int d_qk() const { return kv_lora_rank + qk_rope_head_dim; }  // 576
  int d_v() const { return kv_lora_rank; }                       // 512
  int d_qk_mha() const { return qk_nope_head_dim + qk_rope_head_dim; }  // 192

  // Presets. `tp` divides the model's total head count (ceil for ranks that do not divide evenly is
  // not meaningful: tp must divide the head count). Throws mla::Error otherwise.
  static ModelDims deepseek_v2_lite(int tp = 1);  // 16 heads total
  static ModelDims deepseek_v3(int tp = 1);       // 128 heads total (also R1)
  static ModelDims deepseek_v32(int tp = 1);      // V3 dims + index_topk 2048
  static ModelDims preset(const std::string& name, int tp = 1);  // "v2-lite", "v3", "r1", "v3.2"
  void validate() const;  // throws mla::Error on non-positive dims
};

// YaRN attention scale factor: 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1).
double yarn_mscale(double factor, double mscale_all_dim);

}  // namespace mla
