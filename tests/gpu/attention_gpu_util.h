// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared pieces of the attention GPU tests (decode, prefill, sparse): device copies of host-built
// caches, the tolerances of the CUDA kernels against the float64 CPU oracle, and comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "gpu_test_util.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "mla/tensor.h"
#include "mla/variants.h"
#include "support/test_util.h"

namespace mla::test {

// A decode batch's lengths around the page boundaries (empty, one key, a page less one, a page, a page and one, two
// pages) and one longer than a 256-key split.
inline std::vector<int32_t> boundary_lens(int64_t page, std::mt19937_64& g) {
  const auto p = static_cast<int32_t>(page);
  std::uniform_int_distribution<int32_t> longer(257, 700);  // > one split of 256 keys
  return {0, 1, std::max(p - 1, 1), p, p + 1, 2 * p, longer(g)};
}

// Tolerances (DESIGN.md §5: |got - ref| <= 2 |bf16(ref) - ref| + quantum + extra_rel * max|ref|).
//
// kPvRounding: the kernels multiply probabilities by V on bf16 tensor cores, so each probability p_j
// (times the key's fp8 scale, where there is one) is rounded to bf16 before the PV product: relative
// error <= 2^-9 per term, hence |d out| <= 2^-9 * sum_j p_j |v_j| / l. Everything else is fp32 with
// errors near 1e-6 (the mma sees bf16 Q and the exact K codes; scales are applied in fp32). For the
// random test data the rounding errors of different keys are independent, and the largest deviation
// over a test's outputs stays near 2^-9 * max|out|; 2^-8 gives a factor-2 margin. A wrong key set
// (one key missing of n) moves the LSE by ~1/n, far outside kLseRel, so LSE checks catch what this
// looser output bound might not.
inline constexpr double kPvRounding = 1.0 / 256;
// kLseRel: LSE is fp32 from fp32 scores summed over up to a few thousand keys (each score carries
// ~1e-6 relative error from fp32 accumulation over 576 products, ex2/lg2.approx add ~2^-22).
inline constexpr double kLseRel = 1e-5;

// A copy of a host cache (any strided view inside `storage`) on the GPU, same strides and offset.
struct DeviceCache {
  Tensor storage;
  KVCache cache;
};
inline DeviceCache to_device(const Tensor& host_storage, const KVCache& host_cache, Device dev = Device::cuda(0)) {
  DeviceCache d;
  d.storage = host_storage.to(dev);
  d.cache = host_cache;
  const std::ptrdiff_t offset = static_cast<const char*>(host_cache.data.data) - static_cast<const char*>(host_storage.data());
  d.cache.data.data = static_cast<char*>(d.storage.data()) + offset;
  d.cache.data.device = dev;
  return d;
}

// A host copy of `view`, a (possibly strided) view into the device tensor `storage`: the whole storage
// is copied (cross-device copies need contiguous views) and the view rebased onto the copy.
struct HostView {
  Tensor storage;
  TensorView view;
};
inline HostView to_host(const Tensor& storage, const TensorView& view) {
  HostView h;
  h.storage = storage.to(Device::cpu());
  h.view = view;
  h.view.data = static_cast<char*>(h.storage.data()) +
                (static_cast<const char*>(view.data) - static_cast<const char*>(storage.data()));
  h.view.device = Device::cpu();
  return h;
}

// out (bf16) and lse (fp32) against the oracle's float64 out and fp32 lse; empty messages pass.
inline void expect_attention_close(const TensorView& out, const TensorView& ref_out, const TensorView& lse,
                                   const TensorView& ref_lse, const std::string& what) {
  EXPECT_EQ(check_close(to_doubles(out), to_doubles(ref_out), DType::bf16, kPvRounding), "") << what << ": out";
  if (lse.defined()) {
    EXPECT_EQ(check_close(to_doubles(lse), to_doubles(ref_lse), DType::f32, kLseRel), "") << what << ": lse";
  }
}

// Whether `variant` (of mqa_decode or sparse_mqa) reads `format`'s rows as their bf16 upconvert: the sm90 seesaw and
// converter kernels over fp8_ds_mla records (docs/SEMANTICS.md §14.9); every other kernel reads exact codes, as the
// oracle does.
inline bool variant_upconverts(const std::string& variant, CacheFormat format) {
  return (variant == "sm90_seesaw" || variant == "sm90_convert") && format == CacheFormat::fp8_ds_mla;
}
// The same for the variant that ran last in `family`.
inline bool ran_upconverted(const std::string& family, CacheFormat format) {
  return variant_upconverts(last_variant(family), format);
}
// Whether automatic selection runs a kernel that reads fp8_ds_mla as its upconvert (the converter kernel at 33..64
// rows, the seesaw kernel above, for the seesaw's small-T split and when batch-invariant) for `rows` query rows per
// request (mqa_decode: h · s_q; sparse_mqa: h): more than 32 (core/decode_regime.h).
inline bool sm90_ds_upconverts(int64_t rows) { return rows > 32; }

// A contiguous host copy of `t` (any device) in dtype `dt`, each value rounded once to dt. Attention
// tests build q as bf16 values and pass f16 / f32 copies of them: the CUDA engine feeds its bf16 tensor
// cores, so f16 / f32 queries are rounded to bf16 (ops.h) and bf16-valued inputs make the oracle's
// q exactly the kernel's.
inline Tensor converted(const Tensor& t, DType dt) {
  const std::vector<double> v = to_doubles(t);
  Tensor o = Tensor::empty(std::span<const int64_t>(t.view().shape.data(), static_cast<std::size_t>(t.view().ndim)), dt);
  const std::size_t es = dtype_size(dt);
  for (std::size_t i = 0; i < v.size(); ++i) num::store(static_cast<char*>(o.data()) + i * es, dt, v[i]);
  return o;
}

}  // namespace mla::test
