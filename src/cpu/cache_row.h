// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading one logical cache row on the CPU, for every format: the single place that knows how a
// slot's bytes turn into values (used by the gathers, decode and sparse attention). Values are the
// exact dequantised numbers (code * scale, mla/cache_format.h): bf16 -> float; fp8 -> e4m3 * scale;
// fp8_ds_mla -> e4m3 * tile scale for the latent values, bf16 rope copied; f64 -> the stored double;
// records (v4, v41, v41_fp4) -> e4m3 / e2m1 code * its block's scale byte, v4's bf16 rope copied.
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "mla/cache.h"

namespace mla::cpu {

// Address of slot `slot`'s row (block slot / page_size, offset slot % page_size), honouring strides. A
// record with page scales (v4) has its row bodies back to back from the page start instead.
inline const uint8_t* cache_row_ptr(const KVCache& c, int64_t slot) {
  const int64_t page = c.page_size();
  const int64_t blk = slot / page, off = slot % page;
  const int64_t es = static_cast<int64_t>(c.data.element_size());
  const uint8_t* base = static_cast<const uint8_t*>(c.data.data) + blk * c.data.stride[0] * es;
  const int64_t body = page_row_bytes(c.format);
  return body ? base + off * body : base + off * c.data.stride[1] * es;
}
inline uint8_t* cache_row_ptr_mut(const KVCache& c, int64_t slot) {
  return const_cast<uint8_t*>(cache_row_ptr(c, slot));
}

// One stored value (bf16 bits, an e4m3 code or a float64) at any byte address, exactly.
template <DType D>
inline double load_code(const uint8_t* p) {
  static_assert(D == DType::fp8_e4m3 || D == DType::bf16 || D == DType::f64,
                "cache values are bf16, e4m3 codes or float64");
  if constexpr (D == DType::fp8_e4m3) {
    return num::e4m3_to_float(*p);
  } else if constexpr (D == DType::f64) {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);  // rows of a byte view may sit at odd addresses
    return num::bf16_to_float(h);
  }
}

// Scale of latent column i (i < d_latent) and of the rope columns, per the format's scale kind.
template <class Fmt>
inline double latent_scale(const KVCache& c, const uint8_t* row, int64_t i) {
  if constexpr (Fmt::kScale == CacheScale::per_tensor) {
    return c.scale;
  } else if constexpr (Fmt::kScale == CacheScale::per_tile) {
    float s;
    std::memcpy(&s, row + Fmt::scale_offset(c.d_latent()) + 4 * (i / Fmt::kTile), 4);
    return s;
  } else {
    return 1.0;
  }
}
template <class Fmt>
inline double rope_scale(const KVCache& c) {
  return Fmt::rope_scaled() ? static_cast<double>(c.scale) : 1.0;
}

// Address of a record's scale slot (Fmt::kRecord): inside the row, or in its page's scale region.
template <class Fmt>
inline const uint8_t* record_scale_ptr(const KVCache& c, int64_t slot) {
  static_assert(Fmt::kRecord, "scale slots belong to block-scaled records");
  const int64_t page = c.page_size();
  const int64_t blk = slot / page, off = slot % page;
  const int64_t es = static_cast<int64_t>(c.data.element_size());
  const uint8_t* base = static_cast<const uint8_t*>(c.data.data) + blk * c.data.stride[0] * es;
  if constexpr (Fmt::kPageScales) return base + Fmt::page_scale_offset(page, off);
  return cache_row_ptr(c, slot) + Fmt::scale_offset(c.d_latent());
}

// Code i of a record (Fmt::kRecord) as a number: the e4m3 byte or the e2m1 nibble, unscaled.
template <class Fmt>
inline double record_code(const uint8_t* codes, int64_t i) {
  if constexpr (Fmt::kCode == CacheCode::e2m1) {
    const uint8_t b = codes[i / 2];
    return num::e2m1_to_float(static_cast<uint8_t>(i % 2 ? b >> 4 : b & 0xfu));
  } else {
    return num::e4m3_to_float(codes[i]);
  }
}
// Value of a record's scale byte.
template <class Fmt>
inline double record_scale(uint8_t b) {
  if constexpr (Fmt::kScale == CacheScale::ue8m0) return num::ue8m0_to_double(b);
  else return num::e4m3_to_float(b);
}

// The first `cols` values of a record row: code * its tile's scale (exact in double, rounded once to
// T), and for a v4 row the bf16 rope after its d_latent coded values.
template <class Fmt, class T>
inline void load_record_row(const KVCache& c, int64_t slot, T* out, int64_t cols) {
  const uint8_t* row = cache_row_ptr(c, slot);
  const uint8_t* sc = record_scale_ptr<Fmt>(c, slot);
  const int64_t coded = Fmt::coded_cols(c.d_latent()), nc = cols < coded ? cols : coded;
  for (int64_t i = 0; i < nc; ++i)
    out[i] = static_cast<T>(record_code<Fmt>(row, i) * record_scale<Fmt>(sc[i / Fmt::kTile]));
  const uint8_t* rope = row + Fmt::rope_offset(c.d_latent());
  for (int64_t i = nc; i < cols; ++i) out[i] = static_cast<T>(load_code<DType::bf16>(rope + 2 * (i - coded)));
}

// Writes the first `cols` (<= d_qk) dequantised values of row `slot` into out[0..cols), for the format
// Fmt (CacheFormatTraits): code * scale, exact in double, rounded once to T.
template <class Fmt, class T>
inline void load_cache_row(const KVCache& c, int64_t slot, T* out, int cols) {
  if constexpr (Fmt::kRecord) {
    load_record_row<Fmt>(c, slot, out, cols);
  } else {
    const uint8_t* row = cache_row_ptr(c, slot);
    const int64_t latent = c.d_latent();
    constexpr int64_t lb = dtype_bytes(Fmt::kLatentDType), rb = dtype_bytes(Fmt::kRopeDType);
    const int nl = cols < latent ? cols : static_cast<int>(latent);
    for (int i = 0; i < nl; ++i)
      out[i] = static_cast<T>(load_code<Fmt::kLatentDType>(row + lb * i) * latent_scale<Fmt>(c, row, i));
    const uint8_t* rope = row + Fmt::rope_offset(latent);
    const double rs = rope_scale<Fmt>(c);
    for (int i = nl; i < cols; ++i) out[i] = static_cast<T>(load_code<Fmt::kRopeDType>(rope + rb * (i - latent)) * rs);
  }
}

// The same for a run-time format.
template <class T>
inline void load_cache_row(const KVCache& c, int64_t slot, T* out, int cols) {
  dispatch_cache_format(c.format, [&](auto fmt) { load_cache_row<decltype(fmt)>(c, slot, out, cols); });
}

}  // namespace mla::cpu
