// SPDX-License-Identifier: Apache-2.0
#pragma once
// The layer's quantised output (LayerOptions::out_quant) for tests/unit and tests/gpu: buffers in
// quantize_output's layouts, one forward step writing them, and their reference, quantize_output of the
// same layer's unquantised output.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "mla/block_ops.h"
#include "unit/layer_test_util.h"

namespace mla::test::layer {

// A quantised output of `rows` rows of width W on `device`, poisoned (0xff bytes).
struct QuantOut {
  Tensor codes, scales;
};
inline QuantOut quant_out(OutputQuant key, int64_t rows, int64_t W, Device device) {
  QuantOut q;
  const int64_t G = output_quant_group(key);
  q.codes = poisoned({rows, key == OutputQuant::nvfp4 ? W / 2 : W},
                     key == OutputQuant::nvfp4 ? DType::u8 : DType::fp8_e4m3, device);
  if (key == OutputQuant::nvfp4) q.scales = poisoned({rows, W / 16}, DType::fp8_e4m3, device);
  else if (G > 0) q.scales = poisoned({W / G, rows}, DType::f32, device);
  return q;
}

// Host bytes of a tensor on any device.
inline std::vector<uint8_t> host_bytes(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

inline LayerOptions quant_options(const StepData& d, Device device, DType dtype, OutputQuant key, float out_scale) {
  LayerOptions o = d.sc.options(device, dtype);
  o.out_quant = key;
  o.out_scale = out_scale;
  return o;
}

// One forward step with out_quant = key into `rows` (>= t_act) output rows, on a fresh cache and a
// 0xff-filled workspace of workspace_bytes(plan).
inline QuantOut run_layer_quantised(const StepData& d, Device device, DType dtype, Precision precision,
                                    OutputQuant key, float out_scale, int64_t rows) {
  const MlaAttention layer(quant_options(d, device, dtype, key, out_scale), d.weight);
  CacheBuffer cb = make_cache(d, device);
  DeviceArgs a = device_args(d, device, dtype);
  QuantOut q = quant_out(key, rows, d.sc.h * d.sc.V, device);
  ForwardArgs fa = a.args();
  fa.out = q.codes;
  if (q.scales.defined()) fa.out_scales = q.scales;
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8, device);
  fill(ws.view(), 255.0);
  layer.forward(d.plan, fa, cb.cache, ws.view(), Context{nullptr, precision});
  return q;
}

// quantize_output of the unquantised layer's output rows [0, t_act) into `rows` rows, on `device`.
inline QuantOut quantise_unfused(const StepData& d, Device device, DType dtype, Precision precision, OutputQuant key,
                                 float out_scale, int64_t rows) {
  const MlaAttention layer(d.sc.options(device, dtype), d.weight);
  CacheBuffer cb = make_cache(d, device);
  DeviceArgs a = device_args(d, device, dtype);
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8, device);
  fill(ws.view(), 255.0);
  layer.forward(d.plan, a.args(), cb.cache, ws.view(), Context{nullptr, precision});
  QuantOut q = quant_out(key, rows, d.sc.h * d.sc.V, device);
  quantize_output(a.out.view().slice(0, 0, d.t_act), key, q.codes, q.scales.defined() ? q.scales.view() : TensorView{},
                  out_scale);
  return q;
}

}  // namespace mla::test::layer
