// SPDX-License-Identifier: Apache-2.0
// Command-line parsing of the `mla` program: CLI11 parses, the failures are reworded here.
#include "cli_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "commands.h"

namespace mla::app {

namespace {

// The long names of a command's options in the order of its --help, without --help itself.
std::vector<std::string> option_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt == cmd.get_help_ptr() || opt->get_lnames().empty()) continue;
    names.push_back("--" + opt->get_lnames().front());
  }
  return names;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest option name to `word` when it is close enough to be a typo ("" otherwise).
std::string closest(const std::string& word, const std::vector<std::string>& names) {
  const std::string key = word.substr(0, word.find('='));
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, key.size() / 3) + 1;
  for (const std::string& n : names) {
    const std::size_t d = edit_distance(key, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string command_of(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return {};
  try {
    return app.get_subcommand(argv[1]) ? std::string(argv[1]) : std::string();
  } catch (const CLI::OptionNotFound&) {
    return {};
  }
}

}  // namespace

std::set<std::string> given_options(const CLI::App& cmd) {
  std::set<std::string> given;
  for (const CLI::Option* opt : cmd.get_options())
    if (opt->count() > 0 && !opt->get_lnames().empty()) given.insert("--" + opt->get_lnames().front());
  return given;
}

int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string name = command_of(app, argc, argv);
    const CLI::App* cmd = name.empty() ? &app : app.get_subcommand(name);
    const std::string who = name.empty() ? "mla" : "mla " + name;
    const std::string help = fmt::format("see `{} --help`", who);
    std::string msg;
    std::vector<std::string> commands;
    for (const CLI::App* sub : static_cast<const CLI::App&>(app).get_subcommands([](const CLI::App*) { return true; }))
      commands.push_back(sub->get_name());
    const bool top_level_words = name.empty() && argc > 1;  // `mla --frob`: no command, unknown words
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr || top_level_words) {
      std::vector<std::string> extras = app.remaining(true);
      if (extras.empty() && top_level_words) extras.assign(argv + 1, argv + argc);
      std::vector<std::string> names = option_names(*cmd);
      std::string what;
      bool after_option = false;  // a word after an unknown option is taken for its value, not reported
      for (const std::string& x : extras) {
        const bool is_option = x.rfind("-", 0) == 0;
        if (!is_option && after_option) continue;
        after_option = is_option && x.find('=') == std::string::npos;
        if (!what.empty()) what += "; ";
        if (!is_option) {
          what += fmt::format("unexpected argument '{}' ({} takes options only)", x, who);
          continue;
        }
        what += fmt::format("unknown option '{}'", x);
        const std::string near = closest(x, names);
        if (!near.empty()) what += fmt::format(" (did you mean {}?)", near);
      }
      if (what.empty()) what = e.what();
      const std::string accepted =
          name.empty() ? fmt::format("--help, --version or a command ({})", join(commands)) : join(names);
      msg = fmt::format("{}: {}; {} accepts {} ({})", who, what, who, accepted, help);
    } else if (name.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      msg = fmt::format("mla: a command is required: {} ({})", join(commands), help);
    } else if (const std::string m = e.what(); dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr &&
                                               m.find("missing") != std::string::npos) {
      msg = fmt::format("{}: {} needs a value ({})", who, m.substr(0, m.find(':')), help);
    } else {
      msg = fmt::format("{}: {} ({})", who, e.what(), help);
    }
    std::fprintf(stderr, "%s\n", msg.c_str());
    return kExitError;
  }
}

}  // namespace mla::app
