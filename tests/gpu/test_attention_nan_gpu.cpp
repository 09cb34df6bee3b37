// SPDX-License-Identifier: Apache-2.0
// The NaN rule of the attention ops on CUDA, every registered variant of each family
// (attention_nan_check.h; docs/SEMANTICS.md §14.6a): the same expectations as the CPU backend.
#include <gtest/gtest.h>

#include "unit/attention_nan_check.h"
#include "mla/variants.h"

namespace mla {
namespace {

using test::nan_check::check_decode;
using test::nan_check::check_prefill;
using test::nan_check::check_sparse;

// Runs `body` once per variant of `family` that the device runs, forced; a variant that declines a case
// (VariantUnsupported, e.g. sm90 decode and f16 activations) skips that case. Every case must run somewhere.
template <class Body>
void per_variant(const char* family, Body&& body) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const VariantInfo& v : list_variants(family)) {
    if (!variant_runs_on_device(family, v.name, 0)) continue;
    SCOPED_TRACE(std::string(family) + " variant " + v.name);
    ForceVariant force(family, v.name);
    body();
  }
}

template <class Check>
void unless_declined(Check&& check) {
  try {
    check();
  } catch (const VariantUnsupported&) {
  }
}

TEST(AttentionNaNGpu, DecodeEveryFormat) {
  per_variant("mqa_decode", [] {
    for (CacheFormat f : test::kDeviceFormats) unless_declined([&] { check_decode(Device::cuda(0), f, {}); });
  });
}

TEST(AttentionNaNGpu, SparseEveryFormat) {
  per_variant("sparse_mqa", [] {
    for (CacheFormat f : test::kDeviceFormats) unless_declined([&] { check_sparse(Device::cuda(0), f, {}); });
  });
}

TEST(AttentionNaNGpu, Prefill) {
  per_variant("mha_prefill", [] { unless_declined([] { check_prefill(Device::cuda(0), {}); }); });
}

}  // namespace
}  // namespace mla
