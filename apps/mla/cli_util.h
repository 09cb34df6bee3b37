// SPDX-License-Identifier: Apache-2.0
#pragma once
// Option checking and output files of the `mla` program (issue 14): every integer option is range-checked
// with a short message naming the bound, and --json files are opened before the work starts, so that an
// unwritable path fails at once and a failed write (a full disk) is an error, not a lost record.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>

#include "mla/error.h"

namespace mla::app {

// An integer in [lo, hi] (CLI11 prefixes the option's name to the message).
inline CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (ec != std::errc() || p != end || v < lo || v > hi)
          return fmt::format("expected an integer in [{}, {}], got '{}'", lo, hi, s);
        return {};
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// The long names ("--topk") of the options of `cmd` that the command line gave, after parsing: an option
// that only matters with another one is refused when given alone, whatever its value.
std::set<std::string> given_options(const CLI::App& cmd);

// Parses the command line. Help and --version print and return 0; any other parse failure prints one
// message in the program's voice (what was given, what the command accepts, `mla <command> --help`)
// and returns the error exit code; a successful parse returns -1.
int parse_command_line(CLI::App& app, int argc, char** argv);

// An unsigned 64-bit integer, decimal digits only: CLI11 would read "-1" as 2^64 - 1 and wrap a value
// past 2^64 - 1 instead of refusing it.
inline CLI::Validator uint64_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || s[0] == '-' || s[0] == '+' || ec != std::errc() || p != end)
          return fmt::format("expected an integer in [0, 2^64 - 1], got '{}'", s);
        return {};
      },
      "UINT64");
}

// A file opened for writing when constructed (throws mla::Error naming the option when it cannot be);
// write() replaces its contents and throws when the bytes did not all reach the file.
class OutputFile {
 public:
  OutputFile(std::string path, const char* option) : path_(std::move(path)), option_(option) {
    if (path_.empty()) return;
    f_.open(path_, std::ios::out | std::ios::trunc);
    if (!f_) throw Error(fmt::format("{}: cannot open '{}' for writing", option_, path_));
  }
  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  void write(const std::string& text) {
    f_ << text;
    f_.flush();
    f_.close();
    if (f_.fail()) throw Error(fmt::format("{}: writing '{}' failed (disk full or device error)", option_, path_));
  }

 private:
  std::string path_;
  const char* option_;
  std::ofstream f_;
};

}  // namespace mla::app
