#pragma once
// Seeded synthetic data for `mla run`: bulk bf16 activations and the sparse top-k rows a V3.2
// indexer would hand the layer. A splitmix64 stream, not <random>'s engines and distributions: a
// CUDA run draws tens of millions of values per step and this keeps that well under the step time.
#include <cstdint>
#include <vector>

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
  // Uniform integer in [0, n), n >= 1 (Lemire's multiply-shift; the bias is below 2^-32 for our n).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next() >> 1) * static_cast<uint64_t>(n)) >> 63);
  }
  // Uniform double in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// n bf16 values uniform in [lo, hi), rounded to nearest even.
void fill_uniform_bf16(uint16_t* dst, int64_t n, FastRng& rng, double lo, double hi);

// One sparse top-k row of `width` entries (the model's index_topk) for the token at request-local
// position `pos`: min(topk, pos + 1) distinct positions in [0, pos] that always include pos itself
// (the causal top-k of an indexer contains the token's own key), in random order as a valid prefix,
// then -1 up to `width`. topk <= width.
// `mark` is scratch the caller keeps between calls (grown as needed, left all-zero).
void sparse_topk_row(int32_t* row, int64_t width, int64_t topk, int64_t pos, FastRng& rng, std::vector<uint8_t>& mark);

}  // namespace mla::app
