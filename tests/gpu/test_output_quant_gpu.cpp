// SPDX-License-Identifier: Apache-2.0
// Output quantisation and KV scales from the data on CUDA (docs/SEMANTICS.md §15, §16): quantize_output
// and abs_max against the CPU backend byte for byte (every key, bf16 and f32 inputs, zero and NaN
// groups, padding rows), the layer's quantised output against the CPU quantisation of the CUDA
// layer's own unquantised output (dense mixed batches with padding, sparse), and the calibrated fp8
// cache scale and cache bytes against the CPU layer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "core/numeric.h"
#include "core/up_proj_schedule.h"
#include "cuda/block/up_proj_quant.h"
#include "mla/block_ops.h"
#include "mla/error.h"
#include "mla/ops.h"
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
// within one code (nvfp4's e4m3 scale codes) or one bf16 step of the abs-max, 2^-7 relative plus
// the division's rounding (f32 group scales; NaN equal to NaN).
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
    if (!(std::fabs(a - b) <= 0x1.01p-7 * std::fabs(b) || (std::isnan(a) && std::isnan(b))))
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

// The fp8 keys' quotients over bf16 inputs take the reciprocal form (cuda/cache/quant.cuh) where the scale allows
// it and IEEE division elsewhere: every bf16 significand of both signs, spread over 2^-20 .. 2^3 of each group's
// largest, at group magnitudes from 2^-90 (scales below the reciprocal's range) to 2^110 (above it), and the
// static-scale key at three scales (quotients from below e4m3's zero threshold to past saturation): the CPU's bytes.
TEST(OutputQuantGpu, Bf16QuotientsMatchCpuBytesAtEveryMagnitude) {
  MLA_SKIP_WITHOUT_GPU();
  const int exps[] = {-90, -70, -50, -20, -3, 0, 7, 40, 80, 96, 110};
  const int64_t K = 512, M = static_cast<int64_t>(std::size(exps)), M_pad = M + 3;
  Tensor x = Tensor::empty({M, K}, DType::bf16);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const int j = static_cast<int>(c % 128), shift = static_cast<int>((c * 7) % 24) - 20;
      const double v = std::ldexp(1.0 + j / 128.0, exps[r] + shift) * ((c / 128) % 2 ? -1.0 : 1.0);
      static_cast<uint16_t*>(x.data())[r * K + c] = num::float_to_bf16(static_cast<float>(v));
    }
  const Tensor xd = x.to(kGpu);
  for (OutputQuant k : {OutputQuant::fp8_group128, OutputQuant::fp8_group64, OutputQuant::fp8})
    for (const float scale : {0x1p-30f, 1.0f / 32.0f, 0x1p40f}) {
      if (k != OutputQuant::fp8 && scale != 1.0f / 32.0f) continue;  // the group keys take no static scale
      const QuantOut cpu = quant_out(k, M_pad, K, Device::cpu()), gpu = quant_out(k, M_pad, K, kGpu);
      quantize_output(x.view(), k, cpu.codes, cpu.scales.defined() ? cpu.scales.view() : TensorView{}, scale);
      quantize_output(xd.view(), k, gpu.codes, gpu.scales.defined() ? gpu.scales.view() : TensorView{}, scale);
      expect_same(gpu, cpu, k, "bf16 magnitudes, static scale " + std::to_string(scale));
    }
}

// ---- up_project_quantized: the V up-projection quantised in its epilogue ----------------------------

// Scales that keep the products of the inputs below in range (fp8: |x| / s < 448; nvfp4: g * amax / 6 < 448).
float fused_scale(OutputQuant k) { return k == OutputQuant::nvfp4 ? 448.0f * 6.0f / 32.0f : 1.0f / 16.0f; }

// bf16 host values j / denom, j uniform in [-denom, denom]. With o_lat from denom 8 and w_uv from denom 16
// every product is a multiple of 2^-7 and |partial sums| < 2^10 for L <= 1024: the fp32 sums are exact in
// any order, so cuBLAS's bf16 product equals the fused kernel's and the quantised bytes must be equal.
Tensor dyadic(std::initializer_list<int64_t> shape, int denom) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  auto* p = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const auto j = static_cast<int>(rng()() % static_cast<uint64_t>(2 * denom + 1)) - denom;
    num::store(p + 2 * i, DType::bf16, static_cast<double>(j) / denom);
  }
  return t;
}

// quantize_output(bmm(o_lat, w_uv)) on the GPU: the unfused two-pass reference, into M_pad rows.
QuantOut unfused_reference(const TensorView& o, const TensorView& w, OutputQuant k, int64_t M_pad, float scale) {
  const int64_t M = o.size(0), h = o.size(1), V = w.size(2);
  Tensor x = Tensor::empty({M, h * V}, DType::bf16, kGpu);
  bmm(o.transpose(0, 1), w, x.view().reshape({M, h, V}).transpose(0, 1));
  QuantOut q = quant_out(k, M_pad, h * V, kGpu);
  quantize_output(x.view(), k, q.codes, q.scales.defined() ? q.scales.view() : TensorView{}, scale);
  return q;
}

QuantOut fused(const TensorView& o, const TensorView& w, OutputQuant k, int64_t M_pad, float scale) {
  QuantOut q = quant_out(k, M_pad, o.size(1) * w.size(2), kGpu);
  up_project_quantized(o, w, k, q.codes, q.scales.defined() ? q.scales.view() : TensorView{}, scale);
  return q;
}

// Bit for bit: every key, h 16 / 64 / 128, M 1 .. 520 (each kernel configuration, odd sizes, tile edges),
// padding rows, a NaN, +inf and -inf in o_lat (NaN groups, infinite scales, inf * 0 = NaN columns).
TEST(UpProjectQuantizedGpu, ExactProductsEqualQuantizeOfBmmBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(43);
  constexpr int64_t L = 512, V = 128, kRows = 520;
  for (const int64_t h : {16, 64, 128}) {
    Tensor o = dyadic({kRows, h, L}, 8);
    num::store(o.view().ptr_at({0, 1, 5}), DType::bf16, NAN);
    num::store(o.view().ptr_at({2, 3, 7}), DType::bf16, INFINITY);
    num::store(o.view().ptr_at({150, h - 1, 0}), DType::bf16, -INFINITY);
    const Tensor od = o.to(kGpu), wd = dyadic({h, L, V}, 16).to(kGpu);
    for (const int64_t M : {1, 2, 3, 7, 16, 17, 31, 64, 65, 127, 128, 129, 200, 255, 256, 299, 300, 520}) {
      if (h == 16 && M > 300) continue;
      const int64_t M_pad = M + M % 3;
      const TensorView ov = od.view().slice(0, 0, M);
      for (OutputQuant k : kKeys)
        expect_same(fused(ov, wd.view(), k, M_pad, fused_scale(k)),
                    unfused_reference(ov, wd.view(), k, M_pad, fused_scale(k)), k,
                    "h " + std::to_string(h) + " M " + std::to_string(M));
    }
  }
}

// Continuous inputs: cuBLAS may round a sum to the neighbouring bf16 value, so within one code.
TEST(UpProjectQuantizedGpu, RandomProductsWithinOneCodeOfQuantizeOfBmm) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(44);
  for (const int64_t h : {16, 128}) {
    const Tensor od = random_tensor({300, h, 512}, DType::bf16, kGpu, -1.0, 1.0);
    const Tensor wd = random_tensor({h, 512, 128}, DType::bf16, kGpu, -0.1, 0.1);
    for (const int64_t M : {1, 5, 16, 40, 300}) {
      const TensorView ov = od.view().slice(0, 0, M);
      for (OutputQuant k : kKeys)
        EXPECT_EQ(compare_within_one_code(fused(ov, wd.view(), k, M + 1, fused_scale(k)),
                                          unfused_reference(ov, wd.view(), k, M + 1, fused_scale(k)), k),
                  "")
            << to_string(k) << " h " << h << " M " << M;
    }
  }
}

// Other shapes: V 256 (two column tiles per head) and 64 (half a tile), L 72 (a partial k step), 3 heads.
TEST(UpProjectQuantizedGpu, OtherHeadShapesBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(45);
  struct Shape {
    int64_t h, L, V;
  };
  for (const Shape sh : {Shape{3, 72, 256}, Shape{3, 512, 64}, Shape{5, 40, 16}}) {
    const Tensor od = dyadic({70, sh.h, sh.L}, 8).to(kGpu), wd = dyadic({sh.h, sh.L, sh.V}, 16).to(kGpu);
    for (const int64_t M : {1, 19, 70}) {
      const TensorView ov = od.view().slice(0, 0, M);
      for (OutputQuant k : kKeys) {
        if (sh.V % std::max<int64_t>(output_quant_group(k), 16) != 0) continue;
        expect_same(fused(ov, wd.view(), k, M + 2, fused_scale(k)),
                    unfused_reference(ov, wd.view(), k, M + 2, fused_scale(k)), k,
                    "h " + std::to_string(sh.h) + " L " + std::to_string(sh.L) + " V " + std::to_string(sh.V) +
                        " M " + std::to_string(M));
      }
    }
  }
}

// Strided views: o_lat inside wider rows (q_abs-like), codes rows wider than the output (unaligned rows: the
// byte-store path), group scales a column slice of a wider matrix; the bytes equal the contiguous run's and
// nothing outside the views is written.
TEST(UpProjectQuantizedGpu, StridedViewsWriteTheSameBytesAndNothingElse) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(46);
  constexpr int64_t h = 16, L = 512, V = 128, K = h * V, M = 37, M_pad = 40;
  const Tensor wide = dyadic({M, h, L + 64}, 8).to(kGpu), wd = dyadic({h, L, V}, 16).to(kGpu);
  const TensorView ov = wide.view().slice(2, 0, L);
  for (OutputQuant k : kKeys) {
    const bool fp4 = k == OutputQuant::nvfp4;
    const int64_t G = output_quant_group(k), cw = fp4 ? K / 2 : K, pad_cols = fp4 ? 4 : 8;
    const QuantOut want = unfused_reference(ov, wd.view(), k, M_pad, fused_scale(k));
    Tensor codes = poisoned({M_pad, cw + pad_cols}, DType::u8, kGpu), scales;
    TensorView sv;
    if (fp4) {
      scales = poisoned({M_pad, K / 16 + 3}, DType::u8, kGpu);
      sv = scales.view().slice(1, 0, K / 16);
    } else if (G > 0) {
      scales = poisoned({K / G, M_pad + 10}, DType::f32, kGpu);
      sv = scales.view().slice(1, 5, 5 + M_pad);
    }
    up_project_quantized(ov, wd.view(), k, codes.view().slice(1, 0, cw), sv, fused_scale(k));
    const std::vector<uint8_t> gc = host_bytes(codes), wc = host_bytes(want.codes);
    for (int64_t t = 0; t < M_pad; ++t)
      for (int64_t j = 0; j < cw + pad_cols; ++j) {
        const uint8_t g = gc[static_cast<std::size_t>(t * (cw + pad_cols) + j)];
        if (j >= cw) {
          ASSERT_EQ(g, 0xff) << to_string(k) << ": wrote past the codes view, row " << t;
          continue;
        }
        const uint8_t w = wc[static_cast<std::size_t>(t * cw + j)];
        const bool nan = !fp4 && (g & 0x7f) == 0x7f && (w & 0x7f) == 0x7f;
        ASSERT_TRUE(g == w || nan) << to_string(k) << " code row " << t << " byte " << j;
      }
    if (!scales.defined()) continue;
    const int64_t rows = scales.size(0), cols = scales.size(1), wcols = want.scales.size(1);
    if (fp4) {  // e4m3 scale codes, compared as bytes (a NaN code of either sign equal)
      const std::vector<uint8_t> gs = host_bytes(scales), ws = host_bytes(want.scales);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t g = gs[static_cast<std::size_t>(r * cols + c)];
          if (c >= wcols) {
            ASSERT_EQ(g, 0xff) << "nvfp4: wrote past the scales view, row " << r;
            continue;
          }
          const uint8_t w = ws[static_cast<std::size_t>(r * wcols + c)];
          ASSERT_TRUE(g == w || ((g & 0x7f) == 0x7f && (w & 0x7f) == 0x7f)) << "nvfp4 scale " << r << ", " << c;
        }
      continue;
    }
    const std::vector<double> gs = to_doubles(scales.view()), ws = to_doubles(want.scales.view());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double g = gs[static_cast<std::size_t>(r * cols + c)];
        if (c < 5 || c >= 5 + wcols) {
          ASSERT_TRUE(std::isnan(g)) << to_string(k) << ": wrote past the scales view, group " << r;
          continue;
        }
        const double w = ws[static_cast<std::size_t>(r * wcols + c - 5)];
        ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << to_string(k) << " scale " << r << ", " << c;
      }
  }
}

// No rows: only the padding rows are written (zero codes, group scale 1, nvfp4 scale code 0).
TEST(UpProjectQuantizedGpu, NoRowsWritesPadding) {
  MLA_SKIP_WITHOUT_GPU();
  const Tensor od = Tensor::empty({0, 16, 512}, DType::bf16, kGpu), wd = dyadic({16, 512, 128}, 16).to(kGpu);
  for (OutputQuant k : kKeys) {
    const QuantOut q = fused(od.view(), wd.view(), k, 5, fused_scale(k));
    for (const uint8_t b : host_bytes(q.codes)) ASSERT_EQ(b, 0) << to_string(k);
    if (!q.scales.defined()) continue;
    for (const double v : to_doubles(q.scales.view())) ASSERT_EQ(v, k == OutputQuant::nvfp4 ? 0.0 : 1.0) << to_string(k);
  }
}

// ---- up_project_quantized_with: every schedule (core/up_proj_schedule.h) ----------------------------

// The schedules this device runs: 16 / 64 / 128-row tiles, split 1 / 2 / 4 / 8 ways where there are clusters, and
// on sm_90a the Hopper mainloop's 64 / 128-row tiles at every split.
std::vector<up_proj::Schedule> device_schedules() {
  std::vector<up_proj::Schedule> out;
  const int max_splits = cuda::up_proj_splits_supported(0) ? up_proj::kMaxSplits : 1;
  for (int splits = 1; splits <= max_splits; splits *= 2)
    for (const int rows : up_proj::kTileRows) out.push_back(up_proj::Schedule{rows, splits});
  if (cuda::up_proj_hopper_supported(0))
    for (int splits = 1; splits <= max_splits; splits *= 2)
      for (const int rows : up_proj::kHopperTileRows) out.push_back(up_proj::Schedule{rows, splits, true});
  return out;
}

std::string schedule_name(const up_proj::Schedule& s) {
  return "tile " + std::to_string(s.tile_rows) + " split " + std::to_string(s.splits) + (s.hopper ? " hopper" : "");
}

QuantOut fused_with(const TensorView& o, const TensorView& w, OutputQuant k, int64_t M_pad, float scale,
                    const up_proj::Schedule& sched) {
  QuantOut q = quant_out(k, M_pad, o.size(1) * w.size(2), kGpu);
  cuda::up_project_quantized_with(o, w, k, q.codes, q.scales.defined() ? q.scales.view() : TensorView{}, scale,
                                  sched);
  return q;
}

// Bit for bit against quantize_output(bmm) for every schedule at the decode sizes (b 1, 4, 64, 128 and tile
// edges 17, 65; h 16, 64, 128), padding rows after them, a NaN, +inf and -inf in o_lat: the split sums are
// exact in any order for these inputs, so every split count writes the unfused bytes.
TEST(UpProjectQuantizedGpu, EveryScheduleEqualsQuantizeOfBmmBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(47);
  constexpr int64_t L = 512, V = 128, kRows = 128;
  for (const int64_t h : {16, 64, 128}) {
    Tensor o = dyadic({kRows, h, L}, 8);
    num::store(o.view().ptr_at({0, 1, 5}), DType::bf16, NAN);
    num::store(o.view().ptr_at({3, 3, 300}), DType::bf16, INFINITY);
    num::store(o.view().ptr_at({70, h - 1, 511}), DType::bf16, -INFINITY);
    const Tensor od = o.to(kGpu), wd = dyadic({h, L, V}, 16).to(kGpu);
    for (const int64_t M : {1, 4, 17, 64, 65, 128}) {
      const int64_t M_pad = M + 3;
      const TensorView ov = od.view().slice(0, 0, M);
      for (OutputQuant k : kKeys) {
        const QuantOut want = unfused_reference(ov, wd.view(), k, M_pad, fused_scale(k));
        for (const up_proj::Schedule& sched : device_schedules())
          expect_same(fused_with(ov, wd.view(), k, M_pad, fused_scale(k), sched), want, k,
                      "h " + std::to_string(h) + " M " + std::to_string(M) + " " + schedule_name(sched));
      }
    }
  }
}

// Splits over short and ragged latents: L 40 (two steps), 72 (three: one rank takes one step), 136 (five:
// split four ways, the last rank has none), V 256 (two column tiles) and 64 (half a tile), 3 heads.
TEST(UpProjectQuantizedGpu, SplitsOfRaggedLatentsBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(48);
  struct Shape {
    int64_t h, L, V;
  };
  for (const Shape sh : {Shape{3, 40, 128}, Shape{3, 72, 256}, Shape{3, 136, 64}, Shape{2, 136, 128}}) {
    const Tensor od = dyadic({70, sh.h, sh.L}, 8).to(kGpu), wd = dyadic({sh.h, sh.L, sh.V}, 16).to(kGpu);
    for (const int64_t M : {1, 19, 70}) {
      const TensorView ov = od.view().slice(0, 0, M);
      for (OutputQuant k : kKeys) {
        if (sh.V % std::max<int64_t>(output_quant_group(k), 16) != 0) continue;
        const QuantOut want = unfused_reference(ov, wd.view(), k, M + 2, fused_scale(k));
        for (const up_proj::Schedule& sched : device_schedules()) {
          if (sched.splits > up_proj::k_tiles_of(sched, sh.L)) continue;
          expect_same(fused_with(ov, wd.view(), k, M + 2, fused_scale(k), sched), want, k,
                      "h " + std::to_string(sh.h) + " L " + std::to_string(sh.L) + " V " + std::to_string(sh.V) +
                          " M " + std::to_string(M) + " " + schedule_name(sched));
        }
      }
    }
  }
}

// Continuous inputs through the split schedules: within one code of the unfused bytes.
TEST(UpProjectQuantizedGpu, RandomProductsEveryScheduleWithinOneCode) {
  MLA_SKIP_WITHOUT_GPU();
  reseed(49);
  constexpr int64_t h = 16;
  const Tensor od = random_tensor({64, h, 512}, DType::bf16, kGpu, -1.0, 1.0);
  const Tensor wd = random_tensor({h, 512, 128}, DType::bf16, kGpu, -0.1, 0.1);
  for (const int64_t M : {1, 64}) {
    const TensorView ov = od.view().slice(0, 0, M);
    for (OutputQuant k : kKeys) {
      const QuantOut want = unfused_reference(ov, wd.view(), k, M + 1, fused_scale(k));
      for (const up_proj::Schedule& sched : device_schedules())
        EXPECT_EQ(compare_within_one_code(fused_with(ov, wd.view(), k, M + 1, fused_scale(k), sched), want, k), "")
            << to_string(k) << " M " << M << " " << schedule_name(sched);
    }
  }
}

// A schedule the kernel has no configuration for is refused before anything is written.
TEST(UpProjectQuantizedGpu, BadSchedulesAreRefused) {
  MLA_SKIP_WITHOUT_GPU();
  const Tensor od = dyadic({4, 2, 64}, 8).to(kGpu), wd = dyadic({2, 64, 128}, 16).to(kGpu);
  const OutputQuant k = OutputQuant::fp8_group128;
  // L 64: two 32-wide latent steps (four splits refused), one 64-wide step of the Hopper mainloop (two refused);
  // the Hopper mainloop has no 16-row tile.
  for (const up_proj::Schedule bad : {up_proj::Schedule{32, 1}, up_proj::Schedule{16, 3}, up_proj::Schedule{64, 16},
                                      up_proj::Schedule{16, 4}, up_proj::Schedule{64, 2, true},
                                      up_proj::Schedule{16, 1, true}}) {
    const QuantOut q = quant_out(k, 4, 256, kGpu);  // poisoned
    const std::vector<uint8_t> codes = host_bytes(q.codes), scales = host_bytes(q.scales);
    EXPECT_THROW(cuda::up_project_quantized_with(od.view(), wd.view(), k, q.codes, q.scales.view(), 1.0f, bad), Error)
        << schedule_name(bad);
    EXPECT_EQ(host_bytes(q.codes), codes) << schedule_name(bad);
    EXPECT_EQ(host_bytes(q.scales), scales) << schedule_name(bad);
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
  // Decode only (the fused product writes every row, padding included), more heads.
  for (const int h : {64, 128}) {
    Scenario decode = dense;
    decode.h = h;
    decode.reqs = {{5, 1}, {30, 1}, {200, 1}, {17, 1}};
    decode.require_uniform = false;  // a uniform decode batch takes no padding rows (split_decodes_and_prefills)
    decode.pad_tokens = 4;
    expect_layer_matches(decode);
    decode.compute_capability = 90;  // Hopper, few rows: cuBLAS's product and the separate pass
    expect_layer_matches(decode);
  }
  // Hopper at h 128 with 72 decode tokens and 4 padding rows: the two passes (the layer does not fuse from sm_90
  // on; the op's Hopper mainloop is swept by UpProjectQuantizedGpu's schedules above).
  Scenario many = dense;
  many.h = 128;
  many.reqs.clear();
  for (int i = 0; i < 72; ++i) many.reqs.push_back({5 + (7 * i) % 40, 1});
  many.require_uniform = false;
  many.max_num_seqs = 72;
  many.pad_tokens = 4;
  many.compute_capability = 90;
  expect_layer_matches(many);
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
