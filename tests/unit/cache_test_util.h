// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the cache-op tests: pattern-filled caches (so that a stray write shows as a changed
// byte), an independent decoder of cache rows (not the library's reader), and e4m3 step sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/tensor.h"

namespace mla::test {

inline constexpr uint8_t kPattern = 0xC3;

// A cache of `format` filled byte-wise with kPattern. With `layers` > 1 the cache is the view of
// layer `layer` inside storage [num_blocks, layers, page, entry] (strided: the page stride spans
// every layer), as when one allocation holds several layers.
struct PatternCache {
  Tensor storage;
  KVCache cache;
};
inline PatternCache pattern_cache(CacheFormat format, int64_t num_blocks, int64_t page, float scale = 1.0f,
                                  int64_t layers = 1, int64_t layer = 0) {
  PatternCache p;
  const int64_t entry = cache_entry_elems(format);
  p.storage = Tensor::empty({num_blocks, layers, page, entry}, cache_dtype(format));
  std::memset(p.storage.data(), kPattern, p.storage.nbytes());
  const bool record = cache_format_info(format).record;  // the V4 records: d_qk 512 only
  p.cache = KVCache{p.storage.view().select(1, layer), format, scale, record ? 512 : 576, 64};
  validate_cache(p.cache);
  return p;
}

inline const uint8_t* row_ptr(const KVCache& c, int64_t slot) {
  return static_cast<const uint8_t*>(c.data.ptr_at({slot / c.page_size(), slot % c.page_size(), 0}));
}
inline std::vector<uint8_t> row_bytes(const KVCache& c, int64_t slot) {
  const uint8_t* p = row_ptr(c, slot);
  return std::vector<uint8_t>(p, p + cache_entry_bytes(c.format, c.d_qk));
}

// Empty when every byte of `p.storage` outside the rows of `written` still holds kPattern, else a
// description of the first stray byte.
inline std::string untouched_except(const PatternCache& p, const std::set<int64_t>& written) {
  const auto* base = static_cast<const uint8_t*>(p.storage.data());
  std::vector<bool> mask(p.storage.nbytes(), false);
  const int64_t row = cache_entry_bytes(p.cache.format, p.cache.d_qk);
  for (int64_t s : written) {
    const int64_t off = row_ptr(p.cache, s) - base;
    for (int64_t i = 0; i < row; ++i) mask[static_cast<std::size_t>(off + i)] = true;
  }
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (!mask[i] && base[i] != kPattern) return "byte " + std::to_string(i) + " of the storage was changed";
  return "";
}

// A DeepSeek-V4 record decoded from its bytes, spelled out from the layouts (not the traits):
//   v4      page of P rows: row r's 448 e4m3 codes + 64 bf16 rope at r * 576, its 7 ue8m0 scales (one
//           per 64 codes) at P * 576 + r * 8;
//   v41     512 e4m3 codes | 16 ue8m0 scales (one per 32);
//   v41_fp4 256 bytes of e2m1 pairs (low nibble first) | 32 e4m3 scales (one per 16).
// A ue8m0 byte b is 2^(b - 127) (0xff NaN).
inline double test_ue8m0(uint8_t b) { return b == 0xff ? NAN : std::ldexp(1.0, b - 127); }
inline double test_e2m1(uint8_t n) {
  const double m = (n & 7) < 2 ? 0.5 * (n & 7) : std::ldexp(1.0 + 0.5 * (n & 1), ((n & 7) >> 1) - 1);
  return n & 8 ? -m : m;
}
inline std::vector<double> decode_record(const KVCache& c, int64_t slot) {
  std::vector<double> v(512);
  const int64_t page = c.page_size(), blk = slot / page, r = slot % page;
  const auto* pg = static_cast<const uint8_t*>(c.data.data) + blk * c.data.stride[0];
  if (c.format == CacheFormat::v4) {
    const uint8_t* p = pg + r * 576;
    const uint8_t* sc = pg + page * 576 + r * 8;
    for (int i = 0; i < 448; ++i) v[i] = num::e4m3_to_float(p[i]) * test_ue8m0(sc[i / 64]);
    for (int i = 0; i < 64; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 448 + 2 * i, 2);
      v[448 + i] = num::bf16_to_float(h);
    }
  } else if (c.format == CacheFormat::v41) {
    const uint8_t* p = pg + r * c.data.stride[1];
    for (int i = 0; i < 512; ++i) v[i] = num::e4m3_to_float(p[i]) * test_ue8m0(p[512 + i / 32]);
  } else {
    const uint8_t* p = pg + r * c.data.stride[1];
    for (int i = 0; i < 512; ++i)
      v[i] = test_e2m1(static_cast<uint8_t>(i % 2 ? p[i / 2] >> 4 : p[i / 2] & 15)) * num::e4m3_to_float(p[256 + i / 16]);
  }
  return v;
}

// Row `slot` decoded from its bytes per §3: bf16 bits; e4m3 * scale; e4m3 * tile scale | bf16 rope;
// float64 values (f64); the V4 records by decode_record.
inline std::vector<double> decode_row(const KVCache& c, int64_t slot) {
  if (cache_format_info(c.format).record) return decode_record(c, slot);
  const uint8_t* p = row_ptr(c, slot);
  std::vector<double> v(static_cast<std::size_t>(c.d_qk));
  for (int i = 0; i < c.d_qk; ++i) {
    uint16_t h;
    float s;
    switch (c.format) {
      case CacheFormat::bf16:
        std::memcpy(&h, p + 2 * i, 2);
        v[i] = num::bf16_to_float(h);
        break;
      case CacheFormat::fp8:
        v[i] = static_cast<double>(num::e4m3_to_float(p[i])) * c.scale;
        break;
      case CacheFormat::fp8_ds_mla:
        if (i < 512) {
          std::memcpy(&s, p + 512 + 4 * (i / 128), 4);
          v[i] = static_cast<double>(num::e4m3_to_float(p[i])) * s;
        } else {
          std::memcpy(&h, p + 528 + 2 * (i - 512), 2);
          v[i] = num::bf16_to_float(h);
        }
        break;
      case CacheFormat::f64:
        std::memcpy(&v[i], p + 8 * i, 8);
        break;
      default:  // records: decode_record
        break;
    }
  }
  return v;
}

// Spacing of e4m3 values at magnitude |x| (subnormal quantum 2^-9 below 2^-6).
inline double e4m3_step(double x) {
  const double a = std::fabs(x);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, std::ilogb(a) - 3);
}

// A view with the same memory claiming to live on a CUDA device: device-mismatch checks must
// reject it before anything is read.
// The message of the mla::Error `call` throws ("(no error)" when it returns).
template <class F>
inline std::string error_of(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline TensorView on_fake_cuda(TensorView t) {
  t.device = Device::cuda(0);
  return t;
}

}  // namespace mla::test
