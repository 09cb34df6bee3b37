// SPDX-License-Identifier: Apache-2.0
// Every step kind through a CUDA graph, with CUDA-graph padding (zero-length requests, padded token
// rows). One captured step = upload_step_metadata + forward() of two layers (their own weights, caches
// and inputs; one plan, one workspace, one metadata buffer). The graph is replayed with the inputs it
// was captured with, then with new inputs written into the captured buffers (new q / kv_c / k_pe
// values, block tables, cache contents, top-k rows, and where the kind allows other lengths of the
// same padded shape: same_launches) and the metadata of the new plan written into the pinned staging
// buffer. Every replay matches the float64 oracle layer. The graph holds exactly one host->device
// copy however many layers run, and the capture itself shows that forward() neither synchronises the
// host nor allocates (both invalidate a global-mode capture).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "layer_gpu_util.h"

namespace mla::test::layer {
namespace {

constexpr int kLayers = 2;

// Memcpy nodes of a graph that read host memory: the metadata uploads.
int host_to_device_copies(cudaGraph_t g) {
  std::size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_EQ(cudaGraphGetNodes(g, nodes.data(), &n), cudaSuccess);
  int count = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    if (type != cudaGraphNodeTypeMemcpy) continue;
    cudaMemcpy3DParms p{};
    EXPECT_EQ(cudaGraphMemcpyNodeGetParams(node, &p), cudaSuccess);
    cudaPointerAttributes a{};
    EXPECT_EQ(cudaPointerGetAttributes(&a, p.srcPtr.ptr), cudaSuccess);
    if (p.kind == cudaMemcpyHostToDevice || a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered)
      ++count;
  }
  return count;
}

// One layer of the captured step: its weights, its cache and its argument buffers, and the host inputs
// those buffers hold now (the oracle's).
struct LayerState {
  StepData d;
  std::unique_ptr<MlaAttention> layer;
  CacheBuffer cache;
  DeviceArgs args;
};

// Writes `next`'s inputs into the captured buffers (same shapes) and poisons out again.
void load(LayerState& s, StepData next) {
  const Device dev = Device::cuda(0);
  next.weight = s.d.weight;  // the layer keeps its weights
  const DeviceArgs n = device_args(next, dev, DType::bf16);
  copy(s.args.q, n.q);
  copy(s.args.kv_c, n.kv_c);
  copy(s.args.k_pe, n.k_pe);
  copy(s.args.slots, n.slots);
  copy(s.args.block_table, n.block_table);
  copy(s.args.seq_lens, n.seq_lens);
  if (next.sc.sparse) copy(s.args.topk, n.topk);
  fill(s.args.out.view(), NAN);
  const CacheBuffer c = make_cache(next, dev);
  copy(s.cache.storage.view(), c.storage.view());
  s.d = std::move(next);
}

// Captures one step of kLayers layers for `sc`, replays it with the capture inputs, then once per
// scenario of `replays` (new seeds; lengths may differ where same_launches holds).
void capture_and_replay(const Scenario& sc, const std::vector<Scenario>& replays, const std::string& what) {
  const Device dev = Device::cuda(0);
  std::vector<LayerState> layers(kLayers);
  for (int k = 0; k < kLayers; ++k) {
    Scenario s = sc;
    s.seed = sc.seed + static_cast<uint64_t>(k);
    LayerState& l = layers[k];
    l.d = make_step(s);
    l.layer = std::make_unique<MlaAttention>(s.options(dev, DType::bf16), l.d.weight);
    l.cache = make_cache(l.d, dev);
    l.args = device_args(l.d, dev, DType::bf16);
  }
  const Plan plan = layers[0].d.plan;  // seeds change values, not lengths: one plan for every layer
  const std::size_t meta_bytes = plan.metadata.bytes();
  PinnedBuffer staging(meta_bytes);
  ASSERT_TRUE(staging.pinned());
  Tensor meta = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(meta_bytes), 16)}, DType::u8, dev);
  Tensor ws = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(layers[0].layer->workspace_bytes(plan)), 1)},
                            DType::u8, dev);
  // NaN-poisoned like every layer test's workspace (0xFF bytes: NaN in bf16 and f32): a read of workspace the
  // step did not write shows in the outputs. It also keeps initcheck off the reads of cuBLAS-written q_abs,
  // which it cannot see as writes (docs/DEVELOPING.md, the tool-limit probe).
  fill(ws.view(), 255.0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Context ctx{stream, Precision::fast};
  auto run_step = [&] {
    upload_step_metadata(plan, staging.view(), meta, ctx);
    for (LayerState& l : layers) {
      ForwardArgs a = l.args.args();
      a.metadata = meta;
      l.layer->forward(plan, a, l.cache.cache, ws, ctx);
    }
  };
  // Uncaptured warm-up (library handles are created on first use); it rewrites the same cache rows.
  run_step();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (LayerState& l : layers) fill(l.args.out.view(), NAN);

  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  run_step();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << what;
  EXPECT_EQ(host_to_device_copies(graph), meta_bytes > 0 ? 1 : 0) << what << ": one metadata upload per step";
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  auto replay = [&](const Plan& p, const std::string& label) {
    write_step_metadata(p, staging.view());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int k = 0; k < kLayers; ++k)
      expect_matches_oracle(layers[k].d, to_doubles(layers[k].args.out),
                            (what + " " + label + " layer " + std::to_string(k)).c_str());
  };
  replay(plan, "capture inputs");
  for (std::size_t i = 0; i < replays.size(); ++i) {
    for (int k = 0; k < kLayers; ++k) {
      Scenario s = replays[i];
      s.seed = 100 * (i + 1) + static_cast<uint64_t>(k);
      StepData next = make_step(s);
      ASSERT_TRUE(same_launches(plan, next.plan)) << what << " replay " << i;
      load(layers[k], std::move(next));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    replay(layers[0].d.plan, "replay " + std::to_string(i));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Dense scenarios: 16 heads, MHA dims of DeepSeek, uniform decodes of 2 (spec decode), buffers sized
// for every length of the shape (graph replays with other lengths reuse them).
Scenario dense(std::vector<Req> reqs, int64_t pad) {
  Scenario sc;
  sc.h = 16;
  sc.P = 128;
  sc.V = 128;
  sc.page_size = 16;
  sc.max_model_len = 512;
  sc.decode_threshold = 2;
  sc.require_uniform = true;
  sc.reqs = std::move(reqs);
  sc.pad_tokens = pad;
  sc.min_table_blocks = 512 / 16 + 1;
  sc.min_cache_blocks = 400;
  return sc;
}

TEST(LayerGraph, DecodeOnlyWithPaddingRequestsAndOtherLengths) {
  MLA_SKIP_WITHOUT_GPU();
  // Uniform decodes of 2 and one zero-length padding request: num_tokens = 4 requests x 2 (2 padded rows).
  Scenario sc = dense({{5, 2}, {130, 2}, {300, 2}, {0, 0}}, 2);
  sc.decode_seq_len_bound = 512;  // the schedule depends on the shape only
  Scenario other = sc;
  other.reqs = {{400, 2}, {7, 2}, {61, 2}, {0, 0}};
  capture_and_replay(sc, {other, sc}, "decode-only");
  // Without padding requests, bf16 and fp8_ds_mla caches.
  sc.reqs = {{33, 2}, {200, 2}, {90, 2}};
  sc.pad_tokens = 0;
  sc.format = CacheFormat::fp8_ds_mla;
  capture_and_replay(sc, {sc}, "decode-only fp8_ds_mla");
}

TEST(LayerGraph, PrefillOnlyWithChunkedContextAndPadding) {
  MLA_SKIP_WITHOUT_GPU();
  // Prefills with and without context, chunked through 64 workspace rows, a zero-length padding request
  // at the end and 5 padded token rows.
  Scenario sc = dense({{100, 17}, {40, 9}, {0, 33}, {0, 0}}, 5);
  sc.context_workspace_rows = 64;
  Scenario other = sc;
  other.reqs = {{40, 17}, {100, 9}, {0, 33}, {0, 0}};  // contexts swapped: the same chunk sizes, new metadata
  capture_and_replay(sc, {other}, "prefill-only");
}

TEST(LayerGraph, MixedWithChunkedContextAndPadding) {
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    Scenario sc = dense({{5, 2}, {130, 2}, {63, 2}, {200, 17}, {1, 3}, {64, 33}, {0, 40}, {0, 1}, {0, 0}}, 5);
    sc.format = f;
    sc.context_workspace_rows = 64;
    sc.decode_seq_len_bound = 512;
    Scenario other = sc;
    other.reqs = {{300, 2}, {9, 2}, {100, 2}, {200, 17}, {1, 3}, {64, 33}, {0, 40}, {0, 1}, {0, 0}};
    capture_and_replay(sc, {other}, std::string("mixed ") + to_string(f));
  }
}

// The sparse scenario with uniform decodes, other requests, and buffers for every length of the shape.
Scenario sparse(CacheFormat format, int h, int topk, std::vector<Req> reqs) {
  Scenario sc = sparse_scenario(format, h, topk);
  sc.require_uniform = true;
  sc.reqs = std::move(reqs);
  sc.min_table_blocks = 400 / 64 + 2;
  sc.min_cache_blocks = 64;
  return sc;
}

TEST(LayerGraph, SparseMixedBatchWithPadding) {
  MLA_SKIP_WITHOUT_GPU();
  for (CacheFormat f : {CacheFormat::fp8_ds_mla, CacheFormat::bf16}) {  // h 16: fp8_ds_mla mixed-batch mode
    const Scenario sc = sparse(f, 16, 64, {{20, 2}, {300, 2}, {70, 2}, {10, 60}, {150, 100}, {0, 100}, {0, 0}});
    Scenario other = sc;  // tokens moved between the prefills: new metadata values, the same launches
    other.reqs = {{250, 2}, {4, 2}, {70, 2}, {30, 90}, {150, 140}, {0, 30}, {0, 0}};
    capture_and_replay(sc, {other}, std::string("sparse mixed-batch ") + to_string(f));
  }
}

TEST(LayerGraph, SparseSeparateModeWithPrefills) {
  MLA_SKIP_WITHOUT_GPU();
  Scenario sc = sparse(CacheFormat::fp8_ds_mla, 32, 100, {{20, 2}, {300, 2}, {70, 2}, {10, 60}, {150, 100}, {0, 100}, {0, 0}});
  sc.sparse_workspace_rows = 400;  // prefill sequences 70 + 250 fill one chunk, 100 starts a second
  ASSERT_GE(make_step(sc).plan.sparse_chunks.size(), 2u);
  Scenario other = sc;  // other decode lengths; the prefills (chunk shapes) stay
  other.reqs = {{100, 2}, {50, 2}, {397, 2}, {10, 60}, {150, 100}, {0, 100}, {0, 0}};
  capture_and_replay(sc, {other}, "sparse separate");
}

}  // namespace
}  // namespace mla::test::layer
