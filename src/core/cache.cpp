// SPDX-License-Identifier: Apache-2.0
#include "mla/cache.h"

#include <cmath>
#include <sstream>

#include "core/check.h"

namespace mla {

const char* to_string(CacheFormat f) { return is_valid(f) ? cache_format_info(f).name : "?"; }

CacheFormat cache_format_from_string(const std::string& s) {
  std::string names;
  for (const CacheFormatInfo& i : kCacheFormatTable) {
    if (s == i.name) return i.format;
    std::istringstream aliases(i.aliases);
    for (std::string a; aliases >> a;)
      if (s == a) return i.format;
    names += names.empty() ? i.name : std::string(", ") + i.name;
  }
  throw Error(fmt::format("unknown cache format '{}': expected one of {}", s, names));
}

void check_ds_mla_scale(DsMlaScale s, const char* what) {
  MLA_CHECK(s == DsMlaScale::amax || s == DsMlaScale::pow2, "{}: unknown DsMlaScale value {} (expected 0 amax or 1 pow2)",
            what, static_cast<int>(s));
}

int64_t cache_entry_bytes(CacheFormat format, int d_qk, int d_rope) {
  return cache_format_info(format).entry_bytes(d_qk, d_rope);
}

int64_t cache_entry_elems(CacheFormat format, int d_qk, int d_rope) {
  return cache_format_info(format).entry_elems(d_qk, d_rope);
}

DType cache_dtype(CacheFormat format) { return cache_format_info(format).dtype; }

CacheBuffer allocate_cache(CacheFormat format, int64_t num_blocks, int64_t page_size, Device device, float scale,
                           int d_qk, int d_rope) {
  check_cache_format(format, "allocate_cache");
  MLA_CHECK(cache_format_info(format).device || !device.is_cuda(),
            "allocate_cache: the {} cache format is CPU-only; a CUDA cache is {}", to_string(format),
            device_cache_format_names());
  MLA_CHECK(num_blocks >= 1 && page_size >= 1, "allocate_cache: num_blocks and page_size must be >= 1, got {} and {}",
            num_blocks, page_size);
  CacheBuffer b;
  b.storage = Tensor::empty({num_blocks, page_size, cache_entry_elems(format, d_qk, d_rope)}, cache_dtype(format), device);
  b.cache = KVCache{b.storage.view(), format, scale, d_qk, d_rope};
  validate_cache(b.cache);
  return b;
}

void validate_cache(const KVCache& c, const char* what) {
  check_cache_format(c.format, what);
  const CacheFormatInfo& f = cache_format_info(c.format);
  MLA_CHECK(f.device || !c.data.device.is_cuda(),
            "{}: the {} cache format is CPU-only; a CUDA cache is {}, got {}", what, f.name,
            device_cache_format_names(), c.data.describe());
  detail::check_ndim(c.data, 3, what, "cache.data [num_blocks, page_size, entry]");
  MLA_CHECK(c.data.size(0) >= 1 && c.data.size(1) >= 1, "{}: cache needs num_blocks >= 1 and page_size >= 1, got {}",
            what, c.data.describe());
  MLA_CHECK(c.d_rope > 0 && c.d_qk > c.d_rope, "{}: cache dims need d_qk > d_rope > 0, got d_qk={} d_rope={}", what,
            c.d_qk, c.d_rope);
  MLA_CHECK(f.admits(c.d_qk, c.d_rope), "{}: a {} cache needs d_qk {} and d_rope {}, got {} and {}", what, f.name,
            f.d_qk, f.d_rope, c.d_qk, c.d_rope);
  MLA_CHECK(c.data.dtype == f.dtype || c.data.dtype == f.alt_dtype, "{}: a {} cache holds {} (or {}), got {}", what,
            f.name, to_string(f.dtype), to_string(f.alt_dtype), c.data.describe());
  detail::check_inner_contiguous(c.data, what, "cache.data");
  detail::check_strides(c.data, true, what, "cache.data");
  const int64_t entry = f.entry_elems(c.d_qk, c.d_rope);
  MLA_CHECK(c.data.size(2) == entry, "{}: a {} cache row holds {} elements, got {}", what, f.name, entry,
            c.data.describe());
  // A page of a record with page scales is one run of page_size * entry bytes ([rows | scale region]).
  if (f.page_scales)
    MLA_CHECK(c.data.stride[1] == entry, "{}: a {} cache page must be contiguous (row stride {}), got {}", what,
              f.name, entry, c.data.describe());
  if (f.scale == CacheScale::per_tensor)
    MLA_CHECK(std::isfinite(c.scale) && c.scale > 0, "{}: {} cache scale must be positive and finite, got {}", what,
              f.name, c.scale);
}

}  // namespace mla
