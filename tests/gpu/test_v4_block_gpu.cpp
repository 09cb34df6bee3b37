// SPDX-License-Identifier: Apache-2.0
// The DeepSeek-V4 attention block (mla/deepseek_v4.h) on CUDA: the trace of unit/v4_block_test_util.h (two requests
// in three steps, NaN-poisoned caches and workspace, page ids shuffled) served by the CUDA bf16 block against the
// float64 CPU block over caches of the same formats, every layer kind (sliding only, ratio 4 with top-k picks,
// ratio 8 with every causal entry), V4 and V4.1 (no query head norm), bf16 caches and the V4 records (v4 + v4,
// v41 + v41_fp4), and tensor-parallel ranks. The bound is DESIGN §5's in rel-L2 form: at most twice the error of
// the bf16 CPU block of the same caches against the float64 one, plus 1e-3, and (bf16 caches) within the bf16
// rule against the float64 block (1e-2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "gpu/gpu_test_util.h"
#include "mla/deepseek_v4.h"
#include "unit/v4_block_test_util.h"

namespace mla {
namespace {

using test::v4::small_config;
using test::v4::Trace;
using test::v4::Weights;

DeepseekV4Options opts(Device dev, DType dt, CacheFormat main, CacheFormat extra, int tp = 1, int rank = 0) {
  return test::v4::options(dt, main, extra, tp, rank, dev);
}

struct Formats {
  CacheFormat main, extra;
};

void check_layer(int layer, bool q_norm, Formats f, int tp = 1, int rank = 0) {
  const DeepseekV4Config c = small_config(q_norm);
  const Weights w(c);
  const int ratio = c.compress_ratio(layer);
  const Trace tr(c, ratio, 40 + static_cast<uint64_t>(layer));
  const DeepseekV4Attention gpu(c, layer, w.w, opts(Device::cuda(0), DType::bf16, f.main, f.extra, tp, rank));
  const DeepseekV4Attention f64(c, layer, w.w, opts(Device::cpu(), DType::f64, f.main, f.extra, tp, rank));
  const DeepseekV4Attention bf16(c, layer, w.w, opts(Device::cpu(), DType::bf16, f.main, f.extra, tp, rank));
  const std::vector<double> g = tr.serve(gpu, Precision::fast);
  const std::vector<double> o = tr.serve(f64, Precision::reference);
  const std::vector<double> b = tr.serve(bf16, Precision::fast);
  const double vs_f64 = test::rel_l2(g, o), cpu_bf16 = test::rel_l2(b, o);
  const std::string what = "layer " + std::to_string(layer) + " (ratio " + std::to_string(ratio) + ") q_norm " +
                           std::to_string(q_norm) + " " + to_string(f.main) + " + " + to_string(f.extra) + " tp " +
                           std::to_string(tp) + " rank " + std::to_string(rank);
  std::printf("  %s: CUDA vs f64 CPU block %.3e (bf16 CPU block vs f64: %.3e)\n", what.c_str(), vs_f64, cpu_bf16);
  for (double v : g) ASSERT_TRUE(std::isfinite(v)) << what;
  EXPECT_LE(vs_f64, 2 * cpu_bf16 + 1e-3) << what;
  if (f.main == CacheFormat::bf16) EXPECT_LE(vs_f64, 1e-2) << what;
}

class V4BlockGpuLayers : public ::testing::TestWithParam<int> {};

TEST_P(V4BlockGpuLayers, MatchesTheFloat64CpuBlock) {
  MLA_SKIP_WITHOUT_GPU();
  const int layer = GetParam();
  for (const bool q_norm : {true, false})
    for (const Formats f : {Formats{CacheFormat::bf16, CacheFormat::bf16}, Formats{CacheFormat::v4, CacheFormat::v4},
                            Formats{CacheFormat::v41, CacheFormat::v41_fp4}})
      check_layer(layer, q_norm, f);
}

INSTANTIATE_TEST_SUITE_P(Layers, V4BlockGpuLayers, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "layer" + std::to_string(info.param); });

// Tensor-parallel ranks of the CUDA block: each rank's partial sum against the float64 rank.
TEST(V4BlockGpu, TensorParallelRanks) {
  MLA_SKIP_WITHOUT_GPU();
  for (int rank = 0; rank < 2; ++rank) check_layer(1, true, {CacheFormat::v41, CacheFormat::v41_fp4}, 2, rank);
}

// A CUDA block refuses host tensors and a cache on another device before it writes anything.
TEST(V4BlockGpu, RefusesHostTensors) {
  MLA_SKIP_WITHOUT_GPU();
  const DeepseekV4Config c = small_config();
  const Weights w(c);
  const DeepseekV4Attention gpu(c, 0, w.w, opts(Device::cuda(0), DType::bf16, CacheFormat::bf16, CacheFormat::bf16));
  // Host step tensors and a host cache given to the CUDA block: refused before anything is written.
  CacheBuffer main = allocate_cache(CacheFormat::bf16, 4, 4, Device::cpu(), 1.0f, 512, 64);
  Tensor hidden = Tensor::empty({1, c.hidden_size}, DType::bf16), out = test::poisoned({1, c.hidden_size}, DType::bf16);
  const Tensor pos = test::int64_tensor({0}), rid = test::int_tensor({0}), slots = test::int64_tensor({0});
  const Tensor bt = test::int_tensor_2d({{0}});
  DeepseekV4ForwardArgs a;
  a.hidden = hidden.view();
  a.positions = pos.view();
  a.req_id = rid.view();
  a.block_table = bt.view();
  a.slot_mapping = slots.view();
  a.out = out.view();
  Tensor ws = Tensor::empty({static_cast<int64_t>(gpu.workspace_bytes(1))}, DType::u8, Device::cuda(0));
  EXPECT_THROW(gpu.forward(a, main.cache, KVCache{}, ws.view()), Error);
  for (double v : test::to_doubles(out.view())) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace mla
