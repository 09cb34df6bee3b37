// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test-side safetensors writer: builds file images from a header string and data bytes (malformed
// files by hand), or from named tensors (well-formed files, offsets in insertion order).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "mla/safetensors.h"

namespace mla::test {

// u64 LE header length | header | data.
inline std::string st_image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

struct StEntry {
  std::string name, dtype;  // dtype: "BF16", "F8_E4M3", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

inline std::string st_header(const std::vector<StEntry>& entries, const std::string& metadata_json = "") {
  std::string h = "{";
  if (!metadata_json.empty()) h += "\"__metadata__\":" + metadata_json + ",";
  uint64_t pos = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    std::string shape;
    for (std::size_t d = 0; d < e.shape.size(); ++d) shape += (d ? "," : "") + std::to_string(e.shape[d]);
    h += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", i ? "," : "", e.name,
                     e.dtype, shape, pos, pos + e.bytes.size());
    pos += e.bytes.size();
  }
  h += "}";
  // Pad the header with spaces to a multiple of 8 bytes (as the reference writer does): aligned data.
  while ((h.size() + 8) % 8 != 0) h += ' ';
  return h;
}

inline std::string st_build(const std::vector<StEntry>& entries, const std::string& metadata_json = "") {
  std::string data;
  for (const auto& e : entries) data += e.bytes;
  return st_image(st_header(entries, metadata_json), data);
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream o(p, std::ios::binary);
  o.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A fresh empty directory under the system temp dir (removed by the caller's TempDir).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() /
           fmt::format("mla_{}_{}_{}", tag, static_cast<long>(::getpid()), reinterpret_cast<uintptr_t>(this));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace mla::test
