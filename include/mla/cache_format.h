// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one description of the paged latent-cache formats (DESIGN.md §4): per format a constexpr traits
// type (CacheFormatTraits<F>), a runtime table built from them (cache_format_info) and a dispatch
// helper (dispatch_cache_format) that turns a runtime CacheFormat into its traits type. Validators,
// the CPU readers and writers and every CUDA kernel that touches cache rows read the layout from here;
// nothing else spells a row offset. Usable from host, CPU and device code (no fmt; the device-side
// functions are __host__ __device__ when nvcc compiles them).
//
// A cache row ("entry") is, in byte order:   [ latent | scales | rope ]
//   latent  d_latent values of kLatentDType (bf16, or e4m3 codes)
//   scales  per_tile only: ceil(d_latent / kTile) fp32 scales, tile order
//   rope    d_rope values of kRopeDType (bf16, or e4m3 codes)
// (the CPU-only oracle format f64 stores both parts as float64 values).
// A value is code * scale: none -> 1; per_tensor -> the descriptor's KVCache::scale for latent and
// rope alike; per_tile -> latent value i uses scales[i / kTile], rope values are unscaled.
// Adding a format: docs/DEVELOPING.md, "Adding a cache format".
#include <cstdint>
#include <string>

#include "mla/dtype.h"  // DType, MLA_HD
#include "mla/error.h"

// The formats, in enum order: X(name, enum value). The enum, the runtime table and the dispatch
// helpers are generated from these lists; each entry needs a CacheFormatTraits specialisation below.
// Device formats: every backend (CUDA kernels are instantiated for exactly these).
#define MLA_DEVICE_CACHE_FORMATS(X) \
  X(bf16, 0)                        \
  X(fp8, 1)                         \
  X(fp8_ds_mla, 2)
// Host-only formats: the CPU backend only; a CUDA cache of one is refused by validate_cache.
#define MLA_HOST_CACHE_FORMATS(X) X(f64, 3)
// Every format.
#define MLA_CACHE_FORMATS(X) MLA_DEVICE_CACHE_FORMATS(X) MLA_HOST_CACHE_FORMATS(X)

namespace mla {

// Paged latent-cache formats. Values are stable (JSON records, the Python binding).
enum class CacheFormat : uint8_t {
#define MLA_X(name, value) name = value,
  MLA_CACHE_FORMATS(MLA_X)
#undef MLA_X
};

// How stored codes become values.
enum class CacheScale : uint8_t {
  none = 0,        // values stored as they are (bf16)
  per_tensor = 1,  // one fp32 scale for the whole cache (KVCache::scale), latent and rope alike
  per_tile = 2,    // one fp32 scale per kTile latent values, stored in the row; rope unscaled
};

namespace detail {
// Shared arithmetic of every format's traits (the layout rule in the header comment).
template <class Self>
struct CacheLayout {
  // Bytes of the latent part, the scale block and the whole row.
  static constexpr MLA_HD int64_t latent_bytes(int64_t d_latent) { return d_latent * dtype_bytes(Self::kLatentDType); }
  static constexpr MLA_HD int64_t num_tiles(int64_t d_latent) {
    return Self::kScale == CacheScale::per_tile ? (d_latent + Self::kTile - 1) / Self::kTile : 0;
  }
  static constexpr MLA_HD int64_t scale_offset(int64_t d_latent) { return latent_bytes(d_latent); }
  static constexpr MLA_HD int64_t rope_offset(int64_t d_latent) { return scale_offset(d_latent) + 4 * num_tiles(d_latent); }
  // A fixed-width format's row is its record whatever the dims asked for (validate_cache rejects others).
  static constexpr MLA_HD int64_t entry_bytes(int64_t d_qk, int64_t d_rope) {
    const int64_t q = Self::kDqk ? Self::kDqk : d_qk, r = Self::kDqk ? Self::kDrope : d_rope;
    return rope_offset(q - r) + r * dtype_bytes(Self::kRopeDType);
  }
  // Elements of one row in the cache tensor's own dtype.
  static constexpr MLA_HD int64_t entry_elems(int64_t d_qk, int64_t d_rope) {
    return entry_bytes(d_qk, d_rope) / dtype_bytes(Self::kDType);
  }
  // Row widths the format can hold (fixed-width formats admit exactly kDqk / kDrope).
  static constexpr MLA_HD bool admits(int64_t d_qk, int64_t d_rope) {
    return d_rope > 0 && d_qk > d_rope && (Self::kDqk == 0 || (d_qk == Self::kDqk && d_rope == Self::kDrope));
  }
  // Rope values carry the per-tensor scale (per-tile scales cover the latent only).
  static constexpr MLA_HD bool rope_scaled() { return Self::kScale == CacheScale::per_tensor; }
  // Latent and rope are one run of same-typed codes (a row is d_qk codes with nothing in between).
  static constexpr MLA_HD bool uniform() {
    return Self::kLatentDType == Self::kRopeDType && Self::kScale != CacheScale::per_tile;
  }
};
}  // namespace detail

template <CacheFormat F>
struct CacheFormatTraits;

// bf16: [num_blocks, page_size, d_qk] bf16.
template <>
struct CacheFormatTraits<CacheFormat::bf16> : detail::CacheLayout<CacheFormatTraits<CacheFormat::bf16>> {
  static constexpr CacheFormat kFormat = CacheFormat::bf16;
  static constexpr const char* kName = "bf16";
  static constexpr const char* kAliases = "auto bfloat16";  // other names accepted, space-separated
  static constexpr DType kDType = DType::bf16;     // element type of the cache tensor
  static constexpr DType kAltDType = DType::bf16;  // also accepted (the same bytes)
  static constexpr DType kLatentDType = DType::bf16;
  static constexpr DType kRopeDType = DType::bf16;
  static constexpr CacheScale kScale = CacheScale::none;
  static constexpr int kTile = 0;            // latent values per scale (per_tile only)
  static constexpr int kDqk = 0, kDrope = 0;  // 0: any d_qk > d_rope > 0 (576 and 320 in use)
  static constexpr int kRowAlign = 2;        // bytes every row start must be aligned to
  static constexpr bool kDevice = true;      // CUDA kernels exist (MLA_DEVICE_CACHE_FORMATS)
};

// fp8: [num_blocks, page_size, d_qk] e4m3 (u8 accepted), value = code * KVCache::scale. Writers
// store e4m3_satfinite(x / scale) for latent and rope alike.
template <>
struct CacheFormatTraits<CacheFormat::fp8> : detail::CacheLayout<CacheFormatTraits<CacheFormat::fp8>> {
  static constexpr CacheFormat kFormat = CacheFormat::fp8;
  static constexpr const char* kName = "fp8";
  static constexpr const char* kAliases = "fp8_e4m3";
  static constexpr DType kDType = DType::fp8_e4m3;
  static constexpr DType kAltDType = DType::u8;
  static constexpr DType kLatentDType = DType::fp8_e4m3;
  static constexpr DType kRopeDType = DType::fp8_e4m3;
  static constexpr CacheScale kScale = CacheScale::per_tensor;
  static constexpr int kTile = 0;
  static constexpr int kDqk = 0, kDrope = 0;
  static constexpr int kRowAlign = 1;
  static constexpr bool kDevice = true;
};

// fp8_ds_mla (DeepSeek V3.2 / FlashMLA): [num_blocks, page_size, 656] bytes:
//   512 e4m3 latent codes | 4 fp32 scales, one per 128 latent values | 64 bf16 rope values.
template <>
struct CacheFormatTraits<CacheFormat::fp8_ds_mla> : detail::CacheLayout<CacheFormatTraits<CacheFormat::fp8_ds_mla>> {
  static constexpr CacheFormat kFormat = CacheFormat::fp8_ds_mla;
  static constexpr const char* kName = "fp8_ds_mla";
  static constexpr const char* kAliases = "";
  static constexpr DType kDType = DType::u8;
  static constexpr DType kAltDType = DType::fp8_e4m3;
  static constexpr DType kLatentDType = DType::fp8_e4m3;
  static constexpr DType kRopeDType = DType::bf16;
  static constexpr CacheScale kScale = CacheScale::per_tile;
  static constexpr int kTile = 128;
  static constexpr int kDqk = 576, kDrope = 64;
  static constexpr int kRowAlign = 1;  // bytes; rows of a u8 view may start anywhere
  static constexpr bool kDevice = true;
};

// f64 (the float64 oracle's cache, CPU only): [num_blocks, page_size, d_qk] float64, values stored as
// they are. Every input dtype (bf16, f16, f32, f64) is exact in it, so a float64 layer or block that
// reads its context back from this cache computes as if the context had never been stored
// (docs/BLOCK.md, "Accuracy"). Not a serving format: CUDA ops, layers and blocks refuse it.
template <>
struct CacheFormatTraits<CacheFormat::f64> : detail::CacheLayout<CacheFormatTraits<CacheFormat::f64>> {
  static constexpr CacheFormat kFormat = CacheFormat::f64;
  static constexpr const char* kName = "f64";
  static constexpr const char* kAliases = "float64";
  static constexpr DType kDType = DType::f64;
  static constexpr DType kAltDType = DType::f64;
  static constexpr DType kLatentDType = DType::f64;
  static constexpr DType kRopeDType = DType::f64;
  static constexpr CacheScale kScale = CacheScale::none;
  static constexpr int kTile = 0;
  static constexpr int kDqk = 0, kDrope = 0;
  static constexpr int kRowAlign = 8;
  static constexpr bool kDevice = false;
};

// The fixed record of fp8_ds_mla, named (used by tests, tools and kernels specialised to it).
namespace ds_mla {
using Traits = CacheFormatTraits<CacheFormat::fp8_ds_mla>;
inline constexpr int64_t kNopeDim = Traits::kDqk - Traits::kDrope;                      // 512
inline constexpr int64_t kRopeDim = Traits::kDrope;                                      // 64
inline constexpr int64_t kTile = Traits::kTile;                                          // 128
inline constexpr int64_t kNumTiles = Traits::num_tiles(kNopeDim);                        // 4
inline constexpr int64_t kScaleOffset = Traits::scale_offset(kNopeDim);                  // 512
inline constexpr int64_t kRopeOffset = Traits::rope_offset(kNopeDim);                    // 528
inline constexpr int64_t kEntryBytes = Traits::entry_bytes(Traits::kDqk, Traits::kDrope);  // 656
static_assert(kScaleOffset == 512 && kRopeOffset == 528 && kEntryBytes == 656, "the FlashMLA record is fixed");
}  // namespace ds_mla

// ---- runtime table ------------------------------------------------------------------------

// One format's description as data (the traits' constants, for code that holds a runtime value).
struct CacheFormatInfo {
  CacheFormat format;
  const char* name;
  DType dtype, alt_dtype, latent_dtype, rope_dtype;
  CacheScale scale;
  int tile;        // latent values per scale (per_tile), else 0
  int d_qk, d_rope;  // fixed row widths, 0: any
  int row_align;   // bytes
  bool device;     // CUDA kernels exist (MLA_DEVICE_CACHE_FORMATS); false: CPU only
  int64_t (*entry_bytes)(int64_t d_qk, int64_t d_rope);
  int64_t (*entry_elems)(int64_t d_qk, int64_t d_rope);
  int64_t (*rope_offset)(int64_t d_latent);
  int64_t (*scale_offset)(int64_t d_latent);
  bool (*admits)(int64_t d_qk, int64_t d_rope);
  const char* aliases;  // other names cache_format_from_string accepts, space-separated
};

template <class Tr>
constexpr CacheFormatInfo make_cache_format_info() {
  return {Tr::kFormat,       Tr::kName,        Tr::kDType,       Tr::kAltDType,   Tr::kLatentDType,
          Tr::kRopeDType,    Tr::kScale,       Tr::kTile,        Tr::kDqk,        Tr::kDrope,
          Tr::kRowAlign,     Tr::kDevice,      &Tr::entry_bytes, &Tr::entry_elems, &Tr::rope_offset, &Tr::scale_offset,
          &Tr::admits,       Tr::kAliases};
}

inline constexpr CacheFormatInfo kCacheFormatTable[] = {
#define MLA_X(name, value) make_cache_format_info<CacheFormatTraits<CacheFormat::name>>(),
    MLA_CACHE_FORMATS(MLA_X)
#undef MLA_X
};
inline constexpr int kNumCacheFormats = static_cast<int>(sizeof(kCacheFormatTable) / sizeof(kCacheFormatTable[0]));

// True for the values the enum names.
constexpr MLA_HD bool is_valid(CacheFormat f) {
  switch (f) {
#define MLA_X(name, value) case CacheFormat::name:
    MLA_CACHE_FORMATS(MLA_X)
#undef MLA_X
    return true;
  }
  return false;
}

// Throws mla::Error naming the value unless `f` is one of the formats.
inline void check_cache_format(CacheFormat f, const char* what = "cache format") {
  if (!is_valid(f))
    throw Error(std::string(what) + ": unknown CacheFormat value " + std::to_string(static_cast<int>(f)) +
                " (expected 0.." + std::to_string(kNumCacheFormats - 1) + ")");
}

inline const CacheFormatInfo& cache_format_info(CacheFormat f) {
  check_cache_format(f, "cache_format_info");
  for (const CacheFormatInfo& i : kCacheFormatTable)
    if (i.format == f) return i;
  throw Error("cache_format_info: format missing from the table");  // unreachable: the table is the list
}

// "bf16, fp8, fp8_ds_mla": the device formats' names, for error messages.
inline std::string device_cache_format_names() {
  std::string s;
  for (const CacheFormatInfo& i : kCacheFormatTable)
    if (i.device) s += s.empty() ? i.name : std::string(", ") + i.name;
  return s;
}

const char* to_string(CacheFormat f);                          // the traits' kName; "?" for bad values
CacheFormat cache_format_from_string(const std::string& s);  // kName or an alias; throws otherwise

// ---- dispatch -------------------------------------------------------------------------------

// Calls fn(CacheFormatTraits<f>{}) and returns its result; throws mla::Error on a value outside the
// enum. Host code (launchers, CPU backends): every per-format instantiation comes from here.
template <class Fn>
decltype(auto) dispatch_cache_format(CacheFormat f, Fn&& fn) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    return fn(CacheFormatTraits<CacheFormat::name>{});
    MLA_CACHE_FORMATS(MLA_X)
#undef MLA_X
  }
  check_cache_format(f, "dispatch_cache_format");
  return fn(CacheFormatTraits<CacheFormat::bf16>{});  // unreachable
}

// The same over the device formats only (CUDA launchers: no kernel is instantiated for a host-only
// format); throws mla::Error naming the formats it takes for a host-only or bad value (validate_cache
// refuses a CUDA cache of a host-only format before any launcher runs).
template <class Fn>
decltype(auto) dispatch_device_cache_format(CacheFormat f, Fn&& fn) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    return fn(CacheFormatTraits<CacheFormat::name>{});
    MLA_DEVICE_CACHE_FORMATS(MLA_X)
#undef MLA_X
    default:
      break;
  }
  check_cache_format(f, "dispatch_device_cache_format");
  throw Error(std::string("dispatch_device_cache_format: the ") + cache_format_info(f).name +
              " cache format is CPU-only; CUDA takes " + device_cache_format_names());
}

// Device-side twin for kernels that keep the format as a run-time value (the MQA engine): calls
// fn(CacheFormatTraits<f>{}) for a device format, nothing otherwise (front ends reject the others).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // fn is a device lambda in kernels, a host one in host code
#endif
template <class Fn>
MLA_HD inline void visit_cache_format(CacheFormat f, Fn&& fn) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    fn(CacheFormatTraits<CacheFormat::name>{}); \
    return;
    MLA_DEVICE_CACHE_FORMATS(MLA_X)
#undef MLA_X
    default:
      return;
  }
}

}  // namespace mla
