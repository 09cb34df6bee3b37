// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel variants: the architecture axis of the CUDA backend. Each kernel family (mqa_decode,
// sparse_mqa, mha_prefill) has a dispatch table listing its variants best first, e.g. "sm90" (TMA +
// wgmma, Hopper only) before "portable" (the mma.sync engine, sm_80+). A launch runs the first variant
// whose compute-capability range contains the device's and that supports the problem (shape, format,
// page size...). Tests and benchmarks force a variant with ForceVariant (`mla bench --variant NAME`).
//
// The override and the record of the last choice are process-wide (not per thread or per device).
// Builds without CUDA have no families: every family name is unknown there.
#include <string>
#include <vector>

#include "mla/error.h"

namespace mla {

struct VariantInfo {
  std::string name;         // "portable", "sm90", ...
  int min_cc = 0;           // lowest compute capability it runs on, major * 10 + minor (80 = sm_80)
  int max_cc = 0;           // highest (arch-specific code: sm_90a runs on 90 only); 0 = no upper bound
  std::string description;  // one line: engine, and what it supports
};

// Thrown by a launch when the forced variant cannot run it (device outside its compute-capability
// range, or a problem it does not support); the message names the variant and the reason. Nothing was
// written. Automatic selection never throws this: it falls through to the next variant.
class VariantUnsupported : public Error {
 public:
  using Error::Error;
};

// Families that have a dispatch table in this build.
std::vector<std::string> variant_families();

// The variants of `family`, best first. Throws Error for an unknown family.
std::vector<VariantInfo> list_variants(const std::string& family);

// True when CUDA device `device` has a compute capability in the variant's range (it may still
// decline particular problems). Throws Error for an unknown family or variant.
bool variant_runs_on_device(const std::string& family, const std::string& variant, int device);

// The variant the last launch of `family` ran ("" before the first). Throws Error for an unknown family.
std::string last_variant(const std::string& family);

// The variant `family` is forced to ("" = automatic selection). Throws Error for an unknown family.
std::string forced_variant(const std::string& family);

// Forces `family` to run `variant` while the guard lives ("" = automatic selection), then restores
// the previous setting. Throws Error for an unknown family or variant (the message lists the known
// ones). Guards nest; destroy them in reverse order.
class ForceVariant {
 public:
  ForceVariant(const std::string& family, const std::string& variant);
  ~ForceVariant();
  ForceVariant(const ForceVariant&) = delete;
  ForceVariant& operator=(const ForceVariant&) = delete;

 private:
  std::string family_, previous_;
};

}  // namespace mla
