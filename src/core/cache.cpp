#include "mla/cache.h"

#include <cmath>

#include "core/check.h"

namespace mla {

int64_t cache_entry_bytes(CacheFormat format, int d_qk) {
  switch (format) {
    case CacheFormat::bf16: return 2 * static_cast<int64_t>(d_qk);
    case CacheFormat::fp8: return d_qk;
    case CacheFormat::fp8_ds_mla: return ds_mla::kEntryBytes;
  }
  throw Error("cache_entry_bytes: unknown format");
}

int64_t cache_entry_elems(CacheFormat format, int d_qk) {
  return format == CacheFormat::fp8_ds_mla ? ds_mla::kEntryBytes : d_qk;
}

DType cache_dtype(CacheFormat format) {
  switch (format) {
    case CacheFormat::bf16: return DType::bf16;
    case CacheFormat::fp8: return DType::fp8_e4m3;
    case CacheFormat::fp8_ds_mla: return DType::u8;
  }
  throw Error("cache_dtype: unknown format");
}

CacheBuffer allocate_cache(CacheFormat format, int64_t num_blocks, int64_t page_size, Device device, float scale,
                           int d_qk, int d_rope) {
  MLA_CHECK(num_blocks >= 1 && page_size >= 1, "allocate_cache: num_blocks and page_size must be >= 1, got {} and {}",
            num_blocks, page_size);
  CacheBuffer b;
  b.storage = Tensor::empty({num_blocks, page_size, cache_entry_elems(format, d_qk)}, cache_dtype(format), device);
  b.cache = KVCache{b.storage.view(), format, scale, d_qk, d_rope};
  validate_cache(b.cache);
  return b;
}

void validate_cache(const KVCache& c, const char* what) {
  detail::check_ndim(c.data, 3, what, "cache.data [num_blocks, page_size, entry]");
  MLA_CHECK(c.data.size(0) >= 1 && c.data.size(1) >= 1, "{}: cache needs num_blocks >= 1 and page_size >= 1, got {}",
            what, c.data.describe());
  MLA_CHECK(c.d_rope > 0 && c.d_qk > c.d_rope, "{}: cache dims need d_qk > d_rope > 0, got d_qk={} d_rope={}", what,
            c.d_qk, c.d_rope);
  detail::check_inner_contiguous(c.data, what, "cache.data");
  detail::check_strides(c.data, true, what, "cache.data");
  const int64_t entry = cache_entry_elems(c.format, c.d_qk);
  MLA_CHECK(c.data.size(2) == entry, "{}: a {} cache row holds {} elements, got {}", what, to_string(c.format), entry,
            c.data.describe());
  switch (c.format) {
    case CacheFormat::bf16:
      detail::check_dtype(c.data, DType::bf16, what, "bf16 cache");
      break;
    case CacheFormat::fp8:
      MLA_CHECK(c.data.dtype == DType::fp8_e4m3 || c.data.dtype == DType::u8,
                "{}: fp8 cache must be fp8_e4m3 (or u8 bytes), got {}", what, c.data.describe());
      MLA_CHECK(std::isfinite(c.scale) && c.scale > 0, "{}: fp8 cache scale must be positive and finite, got {}", what,
                c.scale);
      break;
    case CacheFormat::fp8_ds_mla:
      MLA_CHECK(c.data.dtype == DType::u8 || c.data.dtype == DType::fp8_e4m3,
                "{}: fp8_ds_mla cache must be u8 bytes, got {}", what, c.data.describe());
      MLA_CHECK(c.d_qk == 576 && c.d_rope == 64, "{}: fp8_ds_mla needs d_qk 576 and d_rope 64, got {} and {}", what,
                c.d_qk, c.d_rope);
      break;
  }
}

}  // namespace mla
