// SPDX-License-Identifier: Apache-2.0
#pragma once
// A CPU cache for the fuzz targets' two-poison runs: the rows a call may read hold the same random
// finite values in every run (drawn once), every other row holds poison 0xff (NaN in every format) in
// run 0 and 0x7e (large finite) in run 1, so an output that depends on the run read a row it must not.
//
// Speed (fuzz_layer spent a sixth of its time drawing rows): the random rows come from a pool of
// kPoolRows rows per row layout, drawn once with the unit tests' test::randomize_row (any finite
// value of the format); a readable slot s gets pool row (s * 7 + seed) % kPoolRows, so neighbouring
// rows differ and a row read at the wrong slot still shows in the oracle comparisons.
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "unit/attention_test_util.h"

namespace mla::fuzz {

struct PoisonedCache {
  static constexpr int64_t kPoolRows = 61;  // prime: (s * 7 + seed) % 61 cycles through every row
  CacheBuffer cb;
  std::vector<bool> readable;  // per slot; set before randomize()
  std::vector<uint8_t> values;  // the cache with its readable rows drawn (randomize)

  explicit PoisonedCache(CacheBuffer b) : cb(std::move(b)), readable(static_cast<std::size_t>(cb.cache.num_slots())) {}

  std::size_t row_bytes() const {
    return static_cast<std::size_t>(cache_entry_bytes(cb.cache.format, cb.cache.d_qk, cb.cache.d_rope));
  }
  // Random finite rows of this cache's layout, drawn once per layout (format, d_qk, d_rope).
  const uint8_t* pool() const {
    static std::map<std::tuple<int, int, int>, CacheBuffer> pools;
    auto& p = pools[{static_cast<int>(cb.cache.format), cb.cache.d_qk, cb.cache.d_rope}];
    if (!p.storage.defined()) {
      p = allocate_cache(cb.cache.format, 1, kPoolRows, Device::cpu(), 1.0f, cb.cache.d_qk, cb.cache.d_rope);
      test::reseed(5);
      for (int64_t s = 0; s < kPoolRows; ++s) test::randomize_row(p.cache, s);
    }
    return test::row_ptr(p.cache, 0);
  }
  // Readable rows drawn from the pool (it is one dense page: rows row_bytes() apart), the rest 0.
  void randomize(uint64_t seed) {
    std::memset(cb.storage.data(), 0, cb.storage.nbytes());
    const uint8_t* rows = pool();
    const std::size_t row = row_bytes();
    for (int64_t s = 0; s < cb.cache.num_slots(); ++s)
      if (readable[s]) {
        const auto i = static_cast<std::size_t>((static_cast<uint64_t>(s) * 7 + seed) % kPoolRows);
        std::memcpy(const_cast<uint8_t*>(test::row_ptr(cb.cache, s)), rows + i * row, row);
      }
    const auto* p = static_cast<const uint8_t*>(cb.storage.data());
    values.assign(p, p + cb.storage.nbytes());
  }
  // Poison for run `run` (0 or 1), readable rows as drawn.
  void prepare(int run) {
    auto* base = static_cast<uint8_t*>(cb.storage.data());
    std::memset(base, run ? 0x7e : 0xff, cb.storage.nbytes());
    const std::size_t row = row_bytes();
    for (int64_t s = 0; s < cb.cache.num_slots(); ++s)
      if (readable[s]) {
        const std::size_t off = static_cast<std::size_t>(test::row_ptr(cb.cache, s) - base);
        std::memcpy(base + off, values.data() + off, row);
      }
  }
};

}  // namespace mla::fuzz
