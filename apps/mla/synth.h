// SPDX-License-Identifier: Apache-2.0
#pragma once
// Seeded synthetic data for `mla run`: bulk bf16 activations and the sparse top-k rows a V3.2
// indexer would hand the layer. splitmix64 streams rather than <random>'s engines: a CUDA run draws
// tens of millions of values per step, so generation runs on every core, and each block of values
// has its own stream derived from (seed, block) so that the data do not depend on the thread count.
#include <cstdint>

namespace mla::app {

class FastRng {
 public:
  explicit FastRng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n), n >= 1 (multiply-shift; the bias is below 2^-32 for our n).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next() >> 1) * static_cast<uint64_t>(n)) >> 63);
  }
  // Uniform double in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// A seed for sub-stream `index` of stream `seed`.
uint64_t substream(uint64_t seed, uint64_t index);

// n bf16 values uniform in [lo, hi), rounded to nearest even.
void fill_uniform_bf16(uint16_t* dst, int64_t n, uint64_t seed, double lo, double hi);

// Sparse top-k rows [T, width] (width = the model's index_topk) for tokens at request-local
// positions pos[0..T): row t holds min(topk, pos[t] + 1) distinct positions in [0, pos[t]] that
// always include pos[t] itself (an indexer's causal top-k contains the token's own key), in random
// order as a valid prefix, then -1 up to `width`. topk <= width.
void fill_sparse_topk(int32_t* rows, int64_t T, const int32_t* pos, int64_t width, int64_t topk, uint64_t seed);

}  // namespace mla::app
