// SPDX-License-Identifier: Apache-2.0
// Output quantisation and KV scales from the data on CUDA (docs/SEMANTICS.md §15, §16): quantize_output
// and abs_max against the CPU backend byte for byte (every key, bf16 and f32 inputs, zero and NaN
// groups, padding rows), the layer's quantised output against the CPU quantisation of the CUDA
// layer's own unquantised output (dense mixed batches with padding, sparse), and the calibrated fp8
// cache scale and cache bytes against the CPU layer's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "mla/block_ops.h"
#include "unit/layer_quant_util.h"

namespace mla::test::layer {
namespace {

const Device kGpu = Device::cuda(0);
constexpr OutputQuant kKeys[] = {OutputQuant::fp8, OutputQuant::fp8_group128, OutputQuant::fp8_group64,
                                 OutputQuant::nvfp4};

float key_scale(OutputQuant k) { return k == OutputQuant::nvfp4 ? 448.0f * 6.0f / 4.0f : 1.0f / 32.0f; }

// Byte streams equal, NaN codes of either sign counting as equal (e4m3 0x7f / 0xff; an f32 NaN scale's
// bytes are compared as NaN when `f32`). Returns "" or the first difference.
std::string compare_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, bool f32,
                          bool e4m3) {
  if (got.size() != want.size()) return "sizes differ";
  if (f32) {
    for (std::size_t i = 0; i + 4 <= got.size(); i += 4) {
      float a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (!(a == b || (std::isnan(a) && std::isnan(b)))) return "scale " + std::to_string(i / 4);
    }
    return "";
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool nan = e4m3 && (got[i] & 0x7f) == 0x7f && (want[i] & 0x7f) == 0x7f;
    if (got[i] != want[i] && !nan)
      return "byte " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
  }
  return "";
}

// Codes within one code of each other (the signed code index: magnitude with the sign applied), scales
// within one code (nvfp4's e4m3 scale codes) or 2^-7 relative (f32 group scales; NaN equal to NaN).
std::string compare_within_one_code(const QuantOut& got, const QuantOut& want, OutputQuant k) {
  const bool fp4 = k == OutputQuant::nvfp4;
  auto index = [](int mag, bool neg) { return neg ? -mag : mag; };
  const std::vector<uint8_t> gc = host_bytes(got.codes), wc = host_bytes(want.codes);
  if (gc.size() != wc.size()) return "code sizes differ";
  for (std::size_t i = 0; i < gc.size(); ++i)
    for (int half = 0; half < (fp4 ? 2 : 1); ++half) {
      const int a = fp4 ? (gc[i] >> (4 * half)) & 0xf : gc[i], b = fp4 ? (wc[i] >> (4 * half)) & 0xf : wc[i];
      const int mask = fp4 ? 0x7 : 0x7f, sign = fp4 ? 0x8 : 0x80;
      if (!fp4 && (a & mask) == 0x7f && (b & mask) == 0x7f) continue;  // NaN codes
      if (std::abs(index(a & mask, a & sign) - index(b & mask, b & sign)) > 1)
        return "code at byte " + std::to_string(i) + ": " + std::to_string(a) + " vs " + std::to_string(b);
    }
  const std::vector<uint8_t> gs = host_bytes(got.scales), ws = host_bytes(want.scales);
  if (gs.size() != ws.size()) return "scale sizes differ";
  for (std::size_t i = 0; fp4 && i < gs.size(); ++i)
    if (std::abs(index(gs[i] & 0x7f, gs[i] & 0x80) - index(ws[i] & 0x7f, ws[i] & 0x80)) > 1)
      return "scale code " + std::to_string(i);
  for (std::size_t i = 0; !fp4 && i + 4 <= gs.size(); i += 4) {
    float a, b;
    std::memcpy(&a, &gs[i], 4);
    std::memcpy(&b, &ws[i], 4);
    if (!(std::fabs(a - b) <= 0x1.0p-7 * std::fabs(b) || (std::isnan(a) && std::isnan(b))))
      return "scale " + std::to_string(i / 4) + ": " + std::to_string(a) + " vs " + std::to_string(b);
  }
  return "";
}

void expect_same(const QuantOut& got, const QuantOut& want, OutputQuant k, const std::string& what) {
  EXPECT_EQ(compare_bytes(host_bytes(got.codes), host_bytes(want.codes), false, k != OutputQuant::nvfp4), "")
      << to_string(k) << " codes, " << what;
  EXPECT_EQ(compare_bytes(host_bytes(got.scales), host_bytes(want.scales), k != OutputQuant::nvfp4, true), "")
      << to_string(k) << " scales, " << what;
}

TEST(OutputQuantGpu, EveryKeyMatchesCpuBytes) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(41);
  for (const DType in : {DType::bf16, DType::f32}) {
    const int64_t M = 37, K = 512, M_pad = 40;
    Tensor x = random_tensor({M, K}, in, Device::cpu(), -3.0, 3.0);
    fill(x.view().slice(0, 3, 4).slice(1, 128, 256), 0.0);   // an all-zero group (and nvfp4 blocks)
    fill(x.view().slice(0, 5, 6).slice(1, 70, 71), NAN);     // a NaN in a group of 128 / 64 / 16
    fill(x.view().slice(0, 6, 7).slice(1, 10, 11), 1e6);     // saturation
    const Tensor xd = x.to(kGpu);
    for (OutputQuant k : kKeys) {
      const QuantOut cpu = quant_out(k, M_pad, K, Device::cpu()), gpu = quant_out(k, M_pad, K, kGpu);
      quantize_output(x.view(), k, cpu.codes, cpu.scales.defined() ? cpu.scales.view() : TensorView{}, key_scale(k));
      quantize_output(xd.view(), k, gpu.codes, gpu.scales.defined() ? gpu.scales.view() : TensorView{}, key_scale(k));
      expect_same(gpu, cpu, k, to_string(in));
    }
  }
}

TEST(OutputQuantGpu, AbsMaxMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(42);
  Tensor x = random_tensor({300, 576}, DType::bf16, Device::cpu(), -2.0, 2.0);
  fill(x.view().slice(0, 123, 124).slice(1, 7, 8), -9.5);
  Tensor out = poisoned({1}, DType::f32), dout = poisoned({1}, DType::f32, kGpu);
  abs_max(x.view(), out.view());
  abs_max(x.to(kGpu).view(), dout.view());
  EXPECT_EQ(to_doubles(dout.view())[0], 9.5);
  EXPECT_EQ(to_doubles(out.view())[0], 9.5);
  fill(x.view().slice(0, 299, 300).slice(1, 575, 576), NAN);
  abs_max(x.to(kGpu).view(), dout.view());
  EXPECT_TRUE(std::isnan(to_doubles(dout.view())[0]));
}

// The CUDA layer's quantised output equals the CPU quantize_output of the CUDA layer's unquantised
// output (the CUDA layer writes its bf16 output, then quantises it in a separate pass) within one code:
// the two CUDA steps may round an output value differently where the kernels' schedule differs.
void expect_layer_matches(const Scenario& sc) {
  const StepData d = make_step(sc);
  const int64_t rows = d.t_act + 3;
  const MlaAttention plain(d.sc.options(kGpu, DType::bf16), d.weight);
  CacheBuffer cb = make_cache(d, kGpu);
  DeviceArgs a = device_args(d, kGpu, DType::bf16);
  Tensor ws = Tensor::empty({static_cast<int64_t>(plain.workspace_bytes(d.plan))}, DType::u8, kGpu);
  fill(ws.view(), 255.0);
  plain.forward(d.plan, a.args(), cb.cache, ws.view());
  const Tensor unfused = a.out.to(Device::cpu());
  for (OutputQuant k : kKeys) {
    const QuantOut got = run_layer_quantised(d, kGpu, DType::bf16, Precision::fast, k, key_scale(k), rows);
    const QuantOut want = quant_out(k, rows, d.sc.h * d.sc.V, Device::cpu());
    quantize_output(unfused.view().slice(0, 0, d.t_act), k, want.codes,
                    want.scales.defined() ? want.scales.view() : TensorView{}, key_scale(k));
    EXPECT_EQ(compare_within_one_code(got, want, k), "") << to_string(k) << (sc.sparse ? " sparse" : " dense");
  }
}

TEST(LayerOutputQuantGpu, EveryKeyEqualsCpuQuantizeOfTheUnfusedOutput) {
  MLA_SKIP_WITHOUT_GPU();
  Scenario dense;
  dense.h = 16;
  dense.P = 128;
  dense.V = 128;
  dense.decode_threshold = 2;
  dense.require_uniform = true;
  dense.reqs = {{5, 2}, {30, 2}, {200, 2}, {20, 7}, {64, 33}, {0, 9}};  // decode -> extend -> prefill
  dense.pad_tokens = 3;
  expect_layer_matches(dense);
  Scenario sparse = dense;
  sparse.sparse = true;
  sparse.format = CacheFormat::fp8_ds_mla;
  sparse.decode_threshold = 1;
  sparse.require_uniform = false;
  sparse.topk = 64;
  sparse.reqs = {{7, 1}, {90, 1}, {3, 6}};
  sparse.pad_tokens = 0;
  expect_layer_matches(sparse);
}

TEST(LayerKvScalesGpu, FirstBatchScaleAndCacheMatchCpu) {
  MLA_SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.format = CacheFormat::fp8;
  sc.reqs = {{0, 5}, {0, 40}};
  sc.pad_tokens = 2;
  const StepData d = make_step(sc);
  std::vector<float> scales;
  std::vector<std::vector<uint8_t>> caches;
  for (const Device dev : {Device::cpu(), kGpu}) {
    LayerOptions o = d.sc.options(dev, DType::bf16);
    o.kv_scales = KvScales::from_first_batch;
    const MlaAttention layer(o, d.weight);
    CacheBuffer cb = make_cache(d, dev);
    DeviceArgs a = device_args(d, dev, DType::bf16);
    Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8, dev);
    layer.forward(d.plan, a.args(), cb.cache, ws.view());
    ASSERT_TRUE(layer.kv_scale().has_value()) << to_string(dev);
    scales.push_back(*layer.kv_scale());
    caches.push_back(host_bytes(cb.storage));
  }
  EXPECT_EQ(scales[0], scales[1]);
  EXPECT_EQ(caches[0], caches[1]);
}

}  // namespace
}  // namespace mla::test::layer
