// SPDX-License-Identifier: Apache-2.0
#pragma once
// Running the GPU tests of a kernel family once per registered variant (include/mla/variants.h). A
// sweep takes the variant name as one more parameter, from the library's own list, so a new variant is
// swept without editing the tests:
//
//   INSTANTIATE_TEST_SUITE_P(All, Sweep, Combine(..., ValuesIn(test::variants_of("mqa_decode"))), ...);
//   TEST_P(Sweep, X) {
//     MLA_SKIP_WITHOUT_GPU();
//     MLA_FORCE_VARIANT("mqa_decode", variant);        // skips when the device cannot run it
//     MLA_SKIP_IF_DECLINED(r = run_the_op(...));       // skips when the variant declines this problem
//     test::expect_variant_ran("mqa_decode", variant);
//     ... compare with the oracle ...
//   }
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mla/variants.h"

namespace mla::test {

// Variant names of `family`, best first.
inline std::vector<std::string> variants_of(const std::string& family) {
  std::vector<std::string> names;
  for (const VariantInfo& v : list_variants(family)) names.push_back(v.name);
  return names;
}

inline void expect_variant_ran(const std::string& family, const std::string& variant) {
  EXPECT_EQ(last_variant(family), variant) << family << ": the forced variant did not run";
}

}  // namespace mla::test

// Forces `variant` of `family` for the rest of the enclosing scope; skips the test when device 0's compute
// capability is outside the variant's range.
#define MLA_FORCE_VARIANT(family, variant)                                                  \
  ::mla::ForceVariant mla_forced_variant_((family), (variant));                             \
  if (!::mla::variant_runs_on_device((family), (variant), 0))                               \
  GTEST_SKIP() << "variant '" << (variant) << "' of " << (family) << " does not run on this device"

// Runs the statement; a forced variant that declines the problem (VariantUnsupported) skips the test.
#define MLA_SKIP_IF_DECLINED(...)                      \
  try {                                                \
    __VA_ARGS__;                                       \
  } catch (const ::mla::VariantUnsupported& mla_e_) {  \
    GTEST_SKIP() << mla_e_.what();                     \
  }
