// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch through the layer's decode step (docs/DESIGN.md "Programmatic dependent
// launch"). kSteps decode steps of one layer are captured in one CUDA graph; every step writes its new tokens
// (its own kv_c / k_pe) into the same cache slots that its attention then reads and that the next step
// overwrites, so a kernel that reads before its wait sees the previous step's rows and one that writes before
// its wait clobbers rows the previous step still reads. The graph is captured once with Context::pdl on and
// once with it off and each is replayed twice: the replays agree bit for bit (every step's output, the cache
// after the last step), and every step matches the float64 oracle of its own inputs. Dense and sparse, bf16
// and fp8 caches, each mqa_decode / sparse_mqa variant the device runs (forced), s_q 1 and 2, with padding rows
// and split-KV combines; quantised outputs (on / off only). Filter: *LayerPdl*.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "layer_gpu_util.h"
#include "unit/layer_quant_util.h"

namespace mla::test::layer {
namespace {

constexpr int kSteps = 3;

std::vector<uint8_t> bytes_of(const TensorView& t) {
  const Tensor host = Tensor::empty(std::span<const int64_t>(t.shape.data(), t.ndim), t.dtype);
  copy(host.view(), t);
  std::vector<uint8_t> b(host.nbytes());
  std::memcpy(b.data(), host.data(), b.size());
  return b;
}

// What one replay left: each step's output bytes and the cache bytes.
struct Replay {
  std::vector<std::vector<uint8_t>> outs;
  std::vector<uint8_t> cache;
};

// A captured graph and two replays of it.
struct Captured {
  std::vector<Replay> replays;
  int programmatic_edges = 0;  // edges of cudaGraphDependencyTypeProgrammatic: the captured PDL launches
};

int programmatic_edges(cudaGraph_t g) {
  std::size_t n = 0;
  EXPECT_EQ(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  EXPECT_EQ(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n), cudaSuccess);
  int count = 0;
  for (const cudaGraphEdgeData& e : data) count += e.type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  return count;
}

// The steps' inputs: `base` (its cache, block table, slots, lengths, top-k rows, weight and plan) with the
// queries and new tokens of steps[s] at step s.
struct Steps {
  StepData base;
  std::vector<StepData> inputs;  // [kSteps]: q, kv_c, k_pe
  std::vector<OracleRuns> refs;  // [kSteps]
  OutputQuant quant = OutputQuant::none;  // LayerOptions::out_quant (then only on / off / replays are compared)
};

StepData with_inputs(const StepData& base, const StepData& in) {
  StepData e = base;
  e.q = in.q;
  e.kv_c = in.kv_c;
  e.k_pe = in.k_pe;
  return e;
}

Steps make_steps(const Scenario& sc) {
  Steps st;
  st.base = make_step(sc);
  for (int s = 0; s < kSteps; ++s) {
    Scenario o = sc;
    o.seed = sc.seed + 1000 * static_cast<uint64_t>(s + 1);
    st.inputs.push_back(make_step(o));
    st.refs.push_back(oracle_runs(with_inputs(st.base, st.inputs.back())));
  }
  return st;
}

// Captures the kSteps steps on a stream with ctx.pdl = pdl and replays the graph twice from the same cache;
// nullopt where the forced variant declines the problem (the uncaptured first run throws VariantUnsupported).
std::optional<Captured> capture_and_replay(const Steps& st, bool pdl, const std::string& what) {
  const Device dev = Device::cuda(0);
  const StepData& b = st.base;
  const bool quant = st.quant != OutputQuant::none;
  const MlaAttention layer(quant ? quant_options(b, dev, DType::bf16, st.quant, 0.5f) : b.sc.options(dev, DType::bf16),
                           b.weight);
  const CacheBuffer cache = make_cache(b, dev);
  const Tensor pristine = cache.storage.to(dev);
  const DeviceArgs shared = device_args(b, dev, DType::bf16);
  struct StepArgs {
    Tensor q, kv_c, k_pe, out, out_scales;
  };
  std::vector<StepArgs> args;
  for (const StepData& in : st.inputs) {
    StepArgs a{convert(in.q, DType::bf16, dev), convert(in.kv_c, DType::bf16, dev), convert(in.k_pe, DType::bf16, dev),
               poisoned({b.T, b.sc.h * b.sc.V}, DType::bf16, dev), {}};
    if (quant) {
      const QuantOut q = quant_out(st.quant, b.T, b.sc.h * b.sc.V, dev);
      a.out = q.codes;
      a.out_scales = q.scales;
    }
    args.push_back(a);
  }
  Tensor ws = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(layer.workspace_bytes(b.plan)), 1)}, DType::u8, dev);
  fill(ws.view(), 255.0);  // NaN: a read of workspace the step did not write shows
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Context ctx{stream, Precision::fast};
  ctx.pdl = pdl;
  auto run = [&] {
    for (const StepArgs& a : args) {
      ForwardArgs f = shared.args();
      f.q = a.q;
      f.kv_c = a.kv_c;
      f.k_pe = a.k_pe;
      f.out = a.out;
      if (a.out_scales.defined()) f.out_scales = a.out_scales;
      layer.forward(b.plan, f, cache.cache, ws, ctx);
    }
  };
  auto reset = [&] {
    copy(cache.storage.view(), pristine.view());
    for (const StepArgs& a : args)  // 0xff bytes: NaN in bf16, e4m3 and f32
      for (const Tensor* t : {&a.out, &a.out_scales}) {
        if (t->defined()) {
          EXPECT_EQ(cudaMemset(t->data(), 0xff, t->nbytes()), cudaSuccess);
        }
      }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  try {
    run();  // uncaptured: library handles are created on first use; a declining variant throws here
  } catch (const VariantUnsupported& e) {
    std::printf("[ declined ] %s: %s\n", what.c_str(), e.what());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);
    return std::nullopt;
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
  reset();
  cudaGraph_t graph;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  run();
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << what;
  Captured cap;
  cap.programmatic_edges = programmatic_edges(graph);
  cudaGraphExec_t exec;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess) << what;
  cap.replays.resize(2);
  for (Replay& r : cap.replays) {
    reset();
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess) << what;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
    for (const StepArgs& a : args) {
      r.outs.push_back(bytes_of(a.out));
      if (a.out_scales.defined()) r.outs.push_back(bytes_of(a.out_scales));
    }
    r.cache = bytes_of(cache.storage.view());
  }
  for (int s = 0; s < kSteps && !quant; ++s)
    expect_matches_oracle(with_inputs(b, st.inputs[s]), st.refs[s], to_doubles(args[s].out),
                          (what + " step " + std::to_string(s)).c_str());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return cap;
}

void expect_same(const Replay& a, const Replay& b, const std::string& what) {
  ASSERT_EQ(a.outs.size(), b.outs.size());
  for (std::size_t s = 0; s < a.outs.size(); ++s)
    EXPECT_TRUE(a.outs[s] == b.outs[s]) << what << ": step " << s << "'s output differs";
  EXPECT_TRUE(a.cache == b.cache) << what << ": the cache differs";
}

// PDL on and off, each graph replayed twice: four bit-identical results. The graph captured with PDL on holds
// programmatic edges that the one captured with it off does not (cuBLAS may add its own to both).
void check_on_off(const Steps& st, const std::string& what) {
  const auto on = capture_and_replay(st, true, what + " pdl on");
  if (!on) return;
  const auto off = capture_and_replay(st, false, what + " pdl off");
  ASSERT_TRUE(off.has_value()) << what << ": declined with PDL off only";
  EXPECT_GT(on->programmatic_edges, off->programmatic_edges) << what << ": the switch changed no launch";
  expect_same(on->replays[0], on->replays[1], what + " pdl on, two replays");
  expect_same(off->replays[0], off->replays[1], what + " pdl off, two replays");
  expect_same(on->replays[0], off->replays[0], what + " pdl on against off");
}

// The rule's choice, then each variant of `family` the device runs, forced.
void per_variant(const char* family, const Steps& st, const std::string& what) {
  check_on_off(st, what + " (rule)");
  for (const VariantInfo& v : list_variants(family)) {
    if (!variant_runs_on_device(family, v.name, 0)) continue;
    ForceVariant force(family, v.name);
    check_on_off(st, what + " " + family + " " + v.name);
  }
}

// Decode-only dense steps: a long request (split-KV and its combine), short ones, padding rows.
Scenario dense_decode(CacheFormat f, int h, int s_q) {
  Scenario sc;
  sc.format = f;
  sc.h = h;
  sc.P = 128;
  sc.V = 128;
  sc.page_size = 16;
  sc.max_model_len = 1024;
  sc.decode_threshold = s_q;
  sc.reqs = {{700, s_q}, {37, s_q}, {250, s_q}, {3, s_q}};
  sc.pad_tokens = 2;
  sc.seed = 48;
  return sc;
}

// (format, h, s_q), one test case each (the GPU check runs the suite as gtest shards side by side).
class LayerPdlDense : public ::testing::TestWithParam<std::tuple<CacheFormat, int, int>> {};

TEST_P(LayerPdlDense, DecodeStepsBitIdenticalOnAndOff) {
  MLA_SKIP_WITHOUT_GPU();
  const auto& [f, h, s_q] = GetParam();
  const Steps st = make_steps(dense_decode(f, h, s_q));
  per_variant("mqa_decode", st, std::string("dense ") + to_string(f) + " h " + std::to_string(h) + " s_q " + std::to_string(s_q));
}

INSTANTIATE_TEST_SUITE_P(Graphs, LayerPdlDense,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8), ::testing::Values(16, 128),
                                            ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<CacheFormat, int, int>>& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_h" + std::to_string(std::get<1>(i.param)) +
                                  "_sq" + std::to_string(std::get<2>(i.param));
                         });

TEST(LayerPdl, DenseDecodeSingleRequest) {  // b 1: the small-step shape, one request split over many CTAs
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    Scenario sc = dense_decode(f, 128, 1);
    sc.reqs = {{640, 1}};
    sc.pad_tokens = 0;
    check_on_off(make_steps(sc), std::string("dense b 1 ") + to_string(f));
  }
}

TEST(LayerPdl, DenseDecodeQuantisedOutput) {  // quantize_output after the up-projection
  MLA_SKIP_WITHOUT_GPU();
  for (OutputQuant key : {OutputQuant::fp8_group128, OutputQuant::nvfp4}) {
    Steps st = make_steps(dense_decode(CacheFormat::bf16, 16, 2));
    st.quant = key;
    check_on_off(st, std::string("dense out_quant ") + to_string(key));
  }
}

class LayerPdlSparse : public ::testing::TestWithParam<std::tuple<CacheFormat, int>> {};

TEST_P(LayerPdlSparse, DecodeStepsBitIdenticalOnAndOff) {
  MLA_SKIP_WITHOUT_GPU();
  const auto& [f, h] = GetParam();
  Scenario sc = sparse_scenario(f, h, 64);
  // fp8_ds_mla's separate decode path takes whole requests of one query length only (padding tokens count):
  // one query token each there.
  const int s_q = f == CacheFormat::fp8_ds_mla ? 1 : 2;
  sc.reqs = {{20, s_q}, {300, s_q}, {70, s_q}, {5, s_q}};
  sc.seed = 49;
  per_variant("sparse_mqa", make_steps(sc), std::string("sparse ") + to_string(f) + " h " + std::to_string(h));
}

INSTANTIATE_TEST_SUITE_P(Graphs, LayerPdlSparse,
                         ::testing::Combine(::testing::Values(CacheFormat::bf16, CacheFormat::fp8_ds_mla),
                                            ::testing::Values(16, 64)),
                         [](const ::testing::TestParamInfo<std::tuple<CacheFormat, int>>& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_h" + std::to_string(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace mla::test::layer
