// SPDX-License-Identifier: Apache-2.0
#pragma once
// Progress of `mla run` on stderr: a redrawn bar when stderr is a terminal, otherwise one line every
// tenth of the run (and at least every 10 s), so that logs and CI output stay readable.
#include <chrono>
#include <cstdint>
#include <string>

namespace mla::app {

class Progress {
 public:
  Progress(int64_t total_steps, bool enabled);
  // After each step: steps done, tokens processed so far, seconds spent in forward so far.
  void update(int64_t steps_done, int64_t tokens, double forward_seconds, const std::string& note = "");
  void finish();  // ends the bar; without a terminal, prints the final state if the last line was older

 private:
  int64_t total_;
  bool enabled_, tty_, open_line_ = false;
  int64_t next_line_step_ = 0;
  int64_t last_step_ = 0, printed_step_ = -1, last_tokens_ = 0;
  double last_seconds_ = 0;
  std::chrono::steady_clock::time_point last_line_;
};

}  // namespace mla::app
