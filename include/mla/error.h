// SPDX-License-Identifier: Apache-2.0
#pragma once
// mla::Error: the one exception type of the library. Every public entry point validates its input
// before touching memory and throws Error with a message that says what was expected and what came.
#include <stdexcept>
#include <string>

namespace mla {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace mla
