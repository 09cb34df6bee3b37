// SPDX-License-Identifier: Apache-2.0
// convert_topk_indices on CUDA against the CPU backend: exact int32 outputs and valid counts. Covered:
// topk 2048 / 64 / 37 (the element-wise variant), page sizes 1/16/64, block_stride_rows of a flat
// multi-layer row view, prefill-workspace rows, negative and out-of-table positions, NaN-free int
// poisoning of outputs (-7777 before the kernel), and device-side garbage (req_id outside the table,
// prefill ids outside the starts vector: the row becomes -1).
#include <gtest/gtest.h>

#include <tuple>

#include "gpu_test_util.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

constexpr int32_t kPoison = -7777;

struct TopkInputs {
  std::vector<int32_t> req, table_flat, idx, pids, ws_starts;
  int64_t T, K, R, W;
};

TopkInputs make_inputs(int64_t T, int64_t K, int64_t page, bool workspace) {
  TopkInputs in{};
  in.T = T, in.K = K, in.R = 3, in.W = 5;
  std::uniform_int_distribution<int32_t> blk(0, 999), req(0, static_cast<int32_t>(in.R - 1));
  for (int64_t i = 0; i < in.R * in.W; ++i) in.table_flat.push_back(blk(test::rng()));
  // Positions: valid ones inside the table, past the table (-> -1), and negatives.
  std::uniform_int_distribution<int32_t> pos(-3, static_cast<int32_t>(in.W * page + page));
  for (int64_t t = 0; t < T; ++t) {
    in.req.push_back(req(test::rng()));
    for (int64_t k = 0; k < K; ++k) in.idx.push_back(pos(test::rng()));
  }
  if (workspace) {
    in.ws_starts = {0, 100, 250};
    for (int64_t t = 0; t < T; ++t) in.pids.push_back(t % 3 == 0 ? -1 : static_cast<int32_t>(t % 3));
  }
  return in;
}

Tensor matrix(const std::vector<int32_t>& v, int64_t rows, int64_t cols, Device d) {
  Tensor h = Tensor::empty({rows, cols}, DType::i32);
  std::copy(v.begin(), v.end(), static_cast<int32_t*>(h.data()));
  return d.is_cpu() ? h : h.to(d);
}
Tensor filled(int64_t rows, int64_t cols, Device d) {
  return matrix(std::vector<int32_t>(static_cast<std::size_t>(rows * cols), kPoison), rows, cols, d);
}

// Runs both backends on the same inputs (the GPU optionally on corrupted copies) and returns
// (gpu out, cpu out, gpu counts, cpu counts).
struct Outputs {
  std::vector<int32_t> out_gpu, out_cpu, cnt_gpu, cnt_cpu;
};
Outputs run_both(const TopkInputs& in, int64_t page, int64_t stride_rows, const TopkInputs* gpu_in = nullptr,
                 const std::vector<int32_t>* seq_lens = nullptr) {
  const TopkInputs& gi = gpu_in ? *gpu_in : in;
  const Device g = Device::cuda(0), c = Device::cpu();
  const bool ws = !in.pids.empty();
  Tensor oc = filled(in.T, in.K, c), og = filled(in.T, in.K, g);
  Tensor vc = filled(in.T, 1, c), vg = filled(in.T, 1, g);
  const TensorView vcv = vc.view().reshape({in.T}), vgv = vg.view().reshape({in.T});
  convert_topk_indices(test::int_tensor(in.req), matrix(in.table_flat, in.R, in.W, c), matrix(in.idx, in.T, in.K, c),
                       oc, page, stride_rows, ws ? test::int_tensor(in.pids) : Tensor{},
                       ws ? test::int_tensor(in.ws_starts) : Tensor{}, vcv,
                       seq_lens ? test::int_tensor(*seq_lens) : Tensor{}, test::reference_ctx());
  convert_topk_indices(test::int_tensor(gi.req, g), matrix(gi.table_flat, gi.R, gi.W, g),
                       matrix(gi.idx, gi.T, gi.K, g), og, page, stride_rows,
                       ws ? test::int_tensor(gi.pids, g) : Tensor{}, ws ? test::int_tensor(gi.ws_starts, g) : Tensor{},
                       vgv, seq_lens ? test::int_tensor(*seq_lens, g) : Tensor{});
  return {test::to_ints(og), test::to_ints(oc), test::to_ints(vg), test::to_ints(vc)};
}

// (topk, page, workspace, block_stride_rows factor)
using TopkParam = std::tuple<int64_t, int64_t, bool, int64_t>;
class TopkGpu : public ::testing::TestWithParam<TopkParam> {};

TEST_P(TopkGpu, MatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [K, page, ws, stride_factor] = GetParam();
  test::reseed(static_cast<uint64_t>(K * 131 + page));
  const TopkInputs in = make_inputs(19, K, page, ws);
  const Outputs o = run_both(in, page, stride_factor == 1 ? 0 : page * stride_factor);
  EXPECT_EQ(o.out_gpu, o.out_cpu);
  EXPECT_EQ(o.cnt_gpu, o.cnt_cpu);
}

INSTANTIATE_TEST_SUITE_P(All, TopkGpu,
                         ::testing::Combine(::testing::Values(int64_t{2048}, int64_t{64}, int64_t{37}),
                                            ::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}),
                                            ::testing::Bool(), ::testing::Values(int64_t{1}, int64_t{3})),
                         [](const auto& info) {
                           return "k" + std::to_string(std::get<0>(info.param)) + "_page" +
                                  std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_ws" : "") +
                                  "_stride" + std::to_string(std::get<3>(info.param));
                         });

// Device-side garbage the CPU front end would reject: the GPU writes -1 rows (and count 0) for tokens
// whose req_id names no table row or whose prefill id names no workspace start.
TEST(TopkGpuEdge, OutOfRangeIdsGiveInvalidRows) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(5);
  const TopkInputs in = make_inputs(12, 64, 16, true);
  TopkInputs bad = in;
  // Rows 0 and 3 read the table (pid -1), rows 1 and 5 the workspace.
  bad.req[0] = -1;
  bad.req[3] = static_cast<int32_t>(in.R + 4);
  bad.pids[1] = 3;  // only 3 starts
  bad.pids[5] = 1000;
  const Outputs o = run_both(in, 16, 0, &bad);
  for (int64_t t = 0; t < in.T; ++t) {
    const bool garbage = t == 0 || t == 3 || t == 1 || t == 5;
    for (int64_t k = 0; k < in.K; ++k) {
      const std::size_t i = static_cast<std::size_t>(t * in.K + k);
      EXPECT_EQ(o.out_gpu[i], garbage ? -1 : o.out_cpu[i]) << t << " " << k;
    }
    EXPECT_EQ(o.cnt_gpu[static_cast<std::size_t>(t)], garbage ? 0 : o.cnt_cpu[static_cast<std::size_t>(t)]) << t;
  }
}

// Issue 14: a cache row past int32 (block 2 at stride 2^30 starts at row 2^31) is written as -1, never
// wrapped into a small row of another block (the CPU front end refuses such values; the GPU cannot see
// them before the kernel).
TEST(TopkGpuEdge, RowsPastInt32AreInvalid) {
  MLA_SKIP_WITHOUT_GPU();
  const Device dev = Device::cuda(0);
  const Tensor req = test::int_tensor({0}).to(dev), table = test::int_tensor_2d({{0, 1, 2}}).to(dev);
  const Tensor idx = test::int_tensor_2d({{1, 5, 9, -1}}).to(dev);
  Tensor out = Tensor::empty({1, 4}, DType::i32, dev), valid = Tensor::empty({1}, DType::i32, dev);
  fill(out, -77);
  convert_topk_indices(req, table, idx, out, 4, int64_t(1) << 30, {}, {}, valid);
  EXPECT_EQ(test::to_ints(out.to(Device::cpu())), (std::vector<int32_t>{1, (1 << 30) + 1, -1, -1}));
  EXPECT_EQ(test::to_ints(valid.to(Device::cpu())), (std::vector<int32_t>{2}));
}

// Issue 14: with seq_lens, top-k positions at or past the request's length are invalid (-1) on both
// backends, for cache and workspace tokens: a hostile entry never reads another request's rows.
TEST(TopkGpuEdge, PositionsPastSeqLenAreInvalid) {
  MLA_SKIP_WITHOUT_GPU();
  for (bool ws : {false, true}) {
    test::reseed(ws ? 11 : 12);
    const TopkInputs in = make_inputs(24, 64, 16, ws);
    std::vector<int32_t> seq(static_cast<std::size_t>(in.R));
    for (std::size_t r = 0; r < seq.size(); ++r) seq[r] = static_cast<int32_t>((r * 37) % (in.W * 16 + 1));
    const Outputs o = run_both(in, 16, 0, nullptr, &seq);
    int64_t cut = 0;
    for (int64_t t = 0; t < in.T; ++t)
      for (int64_t k = 0; k < in.K; ++k) {
        const std::size_t i = static_cast<std::size_t>(t * in.K + k);
        EXPECT_EQ(o.out_gpu[i], o.out_cpu[i]) << ws << " " << t << " " << k;
        if (in.idx[i] >= seq[static_cast<std::size_t>(in.req[static_cast<std::size_t>(t)])]) {
          EXPECT_EQ(o.out_gpu[i], -1) << ws << " " << t << " " << k;
          cut += in.idx[i] >= 0;
        }
      }
    EXPECT_GT(cut, 0) << "the draw must put some positions past their request's length";
    EXPECT_EQ(o.cnt_gpu, o.cnt_cpu);
  }
}

}  // namespace
}  // namespace mla
