// SPDX-License-Identifier: Apache-2.0
#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace mla::app {

Progress::Progress(int64_t total_steps, bool enabled)
    : total_(std::max<int64_t>(total_steps, 1)),
      enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0),
      last_line_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t steps_done, int64_t tokens, double forward_seconds, const std::string& note) {
  if (!enabled_) return;
  last_step_ = steps_done;
  last_tokens_ = tokens;
  last_seconds_ = forward_seconds;
  const double tps = forward_seconds > 0 ? static_cast<double>(tokens) / forward_seconds : 0.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * std::min<int64_t>(steps_done, total_) / total_);
    fmt::print(stderr, "\r[{}{}] step {}/{}  {} tokens  {:.0f} tok/s  {}\x1b[K", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), steps_done, total_, tokens, tps, note);
    std::fflush(stderr);
    open_line_ = true;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (steps_done < next_line_step_ && now - last_line_ < std::chrono::seconds(10) && steps_done < total_) return;
  next_line_step_ = steps_done + std::max<int64_t>(1, total_ / 10);
  last_line_ = now;
  printed_step_ = steps_done;
  fmt::print(stderr, "[mla run] step {}/{}: {} tokens, {:.0f} tok/s in forward{}{}\n", steps_done, total_, tokens, tps,
             note.empty() ? "" : ", ", note);
}

void Progress::finish() {
  if (!enabled_) return;
  if (tty_ && open_line_) fmt::print(stderr, "\n");
  open_line_ = false;
  if (!tty_ && printed_step_ != last_step_) {
    next_line_step_ = 0;  // forces the line
    update(last_step_, last_tokens_, last_seconds_);
  }
}

}  // namespace mla::app
