// SPDX-License-Identifier: Apache-2.0
// Public variant API (include/mla/variants.h) over the CUDA dispatch tables (src/cuda/dispatch/).
#include "mla/variants.h"

#include <string>
#include <vector>

#if MLA_WITH_CUDA
#include "cuda/dispatch/families.h"
#endif

namespace mla {
namespace {

#if MLA_WITH_CUDA
cuda::dispatch::Family& find(const std::string& family) {
  std::string known;
  for (cuda::dispatch::Family* f : cuda::dispatch::all_families()) {
    if (f->name() == family) return *f;
    known += (known.empty() ? "" : ", ") + f->name();
  }
  throw Error("unknown kernel family '" + family + "' (families with variants: " + known + ")");
}
#else
[[noreturn]] void no_family(const std::string& family) {
  throw Error("unknown kernel family '" + family + "': this build of mla has no CUDA backend, so no kernel variants");
}
#endif

}  // namespace

std::vector<std::string> variant_families() {
  std::vector<std::string> names;
#if MLA_WITH_CUDA
  for (cuda::dispatch::Family* f : cuda::dispatch::all_families()) names.push_back(f->name());
#endif
  return names;
}

std::vector<VariantInfo> list_variants(const std::string& family) {
#if MLA_WITH_CUDA
  return find(family).variants();
#else
  no_family(family);
#endif
}

bool variant_runs_on_device(const std::string& family, const std::string& variant, int device) {
#if MLA_WITH_CUDA
  return cuda::dispatch::cc_in_range(find(family).info(variant), cuda::dispatch::device_cc(device));
#else
  (void)variant, (void)device;
  no_family(family);
#endif
}

std::string last_variant(const std::string& family) {
#if MLA_WITH_CUDA
  return find(family).last();
#else
  no_family(family);
#endif
}

std::string forced_variant(const std::string& family) {
#if MLA_WITH_CUDA
  return find(family).forced();
#else
  no_family(family);
#endif
}

ForceVariant::ForceVariant(const std::string& family, const std::string& variant) : family_(family) {
#if MLA_WITH_CUDA
  previous_ = find(family).force(variant);
#else
  (void)variant;
  no_family(family);
#endif
}

ForceVariant::~ForceVariant() {
#if MLA_WITH_CUDA
  find(family_).force(previous_);
#endif
}

}  // namespace mla
