// SPDX-License-Identifier: Apache-2.0
// mla::bench::run / available, the benchmark context (timing, L2 flush, result rows, JSON record).
// Compiled in every build; without CUDA, run() throws and available() is empty.
#include "registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "families.h"
#include "mla/error.h"
#include "mla/variants.h"

#if MLA_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/device_api.h"
#endif

namespace mla::bench {

void Registry::add(std::string name, std::string description, BenchFn fn) {
  for (const Entry& e : entries_)
    if (e.name == name) throw Error("bench registry: benchmark '" + name + "' registered twice");
  entries_.push_back({std::move(name), std::move(description), std::move(fn)});
}

const std::vector<std::string>& grids() {
  static const std::vector<std::string> names = {"issue7", "issue8", "issue9", "issue48", "v4"};
  return names;
}

void check_grid_name(const std::string& grid) {
  if (grid.empty() || std::find(grids().begin(), grids().end(), grid) != grids().end()) return;
  std::string known;
  for (const std::string& g : grids()) known += (known.empty() ? "" : ", ") + g;
  throw Error("mla bench: unknown grid '" + grid + "' (known: " + known + ")");
}

std::vector<int32_t> random_permutation(int64_t n, uint64_t seed) {
  std::vector<int32_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 g(seed);
  std::shuffle(p.begin(), p.end(), g);
  return p;
}

#if MLA_WITH_CUDA

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("mla bench: {}: {}", what, cudaGetErrorString(e)));
}
std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

BenchContext::BenchContext(const BenchOptions& options, void* stream) : options_(options), stream_(stream) {
  const cuda_rt::DeviceInfo info = cuda_rt::device_info(options.device);
  flush_bytes_ = std::max<std::size_t>(2 * info.l2_bytes, std::size_t{64} << 20);
  check(cudaMalloc(&flush_, flush_bytes_), "cudaMalloc (L2 flush buffer)");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

BenchContext::~BenchContext() {
  cudaFree(flush_);
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void BenchContext::flush_l2() {
  check(cudaMemsetAsync(flush_, 0x5a, flush_bytes_, static_cast<cudaStream_t>(stream_)), "L2 flush");
}

double BenchContext::median_timed_ms(const std::function<void()>& run) {
  auto s = static_cast<cudaStream_t>(stream_);
  auto ev0 = static_cast<cudaEvent_t>(start_), ev1 = static_cast<cudaEvent_t>(stop_);
  std::vector<float> ms(static_cast<std::size_t>(std::max(1, options_.iters)));
  for (std::size_t i = 0; i < ms.size(); ++i) {
    // Writing a buffer twice the L2's size evicts the previous run's data: every timed run starts cold.
    check(cudaMemsetAsync(flush_, static_cast<int>(i & 0xff), flush_bytes_, s), "L2 flush");
    check(cudaEventRecord(ev0, s), "cudaEventRecord");
    run();
    check(cudaEventRecord(ev1, s), "cudaEventRecord");
    check(cudaEventSynchronize(ev1), "timed run");
    check(cudaEventElapsedTime(&ms[i], ev0, ev1), "cudaEventElapsedTime");
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

double BenchContext::time_ms(const std::function<void()>& launch) {
  for (int i = 0; i < options_.warmup; ++i) launch();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "warm-up");
  return median_timed_ms(launch);
}

namespace {
// The captured graph and its executable form, destroyed on every path out of time_graph_ms.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};
}  // namespace

BenchContext::GraphTiming BenchContext::time_graph_ms(const std::function<void()>& launch) {
  auto s = static_cast<cudaStream_t>(stream_);
  // Eager warm-up: allocations, kernel attributes and library handles made on first use are not capturable.
  for (int i = 0; i < std::max(1, options_.warmup); ++i) launch();
  check(cudaStreamSynchronize(s), "warm-up");
  GraphTiming r;
  CapturedGraph g;
  // Thread-local mode: a call of this thread that is unsafe during a capture (a cudaMalloc, a synchronous
  // copy) fails the capture instead of being recorded wrongly.
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    r.note = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
  } else {
    try {
      launch();
    } catch (const std::exception& ex) {
      r.note = std::string("the call threw during the capture: ") + ex.what();
    }
    e = cudaStreamEndCapture(s, &g.graph);  // ends the capture on every path, also after a throw
    if (r.note.empty() && e != cudaSuccess) r.note = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
    if (r.note.empty() && g.graph == nullptr) r.note = "the capture recorded no graph";
    if (r.note.empty()) {
      e = cudaGraphInstantiate(&g.exec, g.graph, 0);
      if (e != cudaSuccess) r.note = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
    }
  }
  if (!r.note.empty()) {
    cudaGetLastError();  // the failed capture's error is not sticky: clear it before timing eagerly
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t dropped = nullptr;
      cudaStreamEndCapture(s, &dropped);
      if (dropped) cudaGraphDestroy(dropped);
      cudaGetLastError();
    }
    r.ms = time_ms(launch);
    return r;
  }
  auto replay = [&] { check(cudaGraphLaunch(g.exec, s), "cudaGraphLaunch"); };
  for (int i = 0; i < std::max(1, options_.warmup); ++i) replay();  // the first replay uploads the graph
  check(cudaStreamSynchronize(s), "graph warm-up");
  r.ms = median_timed_ms(replay);
  r.graph = true;
  return r;
}

double BenchContext::time_ms(const std::function<void()>& launch, bool graph, std::string& config) {
  if (!graph) return time_ms(launch);
  const GraphTiming t = time_graph_ms(launch);
  config += " " + t.label();
  return t.ms;
}

void BenchContext::report(const std::string& op, const std::string& config, double ms, double bytes, double flops,
                          const std::string& formula) {
  const std::vector<std::string> families = variant_families();
  const std::string variant =
      std::find(families.begin(), families.end(), op) != families.end() ? last_variant(op) : std::string();
  if (op != last_op_) {
    std::printf("\n%s   [%s]%s\n", op.c_str(), formula.c_str(),
                variant.empty() ? "" : ("   variant " + variant).c_str());
    std::printf("  %-46s %10s %9s %7s %9s %7s\n", "config", "time ms", "GB/s", "%copy", "TFLOP/s", "%gemm");
    last_op_ = op;
    op_variant_ = variant;
  }
  // A row run by another variant than the op's first row (automatic selection by shape) says so.
  const std::string note = variant != op_variant_ ? "   variant " + variant : "";
  const double gbps = ms > 0 ? bytes / (ms * 1e6) : 0;  // bytes / (ms * 1e-3) / 1e9
  const double tflops = ms > 0 ? flops / (ms * 1e9) : 0;
  const double pct_copy = ceilings_.copy_gbps > 0 ? 100.0 * gbps / ceilings_.copy_gbps : 0;
  const double pct_gemm = ceilings_.gemm_tflops > 0 ? 100.0 * tflops / ceilings_.gemm_tflops : 0;
  if (flops > 0)
    std::printf("  %-46s %10.4f %9.1f %6.1f%% %9.1f %6.1f%%%s\n", config.c_str(), ms, gbps, pct_copy, tflops, pct_gemm,
                note.c_str());
  else
    std::printf("  %-46s %10.4f %9.1f %6.1f%% %9s %7s%s\n", config.c_str(), ms, gbps, pct_copy, "-", "-", note.c_str());
  std::fflush(stdout);
  rows_.push_back({op, config, formula, ms, bytes, flops, variant});
}

void BenchContext::report_floor(double floor_ms, double floor_bytes, bool graph) {
  if (rows_.empty() || floor_ms <= 0) return;
  Row& r = rows_.back();
  r.floor_ms = floor_ms;
  const double gbps = floor_bytes / (floor_ms * 1e6);
  std::printf("    read floor of its rows (%s) %10.4f %9.1f %6.1f%%   row at %.1f%% of the floor's rate\n",
              graph ? "load-only, graph" : "load-only kernel", floor_ms, gbps,
              ceilings_.copy_gbps > 0 ? 100.0 * gbps / ceilings_.copy_gbps : 0.0,
              r.ms > 0 ? 100.0 * floor_ms / r.ms : 0.0);
  std::fflush(stdout);
}

int run(const BenchOptions& o) {
  if (cuda_rt::device_count() <= o.device)
    throw Error(fmt::format("mla bench: CUDA device {} not found ({} present)", o.device, cuda_rt::device_count()));
  check(cudaSetDevice(o.device), "cudaSetDevice");
  Registry reg;
  register_all(reg);
  for (const std::string& name : o.ops) {
    const bool known = std::any_of(reg.entries().begin(), reg.entries().end(),
                                   [&](const Registry::Entry& e) { return e.name == name; });
    if (!known) {
      std::string names;
      for (const auto& e : reg.entries()) names += (names.empty() ? "" : ", ") + e.name;
      throw Error(fmt::format("mla bench: unknown benchmark '{}' (available: {})", name, names));
    }
  }
  auto selected = [&](const std::string& name) {
    return o.ops.empty() || std::find(o.ops.begin(), o.ops.end(), name) != o.ops.end();
  };

  // --variant: force it in every family that has a variant of that name (guards live for the run).
  std::vector<std::unique_ptr<ForceVariant>> forced;
  std::string forced_in;
  if (!o.variant.empty()) {
    std::string known;
    for (const std::string& f : variant_families())
      for (const VariantInfo& v : list_variants(f)) {
        known += (known.empty() ? "" : ", ") + f + ":" + v.name;
        if (v.name != o.variant) continue;
        forced.push_back(std::make_unique<ForceVariant>(f, o.variant));
        forced_in += (forced_in.empty() ? "" : ", ") + f;
      }
    if (forced.empty())
      throw Error(fmt::format("mla bench: no kernel family has a variant '{}' (family:variant pairs: {})", o.variant,
                              known));
  }

  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const cuda_rt::DeviceInfo info = cuda_rt::device_info(o.device);
  const char* commit = std::getenv("MLA_GIT_COMMIT");
  std::printf("mla bench on %s (cc %d.%d, %d SMs, L2 %.0f MB, %.1f GiB), %s%s, warm-up %d, median of %d, L2 flushed\n",
              info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count, info.l2_bytes / 1e6,
              info.total_mem / 1073741824.0, now_utc().c_str(), o.quick ? ", QUICK sizes" : "", o.warmup, o.iters);
  if (!o.pdl) std::printf("programmatic dependent launch off (--no-pdl)\n");
  if (!forced.empty()) std::printf("variant %s forced in %s\n", o.variant.c_str(), forced_in.c_str());
  int rc = 0;
  {
    BenchContext ctx(o, stream);
    // The ceilings come first whatever was selected: every row is reported as a share of them.
    for (const auto& e : reg.entries()) {
      if (e.name != "ceilings" && !selected(e.name)) continue;
      try {
        e.fn(ctx);
      } catch (const std::exception& ex) {
        std::printf("\n%s FAILED: %s\n", e.name.c_str(), ex.what());
        rc = 1;
        cudaGetLastError();
      }
    }
    if (!o.json_path.empty()) {
      nlohmann::json j;
      j["device"] = info.name;
      j["sm_count"] = info.sm_count;
      j["l2_bytes"] = info.l2_bytes;
      j["date"] = now_utc();
      j["commit"] = commit ? commit : "unknown";
      j["quick"] = o.quick;
      j["warmup"] = o.warmup;
      j["iters"] = o.iters;
      j["variant"] = o.variant;
      j["pdl"] = o.pdl;
      j["ceilings"] = {{"copy_gbps", ctx.ceilings().copy_gbps}, {"gemm_tflops", ctx.ceilings().gemm_tflops}};
      for (const Row& r : ctx.rows()) {
        const double gbps = r.ms > 0 ? r.bytes / (r.ms * 1e6) : 0, tflops = r.ms > 0 ? r.flops / (r.ms * 1e9) : 0;
        j["rows"].push_back({{"op", r.op}, {"config", r.config}, {"formula", r.formula}, {"time_ms", r.ms},
                             {"bytes", r.bytes}, {"flops", r.flops}, {"variant", r.variant}, {"gbps", gbps}, {"tflops", tflops},
                             {"pct_copy", ctx.ceilings().copy_gbps > 0 ? 100 * gbps / ctx.ceilings().copy_gbps : 0},
                             {"pct_gemm", ctx.ceilings().gemm_tflops > 0 ? 100 * tflops / ctx.ceilings().gemm_tflops : 0}});
        if (r.floor_ms > 0) {
          j["rows"].back()["floor_ms"] = r.floor_ms;
          j["rows"].back()["pct_floor"] = r.ms > 0 ? 100 * r.floor_ms / r.ms : 0;
        }
      }
      if (o.write_json) {
        o.write_json(j.dump(2) + "\n");
      } else {
        std::ofstream f(o.json_path);
        f << j.dump(2) << "\n";
        f.close();
        if (!f) throw Error(fmt::format("mla bench: writing '{}' failed", o.json_path));
      }
      std::printf("\nwrote %s\n", o.json_path.c_str());
    }
  }
  cudaStreamDestroy(stream);
  return rc;
}

std::vector<std::string> available() {
  Registry reg;
  register_all(reg);
  std::vector<std::string> names;
  for (const auto& e : reg.entries()) names.push_back(e.name);
  return names;
}

#else  // !MLA_WITH_CUDA

int run(const BenchOptions&) { throw Error("mla bench: built without CUDA"); }
std::vector<std::string> available() { return {}; }

#endif

}  // namespace mla::bench
