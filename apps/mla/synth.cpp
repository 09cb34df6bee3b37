// SPDX-License-Identifier: Apache-2.0
#include "synth.h"

#include <algorithm>
#include <vector>

#include "core/numeric.h"

namespace mla::app {

uint64_t substream(uint64_t seed, uint64_t index) {
  FastRng r(seed ^ (index * 0xd1b54a32d192ed03ull));
  return r.next();
}

void fill_uniform_bf16(uint16_t* dst, int64_t n, uint64_t seed, double lo, double hi) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    FastRng rng(substream(seed, static_cast<uint64_t>(b)));
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) dst[i] = num::float_to_bf16(static_cast<float>(rng.uniform(lo, hi)));
  }
}

namespace {

void topk_row(int32_t* row, int64_t width, int64_t topk, int64_t pos, FastRng& rng, std::vector<uint8_t>& mark) {
  const int64_t n = pos + 1;
  const int64_t k = std::min(topk, n);
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) row[i] = static_cast<int32_t>(i);
  } else {
    // Floyd's sampling of k - 1 distinct positions from [0, pos), then pos itself: O(k), not O(pos).
    if (static_cast<int64_t>(mark.size()) < n) mark.resize(static_cast<std::size_t>(n), 0);
    int64_t m = 0;
    for (int64_t j = pos - (k - 1); j < pos; ++j) {
      const int64_t t = rng.below(j + 1);
      const int64_t pick = mark[static_cast<std::size_t>(t)] ? j : t;
      mark[static_cast<std::size_t>(pick)] = 1;
      row[m++] = static_cast<int32_t>(pick);
    }
    row[m++] = static_cast<int32_t>(pos);
    for (int64_t i = 0; i < m - 1; ++i) mark[static_cast<std::size_t>(row[i])] = 0;
  }
  // Random order inside the valid prefix: kernels must not rely on sorted indices.
  for (int64_t i = k - 1; i > 0; --i) std::swap(row[i], row[rng.below(i + 1)]);
  std::fill(row + k, row + width, -1);
}

}  // namespace

void fill_sparse_topk(int32_t* rows, int64_t T, const int32_t* pos, int64_t width, int64_t topk, uint64_t seed) {
#pragma omp parallel
  {
    std::vector<uint8_t> mark;  // per thread, all-zero between rows
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      FastRng rng(substream(seed, static_cast<uint64_t>(t)));
      topk_row(rows + t * width, width, topk, pos[t], rng, mark);
    }
  }
}

}  // namespace mla::app
