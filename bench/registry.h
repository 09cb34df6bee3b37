// SPDX-License-Identifier: Apache-2.0
#pragma once
// The benchmark registry behind `mla bench` (bench.h). Plain C++ (no fmt, no JSON types): benchmark
// sources may be .cu files compiled by nvcc.
//
// Adding benchmarks (e.g. a new bench/<family>.cu):
//   1. write `void register_attention(Registry& r)` that calls
//        r.add("mqa_decode", "absorbed MQA decode over the paged cache", [](BenchContext& ctx) { ... });
//      once per benchmark name (the names `--ops` selects; BenchOptions lists the usual ones);
//   2. declare it and call it in bench/families.h (the one list of families; explicit, because objects
//      of a static library that nothing references would be dropped by the linker).
// A benchmark allocates its inputs (Tensor on Device::cuda(ctx.device()); fill them with the device
// fills below, never zeros), times its op with ctx.time_ms (warm-up, then the median of
// options.iters runs with the L2 flushed before each), and reports rows with ctx.report: bytes and
// FLOPs are the minimum traffic and arithmetic the op needs (formula given with the row), and the
// printed shares are of the ceilings measured at the start of the same run.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "mla/cache.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla::bench {

// Measured in the same run before any benchmark (ceilings.cu).
struct Ceilings {
  double copy_gbps = 0;    // cudaMemcpyAsync device-to-device, bytes read + written per second / 1e9
  double gemm_tflops = 0;  // cuBLAS bf16 GEMM 8192^3, random data, fp32 accumulation
};

struct Row {
  std::string op, config, formula;
  double ms = 0, bytes = 0, flops = 0;
  std::string variant;  // the kernel variant that ran, when `op` is a kernel family with variants
  double floor_ms = 0;  // the read floor of the rows the op read (floor.h), 0: not measured
};

class BenchContext {
 public:
  BenchContext(const BenchOptions& options, void* stream);
  ~BenchContext();
  BenchContext(const BenchContext&) = delete;
  BenchContext& operator=(const BenchContext&) = delete;

  const BenchOptions& options() const { return options_; }
  int device() const { return options_.device; }
  bool quick() const { return options_.quick; }
  void* stream() const { return stream_; }  // cudaStream_t every benchmark launches on
  Context op_context() const {
    Context c{stream_, Precision::fast};
    c.pdl = options_.pdl;
    return c;
  }
  Ceilings& ceilings() { return ceilings_; }

  // Median milliseconds of `launch` (which enqueues the work on stream()): options().warmup untimed
  // calls, then options().iters calls each timed with CUDA events, the L2 flushed (a memset of a
  // buffer twice the L2 size) before each timed call.
  double time_ms(const std::function<void()>& launch);
  // time_ms's measurement of a graph-replayed call, the way engines run small decode steps: options().warmup
  // eager calls (lazy initialisation is not capturable), then `launch` captured once into a CUDA graph on
  // stream(), and the median of options().iters replays of it, each timed with CUDA events after the same L2
  // flush (outside the timed region). A call that cannot be captured (it throws during the capture, or the
  // capture or the instantiation fails) is timed by time_ms instead, and `note` says why; it never throws for
  // that reason (an error of the eager warm-up propagates as in time_ms).
  struct GraphTiming {
    double ms = 0;
    bool graph = false;  // true: graph replays; false: time_ms's eager timing (see note)
    std::string note;    // why the call was not captured; empty when graph
    // "graph", or "eager (no graph: <note>)": for a row's config.
    std::string label() const { return graph ? "graph" : "eager (no graph: " + note + ")"; }
  };
  GraphTiming time_graph_ms(const std::function<void()>& launch);
  // A row's timing by its flag: time_graph_ms when `graph` (" " + its label() appended to `config`), else time_ms.
  double time_ms(const std::function<void()>& launch, bool graph, std::string& config);
  // Enqueues the L2 flush time_ms does before each timed call (a memset of twice the L2 size) on stream().
  void flush_l2();

  // Prints one result row: time, GB/s = bytes / time, % of the copy ceiling, TFLOP/s = flops /
  // time, % of the GEMM ceiling (the last two only when flops > 0), and records it for --json.
  // `formula` says how bytes/flops were counted; it is printed once per op.
  void report(const std::string& op, const std::string& config, double ms, double bytes, double flops,
              const std::string& formula);
  // Attaches a read floor (floor.h: the rows the op read, `floor_bytes` of them, read by a load-only kernel,
  // same timing) to the last row and prints it under that row: its time, GB/s, % of copy and the row's share
  // of the floor's rate (floor time / row time). `graph`: the floor was timed graph-replayed (the line says so).
  void report_floor(double floor_ms, double floor_bytes, bool graph = false);
  const std::vector<Row>& rows() const { return rows_; }

 private:
  // The timed loop of time_ms and time_graph_ms: options().iters runs of `run`, each after an L2 flush,
  // each timed with events; the median.
  double median_timed_ms(const std::function<void()>& run);
  const BenchOptions& options_;
  void* stream_;
  Ceilings ceilings_;
  void* flush_ = nullptr;
  std::size_t flush_bytes_ = 0;
  void* start_ = nullptr;
  void* stop_ = nullptr;
  std::vector<Row> rows_;
  std::string last_op_, op_variant_;
};

using BenchFn = std::function<void(BenchContext&)>;

// The named grids of --grid (bench.h BenchOptions::decode_grid); throws mla::Error naming the known ones
// for any other non-empty name. Each op checks it before running its default rows under another op's grid.
void check_grid_name(const std::string& grid);

class Registry {
 public:
  void add(std::string name, std::string description, BenchFn fn);
  struct Entry {
    std::string name, description;
    BenchFn fn;
  };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// ---- device fills for benchmark inputs (bench/fill.cu) -----------------------------------------
// Counter-based random values (a hash of seed and index), so multi-GB inputs fill in milliseconds.
void fill_uniform(const TensorView& t, double lo, double hi, uint64_t seed, void* stream);  // bf16 / f32
void fill_e4m3_codes(const TensorView& t, uint64_t seed, void* stream);  // random finite e4m3 codes (any 1-byte dtype)
// fp8_ds_mla records: finite codes, positive tile scales in [1e-3, 1e-2), bf16 rope in [-1, 1).
void fill_ds_mla_rows(const TensorView& cache_data, uint64_t seed, void* stream);
// A cache's contents by its format: random bf16 in [-1, 1), fp8 codes, or fp8_ds_mla records as above.
void fill_cache(const KVCache& c, uint64_t seed, void* stream);
void fill_iota_i32(const TensorView& t, int32_t start, int32_t step, void* stream);  // contiguous i32

// Permutation of [0, n) as int32 (host shuffle, copied to the device): scattered block tables and slots.
std::vector<int32_t> random_permutation(int64_t n, uint64_t seed);

}  // namespace mla::bench
