// SPDX-License-Identifier: Apache-2.0
#pragma once
// Strict JSON parsing for checkpoint files (safetensors headers, index and config files): RFC 8259
// via nlohmann/json (no comments, valid UTF-8), plus what the library refuses on top of it: nesting
// deeper than `max_depth` (checked by a scan before parsing, so a hostile header cannot drive the
// parser deep) and a key repeated inside one object (a later duplicate would silently replace the
// first). Errors are mla::Error "<what>: ...".
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace mla::io {

nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth);
// Opens `path` read-only when it is a regular file (following symlinks) and returns the descriptor
// with the file's size; throws mla::Error naming it otherwise. A FIFO, socket or device is refused
// before it is opened, so a hostile directory entry cannot block the caller.
int open_regular_file(const std::string& path, uint64_t& size);
// Reads a whole (small) regular file; throws mla::Error naming it when it cannot be read or exceeds max_bytes.
std::string read_text_file(const std::string& path, std::size_t max_bytes);

}  // namespace mla::io
