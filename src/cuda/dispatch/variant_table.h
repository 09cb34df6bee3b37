// SPDX-License-Identifier: Apache-2.0
#pragma once
// The dispatch table of one CUDA kernel family (include/mla/variants.h is the public face). Plain C++,
// no CUDA headers: the selection logic is unit-tested on the CPU (tests/unit/test_variants.cpp).
//
// A family's launcher (src/cuda/<family>/launch.cu) packs its arguments into an Args struct and calls
// table.run(args, device_cc). Adding a variant: write its `supports` predicate (nullptr = supported,
// else a static string saying why not) and its `run`, and insert one entry in the family's list at its
// rank (best first); the GPU tests then run it in the family's sweep (tests/gpu/variant_test_util.h).
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mla/error.h"
#include "mla/variants.h"

namespace mla::cuda::dispatch {

// Type-erased part: the names, the override and the last choice (what the public API reads).
class Family {
 public:
  explicit Family(std::string name) : name_(std::move(name)) {}
  virtual ~Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  const std::string& name() const { return name_; }
  virtual std::vector<VariantInfo> variants() const = 0;

  // The entry named `variant`; throws Error listing the known names when there is none.
  VariantInfo info(const std::string& variant) const {
    std::string known;
    for (const VariantInfo& v : variants()) {
      if (v.name == variant) return v;
      known += (known.empty() ? "" : ", ") + v.name;
    }
    throw Error("kernel family '" + name_ + "' has no variant '" + variant + "' (variants: " + known + ")");
  }
  // Sets the override ("" = automatic) and returns the previous one. Unknown names throw Error.
  std::string force(const std::string& variant) {
    if (!variant.empty()) info(variant);
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(forced_, variant);
  }
  std::string forced() const {
    std::lock_guard<std::mutex> lock(mu_);
    return forced_;
  }
  std::string last() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 protected:
  void set_last(const std::string& v) {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = v;
  }

 private:
  std::string name_;
  mutable std::mutex mu_;
  std::string forced_, last_;
};

inline bool cc_in_range(const VariantInfo& v, int cc) { return cc >= v.min_cc && (v.max_cc == 0 || cc <= v.max_cc); }

inline std::string cc_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }
inline std::string cc_range_string(const VariantInfo& v) {
  if (v.max_cc == 0) return cc_string(v.min_cc) + "+";
  return v.max_cc == v.min_cc ? cc_string(v.min_cc) : cc_string(v.min_cc) + ".." + cc_string(v.max_cc);
}

template <class Args>
class Table final : public Family {
 public:
  struct Variant {
    VariantInfo info;
    const char* (*supports)(const Args&);  // nullptr (the function or its result): supported
    void (*run)(const Args&);
    // Automatic selection only: whether the family's host rule picks this variant for `a` among those that
    // support it (nullptr: always). A forced variant runs wherever it is supported; the rule chooses among
    // kernels that could all run a problem (e.g. the sm90 decode kernels, core/decode_regime.h).
    bool (*prefers)(const Args&) = nullptr;
  };

  Table(std::string family, std::vector<Variant> list) : Family(std::move(family)), list_(std::move(list)) {}

  std::vector<VariantInfo> variants() const override {
    std::vector<VariantInfo> out;
    for (const Variant& v : list_) out.push_back(v.info);
    return out;
  }

  // The variant that runs `a` on a device of compute capability `cc` (major * 10 + minor): the forced one
  // (VariantUnsupported when it cannot), else the first in rank order that can and that its rule prefers (Error
  // when none can).
  const Variant& select(const Args& a, int cc) const {
    const std::string want = forced();
    std::string why_not;
    for (const Variant& v : list_) {
      if (!want.empty() && v.info.name != want) continue;
      std::string r;
      if (!cc_in_range(v.info, cc))
        r = "needs compute capability " + cc_range_string(v.info) + ", the device has " + cc_string(cc);
      else if (const char* why = v.supports != nullptr ? v.supports(a) : nullptr)
        r = why;
      else if (want.empty() && v.prefers != nullptr && !v.prefers(a))
        r = "the host rule prefers another kernel for this problem";
      if (r.empty()) return v;
      if (!want.empty())
        throw VariantUnsupported(name() + ": forced variant '" + want + "' cannot run this launch: " + r);
      why_not += (why_not.empty() ? "" : "; ") + v.info.name + ": " + r;
    }
    throw Error(name() + ": no kernel variant can run this launch (" + why_not + ")");
  }

  // Selects, records the choice (last()) and runs it.
  void run(const Args& a, int cc) {
    const Variant& v = select(a, cc);
    set_last(v.info.name);
    v.run(a);
  }

 private:
  std::vector<Variant> list_;
};

}  // namespace mla::cuda::dispatch
