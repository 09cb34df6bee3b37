// SPDX-License-Identifier: Apache-2.0
// safetensors reader: mapping, header validation, tensor access (mla/safetensors.h).
#include "mla/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/checked.h"
#include "core/numeric.h"
#include "io/json_util.h"

namespace mla {

namespace {

struct DTypeName {
  const char* name;
  StDType dtype;
  int bytes;
};
constexpr DTypeName kDTypes[] = {
    {"BOOL", StDType::BOOL, 1}, {"U8", StDType::U8, 1},     {"I8", StDType::I8, 1},
    {"F8_E5M2", StDType::F8_E5M2, 1}, {"F8_E4M3", StDType::F8_E4M3, 1}, {"F8_E8M0", StDType::F8_E8M0, 1},
    {"I16", StDType::I16, 2},   {"U16", StDType::U16, 2},   {"F16", StDType::F16, 2},
    {"BF16", StDType::BF16, 2}, {"I32", StDType::I32, 4},   {"U32", StDType::U32, 4},
    {"F32", StDType::F32, 4},   {"F64", StDType::F64, 8},   {"I64", StDType::I64, 8},
    {"U64", StDType::U64, 8},
};

// The format's reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

const char* to_string(StDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}
int st_dtype_bytes(StDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.bytes;
  return 0;
}
std::optional<DType> to_mla_dtype(StDType t) {
  switch (t) {
    case StDType::BF16: return DType::bf16;
    case StDType::F16: return DType::f16;
    case StDType::F32: return DType::f32;
    case StDType::F64: return DType::f64;
    case StDType::F8_E4M3: return DType::fp8_e4m3;
    case StDType::U8: return DType::u8;
    case StDType::I32: return DType::i32;
    case StDType::I64: return DType::i64;
    default: return std::nullopt;
  }
}

struct SafetensorsFile::Impl {
  std::string path;
  // The mapping (owned) or borrowed bytes.
  void* map = nullptr;
  std::size_t map_size = 0;
  const std::byte* file = nullptr;
  uint64_t file_size = 0;
  const std::byte* data = nullptr;  // start of the byte buffer
  uint64_t data_size = 0;
  std::vector<StTensorInfo> tensors;         // offset order
  std::map<std::string, std::size_t, std::less<>> by_name;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (map) munmap(map, map_size);
  }
};

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& msg) {
  throw Error(fmt::format("{}: {}", what, msg));
}

StTensorInfo parse_entry(const std::string& what, const std::string& name, const nlohmann::json& e) {
  if (!e.is_object()) fail(what, fmt::format("tensor '{}': entry must be an object, got {}", name, e.type_name()));
  for (auto it = e.begin(); it != e.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      fail(what, fmt::format("tensor '{}': unknown field '{}'", name, it.key()));
  StTensorInfo t;
  t.name = name;
  const auto d = e.find("dtype");
  if (d == e.end() || !d->is_string()) fail(what, fmt::format("tensor '{}': \"dtype\" must be a string", name));
  const std::string& dn = d->get_ref<const std::string&>();
  const auto k = std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeName& x) { return dn == x.name; });
  if (k == std::end(kDTypes))
    fail(what, fmt::format("tensor '{}': unsupported dtype '{}' (known: BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 I16 U16 "
                           "F16 BF16 I32 U32 F32 F64 I64 U64)", name, dn));
  t.dtype = k->dtype;
  const auto s = e.find("shape");
  if (s == e.end() || !s->is_array()) fail(what, fmt::format("tensor '{}': \"shape\" must be an array", name));
  if (s->size() > 8) fail(what, fmt::format("tensor '{}': {} dimensions (at most 8)", name, s->size()));
  int64_t numel = 1;
  for (const auto& v : *s) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(what, fmt::format("tensor '{}': shape entries must be non-negative integers, got {}", name, v.dump()));
    const auto dim = static_cast<int64_t>(v.get<uint64_t>());
    t.shape.push_back(dim);
    int64_t next;
    if (__builtin_mul_overflow(numel, dim, &next))
      fail(what, fmt::format("tensor '{}': element count of shape {} overflows int64", name, s->dump()));
    numel = next;
  }
  t.numel = numel;
  const auto o = e.find("data_offsets");
  if (o == e.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
      !(*o)[1].is_number_unsigned())
    fail(what, fmt::format("tensor '{}': \"data_offsets\" must be two non-negative integers", name));
  t.begin = (*o)[0].get<uint64_t>();
  t.end = (*o)[1].get<uint64_t>();
  if (t.end < t.begin) fail(what, fmt::format("tensor '{}': data_offsets [{}, {}] end before begin", name, t.begin, t.end));
  uint64_t expect;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(k->bytes), &expect) ||
      expect != t.end - t.begin)
    fail(what, fmt::format("tensor '{}': {} x {} ({} elements of {} bytes) needs {} bytes, data_offsets [{}, {}] "
                           "hold {}", name, dn, s->dump(), numel, k->bytes,
                           static_cast<unsigned long long>(numel) * k->bytes, t.begin, t.end, t.end - t.begin));
  return t;
}

void parse_header(SafetensorsFile::Impl& f) {
  const std::string& what = f.path;
  if (f.file_size < 8) fail(what, fmt::format("{} bytes: too short for the 8-byte header length", f.file_size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(f.file[i]);
  if (n < 2) fail(what, fmt::format("header length {} is too small for a JSON object", n));
  if (n > kMaxHeaderBytes) fail(what, fmt::format("header length {} exceeds the 100 MB limit", n));
  if (n > f.file_size - 8)
    fail(what, fmt::format("header length {} runs past the end of the file ({} bytes after the length)", n,
                           f.file_size - 8));
  const char* text = reinterpret_cast<const char*>(f.file + 8);
  if (text[0] != '{') fail(what, "header does not start with '{'");
  const nlohmann::json header = io::parse_json_strict(std::string_view(text, n), what + " header", /*max_depth=*/3);
  if (!header.is_object()) fail(what, "header is not a JSON object");
  f.data = f.file + 8 + n;
  f.data_size = f.file_size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(what, "\"__metadata__\" must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(what, fmt::format("\"__metadata__\" value of '{}' is not a string", m.key()));
        f.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    StTensorInfo t = parse_entry(what, it.key(), *it);
    if (t.end > f.data_size)
      fail(what, fmt::format("tensor '{}': data_offsets [{}, {}] run past the {}-byte data buffer", t.name, t.begin,
                             t.end, f.data_size));
    f.tensors.push_back(std::move(t));
  }
  // Offsets tile the buffer: sorted by (begin, end), each starts where the previous ended.
  std::sort(f.tensors.begin(), f.tensors.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const StTensorInfo* prev = nullptr;
  for (const auto& t : f.tensors) {
    if (t.begin < pos)
      fail(what, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", prev->name, prev->begin, prev->end,
                             t.name, t.begin, t.end));
    if (t.begin > pos)
      fail(what, fmt::format("bytes [{}, {}) of the data buffer belong to no tensor (before '{}')", pos, t.begin,
                             t.name));
    pos = t.end;
    prev = &t;
  }
  if (pos != f.data_size)
    fail(what, fmt::format("the data buffer has {} bytes but the tensors cover {}", f.data_size, pos));
  for (std::size_t i = 0; i < f.tensors.size(); ++i) f.by_name.emplace(f.tensors[i].name, i);
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  // A regular file only, checked before it is opened (a FIFO named as a shard would block open()).
  const int fd = io::open_regular_file(path, impl->file_size);
  if (impl->file_size > 0) {
    void* p = mmap(nullptr, static_cast<std::size_t>(impl->file_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, fmt::format("mmap failed: {}", std::strerror(err)));
    }
    impl->map = p;
    impl->map_size = static_cast<std::size_t>(impl->file_size);
    impl->file = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  parse_header(*impl);
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::span<const std::byte> bytes, const std::string& what) {
  auto impl = std::make_shared<Impl>();
  impl->path = what;
  impl->file = bytes.data();
  impl->file_size = bytes.size();
  parse_header(*impl);
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<StTensorInfo>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

const StTensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}
const StTensorInfo& SafetensorsFile::info(std::string_view name) const {
  const StTensorInfo* t = find(name);
  if (!t) fail(impl_->path, fmt::format("no tensor named '{}'", name));
  return *t;
}
std::span<const std::byte> SafetensorsFile::bytes(const StTensorInfo& t) const {
  // t must be one of ours: re-check against the buffer anyway (a foreign info never reads outside).
  MLA_CHECK(t.begin <= t.end && t.end <= impl_->data_size, "{}: tensor '{}' [{}, {}] is outside the data buffer",
            impl_->path, t.name, t.begin, t.end);
  return {impl_->data + t.begin, static_cast<std::size_t>(t.end - t.begin)};
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const StTensorInfo& t = info(name);
  const auto dt = to_mla_dtype(t.dtype);
  if (!dt) fail(impl_->path, fmt::format("tensor '{}': dtype {} has no mla DType (use load())", t.name, to_string(t.dtype)));
  const auto b = bytes(t);
  if (reinterpret_cast<uintptr_t>(b.data()) % st_dtype_bytes(t.dtype) != 0)
    fail(impl_->path, fmt::format("tensor '{}': data is not aligned to its {}-byte elements (use load())", t.name,
                                  st_dtype_bytes(t.dtype)));
  std::vector<int64_t> shape = t.shape;
  if (shape.empty()) shape.push_back(1);
  if (shape.size() > static_cast<std::size_t>(kMaxDims))
    fail(impl_->path, fmt::format("tensor '{}': {} dimensions (views hold at most {})", t.name, shape.size(), kMaxDims));
  return TensorView(const_cast<std::byte*>(b.data()), *dt, std::span<const int64_t>(shape));
}

Tensor SafetensorsFile::load(std::string_view name, DType dtype) const {
  const StTensorInfo& t = info(name);
  std::vector<int64_t> shape = t.shape;
  if (shape.empty()) shape.push_back(1);
  if (shape.size() > static_cast<std::size_t>(kMaxDims))
    fail(impl_->path, fmt::format("tensor '{}': {} dimensions (tensors hold at most {})", t.name, shape.size(), kMaxDims));
  const auto src_dt = to_mla_dtype(t.dtype);
  const bool src_float = src_dt && is_floating(*src_dt);
  const bool src_int = t.dtype == StDType::I8 || t.dtype == StDType::U8 || t.dtype == StDType::I16 ||
                       t.dtype == StDType::U16 || t.dtype == StDType::I32 || t.dtype == StDType::U32 ||
                       t.dtype == StDType::I64 || t.dtype == StDType::U64 || t.dtype == StDType::BOOL;
  const bool dst_float = is_floating(dtype);
  const bool dst_int = dtype == DType::i32 || dtype == DType::i64;
  if (!(src_dt && *src_dt == dtype) && !(src_float && dst_float) && !(src_int && dst_int))
    fail(impl_->path, fmt::format("tensor '{}': cannot load {} as {}", t.name, to_string(t.dtype), to_string(dtype)));
  Tensor out = Tensor::empty(std::span<const int64_t>(shape), dtype);
  const auto src = bytes(t);
  auto* dst = static_cast<std::byte*>(out.data());
  if (src_dt && *src_dt == dtype) {
    if (!src.empty()) std::memcpy(dst, src.data(), src.size());
    return out;
  }
  const int sb = st_dtype_bytes(t.dtype);
  const std::size_t db = dtype_size(dtype);
  for (int64_t i = 0; i < t.numel; ++i) {
    alignas(8) std::byte e[8];
    std::memcpy(e, src.data() + static_cast<std::size_t>(i) * sb, sb);
    if (src_float) {
      num::store(dst + static_cast<std::size_t>(i) * db, dtype, num::load(e, *src_dt));
      continue;
    }
    // Integers: exact values, range-checked against the destination.
    int64_t v = 0;
    switch (t.dtype) {
      case StDType::BOOL: case StDType::U8: v = *reinterpret_cast<const uint8_t*>(e); break;
      case StDType::I8: v = *reinterpret_cast<const int8_t*>(e); break;
      case StDType::I16: v = *reinterpret_cast<const int16_t*>(e); break;
      case StDType::U16: v = *reinterpret_cast<const uint16_t*>(e); break;
      case StDType::I32: v = *reinterpret_cast<const int32_t*>(e); break;
      case StDType::U32: v = *reinterpret_cast<const uint32_t*>(e); break;
      case StDType::I64: v = *reinterpret_cast<const int64_t*>(e); break;
      case StDType::U64: {
        const uint64_t u = *reinterpret_cast<const uint64_t*>(e);
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail(impl_->path, fmt::format("tensor '{}': element {} = {} does not fit {}", t.name, i, u, to_string(dtype)));
        v = static_cast<int64_t>(u);
        break;
      }
      default: break;
    }
    if (dtype == DType::i32) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail(impl_->path, fmt::format("tensor '{}': element {} = {} does not fit i32", t.name, i, v));
      const auto w = static_cast<int32_t>(v);
      std::memcpy(dst + static_cast<std::size_t>(i) * 4, &w, 4);
    } else {
      std::memcpy(dst + static_cast<std::size_t>(i) * 8, &v, 8);
    }
  }
  return out;
}

}  // namespace mla
