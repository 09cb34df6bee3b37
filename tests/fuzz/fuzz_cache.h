#pragma once
// A CPU cache for the fuzz targets' two-poison runs: the rows a call may read hold the same random
// finite values in every run (drawn once), every other row holds poison 0xff (NaN in every format) in
// run 0 and 0x7e (large finite) in run 1, so an output that depends on the run read a row it must not.
#include <cstring>
#include <vector>

#include "unit/attention_test_util.h"

namespace mla::fuzz {

struct PoisonedCache {
  CacheBuffer cb;
  std::vector<bool> readable;  // per slot; set before randomize()
  std::vector<uint8_t> values;  // the cache with its readable rows drawn (randomize)

  explicit PoisonedCache(CacheBuffer b) : cb(std::move(b)), readable(static_cast<std::size_t>(cb.cache.num_slots())) {}

  void randomize(uint64_t seed) {
    std::memset(cb.storage.data(), 0, cb.storage.nbytes());
    test::reseed(seed);
    for (int64_t s = 0; s < cb.cache.num_slots(); ++s)
      if (readable[s]) test::randomize_row(cb.cache, s);
    const auto* p = static_cast<const uint8_t*>(cb.storage.data());
    values.assign(p, p + cb.storage.nbytes());
  }
  // Poison for run `run` (0 or 1), readable rows as drawn.
  void prepare(int run) {
    auto* base = static_cast<uint8_t*>(cb.storage.data());
    std::memset(base, run ? 0x7e : 0xff, cb.storage.nbytes());
    const auto row = static_cast<std::size_t>(cache_entry_bytes(cb.cache.format, cb.cache.d_qk, cb.cache.d_rope));
    for (int64_t s = 0; s < cb.cache.num_slots(); ++s)
      if (readable[s]) {
        const std::size_t off = static_cast<std::size_t>(test::row_ptr(cb.cache, s) - base);
        std::memcpy(base + off, values.data() + off, row);
      }
  }
};

}  // namespace mla::fuzz
