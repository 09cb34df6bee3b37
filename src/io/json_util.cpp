// SPDX-License-Identifier: Apache-2.0
#include "io/json_util.h"

#include <fmt/format.h>

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "mla/error.h"

namespace mla::io {

nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth) {
  // Depth scan: brackets outside strings.
  int depth = 0;
  bool in_string = false, escape = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw Error(fmt::format("{}: JSON nested deeper than {} levels (at byte {})", what, max_depth, i));
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    else if (ev == E::object_end && !keys.empty()) keys.pop_back();
    else if (ev == E::key && !keys.empty() && parsed.is_string()) {
      if (!keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", what, e.what()));
  }
  if (!duplicate.empty()) throw Error(fmt::format("{}: key '{}' appears twice in one object", what, duplicate));
  return j;
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open", path));
  std::string s;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    s.append(buf, static_cast<std::size_t>(in.gcount()));
    if (s.size() > max_bytes) throw Error(fmt::format("{}: larger than {} bytes", path, max_bytes));
  }
  if (in.bad()) throw Error(fmt::format("{}: read error", path));
  return s;
}

}  // namespace mla::io
