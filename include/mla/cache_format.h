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
//
// Block-scaled records (kRecord: the DeepSeek-V4 family v4, v41, v41_fp4; d_qk 512 = 448 + 64 rope,
// K = V over the whole row) follow a second rule. A record is, in byte order,
//   [ codes | rope | scale slot ]
//   codes       coded_cols codes of kCode: e4m3 one byte each, e2m1 two per byte (column 2i in the
//               low nibble, 2i+1 in the high one). coded_cols is d_qk when the rope is coded with the
//               rest (kRopeCoded), else d_latent.
//   rope        !kRopeCoded only: d_rope bf16 values, unscaled.
//   scale slot  one byte per kTile codes, tile order, padded to kScaleSlot bytes: CacheScale::ue8m0
//               (the value 2^(b - 127); 0xff is NaN) or CacheScale::e4m3_block (an e4m3 value).
// Code i's value is code * scale[i / kTile]. With kPageScales the scale slots are not inside the rows:
// a page of P rows holds P bodies [codes | rope] back to back, then the P slots (row r's slot at byte
// P * row_stride_bytes + r * kScaleSlot of the page); the record size (entry_bytes) counts the slot, so
// a page spans P * entry_bytes bytes and the cache tensor keeps its [num_blocks, P, entry] shape.
// Adding a format: docs/DEVELOPING.md, "Adding a cache format".
#include <cstdint>
#include <string>

#include "mla/dtype.h"  // DType, MLA_HD
#include "mla/error.h"

// The formats, in enum order: X(name, enum value). The enum, the runtime table and the dispatch
// helpers are generated from these lists; each entry needs a CacheFormatTraits specialisation below.
// Device formats of the first rule: every backend (the plain CUDA kernels are instantiated for exactly these).
#define MLA_DEVICE_CACHE_FORMATS(X) \
  X(bf16, 0)                        \
  X(fp8, 1)                         \
  X(fp8_ds_mla, 2)
// Host-only formats: the CPU backend only; a CUDA cache of one is refused by validate_cache.
#define MLA_HOST_CACHE_FORMATS(X) X(f64, 3)
// Block-scaled record formats (the DeepSeek-V4 family; the rule above): every backend (kDevice), read and
// written by their own kernels (CUDA: the record writer and gather of src/cuda/cache/, the MQA engine's
// record rows), which dispatch_record_cache_format / visit_record_cache_format instantiate. Ops that take
// them: write_cache, gather_cache, cp_gather_cache (v41, v41_fp4), upconvert_ds_mla and sparse_mqa with
// values_include_rope; every other op refuses them by name.
#define MLA_RECORD_CACHE_FORMATS(X) \
  X(v4, 4)                          \
  X(v41, 5)                         \
  X(v41_fp4, 6)
// Every format.
#define MLA_CACHE_FORMATS(X) MLA_DEVICE_CACHE_FORMATS(X) MLA_HOST_CACHE_FORMATS(X) MLA_RECORD_CACHE_FORMATS(X)

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
  ue8m0 = 3,       // records: one power-of-two scale byte (2^(b - 127)) per kTile codes
  e4m3_block = 4,  // records: one e4m3 scale byte per kTile codes
};

// Element type of a record's codes (kRecord formats).
enum class CacheCode : uint8_t {
  e4m3 = 0,  // OCP e4m3fn, one byte
  e2m1 = 1,  // OCP e2m1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two per byte
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
  // Row rule of the header comment's first kind (not a block-scaled record).
  static constexpr bool kRecord = false;
  static constexpr bool kPageScales = false;
  static constexpr bool kRopeCoded = false;
  static constexpr CacheCode kCode = CacheCode::e4m3;
  static constexpr int kScaleSlot = 0;
  static constexpr MLA_HD int64_t page_row_bytes() { return 0; }  // rows follow the tensor's strides
};

// The record rule (header comment, "Block-scaled records"). Self names kCode, kRopeCoded, kTile,
// kScaleSlot, kPageScales and the fixed kDqk / kDrope.
template <class Self>
struct RecordLayout {
  static constexpr bool kRecord = true;
  static constexpr MLA_HD int64_t code_bits() { return Self::kCode == CacheCode::e2m1 ? 4 : 8; }
  // Coded columns: the whole row when the rope is coded, else the latent part.
  static constexpr MLA_HD int64_t coded_cols(int64_t d_latent) {
    return Self::kRopeCoded ? d_latent + Self::kDrope : d_latent;
  }
  static constexpr MLA_HD int64_t code_bytes(int64_t d_latent) { return coded_cols(d_latent) * code_bits() / 8; }
  static constexpr MLA_HD int64_t num_tiles(int64_t d_latent) { return coded_cols(d_latent) / Self::kTile; }
  // Byte offset of code i (i even for e2m1: codes 2j and 2j + 1 share byte j, 2j in the low nibble).
  static constexpr MLA_HD int64_t code_offset(int64_t i) { return i * code_bits() / 8; }
  // Byte offset of the rope: the bf16 values, or (kRopeCoded) the code of column d_latent; either way
  // right after the latent's codes.
  static constexpr MLA_HD int64_t rope_offset(int64_t d_latent) { return d_latent * code_bits() / 8; }
  static constexpr MLA_HD int64_t rope_bytes() { return Self::kRopeCoded ? 0 : 2 * Self::kDrope; }
  // Offset of the scale slot in the record [codes | rope | slot]; a kPageScales row's slot is in its
  // page's scale region instead (page_scale_offset).
  static constexpr MLA_HD int64_t scale_offset(int64_t d_latent) { return code_bytes(d_latent) + rope_bytes(); }
  static constexpr MLA_HD int64_t entry_bytes(int64_t, int64_t) {
    return scale_offset(Self::kDqk - Self::kDrope) + Self::kScaleSlot;
  }
  static constexpr MLA_HD int64_t entry_elems(int64_t d_qk, int64_t d_rope) { return entry_bytes(d_qk, d_rope); }
  // Bytes between consecutive rows of a page: the record, or only [codes | rope] with page scales.
  static constexpr MLA_HD int64_t row_stride_bytes() {
    return Self::kPageScales ? scale_offset(Self::kDqk - Self::kDrope) : entry_bytes(0, 0);
  }
  // Offsets from the start of a page of `page_size` rows: row r's body and its scale slot.
  static constexpr MLA_HD int64_t page_row_offset(int64_t r) { return r * row_stride_bytes(); }
  static constexpr MLA_HD int64_t page_scale_offset(int64_t page_size, int64_t r) {
    return Self::kPageScales ? page_size * row_stride_bytes() + r * Self::kScaleSlot
                             : r * row_stride_bytes() + scale_offset(Self::kDqk - Self::kDrope);
  }
  static constexpr MLA_HD bool admits(int64_t d_qk, int64_t d_rope) { return d_qk == Self::kDqk && d_rope == Self::kDrope; }
  static constexpr MLA_HD bool rope_scaled() { return false; }  // no per-tensor scale
  static constexpr MLA_HD bool uniform() { return false; }
  static constexpr MLA_HD int64_t page_row_bytes() { return Self::kPageScales ? row_stride_bytes() : 0; }
  // Byte offsets from the start of a page of `page_size` rows of row r's body [codes | rope] and of its scale
  // slot, for a cache tensor whose rows are `row_bytes` apart (its stride[1] in bytes; a page-scale record's
  // rows are always packed, validate_cache requires stride[1] == entry).
  static constexpr MLA_HD int64_t body_offset(int64_t r, int64_t row_bytes) {
    return Self::kPageScales ? page_row_offset(r) : r * row_bytes;
  }
  static constexpr MLA_HD int64_t slot_offset(int64_t page_size, int64_t r, int64_t row_bytes) {
    return Self::kPageScales ? page_scale_offset(page_size, r)
                             : r * row_bytes + scale_offset(Self::kDqk - Self::kDrope);
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
  static constexpr bool kDevice = true;      // CUDA kernels exist (MLA_DEVICE_CACHE_FORMATS, MLA_RECORD_CACHE_FORMATS)
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

// v4 (DeepSeek-V4, FlashMLA's V4 sparse fp8 record): 584 bytes per row, [num_blocks, page_size, 584] u8:
//   448 e4m3 latent codes | 64 bf16 rope values (576-byte rows back to back), and per row 7 ue8m0
//   scales (one per 64 latent values) + 1 pad byte in the page's scale region after the rows.
// Writers: scale 2^ceil(log2(max(amax / 448, 1e-4))), code e4m3_satfinite(x / scale).
template <>
struct CacheFormatTraits<CacheFormat::v4> : detail::RecordLayout<CacheFormatTraits<CacheFormat::v4>> {
  static constexpr CacheFormat kFormat = CacheFormat::v4;
  static constexpr const char* kName = "v4";
  static constexpr const char* kAliases = "deepseek_v4";
  static constexpr DType kDType = DType::u8;
  static constexpr DType kAltDType = DType::fp8_e4m3;
  static constexpr DType kLatentDType = DType::fp8_e4m3;
  static constexpr DType kRopeDType = DType::bf16;
  static constexpr CacheScale kScale = CacheScale::ue8m0;
  static constexpr CacheCode kCode = CacheCode::e4m3;
  static constexpr bool kRopeCoded = false;
  static constexpr bool kPageScales = true;
  static constexpr int kTile = 64;
  static constexpr int kScaleSlot = 8;
  static constexpr int kDqk = 512, kDrope = 64;
  static constexpr int kRowAlign = 1;
  static constexpr bool kDevice = true;
};

// v41 (DeepSeek-V4.1 MXFP8 window cache): 528 bytes per row, [num_blocks, page_size, 528] u8:
//   512 e4m3 codes (latent and rope alike) | 16 ue8m0 scales, one per 32 codes.
// Writers: scale 2^ceil(log2(max(amax / 448, 1e-4))), code e4m3_satfinite(x / scale).
template <>
struct CacheFormatTraits<CacheFormat::v41> : detail::RecordLayout<CacheFormatTraits<CacheFormat::v41>> {
  static constexpr CacheFormat kFormat = CacheFormat::v41;
  static constexpr const char* kName = "v41";
  static constexpr const char* kAliases = "deepseek_v41 mxfp8";
  static constexpr DType kDType = DType::u8;
  static constexpr DType kAltDType = DType::fp8_e4m3;
  static constexpr DType kLatentDType = DType::fp8_e4m3;
  static constexpr DType kRopeDType = DType::fp8_e4m3;
  static constexpr CacheScale kScale = CacheScale::ue8m0;
  static constexpr CacheCode kCode = CacheCode::e4m3;
  static constexpr bool kRopeCoded = true;
  static constexpr bool kPageScales = false;
  static constexpr int kTile = 32;
  static constexpr int kScaleSlot = 16;
  static constexpr int kDqk = 512, kDrope = 64;
  static constexpr int kRowAlign = 1;
  static constexpr bool kDevice = true;
};

// v41_fp4 (DeepSeek-V4.1 NVFP4 compressed cache): 288 bytes per row, [num_blocks, page_size, 288] u8:
//   512 e2m1 codes in 256 bytes (latent and rope alike) | 32 e4m3 scales, one per 16 codes.
// Writers: scale e4m3(clamp(amax / 6, 2^-9, 448)) (round to nearest), code e2m1(x / scale) rounded to
// nearest even and saturated to +-6; a tile holding a NaN gets the NaN scale 0x7f (e2m1 has no NaN).
template <>
struct CacheFormatTraits<CacheFormat::v41_fp4> : detail::RecordLayout<CacheFormatTraits<CacheFormat::v41_fp4>> {
  static constexpr CacheFormat kFormat = CacheFormat::v41_fp4;
  static constexpr const char* kName = "v41_fp4";
  static constexpr const char* kAliases = "deepseek_v41_fp4 nvfp4";
  static constexpr DType kDType = DType::u8;
  static constexpr DType kAltDType = DType::u8;
  static constexpr DType kLatentDType = DType::u8;  // e2m1 pairs (kCode)
  static constexpr DType kRopeDType = DType::u8;
  static constexpr CacheScale kScale = CacheScale::e4m3_block;
  static constexpr CacheCode kCode = CacheCode::e2m1;
  static constexpr bool kRopeCoded = true;
  static constexpr bool kPageScales = false;
  static constexpr int kTile = 16;
  static constexpr int kScaleSlot = 32;
  static constexpr int kDqk = 512, kDrope = 64;
  static constexpr int kRowAlign = 1;
  static constexpr bool kDevice = true;
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
  bool device;     // CUDA kernels exist (device and record formats); false: CPU only
  int64_t (*entry_bytes)(int64_t d_qk, int64_t d_rope);
  int64_t (*entry_elems)(int64_t d_qk, int64_t d_rope);
  int64_t (*rope_offset)(int64_t d_latent);
  int64_t (*scale_offset)(int64_t d_latent);
  bool (*admits)(int64_t d_qk, int64_t d_rope);
  const char* aliases;  // other names cache_format_from_string accepts, space-separated
  bool record;          // a block-scaled record (the header comment's second rule)
  bool page_scales;     // record scale slots in a per-page region
  int scale_slot;       // bytes of a record's scale slot, else 0
};

template <class Tr>
constexpr CacheFormatInfo make_cache_format_info() {
  return {Tr::kFormat,       Tr::kName,        Tr::kDType,       Tr::kAltDType,   Tr::kLatentDType,
          Tr::kRopeDType,    Tr::kScale,       Tr::kTile,        Tr::kDqk,        Tr::kDrope,
          Tr::kRowAlign,     Tr::kDevice,      &Tr::entry_bytes, &Tr::entry_elems, &Tr::rope_offset, &Tr::scale_offset,
          &Tr::admits,       Tr::kAliases,     Tr::kRecord,      Tr::kPageScales, Tr::kScaleSlot};
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

// Bytes between consecutive rows of a page for a format whose rows are not the cache tensor's rows (a
// record with page scales: v4's 576-byte bodies), else 0 (row r of a page is the tensor's row r).
constexpr MLA_HD int64_t page_row_bytes(CacheFormat f) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    return CacheFormatTraits<CacheFormat::name>::page_row_bytes();
    MLA_CACHE_FORMATS(MLA_X)
#undef MLA_X
  }
  return 0;
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

// "bf16, fp8, fp8_ds_mla, v4, v41, v41_fp4": the names of the formats CUDA takes, for error messages.
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
  if (cache_format_info(f).record)
    throw Error(std::string("dispatch_device_cache_format: the ") + cache_format_info(f).name +
                " cache format is a block-scaled record, read and written by the record kernels "
                "(dispatch_record_cache_format)");
  throw Error(std::string("dispatch_device_cache_format: the ") + cache_format_info(f).name +
              " cache format is CPU-only; CUDA takes " + device_cache_format_names());
}

// The same over the block-scaled record formats (MLA_RECORD_CACHE_FORMATS: the record writer, gather and
// MQA rows); throws mla::Error for any other value.
template <class Fn>
decltype(auto) dispatch_record_cache_format(CacheFormat f, Fn&& fn) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    return fn(CacheFormatTraits<CacheFormat::name>{});
    MLA_RECORD_CACHE_FORMATS(MLA_X)
#undef MLA_X
    default:
      break;
  }
  check_cache_format(f, "dispatch_record_cache_format");
  throw Error(std::string("dispatch_record_cache_format: the ") + cache_format_info(f).name +
              " cache format is not a block-scaled record (v4, v41, v41_fp4)");
}

// Device-side twin for kernels that keep the format as a run-time value (the MQA engine): calls
// fn(CacheFormatTraits<f>{}) for a device format of the first rule, nothing otherwise (front ends reject the
// others; records go through visit_record_cache_format).
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

// The same over the record formats: fn(CacheFormatTraits<f>{}) for v4 / v41 / v41_fp4, nothing otherwise.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Fn>
MLA_HD inline void visit_record_cache_format(CacheFormat f, Fn&& fn) {
  switch (f) {
#define MLA_X(name, value) \
  case CacheFormat::name:  \
    fn(CacheFormatTraits<CacheFormat::name>{}); \
    return;
    MLA_RECORD_CACHE_FORMATS(MLA_X)
#undef MLA_X
    default:
      return;
  }
}

}  // namespace mla
