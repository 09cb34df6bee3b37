// SPDX-License-Identifier: Apache-2.0
// `mla info`: version, build, backends, devices.
#include <fmt/format.h>
#include <omp.h>

#include <fstream>
#include <string_view>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mla/tensor.h"
#include "mla/version.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla::app {

// The version of project(mla VERSION ...), through the generated mla/version.h.
std::string version_string() { return MLA_VERSION_STRING; }

std::string build_type() {
#ifdef MLA_BUILD_TYPE
  return MLA_BUILD_TYPE;
#elif defined(NDEBUG)
  return "optimised (NDEBUG)";
#else
  return "debug (assertions on)";
#endif
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

int openmp_threads() { return omp_get_max_threads(); }

CLI::App* add_info_command(CLI::App& app, InfoOptions& o) {
  CLI::App* cmd = app.add_subcommand("info", "Show the version, the build (CUDA or not), the devices present and "
                                             "the OpenMP thread count");
  cmd->add_flag("--json", o.json, "Print the same facts as one JSON object");
  return cmd;
}

int info_command(const InfoOptions& o) {
  nlohmann::json j;
  j["version"] = version_string();
  j["build_type"] = build_type();
  j["commit"] = MLA_GIT_COMMIT;
  j["compiler"] = MLA_CXX_COMPILER;
  j["cuda_built"] = built_with_cuda();
  j["cuda_toolkit"] = MLA_CUDA_TOOLKIT_VERSION;  // "" without the CUDA backend
  j["cuda_archs"] = nlohmann::json::array();     // GPU code built: sm_XY machine code, compute_XY PTX
  for (std::string_view rest = MLA_CUDA_ARCHS; !rest.empty();) {
    const size_t sp = rest.find(' ');
    if (sp != 0) j["cuda_archs"].push_back(std::string(rest.substr(0, sp)));
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
  }
  j["cpu"] = cpu_name();
  j["openmp_threads"] = openmp_threads();
  j["devices"] = nlohmann::json::array();
  const int n = cuda_device_count();
#if MLA_WITH_CUDA
  for (int d = 0; d < n; ++d) {
    const cuda_rt::DeviceInfo info = cuda_rt::device_info(d);
    j["devices"].push_back({{"index", d},
                            {"name", info.name},
                            {"compute_capability", fmt::format("{}.{}", info.cc_major, info.cc_minor)},
                            {"sms", info.sm_count},
                            {"memory_bytes", info.total_mem},
                            {"l2_bytes", info.l2_bytes},
                            {"smem_per_block_optin", info.smem_per_block_optin}});
  }
#endif
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
    return kExitOk;
  }
  fmt::print("mla {} — DeepSeek Multi-head Latent Attention (dense and sparse), CPU and CUDA backends\n",
             version_string());
  fmt::print("  commit:         {}\n", MLA_GIT_COMMIT);
  fmt::print("  build:          {}, {}\n", build_type(), MLA_CXX_COMPILER);
  if (built_with_cuda())
    fmt::print("  CUDA backend:   built with CUDA {} for {}\n", MLA_CUDA_TOOLKIT_VERSION, MLA_CUDA_ARCHS);
  else
    fmt::print("  CUDA backend:   not built (-DMLA_WITH_CUDA=OFF or no nvcc)\n");
  fmt::print("  CPU backend:    {} ({} OpenMP threads)\n", cpu_name(), openmp_threads());
  if (!built_with_cuda()) {
    fmt::print("  CUDA devices:   - (not built)\n");
  } else if (n == 0) {
    fmt::print("  CUDA devices:   none found (mla run uses the CPU backend)\n");
  } else {
    for (const auto& d : j["devices"])
      fmt::print("  cuda:{}:         {}, sm_{}, {} SMs, {:.1f} GiB, L2 {:.0f} MiB\n", d["index"].get<int>(),
                 d["name"].get<std::string>(), d["compute_capability"].get<std::string>(), d["sms"].get<int>(),
                 d["memory_bytes"].get<double>() / (1ull << 30), d["l2_bytes"].get<double>() / (1ull << 20));
  }
  return kExitOk;
}

}  // namespace mla::app
