// SPDX-License-Identifier: Apache-2.0
// The indexer K cache descriptor (mla/indexer.h, docs/INDEXER.md §1): allocation and validation.
#include "core/check.h"
#include "core/checked.h"
#include "mla/indexer.h"

namespace mla {

void check_indexer_scale(IndexerScale s, const char* what) {
  MLA_CHECK(s == IndexerScale::ue8m0 || s == IndexerScale::amax,
            "{}: unknown IndexerScale value {} (expected 0 ue8m0 or 1 amax)", what, static_cast<int>(s));
}

IndexerCacheBuffer allocate_indexer_cache(int64_t num_blocks, int64_t page_size, Device device) {
  MLA_CHECK(num_blocks >= 1 && page_size >= 1,
            "allocate_indexer_cache: num_blocks and page_size must be >= 1, got {} and {}", num_blocks, page_size);
  IndexerCacheBuffer b;
  b.storage = Tensor::empty({num_blocks, page_size, kIndexerEntryBytes}, DType::u8, device);
  b.cache = IndexerKCache{b.storage.view()};
  validate_indexer_cache(b.cache, "allocate_indexer_cache");
  return b;
}

void validate_indexer_cache(const IndexerKCache& c, const char* what) {
  const TensorView& d = c.data;
  detail::check_ndim(d, 3, what, "cache.data [num_blocks, page_size, 132]");
  MLA_CHECK(d.dtype == DType::u8 || d.dtype == DType::fp8_e4m3, "{}: the indexer cache holds u8 bytes, got {}", what,
            d.describe());
  MLA_CHECK(d.size(0) >= 1 && d.size(1) >= 1, "{}: indexer cache needs num_blocks >= 1 and page_size >= 1, got {}",
            what, d.describe());
  MLA_CHECK(d.size(2) == kIndexerEntryBytes, "{}: an indexer cache row holds {} bytes (128 e4m3 + fp32 scale), got {}",
            what, kIndexerEntryBytes, d.describe());
  // The block's bytes are one structure-of-arrays record: values of every token, then the scales.
  MLA_CHECK(d.stride[2] == 1 && d.stride[1] == kIndexerEntryBytes,
            "{}: an indexer cache block must be contiguous (inner strides (132, 1): values then scales per "
            "block), got {}",
            what, d.describe());
  const int64_t block_bytes = detail::checked_mul(d.size(1), kIndexerEntryBytes, "indexer cache block bytes");
  MLA_CHECK(d.stride[0] >= block_bytes || d.size(0) == 1,
            "{}: indexer cache blocks overlap: block stride {} < page_size * 132 = {} ({})", what, d.stride[0],
            block_bytes, d.describe());
  MLA_CHECK(d.stride[0] % 4 == 0 || d.size(0) == 1,
            "{}: the indexer cache block stride must be a multiple of 4 bytes (fp32 scales), got {}", what,
            d.describe());
  MLA_CHECK(reinterpret_cast<uintptr_t>(d.data) % 4 == 0, "{}: the indexer cache must be 4-byte aligned, got {}",
            what, d.describe());
  detail::check_device_value(d.device, what, "cache.data");
}

}  // namespace mla
