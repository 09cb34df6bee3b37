// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading one logical cache row on the CPU, for every format: the single place that knows how a
// slot's bytes turn into values (used by the gathers, decode and sparse attention). Values are the
// exact dequantised numbers (code * scale, mla/cache_format.h): bf16 -> float; fp8 -> e4m3 * scale;
// fp8_ds_mla -> e4m3 * tile scale for the latent values, bf16 rope copied; f64 -> the stored double.
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "mla/cache.h"

namespace mla::cpu {

// Address of slot `slot`'s row (block slot / page_size, offset slot % page_size), honouring strides.
inline const uint8_t* cache_row_ptr(const KVCache& c, int64_t slot) {
  const int64_t page = c.page_size();
  const int64_t blk = slot / page, off = slot % page;
  const int64_t elem = blk * c.data.stride[0] + off * c.data.stride[1];
  return static_cast<const uint8_t*>(c.data.data) + elem * static_cast<int64_t>(c.data.element_size());
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

// Writes the first `cols` (<= d_qk) dequantised values of row `slot` into out[0..cols), for the format
// Fmt (CacheFormatTraits): code * scale, exact in double, rounded once to T.
template <class Fmt, class T>
inline void load_cache_row(const KVCache& c, int64_t slot, T* out, int cols) {
  const uint8_t* row = cache_row_ptr(c, slot);
  const int64_t latent = c.d_latent();
  constexpr int64_t lb = dtype_bytes(Fmt::kLatentDType), rb = dtype_bytes(Fmt::kRopeDType);
  const int nl = cols < latent ? cols : static_cast<int>(latent);
  for (int i = 0; i < nl; ++i) out[i] = static_cast<T>(load_code<Fmt::kLatentDType>(row + lb * i) * latent_scale<Fmt>(c, row, i));
  const uint8_t* rope = row + Fmt::rope_offset(latent);
  const double rs = rope_scale<Fmt>(c);
  for (int i = nl; i < cols; ++i) out[i] = static_cast<T>(load_code<Fmt::kRopeDType>(rope + rb * (i - latent)) * rs);
}

// The same for a run-time format.
template <class T>
inline void load_cache_row(const KVCache& c, int64_t slot, T* out, int cols) {
  dispatch_cache_format(c.format, [&](auto fmt) { load_cache_row<decltype(fmt)>(c, slot, out, cols); });
}

}  // namespace mla::cpu
