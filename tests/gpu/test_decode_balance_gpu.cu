// SPDX-License-Identifier: Apache-2.0
// The device twin of the balanced decode schedule (core/decode_balance.h): every CTA of a launch finds its
// window with the kernel's block scan over the device seq_lens (decode_sm90 pipeline.cuh
// balanced_window, 384 threads like the kernels) and walks its segments with the kernels' Units; the
// windows and segments must equal the host reference (balance::windows + Cursor) for varlen batches with
// empty requests, negative and too-long lengths (clamped), and grids larger than the work. The kernels
// themselves are checked against the float64 oracle in test_decode_gpu.cpp (BalancedManySegments).
#include <algorithm>
#include <random>
#include <vector>

#include "cuda/attention/sm90/common/pipeline.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

using cuda::DecodeSm90Params;

constexpr int kMaxSegs = 64;  // per CTA (the test batches stay below)

struct DevSeg {
  int64_t req, t0, t1, splits, slot, first_slot, key_begin, key_end;
};

__global__ void __launch_bounds__(384, 1)
    balance_twin_kernel(const DecodeSm90Params p, balance::Window* wins, DevSeg* segs, int* counts) {
  __shared__ balance::Window win;
  __shared__ int64_t scratch[32];
  cuda::decode_sm90::balanced_window(p, &win, scratch);
  if (threadIdx.x != 0) return;
  wins[blockIdx.x] = win;
  cuda::decode_sm90::Units<false> units(p, &win);
  cuda::decode_sm90::Unit u;
  balance::Segment s;
  int n = 0;
  while (units.next(p, &win, u, s)) {
    if (n < kMaxSegs)
      segs[blockIdx.x * kMaxSegs + n] = DevSeg{s.req, s.t0, s.t1, s.splits, s.slot, s.first_slot, u.key_begin, u.key_end};
    ++n;
  }
  counts[blockIdx.x] = n;
}

void check_twin(const std::vector<int32_t>& lens, int64_t max_blocks, int32_t page, int ctas) {
  const int64_t b = static_cast<int64_t>(lens.size());
  test::DevBuf<int32_t> d_lens(lens);
  test::DevBuf<balance::Window> d_wins(static_cast<std::size_t>(ctas));
  test::DevBuf<DevSeg> d_segs(static_cast<std::size_t>(ctas) * kMaxSegs);
  test::DevBuf<int> d_counts(static_cast<std::size_t>(ctas));
  d_segs.fill_bytes(0);  // CTAs write only their segments; the whole buffer is downloaded
  DecodeSm90Params p{};
  p.rows.groups = b;
  p.seq_lens = d_lens.p;
  p.seq_lens_stride = 1;
  p.max_blocks = max_blocks;
  p.page_size = page;
  p.balanced = 1;
  balance_twin_kernel<<<ctas, 384>>>(p, d_wins.p, d_segs.p, d_counts.p);
  MLA_CUDA_OK(cudaDeviceSynchronize());

  std::vector<int64_t> tiles(lens.size()), clamped(lens.size());
  for (std::size_t i = 0; i < lens.size(); ++i) {
    clamped[i] = std::clamp<int64_t>(lens[i], 0, max_blocks * page);
    tiles[i] = balance::tiles_of(clamped[i]);
  }
  const auto wins = balance::windows(tiles, ctas);
  const auto dw = d_wins.download();
  const auto ds = d_segs.download();
  const auto dc = d_counts.download();
  auto tiles_of = [&](int64_t i) { return tiles[static_cast<std::size_t>(i)]; };
  for (int k = 0; k < ctas; ++k) {
    SCOPED_TRACE("CTA " + std::to_string(k));
    const balance::Window& w = wins[static_cast<std::size_t>(k)];
    const balance::Window& v = dw[static_cast<std::size_t>(k)];
    EXPECT_EQ(v.lo, w.lo);
    EXPECT_EQ(v.hi, w.hi);
    EXPECT_EQ(v.req, w.req);
    EXPECT_EQ(v.pos, w.pos);
    EXPECT_EQ(v.per, w.per);
    EXPECT_EQ(v.whole, w.whole);
    balance::Cursor c(w, b, k);
    balance::Segment s{};
    int n = 0;
    while (c.next(w, tiles_of, s)) {
      ASSERT_LT(n, dc[static_cast<std::size_t>(k)]);
      ASSERT_LT(n, kMaxSegs);
      const DevSeg& d = ds[static_cast<std::size_t>(k) * kMaxSegs + static_cast<std::size_t>(n)];
      EXPECT_EQ(d.req, s.req);
      EXPECT_EQ(d.t0, s.t0);
      EXPECT_EQ(d.t1, s.t1);
      EXPECT_EQ(d.splits, s.splits);
      EXPECT_EQ(d.slot, s.slot);
      EXPECT_EQ(d.first_slot, s.first_slot);
      EXPECT_EQ(d.key_begin, s.t0 * 64);
      EXPECT_EQ(d.key_end, std::min(s.t1 * 64, clamped[static_cast<std::size_t>(s.req)]));
      ++n;
    }
    EXPECT_EQ(n, dc[static_cast<std::size_t>(k)]);
  }
}

TEST(DecodeBalanceGpu, DeviceTwinMatchesHost) {
  MLA_SKIP_WITHOUT_GPU();
  check_twin({1024, 1024, 1024, 1024}, 16, 64, 132);
  check_twin(std::vector<int32_t>(128, 4096), 64, 64, 132);  // near-uniform: whole requests
  {
    std::vector<int32_t> lens(120, 2000);
    lens[3] = 0;  // an empty request in the whole-requests mode
    lens[9] = 2100;
    check_twin(lens, 40, 64, 132);
  }
  check_twin({0, 0, 0}, 4, 16, 132);
  check_twin({5000, -3, 0, 70, 1 << 30, 64, 65}, 100, 64, 7);  // negative and too long: clamped
  std::mt19937_64 g(99);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t b = std::uniform_int_distribution<int64_t>(1, 400)(g);
    std::vector<int32_t> lens(static_cast<std::size_t>(b));
    for (auto& l : lens) l = g() % 4 == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, 8192)(g);
    check_twin(lens, 128, 64, trial % 2 ? 132 : 13);
  }
}

}  // namespace
}  // namespace mla
