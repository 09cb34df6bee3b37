// SPDX-License-Identifier: Apache-2.0
// mla: run, check and benchmark one DeepSeek MLA attention layer.
//   mla run    a synthetic continuous-batching trace through MlaAttention, checked against a float64 oracle
//   mla info   build, backends, devices
//   mla bench  kernel and layer benchmarks (CUDA)
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <new>

#include "cli_util.h"
#include "commands.h"
#include "mla/error.h"

int main(int argc, char** argv) {
  using namespace mla::app;
  CLI::App app{fmt::format("mla {}: DeepSeek Multi-head Latent Attention (vLLM's MLA layer and FlashMLA-sparse "
                           "semantics), dense and sparse, on the CPU and CUDA",
                           version_string()),
               "mla"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_string());

  RunOptions run_opts;
  InfoOptions info_opts;
  mla::bench::BenchOptions bench_opts;
  CLI::App* run = add_run_command(app, run_opts);
  CLI::App* info = add_info_command(app, info_opts);
  CLI::App* bench = add_bench_command(app, bench_opts);
  app.footer("Run `mla <command> --help` for the options of a command.");

  // A first word that is neither an option nor a command: name it (CLI11 would say only that a
  // subcommand is required).
  auto is_command = [&](const std::string& w) {
    try {
      return app.get_subcommand_ptr(w) != nullptr;
    } catch (const CLI::OptionNotFound&) {
      return false;
    }
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    fmt::print(stderr, "mla: unknown command '{}' (expected run, info or bench; see `mla --help`)\n", argv[1]);
    return kExitError;
  }
  if (const int rc = parse_command_line(app, argc, argv); rc >= 0) return rc;
  try {
    if (run->parsed()) {
      run_opts.given = given_options(*run);
      return run_command(run_opts);
    }
    if (info->parsed()) return info_command(info_opts);
    if (bench->parsed()) return bench_command(bench_opts, given_options(*bench));
  } catch (const mla::Error& e) {
    fmt::print(stderr, "mla: error: {}\n", e.what());
    return kExitError;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "mla: error: out of host memory for this configuration (reduce --requests, --max-context, "
                       "--token-budget or --max-seqs)\n");
    return kExitError;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mla: unexpected failure: {}\n", e.what());
    return kExitError;
  }
  return kExitError;
}
