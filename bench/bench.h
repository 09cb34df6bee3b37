#pragma once
// `mla bench`: kernel and layer benchmarks. Every benchmark prints time (median of many runs after
// warm-up, L2 flushed between runs), TFLOP/s, GB/s and the share of the ceilings measured in the
// same run (device-to-device copy bandwidth, cuBLAS bf16 GEMM). Formulas sit next to each print.
#include <string>
#include <vector>

namespace mla::bench {

struct BenchOptions {
  std::vector<std::string> ops;  // empty = all; names: ceilings, write_cache, gather_cache, upconvert,
                                 // merge, convert_topk, mqa_decode, mha_prefill, sparse_mqa, gemm, layer
  std::string json_path;         // write a JSON record here when non-empty
  int device = 0;
  int warmup = 5;
  int iters = 30;
  bool quick = false;            // smaller sizes (smoke test)
  std::string variant;           // force this kernel variant (include/mla/variants.h) in every family
                                 // that has one of that name; empty = automatic selection
};

// Runs the selected benchmarks on CUDA device `device` and prints tables. Returns a process exit code.
// Throws mla::Error when the build or machine has no CUDA device.
int run(const BenchOptions& options);

// Names run() accepts.
std::vector<std::string> available();

}  // namespace mla::bench
