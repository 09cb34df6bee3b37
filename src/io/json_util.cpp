// SPDX-License-Identifier: Apache-2.0
#include "io/json_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

int open_regular_file(const std::string& path, uint64_t& size) {
  // stat first: a FIFO, socket or device is refused without being opened (opening a FIFO blocks
  // until a writer comes). O_NONBLOCK covers the path being swapped for one in between, and fstat of
  // the opened descriptor decides.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("{}: not a regular file", path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path));
  }
  size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, size);
  std::string s;
  char buf[65536];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("{}: read error: {}", path, std::strerror(err)));
    }
    if (k == 0) break;
    s.append(buf, static_cast<std::size_t>(k));
    if (s.size() > max_bytes) {
      ::close(fd);
      throw Error(fmt::format("{}: larger than {} bytes", path, max_bytes));
    }
  }
  ::close(fd);
  return s;
}

}  // namespace mla::io
