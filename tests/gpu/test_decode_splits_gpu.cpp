// SPDX-License-Identifier: Apache-2.0
// mqa_decode with the split count as an explicit argument (the step plan's decode schedule passes its
// own): every count from one to the cap matches the CPU float64 oracle with the workspace that
// mqa_decode_workspace_bytes sizes for that count, and the default (0) is the planner's policy for the
// device's SM count.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_gpu_util.h"
#include "cuda/cuda_ops.h"
#include "runtime/device_api.h"
#include "mla/error.h"
#include "mla/plan.h"
#include "mla/variants.h"
#include "unit/attention_test_util.h"

namespace mla {
namespace {

constexpr double kScale = 0.0722;  // 1/sqrt(192)

TEST(DecodeSplitsGpu, ExplicitSplitCountsMatchTheOracle) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(21);
  const std::vector<int32_t> lens = {1900, 0, 33, 700, 256};
  const int64_t b = 5, s_q = 2, h = 16, page = 16, max_blocks = 120;
  const test::PagedBatch pb = test::paged_batch(CacheFormat::fp8_ds_mla, page, lens, max_blocks);
  const Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16);
  Tensor ref_out = test::poisoned({b, s_q, h, 512}, DType::f64), ref_lse = test::poisoned({b, s_q, h}, DType::f32);
  const Device gpu = Device::cuda(0);
  const test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
  const Tensor qd = q.to(gpu), bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
  {  // the oracle reads what the variant that runs reads (the sm90 seesaw kernel: the bf16 upconvert of the records)
    Tensor probe = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu);
    cuda::mqa_decode(qd, dc.cache, bt, sl, probe, {}, kScale, true, {}, Context{}, 1, false, false);
    cuda_rt::synchronize(0);
  }
  const CacheBuffer up = test::upconverted_cache(pb.cb.cache);
  const bool upconverted = test::ran_upconverted("mqa_decode", pb.cb.cache.format);
  const KVCache& oracle_cache = upconverted ? up.cache : pb.cb.cache;
  mqa_decode(q, oracle_cache, pb.block_table, pb.seq_lens, ref_out, ref_lse, kScale, true, {}, test::reference_ctx());

  const int64_t max_len = max_blocks * page;
  for (int splits : {1, 2, 3, 7, 16, kDecodeMaxSplits}) {
    SCOPED_TRACE(splits);
    const std::size_t need = mqa_decode_workspace_bytes(b, s_q, h, max_len, gpu, splits);
    // The uniform split partials, or more: the sm90 kernel's balanced schedule takes (b + SMs) partials.
    const std::size_t uniform = cuda::decode_workspace_bytes(b, s_q, h, splits);
    EXPECT_GE(need, uniform);
    EXPECT_EQ(uniform == 0, splits == 1);
    Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(need, 1))}, DType::u8, gpu);
    Tensor out = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu), lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
    mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view(), Context{}, splits);
    cuda_rt::synchronize(0);
    test::expect_attention_close(out, ref_out, lse, ref_lse, "explicit splits");
    // The whole-requests hint changes the schedule, never the result, whether or not the lengths are near-uniform.
    fill(out.view(), NAN);
    fill(lse.view(), NAN);
    mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view(), Context{}, splits, /*whole_requests=*/true);
    cuda_rt::synchronize(0);
    test::expect_attention_close(out, ref_out, lse, ref_lse, "explicit splits, whole-requests hint");
    if (uniform > 0) {  // exactly the uniform partials (the backend entry point): the uniform split-KV path
      fill(out.view(), NAN);
      fill(lse.view(), NAN);
      cuda::mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view().slice(0, 0, static_cast<int64_t>(uniform)),
                       Context{}, splits, false, false);
      cuda_rt::synchronize(0);
      test::expect_attention_close(out, ref_out, lse, ref_lse, "uniform splits");
    }
    if (splits > 1) {  // the front end insists on the split partials of the splits asked for
      EXPECT_THROW(mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true,
                              ws.view().slice(0, 0, static_cast<int64_t>(uniform) - 1), Context{}, splits),
                   Error);
    }
    if (need > uniform) {  // ... and not on the balanced schedule's extra: less runs the split schedule
      fill(out.view(), NAN);
      fill(lse.view(), NAN);
      mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view().slice(0, 0, static_cast<int64_t>(need) - 1),
                 Context{}, splits);
      cuda_rt::synchronize(0);
      test::expect_attention_close(out, ref_out, lse, ref_lse, "workspace short of the balanced schedule");
    }
  }
  // The default is the planner's policy with the device's SM count.
  const int sms = multiprocessor_count(gpu);
  EXPECT_EQ(sms, cuda_rt::device_info(0).sm_count);
  EXPECT_EQ(mqa_decode_workspace_bytes(b, s_q, h, max_len, gpu),
            mqa_decode_workspace_bytes(b, s_q, h, max_len, gpu, decode_num_splits(b, s_q, h, max_len, sms)));
  Tensor out = test::poisoned({b, s_q, h, 512}, DType::bf16, gpu);
  EXPECT_THROW(mqa_decode(qd, dc.cache, bt, sl, out, {}, kScale, true, {}, Context{}, kDecodeMaxSplits + 1), Error);
}

// The split-KV combine over value widths that are not a multiple of its four columns a thread (3, 201, 510: the
// row's last 3, 1, 2 columns loaded one by one), with 2 and 16 uniform splits (both batch widths of the combine)
// and through the rule's schedule; bf16 and fp8 caches (exact codes in every kernel, as in the oracle; the combine
// does not see the format), outputs and workspace NaN-poisoned.
TEST(DecodeSplitsGpu, NarrowValuesThroughTheCombine) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(23);
  const std::vector<int32_t> lens = {900, 1, 0, 300};
  const int64_t b = 4, s_q = 1, h = 16, page = 16, max_blocks = 60;
  const Device gpu = Device::cuda(0);
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    const test::PagedBatch pb = test::paged_batch(f, page, lens, max_blocks);
    const test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
    const Tensor bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
    const Tensor q = test::random_tensor({b, s_q, h, 576}, DType::bf16);
    const Tensor qd = q.to(gpu);
    for (const int64_t dv : {3, 201, 510}) {
      Tensor ref_out = test::poisoned({b, s_q, h, dv}, DType::f64), ref_lse = test::poisoned({b, s_q, h}, DType::f32);
      mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, ref_out, ref_lse, kScale, true, {}, test::reference_ctx());
      for (int splits : {2, 16}) {
        SCOPED_TRACE(testing::Message() << to_string(f) << " d_v " << dv << " splits " << splits);
        const std::size_t need = mqa_decode_workspace_bytes(b, s_q, h, max_blocks * page, gpu, splits);
        const std::size_t uniform = cuda::decode_workspace_bytes(b, s_q, h, splits);
        Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(need, 1))}, DType::u8, gpu);
        fill(ws.view(), 255.0);  // 0xff bytes: NaN partials where a split wrote nothing
        Tensor out = test::poisoned({b, s_q, h, dv}, DType::bf16, gpu), lse = test::poisoned({b, s_q, h}, DType::f32, gpu);
        mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view(), Context{}, splits);
        cuda_rt::synchronize(0);
        test::expect_attention_close(out, ref_out, lse, ref_lse, "the rule's schedule");
        fill(out.view(), NAN);
        fill(lse.view(), NAN);
        cuda::mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view().slice(0, 0, static_cast<int64_t>(uniform)),
                         Context{}, splits, false, false);
        cuda_rt::synchronize(0);
        test::expect_attention_close(out, ref_out, lse, ref_lse, "uniform splits and the combine");
      }
    }
  }
}

// The seesaw tile's splits of a bf16 cache merge inside a thread-block cluster (decode_sm90 cluster_merge.cuh,
// 2..8 splits): 16 rows at small batch (the seesaw tile), 64 rows and two row tiles, s_q 1 and 2, causal or
// not, lengths 0, 1 and shorter than the splits (units without keys: LSE -inf partials), with and without the
// LSE output; the outputs NaN-poisoned before each call.
TEST(DecodeSplitsGpu, ClusterMergeMatchesTheOracle) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(22);
  // The seesaw forced: the rule sends some of these launches (h 16, 8 splits of 4 tiles) to the small kernel's small
  // step (SmallStepsWriteAPartialPerWarpgroup below).
  ForceVariant force("mqa_decode", "sm90_seesaw");
  const std::vector<int32_t> lens = {1900, 0, 1, 65, 700, 256};
  const int64_t b = static_cast<int64_t>(lens.size()), page = 64, max_blocks = 32;
  const test::PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, lens, max_blocks);
  const Device gpu = Device::cuda(0);
  const test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
  const Tensor bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
  struct Shape {
    int64_t s_q, h;
  };
  for (const Shape sh : {Shape{1, 16}, Shape{2, 64}, Shape{1, 128}}) {
    const Tensor q = test::random_tensor({b, sh.s_q, sh.h, 576}, DType::bf16);
    const Tensor qd = q.to(gpu);
    for (const bool causal : {true, false}) {
      Tensor ref_out = test::poisoned({b, sh.s_q, sh.h, 512}, DType::f64);
      Tensor ref_lse = test::poisoned({b, sh.s_q, sh.h}, DType::f32);
      mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, ref_out, ref_lse, kScale, causal, {}, test::reference_ctx());
      for (int splits : {2, 3, 5, 8}) {
        SCOPED_TRACE(testing::Message() << "s_q " << sh.s_q << " h " << sh.h << " causal " << causal << " splits " << splits);
        const std::size_t need = mqa_decode_workspace_bytes(b, sh.s_q, sh.h, max_blocks * page, gpu, splits);
        Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(need, 1))}, DType::u8, gpu);
        Tensor out = test::poisoned({b, sh.s_q, sh.h, 512}, DType::bf16, gpu);
        Tensor lse = test::poisoned({b, sh.s_q, sh.h}, DType::f32, gpu);
        mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, causal, ws.view(), Context{}, splits);
        cuda_rt::synchronize(0);
        test::expect_attention_close(out, ref_out, lse, ref_lse, "cluster merge");
        fill(out.view(), NAN);
        mqa_decode(qd, dc.cache, bt, sl, out, {}, kScale, causal, ws.view(), Context{}, splits);  // no LSE out
        cuda_rt::synchronize(0);
        test::expect_attention_close(out, ref_out, lse, ref_lse, "cluster merge without the LSE");
      }
    }
  }
}

// Small steps (core/decode_regime.h small_step) on the small kernel: uniform splits, a partial per consumer warpgroup
// (decode_sm90 small_wg_partial) merged by the combine: lengths 0 (every split empty: both partials' LSE -inf), 40 (one
// tile: warpgroup 1 of split 0 has no tile, the other splits none), mid-tile and the bound; 16 rows (N 16), 128 rows
// (row tiles of 32), s_q 2; the kernel that ran is asserted. Workspace bytes 0xff (NaN partials where nothing was
// written) and NaN-poisoned outputs; then the same launches with exactly the uniform partials (one a split: the
// warpgroups merge in the kernel).
TEST(DecodeSplitsGpu, SmallStepsWriteAPartialPerWarpgroup) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(24);
  const Device gpu = Device::cuda(0);
  struct Shape {
    std::vector<int32_t> lens;
    int64_t s_q, h, max_blocks;
    int splits;
  };
  for (const Shape& sh : {Shape{{0, 40, 700, 1024}, 1, 16, 16, 8}, Shape{{640}, 1, 128, 10, 5},
                          Shape{{0, 130}, 1, 128, 10, 5}, Shape{{1024, 33, 513}, 2, 8, 16, 8}}) {
    const int64_t b = static_cast<int64_t>(sh.lens.size()), page = 64;
    SCOPED_TRACE(testing::Message() << "b " << b << " s_q " << sh.s_q << " h " << sh.h << " splits " << sh.splits);
    const test::PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, sh.lens, sh.max_blocks);
    const test::DeviceCache dc = test::to_device(pb.cb.storage, pb.cb.cache);
    const Tensor bt = pb.block_table.to(gpu), sl = pb.seq_lens.to(gpu);
    const Tensor q = test::random_tensor({b, sh.s_q, sh.h, 576}, DType::bf16);
    const Tensor qd = q.to(gpu);
    Tensor ref_out = test::poisoned({b, sh.s_q, sh.h, 512}, DType::f64), ref_lse = test::poisoned({b, sh.s_q, sh.h}, DType::f32);
    mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, ref_out, ref_lse, kScale, true, {}, test::reference_ctx());
    const int64_t max_len = sh.max_blocks * page;
    const std::size_t need = mqa_decode_workspace_bytes(b, sh.s_q, sh.h, max_len, gpu, sh.splits);
    const std::size_t uniform = cuda::decode_workspace_bytes(b, sh.s_q, sh.h, sh.splits);
    EXPECT_GE(need, 2 * uniform);  // room for a partial per warpgroup
    Tensor ws = Tensor::empty({static_cast<int64_t>(need)}, DType::u8, gpu);
    for (const std::size_t bytes : {need, uniform}) {
      SCOPED_TRACE(bytes == need ? "two partials a split" : "one partial a split");
      fill(ws.view(), 255.0);
      Tensor out = test::poisoned({b, sh.s_q, sh.h, 512}, DType::bf16, gpu);
      Tensor lse = test::poisoned({b, sh.s_q, sh.h}, DType::f32, gpu);
      mqa_decode(qd, dc.cache, bt, sl, out, lse, kScale, true, ws.view().slice(0, 0, static_cast<int64_t>(bytes)),
                 Context{}, sh.splits);
      cuda_rt::synchronize(0);
      if (variant_runs_on_device("mqa_decode", "sm90_small", 0)) {
        EXPECT_EQ(last_variant("mqa_decode"), "sm90_small");
      }
      test::expect_attention_close(out, ref_out, lse, ref_lse, "small step");
    }
  }
}

}  // namespace
}  // namespace mla
