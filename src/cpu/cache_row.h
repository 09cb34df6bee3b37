#pragma once
// Reading one logical cache row on the CPU, for every format: the single place that knows how a
// slot's bytes turn into values (used by the gathers, decode and sparse attention). Values are the
// exact dequantised numbers: bf16 -> float; fp8 -> e4m3 * scale; fp8_ds_mla -> e4m3 * tile scale for
// the 512 latent values, bf16 rope copied.
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

// Writes the first `cols` (<= d_qk) dequantised values of row `slot` into out[0..cols).
template <class T>
inline void load_cache_row(const KVCache& c, int64_t slot, T* out, int cols) {
  const uint8_t* row = cache_row_ptr(c, slot);
  switch (c.format) {
    case CacheFormat::bf16: {
      for (int i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = static_cast<T>(num::bf16_to_float(h));
      }
      return;
    }
    case CacheFormat::fp8: {
      const double s = c.scale;
      for (int i = 0; i < cols; ++i) out[i] = static_cast<T>(static_cast<double>(num::e4m3_to_float(row[i])) * s);
      return;
    }
    case CacheFormat::fp8_ds_mla: {
      float scales[ds_mla::kNumTiles];
      std::memcpy(scales, row + ds_mla::kScaleOffset, sizeof(scales));
      const int nope = cols < ds_mla::kNopeDim ? cols : static_cast<int>(ds_mla::kNopeDim);
      for (int i = 0; i < nope; ++i)
        out[i] = static_cast<T>(static_cast<double>(num::e4m3_to_float(row[i])) *
                                static_cast<double>(scales[i / ds_mla::kTile]));
      for (int i = nope; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, row + ds_mla::kRopeOffset + 2 * (i - ds_mla::kNopeDim), 2);
        out[i] = static_cast<T>(num::bf16_to_float(h));
      }
      return;
    }
  }
}

}  // namespace mla::cpu
