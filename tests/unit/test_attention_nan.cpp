// SPDX-License-Identifier: Apache-2.0
// The NaN rule of the attention ops on the CPU backend, fast and reference precision (attention_nan_check.h;
// docs/SEMANTICS.md §14.6a). Before the rule was pinned, one NaN key turned a CPU row into "empty"
// (out 0, LSE -inf) while the GPU gave NaN out with LSE -inf.
#include <gtest/gtest.h>

#include "attention_nan_check.h"

namespace mla {
namespace {

using test::nan_check::check_decode;
using test::nan_check::check_prefill;
using test::nan_check::check_sparse;

const Context kReference{nullptr, Precision::reference};

TEST(AttentionNaN, DecodeEveryFormat) {
  for (CacheFormat f : test::kAllFormats) {
    check_decode(Device::cpu(), f, {});
    check_decode(Device::cpu(), f, kReference);
  }
}

TEST(AttentionNaN, SparseEveryFormat) {
  for (CacheFormat f : test::kAllFormats) {
    check_sparse(Device::cpu(), f, {});
    check_sparse(Device::cpu(), f, kReference);
  }
}

TEST(AttentionNaN, Prefill) {
  check_prefill(Device::cpu(), {});
  check_prefill(Device::cpu(), kReference);
}

}  // namespace
}  // namespace mla
