// SPDX-License-Identifier: Apache-2.0
// CPU cache write and gathers (semantics §3-§5). Arguments were validated by the front ends in
// src/ops/cache_ops.cpp; here every slot and block id is known to be inside the cache.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "cpu/cache_row.h"
#include "cpu/cpu_ops.h"
#include "core/index_view.h"

namespace mla::cpu {
namespace {

// Address of element (row, col) of a 2-D view.
inline const char* elem_ptr(const TensorView& t, int64_t row, int64_t col) {
  const int64_t off = row * t.stride[0] + col * t.stride[1];
  return static_cast<const char*>(t.data) + off * static_cast<int64_t>(t.element_size());
}

// bf16 bits of one input element, correctly rounded. bf16 inputs are copied bit-exactly. An f64
// value is first rounded to float *to odd* (truncate, then set the last bit if anything was lost):
// float keeps 16 more bits than bf16, so the final round-to-nearest-even sees the same tie/no-tie
// decision as a direct double -> bf16 rounding (plain double -> float -> bf16 could round twice).
inline uint16_t bf16_bits(const char* p, DType t) {
  if (t == DType::bf16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
  const double d = num::load(p, t);
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // magnitude toward zero, sign bit unchanged
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return num::float_to_bf16(f);
}

inline float load_f(const char* p, DType t) { return static_cast<float>(num::load(p, t)); }

// fp8_ds_mla tile scale (§3.3). amax: vLLM's writer; pow2: FlashMLA's UE8M0 reference quantiser.
inline float ds_tile_scale(float amax, DsMlaScale mode) {
  if (mode == DsMlaScale::amax) return std::fmax(amax / num::kFp8Max, FLT_MIN);
  const float s = std::fmax(amax / num::kFp8Max, 1e-4f);
  if (!std::isfinite(s)) return s;
  // 2^ceil(log2 s) computed exactly: s = m * 2^e with m in [0.5, 1); m == 0.5 means s is 2^(e-1).
  int e;
  const float m = std::frexp(s, &e);
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

// One input value stored as a cache code: bf16 bits (correctly rounded, unscaled), the input as a
// float64 (exact for every input dtype, unscaled) or e4m3_satfinite(x / s) with x the input as float
// and s the scale (§3.2: divide convention).
template <DType D>
inline void store_code(uint8_t* dst, const char* src, DType src_dtype, float s) {
  static_assert(D == DType::fp8_e4m3 || D == DType::bf16 || D == DType::f64,
                "cache values are bf16, e4m3 codes or float64");
  if constexpr (D == DType::bf16) {
    const uint16_t h = bf16_bits(src, src_dtype);
    std::memcpy(dst, &h, 2);
  } else if constexpr (D == DType::f64) {
    const double d = num::load(src, src_dtype);
    std::memcpy(dst, &d, 8);
  } else {
    *dst = num::float_to_e4m3(load_f(src, src_dtype) / s);
  }
}

// Token t's row (kv_c row t, k_pe row t) in the layout of Fmt (mla/cache_format.h).
template <class Fmt>
void write_row(const KVCache& c, uint8_t* row, const TensorView& kv_c, const TensorView& k_pe, int64_t t,
               DsMlaScale mode) {
  const int64_t latent = c.d_latent();
  constexpr int64_t lb = dtype_bytes(Fmt::kLatentDType), rb = dtype_bytes(Fmt::kRopeDType);
  if constexpr (Fmt::kScale == CacheScale::per_tile) {
    static_assert(Fmt::kLatentDType == DType::fp8_e4m3, "tile scales quantise e4m3 codes");
    float x[Fmt::kTile];
    for (int64_t t0 = 0, tile = 0; t0 < latent; t0 += Fmt::kTile, ++tile) {
      const int64_t n = std::min<int64_t>(Fmt::kTile, latent - t0);
      // NaN inputs never raise amax: a comparison is false for every NaN, signalling ones included
      // (std::fmax returns NaN for a signalling NaN on x86), matching the GPU writer's fmaxf.
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        x[i] = load_f(elem_ptr(kv_c, t, t0 + i), kv_c.dtype);
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
      }
      const float scale = ds_tile_scale(amax, mode);
      for (int64_t i = 0; i < n; ++i) row[lb * (t0 + i)] = num::float_to_e4m3(x[i] / scale);
      std::memcpy(row + Fmt::scale_offset(latent) + 4 * tile, &scale, 4);
    }
  } else {
    const float s = Fmt::kScale == CacheScale::per_tensor ? c.scale : 1.0f;
    for (int64_t i = 0; i < latent; ++i) store_code<Fmt::kLatentDType>(row + lb * i, elem_ptr(kv_c, t, i), kv_c.dtype, s);
  }
  uint8_t* rope = row + Fmt::rope_offset(latent);
  const float rs = Fmt::rope_scaled() ? c.scale : 1.0f;
  for (int64_t j = 0; j < c.d_rope; ++j) store_code<Fmt::kRopeDType>(rope + rb * j, elem_ptr(k_pe, t, j), k_pe.dtype, rs);
}

// Input column i of token t of a record row: kv_c's latent columns, then k_pe's rope columns.
inline float record_input(const KVCache& c, const TensorView& kv_c, const TensorView& k_pe, int64_t t, int64_t i) {
  const int64_t latent = c.d_latent();
  return i < latent ? load_f(elem_ptr(kv_c, t, i), kv_c.dtype) : load_f(elem_ptr(k_pe, t, i - latent), k_pe.dtype);
}

// Token t's record (Fmt::kRecord) at slot `slot`: per block of kTile coded columns the scale byte
// (mla/cache_format.h, the format's writer rule), then the codes; v4's rope as bf16. NaN inputs never
// raise amax (as for fp8_ds_mla's tiles).
template <class Fmt>
void write_record(const KVCache& c, int64_t slot, const TensorView& kv_c, const TensorView& k_pe, int64_t t) {
  uint8_t* row = cache_row_ptr_mut(c, slot);
  uint8_t* sc = const_cast<uint8_t*>(record_scale_ptr<Fmt>(c, slot));
  const int64_t coded = Fmt::coded_cols(c.d_latent());
  std::memset(sc, 0, Fmt::kScaleSlot);  // the padding bytes too: a record's bytes depend on its inputs only
  float x[Fmt::kTile];
  for (int64_t t0 = 0, tile = 0; t0 < coded; t0 += Fmt::kTile, ++tile) {
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < Fmt::kTile; ++i) {
      x[i] = record_input(c, kv_c, k_pe, t, t0 + i);
      nan = nan || std::isnan(x[i]);
      if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
    }
    if constexpr (Fmt::kCode == CacheCode::e2m1) {
      // NVFP4: e4m3 scale clamp(amax / 6, 2^-9, 448) rounded to nearest; a NaN tile gets the NaN scale.
      const uint8_t s_code = nan ? uint8_t{0x7f} : num::float_to_e4m3(std::fmin(std::fmax(amax / 6.0f, 0x1p-9f), 448.0f));
      const float s = num::e4m3_to_float(s_code);
      sc[tile] = s_code;
      for (int64_t i = 0; i < Fmt::kTile; i += 2) {
        const uint8_t lo = nan ? 0 : num::float_to_e2m1(x[i] / s), hi = nan ? 0 : num::float_to_e2m1(x[i + 1] / s);
        row[(t0 + i) / 2] = static_cast<uint8_t>(lo | hi << 4);
      }
    } else {
      const uint8_t e = num::pow2_scale_ue8m0(amax);
      sc[tile] = e;
      const float s = static_cast<float>(num::ue8m0_to_double(e));  // NaN for 0xff: every code NaN
      for (int64_t i = 0; i < Fmt::kTile; ++i) row[t0 + i] = num::float_to_e4m3(x[i] / s);
    }
  }
  if constexpr (!Fmt::kRopeCoded) {
    uint8_t* rope = row + Fmt::rope_offset(c.d_latent());
    for (int64_t j = 0; j < c.d_rope; ++j) {
      const uint16_t h = bf16_bits(elem_ptr(k_pe, t, j), k_pe.dtype);
      std::memcpy(rope + 2 * j, &h, 2);
    }
  }
}

// For every dst row, the cache slot it receives, or -1 when the row is not written (beyond the
// requests' extents, or its logical block lies outside the table: such blocks are never read).
// Request b fills rows [row_begin(b), row_end(b)); token i is logical position start(b) + i.
template <class Extent>
std::vector<int64_t> map_rows(const KVCache& c, const TensorView& block_table, const TensorView& seq_starts,
                              int64_t tot, int64_t num_requests, Extent extent) {
  std::vector<int64_t> slot(static_cast<std::size_t>(tot), -1);
  const int64_t page = c.page_size(), max_blocks = block_table.size(1);
  for (int64_t b = 0; b < num_requests; ++b) {
    const auto [row0, row1] = extent(b);
    const int64_t start = seq_starts.defined() ? index_at(seq_starts, b) : 0;
    for (int64_t r = row0; r < row1 && r < tot; ++r) {
      const int64_t p = start + (r - row0);
      const int64_t blk = p / page;
      if (blk >= max_blocks) continue;
      slot[static_cast<std::size_t>(r)] = index_at(block_table, b, blk) * page + p % page;
    }
  }
  return slot;
}

std::vector<int64_t> map_rows_cu(const KVCache& c, const TensorView& block_table, const TensorView& cu,
                                 const TensorView& seq_starts, int64_t tot) {
  return map_rows(c, block_table, seq_starts, tot, cu.size(0) - 1,
                  [&](int64_t b) { return std::pair{index_at(cu, b), index_at(cu, b + 1)}; });
}

// Dequantised rows (cache_row.h, exact in double) stored to dst's dtype: for 16-bit dst this is
// bf16(float(q) * scale), the formula of §3.3 / §5.1.
void dequant_rows(const KVCache& c, const TensorView& dst, const std::vector<int64_t>& slot) {
  const int cols = static_cast<int>(dst.size(1));
  const int64_t n = static_cast<int64_t>(slot.size());
  const std::size_t es = dst.element_size();
#pragma omp parallel
  {
    std::vector<double> v(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      if (slot[static_cast<std::size_t>(r)] < 0) continue;
      load_cache_row(c, slot[static_cast<std::size_t>(r)], v.data(), cols);
      char* out = static_cast<char*>(dst.data) + r * dst.stride[0] * static_cast<int64_t>(es);
      for (int i = 0; i < cols; ++i) num::store(out + i * es, dst.dtype, v[static_cast<std::size_t>(i)]);
    }
  }
}

}  // namespace

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,
                 DsMlaScale ds_scale, const Context&) {
  const int64_t n = slot_mapping.size(0);
  // The slots as validated, read before any row is written: slot_mapping may live inside the cache
  // tensor (or alias kv_c / k_pe), and a row written first must not change a later token's slot.
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  for (int64_t t = 0; t < n; ++t) slots[static_cast<std::size_t>(t)] = index_at(slot_mapping, t);
  dispatch_cache_format(cache.format, [&](auto fmt) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = slots[static_cast<std::size_t>(t)];
      if (slot < 0) continue;  // PAD_SLOT_ID: nothing written
      if constexpr (decltype(fmt)::kRecord)
        write_record<decltype(fmt)>(cache, slot, kv_c, k_pe, t);
      else
        write_row<decltype(fmt)>(cache, cache_row_ptr_mut(cache, slot), kv_c, k_pe, t, ds_scale);
    }
  });
}

void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context&) {
  dequant_rows(cache, dst, map_rows_cu(cache, block_table, cu_seq_lens, seq_starts, dst.size(0)));
}

void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context&) {
  const std::vector<int64_t> slot = map_rows_cu(cache, block_table, cu_seq_lens, seq_starts, dst.size(0));
  const int64_t n = static_cast<int64_t>(slot.size());
  const std::size_t row_bytes = static_cast<std::size_t>(cache.data.size(2)) * cache.data.element_size();
  const int64_t dst_row_bytes = dst.stride[0] * static_cast<int64_t>(dst.element_size());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t s = slot[static_cast<std::size_t>(r)];
    if (s >= 0) std::memcpy(static_cast<char*>(dst.data) + r * dst_row_bytes, cache_row_ptr(cache, s), row_bytes);
  }
}

void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts, const Context&) {
  const int64_t tot = dst.size(0), b = workspace_starts.size(0);
  // Request b's length is implied by the next request's start; the last one runs to the end of dst.
  dequant_rows(cache, dst, map_rows(cache, block_table, seq_starts, tot, b, [&](int64_t r) {
                 return std::pair{index_at(workspace_starts, r), r + 1 < b ? index_at(workspace_starts, r + 1) : tot};
               }));
}

}  // namespace mla::cpu
