// SPDX-License-Identifier: Apache-2.0
#pragma once
// `mla bench`: kernel and layer benchmarks. Every benchmark prints time (median of many runs after
// warm-up, L2 flushed between runs), TFLOP/s, GB/s and the share of the ceilings measured in the
// same run (device-to-device copy bandwidth, cuBLAS bf16 GEMM). Formulas sit next to each print.
#include <functional>
#include <string>
#include <vector>

namespace mla::bench {

struct BenchOptions {
  std::vector<std::string> ops;  // empty = all; names: ceilings, write_cache, gather_cache, upconvert,
                                 // merge, convert_topk, mqa_decode, mha_prefill, sparse_mqa, gemm, layer, block
  std::string json_path;         // write a JSON record here when non-empty
  // When set, the record goes through it instead (the CLI opens the file before the run and reports
  // write errors).
  std::function<void(const std::string& text)> write_json;
  int device = 0;
  int warmup = 5;
  int iters = 30;
  bool quick = false;            // smaller sizes (smoke test)
  // mqa_decode / mha_prefill shapes: decode.b > 0 benchmarks exactly that shape (each op reads the
  // fields it has); decode_grid names a fixed list of shapes of one op instead ("issue7": mqa_decode,
  // issue 7's table with FlashMLA's times beside ours, small batch, varlen, other head counts, page sizes
  // and fp8 formats; "issue8": sparse_mqa, issue 8's table and more; "issue9": mha_prefill, issue 9's
  // grid; "issue48": issue 48's small decode steps, graph-replayed with the targets, of mqa_decode,
  // sparse_mqa and layer, each op its own rows); the other ops run their default rows.
  // Neither: the default rows.
  struct DecodeShape {
    int64_t b = 0, s_q = 1, h = 16, s_k = 4096, page = 64;
    std::string format = "bf16";  // bf16, fp8, fp8_ds_mla
    bool varlen = false;          // seq_lens uniform in [1, s_k] (seeded) instead of all s_k (mha_prefill:
                                  // s_q per request uniform in [1, s_q], s_k = s_q causal, else in [1, s_k])
    bool non_causal = false;      // mha_prefill: a non-causal context chunk instead of causal self-attention
    bool sequential_pages = false;  // mqa_decode: request i's pages are i * pages .. (the block tables of
                                    // FlashMLA's benchmark) instead of a random permutation of the cache
    int splits = 0;               // KV splits per request (0: the planner's decode_num_splits)
    int64_t topk = 2048;          // sparse_mqa: indices per token (b = tokens, h, format)
    int64_t pool = 0;             // sparse_mqa: cache rows the indices are drawn from (0: b * topk, each read once)
    // sparse_mqa: a DeepSeek-V4 shape (d_qk 512, K = V, a per-head sink) when extra_topk > 0: topk window rows of
    // the main cache and extra_topk rows of an extra cache (format extra_format, empty: the main one's), drawn from
    // extra_pool rows (0: b * extra_topk, each read once)
    int64_t extra_topk = 0;
    int64_t extra_pool = 0;
    std::string extra_format;
    bool graph = false;           // mqa_decode / sparse_mqa shape (--b): timed graph-replayed (no host launch cost)
    // mqa_decode / sparse_mqa: each row runs twice, as is and in the batch-invariant mode (PlannerConfig::
    // batch_invariant; decode: the split count batch_invariant_splits gives a config whose full batch is the row's b)
    bool batch_invariant = false;
    // mqa_decode: each fp8 per-tensor row runs twice, as is and with fp8 compute (mqa_decode's fp8_compute: the
    // sm90_fp8c kernel above 32 rows) right after it
    bool fp8_compute = false;
    bool trace = false;           // mqa_decode: after each row, the sm90 kernels' timeline of one warm and one cold
                                  // call (a build configured with -DMLA_DECODE_TRACE=ON; cuda/common/trace.cuh)
  } decode;
  std::string decode_grid;
  int dcp = 0;                   // dcp: GPUs of the DCP group (0 = every GPU of the machine)
  bool pdl = true;               // Context::pdl of every op the benchmarks call (--no-pdl: each kernel starts after the
                                 // previous one completed)
  std::string variant;           // force this kernel variant (include/mla/variants.h) in every family
                                 // that has one of that name; empty = automatic selection
  // layer: the output format (an mla::OutputQuant key; other than none, every row runs unquantised and
  // then quantised, in the same call) and the fp8 cache's scale ("fixed", or "auto": calibrated from
  // the first timed step; fp8 rows only).
  std::string out_quant = "none";
  std::string kv_scales = "fixed";
  // mha_prefill: fp8 compute (PrefillOptions::fp8; sm_90 only) with scales 1/256 on inputs in [-1, 1]; the time
  // includes the quantise pass. layer: LayerOptions::fp8_prefill (scales 1) in the dense rows over fp8 and
  // fp8_ds_mla caches (their labels end in "fp8-prefill"). block: the prefill step again with
  // DeepseekOptions::fp8_prefill over an fp8_ds_mla cache ("... fp8-prefill fp8_ds_mla").
  bool fp8_prefill = false;
};

// Runs the selected benchmarks on CUDA device `device` and prints tables. Returns a process exit code.
// Throws mla::Error when the build or machine has no CUDA device.
int run(const BenchOptions& options);

// Names run() accepts.
std::vector<std::string> available();

// The named grids (--grid; BenchOptions::decode_grid), in every build.
const std::vector<std::string>& grids();

}  // namespace mla::bench
