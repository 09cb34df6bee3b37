// SPDX-License-Identifier: Apache-2.0
// The kernel-variant axis: the dispatch table's selection (rank order, compute-capability range,
// supports predicate), the override (forced variant, unknown names, restoring), the record of the last
// choice, and the public API of include/mla/variants.h. CPU only: a fake family stands in for kernels.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/dispatch/variant_table.h"
#include "mla/variants.h"

namespace mla {
namespace {

using cuda::dispatch::Table;

struct FakeArgs {
  int size;
  std::vector<std::string>* ran;
};

const char* small_only(const FakeArgs& a) { return a.size <= 64 ? nullptr : "size above 64"; }
void run_fast(const FakeArgs& a) { a.ran->push_back("fast"); }
void run_portable(const FakeArgs& a) { a.ran->push_back("portable"); }

Table<FakeArgs> fake_table() {
  return Table<FakeArgs>("fake", {{{"fast", 90, 90, "sm_90a only, small sizes"}, small_only, run_fast},
                                  {{"portable", 80, 0, "everything"}, nullptr, run_portable}});
}

TEST(VariantTable, PicksTheFirstVariantThatCanRun) {
  Table<FakeArgs> t = fake_table();
  std::vector<std::string> ran;
  EXPECT_EQ(t.last(), "");
  t.run({10, &ran}, 90);   // fast: in range, supported
  t.run({100, &ran}, 90);  // fast declines the size
  t.run({10, &ran}, 80);   // below fast's range
  t.run({10, &ran}, 100);  // above fast's range (arch-specific code)
  EXPECT_EQ(ran, (std::vector<std::string>{"fast", "portable", "portable", "portable"}));
  EXPECT_EQ(t.last(), "portable");
  ASSERT_EQ(t.variants().size(), 2u);
  EXPECT_EQ(t.variants()[0].name, "fast");
  EXPECT_EQ(t.variants()[1].min_cc, 80);
}

TEST(VariantTable, ForcedVariantRunsOrThrowsWithoutRunning) {
  Table<FakeArgs> t = fake_table();
  std::vector<std::string> ran;
  EXPECT_EQ(t.force("portable"), "");
  t.run({10, &ran}, 90);
  EXPECT_EQ(ran, std::vector<std::string>{"portable"});
  EXPECT_EQ(t.force("fast"), "portable");
  try {
    t.run({100, &ran}, 90);
    ADD_FAILURE() << "expected VariantUnsupported";
  } catch (const VariantUnsupported& e) {
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("size above 64"), std::string::npos) << e.what();
  }
  try {
    t.run({10, &ran}, 80);
    ADD_FAILURE() << "expected VariantUnsupported";
  } catch (const VariantUnsupported& e) {
    EXPECT_NE(std::string(e.what()).find("needs compute capability 9.0, the device has 8.0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ran, std::vector<std::string>{"portable"});  // nothing ran on the refusals
  EXPECT_EQ(t.last(), "portable");
  t.force("");
  t.run({10, &ran}, 90);
  EXPECT_EQ(ran.back(), "fast");
}

TEST(VariantTable, UnknownVariantIsRefusedAndKeepsTheSetting) {
  Table<FakeArgs> t = fake_table();
  t.force("portable");
  try {
    t.force("sm100");
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("variants: fast, portable"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.forced(), "portable");
}

TEST(VariantTable, NoVariantCanRunIsAnErrorNamingEachReason) {
  Table<FakeArgs> t("only_fast", {{{"fast", 90, 90, ""}, small_only, run_fast}});
  std::vector<std::string> ran;
  try {
    t.run({10, &ran}, 80);
    ADD_FAILURE() << "expected Error";
  } catch (const VariantUnsupported&) {
    ADD_FAILURE() << "automatic selection must not report a forced-variant refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast: needs compute capability 9.0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(ran.empty());
}

TEST(Variants, PublicApiListsForcesAndRestores) {
  EXPECT_THROW(list_variants("no_such_family"), Error);
  EXPECT_THROW(ForceVariant("no_such_family", "portable"), Error);
  EXPECT_THROW(last_variant("no_such_family"), Error);
  const std::vector<std::string> families = variant_families();
#if MLA_WITH_CUDA
  EXPECT_EQ(families, (std::vector<std::string>{"mqa_decode", "sparse_mqa", "mha_prefill", "indexer_logits"}));
  for (const std::string& f : families) {
    const std::vector<VariantInfo> vs = list_variants(f);
    ASSERT_FALSE(vs.empty()) << f;
    EXPECT_EQ(vs.back().name, "portable") << f << ": the portable engine is every family's fallback";
    EXPECT_THROW(ForceVariant(f, "no_such_variant"), Error);
    EXPECT_THROW(variant_runs_on_device(f, "no_such_variant", 0), Error);  // refused before any device query
  }
  EXPECT_EQ(forced_variant("mqa_decode"), "");
  {
    ForceVariant outer("mqa_decode", "portable");
    EXPECT_EQ(forced_variant("mqa_decode"), "portable");
    {
      ForceVariant inner("mqa_decode", "");
      EXPECT_EQ(forced_variant("mqa_decode"), "");
    }
    EXPECT_EQ(forced_variant("mqa_decode"), "portable");
  }
  EXPECT_EQ(forced_variant("mqa_decode"), "");
#else
  EXPECT_TRUE(families.empty());
#endif
}

}  // namespace
}  // namespace mla
