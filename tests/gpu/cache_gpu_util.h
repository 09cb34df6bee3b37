// SPDX-License-Identifier: Apache-2.0
#pragma once
// Mirrored paged caches for the GPU cache-op tests: host storage (the CPU oracle's cache) and its
// device copy, poisoned with 0xFF bytes (NaN in bf16, e4m3 and the fp32 scales) wherever no token was
// written, so that a stray read shows up as NaN in a gathered row.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "gpu_test_util.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla::test {

inline constexpr uint8_t kCachePoison = 0xFF;

// n distinct random slots of a cache of num_slots (shuffled), every fifth (from the first) -1: skipped.
inline std::vector<int64_t> random_slots(int64_t n, int64_t num_slots) {
  std::vector<int64_t> all(static_cast<std::size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng());
  std::vector<int64_t> s(all.begin(), all.begin() + n);
  for (std::size_t i = 0; i < s.size(); i += 5) s[i] = -1;
  return s;
}

// A cache of `format` as the view of layer 1 inside storage [num_blocks, 2, page, entry] (so the
// block stride spans two layers), starting `offset_elems` elements into the storage (a non-zero
// offset makes the rows misaligned for 16-byte accesses and exercises the element-wise kernels).
struct CacheMirror {
  Tensor host_storage, dev_storage;
  KVCache host, dev;

  CacheMirror(CacheFormat format, int64_t num_blocks, int64_t page, float scale = 1.0f, int64_t offset_elems = 0,
              int d_qk = 576) {
    const int64_t entry = cache_entry_elems(format, d_qk);
    const DType dt = cache_dtype(format);
    const int64_t elems = num_blocks * 2 * page * entry + offset_elems;
    host_storage = Tensor::empty({elems}, dt);
    std::memset(host_storage.data(), kCachePoison, host_storage.nbytes());
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    char* base = static_cast<char*>(host_storage.data()) + (offset_elems + page * entry) * es;  // layer 1
    const int64_t shape[3] = {num_blocks, page, entry}, stride[3] = {2 * page * entry, entry, 1};
    host = KVCache{TensorView(base, dt, shape, stride), format, scale, d_qk};
    validate_cache(host);
    sync();
  }
  // Copies the host storage to the device (after host-side writes).
  void sync() {
    dev_storage = host_storage.to(Device::cuda(0));
    dev = host;
    dev.data = rebase(host.data, host_storage, dev_storage);
  }
  // Fills the given slots with random tokens (CPU writer), then syncs.
  void fill_slots(const std::vector<int64_t>& slots, double lo = -3, double hi = 3) {
    const auto n = static_cast<int64_t>(slots.size());
    if (n == 0) return sync();
    write_cache(random_tensor({n, host.d_latent()}, DType::bf16, Device::cpu(), lo, hi),
                random_tensor({n, host.d_rope}, DType::bf16, Device::cpu(), lo, hi), int64_tensor(slots), host);
    sync();
  }
  std::vector<uint8_t> host_bytes_all() const { return host_bytes(host_storage); }
  std::vector<uint8_t> dev_bytes_all() const { return host_bytes(dev_storage); }
};

// A batch of requests reading a cache through a block table (§5): request b has lens[b] rows
// starting at logical position starts[b]. The table has `width` columns; positions whose block lies
// beyond it are outside the table. Table entries are distinct random blocks; only referenced blocks
// are filled with tokens, the rest stay poisoned.
struct GatherBatch {
  std::vector<int32_t> lens, starts;
  int64_t page = 1, width = 0, num_blocks = 0;
  std::vector<int32_t> table;  // [B, width] row-major

  GatherBatch(std::vector<int32_t> l, std::vector<int32_t> s, int64_t page_size, int64_t table_width)
      : lens(std::move(l)), starts(std::move(s)), page(page_size), width(table_width) {
    const auto B = static_cast<int64_t>(lens.size());
    num_blocks = B * width + 3;
    std::vector<int32_t> ids(static_cast<std::size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    table.assign(ids.begin(), ids.begin() + B * width);
  }
  int64_t B() const { return static_cast<int64_t>(lens.size()); }
  int64_t total() const { return std::accumulate(lens.begin(), lens.end(), int64_t{0}); }
  // All slots of the referenced blocks.
  std::vector<int64_t> referenced_slots() const {
    std::vector<int64_t> s;
    for (int32_t blk : table)
      for (int64_t o = 0; o < page; ++o) s.push_back(blk * page + o);
    return s;
  }
  // Block-table column of token i of request b, or -1 when outside the table.
  int64_t column(int64_t b, int64_t i) const {
    const int64_t blk = (starts[static_cast<std::size_t>(b)] + i) / page;
    return blk < width ? blk : -1;
  }
};

}  // namespace mla::test
