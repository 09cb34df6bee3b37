// SPDX-License-Identifier: Apache-2.0
// MlaAttention: bad input raises mla::Error before anything is written (out and cache untouched),
// the exact workspace suffices (nothing past it is touched), and max_workspace_bytes /
// max_step_metadata_bytes bound workspace_bytes / plan.metadata.bytes() over random plans of a config.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <limits>

#include "layer/layer_internal.h"
#include "layer_test_util.h"
#include "mla/dcp.h"

namespace mla::test::layer {
namespace {

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

Scenario error_scenario() {
  Scenario sc;
  sc.reqs = {{5, 1}, {30, 1}, {20, 7}, {0, 9}};
  sc.pad_tokens = 2;
  return sc;
}

using Mutation = std::function<void(ForwardArgs&, Plan&, KVCache&, TensorView&)>;

// The error scenario's step on an f64 CPU layer, its cache's bytes before any call, and its arguments.
struct ErrorStep {
  const StepData d = make_step(error_scenario());
  const MlaAttention layer{d.sc.options(Device::cpu(), DType::f64), d.weight};
  CacheBuffer cb = make_cache(d, Device::cpu());
  const std::vector<uint8_t> cache_before = bytes_of(cb.storage);
  DeviceArgs a = device_args(d, Device::cpu(), DType::f64);
  const int64_t need = static_cast<int64_t>(layer.workspace_bytes(d.plan));
};

TEST(LayerErrors, BadInputsThrowAndWriteNothing) {
  ErrorStep e;
  const StepData& d = e.d;
  const Scenario& sc = d.sc;
  const MlaAttention& layer = e.layer;
  CacheBuffer& cb = e.cb;
  const std::vector<uint8_t>& cache_before = e.cache_before;
  DeviceArgs& a = e.a;
  const int64_t need = e.need;
  Tensor ws = Tensor::empty({need + 64}, DType::u8);
  const Context ctx{nullptr, Precision::reference};
  const int64_t nr = d.plan.num_reqs, T = d.T;

  // Replacement tensors the mutations point at (they must outlive the calls).
  const Tensor q_f32 = convert(d.q, DType::f32, Device::cpu());
  std::vector<int32_t> lens = to_ints(d.seq_lens);
  lens[1] += 1;
  const Tensor bad_lens = int_tensor(lens);
  std::vector<std::vector<int32_t>> bt = d.bt;
  bt[2][0] = static_cast<int32_t>(d.num_blocks);
  const Tensor bad_table = int_tensor_2d(bt);
  std::vector<int64_t> slots(static_cast<std::size_t>(T));
  for (int64_t t = 0; t < T; ++t) slots[t] = static_cast<int64_t>(to_doubles(d.slots)[t]);
  slots[3] = d.num_blocks * sc.page_size;
  const Tensor bad_slots = int64_tensor(slots);
  const Tensor topk = int_tensor_2d(std::vector<std::vector<int32_t>>(static_cast<std::size_t>(T), {0, 1}));
  const CacheBuffer fp8_cache = allocate_cache(CacheFormat::fp8, d.num_blocks, sc.page_size, Device::cpu(), 0.01f);
  Scenario other_page = sc;
  other_page.page_size = 64;
  Scenario sparse = sc;
  sparse.sparse = true;
  Scenario more_heads = sc;
  more_heads.h = 8;
  const std::vector<int32_t> qsl = d.plan.query_start_loc, seq = d.plan.seq_lens;
  // The plan's metadata shifted by one word (found by fuzz_layer: a stale or misplaced copy made
  // mha_prefill refuse its cu_seqlens after the cache had been written).
  Tensor shifted_meta = Tensor::zeros({static_cast<int64_t>(d.plan.metadata.bytes()) + 16}, DType::u8);
  std::memcpy(static_cast<uint8_t*>(shifted_meta.data()) + 4, d.plan.metadata.data.data(), d.plan.metadata.bytes());

  const std::vector<std::pair<const char*, Mutation>> cases = {
      {"q with a row fewer", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.q = x.q.slice(0, 0, T - 1); }},
      {"q in f32 for an f64 layer", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.q = q_f32; }},
      {"kv_c narrower than L",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.kv_c = x.kv_c.slice(1, 0, kL - 1); }},
      {"k_pe missing", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.k_pe = {}; }},
      {"out narrower than h * V",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.out = x.out.slice(1, 0, sc.h * sc.V - 1); }},
      {"workspace one byte short",
       [&](ForwardArgs&, Plan&, KVCache&, TensorView& w) { w = w.slice(0, 0, need - 1); }},
      {"workspace not bytes",
       [&](ForwardArgs&, Plan&, KVCache&, TensorView& w) { w = TensorView(w.data, DType::i32, {need / 4 + 1}); }},
      {"workspace misaligned",
       [&](ForwardArgs&, Plan&, KVCache&, TensorView& w) { w = ws.view().slice(0, 1, need + 1); }},
      {"seq_lens disagree with the plan", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.seq_lens = bad_lens; }},
      {"block_table with a row fewer",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.block_table = x.block_table.slice(0, 0, nr - 1); }},
      {"block_table too narrow for a sequence",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.block_table = x.block_table.slice(1, 0, 1); }},
      {"block id outside the cache", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.block_table = bad_table; }},
      {"slot outside the cache", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.slot_mapping = bad_slots; }},
      {"slot_mapping shorter than the actual tokens",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) {
         x.slot_mapping = x.slot_mapping.slice(0, 0, d.t_act - 1);
       }},
      {"topk_indices for a dense layer", [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) { x.topk_indices = topk; }},
      {"cache of another format", [&](ForwardArgs&, Plan&, KVCache& c, TensorView&) { c = fp8_cache.cache; }},
      {"plan for another page size",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) {
         p = make_plan(BatchDesc{qsl, seq, T}, other_page.config());
       }},
      {"plan for a sparse layer",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) {
         PlannerConfig c = sparse.config();
         c.dims.index_topk = 16;
         p = make_plan(BatchDesc{qsl, seq, T}, c);
       }},
      {"plan for more heads",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) {
         p = make_plan(BatchDesc{qsl, seq, T}, more_heads.config());
       }},
      {"plan for more tokens",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p = make_plan(BatchDesc{qsl, seq, T + 1}, sc.config()); }},
      {"plan edited inconsistently", [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p.seq_lens.pop_back(); }},
      {"metadata one byte short of the plan's",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) {
         x.metadata = x.metadata.slice(0, 0, static_cast<int64_t>(d.plan.metadata.bytes()) - 1);
       }},
      {"metadata not the plan's",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) {
         ASSERT_GT(d.plan.metadata.bytes(), 0u);
         x.metadata = shifted_meta.view();
       }},
      {"metadata not bytes",
       [&](ForwardArgs& x, Plan&, KVCache&, TensorView&) {
         x.metadata = TensorView(x.metadata.data, DType::i32, {x.metadata.size(0) / 4});
       }},
      {"decode schedule sized for a longer bound than the block table covers",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p = make_plan(BatchDesc{qsl, seq, T, 256}, sc.config()); }},
      {"decode schedule edited past the decodes",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p.decode.runs.back().req_end = nr; }},
      // Issue 14: hand-edited plan values that a later op rejected after the cache had been written
      // (or that no op checks at all); the seal refuses every edit before the first write.
      {"plan not sealed", [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p.seal = 0; }},
      {"negative max_prefill_query_len",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p.max_prefill_query_len = -1; }},
      {"context chunk start moved",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) {
         ASSERT_FALSE(p.context.chunks.empty());
         p.context.chunks[0].seq_starts[0] += 3;
       }},
      {"metadata word edited",
       [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) {
         ASSERT_FALSE(p.metadata.data.empty());
         p.metadata.data.back() += 1;
       }},
      {"num_actual_tokens raised", [&](ForwardArgs&, Plan& p, KVCache&, TensorView&) { p.num_actual_tokens += 1; }},
  };
  for (const auto& [what, mutate] : cases) {
    ForwardArgs args = a.args();
    Plan plan = d.plan;
    KVCache cache = cb.cache;
    TensorView w = ws.view().slice(0, 0, need);
    mutate(args, plan, cache, w);
    EXPECT_THROW(layer.forward(plan, args, cache, w, ctx), Error) << what;
    for (double x : to_doubles(a.out)) ASSERT_TRUE(std::isnan(x)) << what << ": out was written";
    ASSERT_EQ(bytes_of(cb.storage), cache_before) << what << ": the cache was written";
  }
  // The unmodified call goes through.
  layer.forward(d.plan, a.args(), cb.cache, ws.view().slice(0, 0, need), ctx);
  const std::vector<double> out = to_doubles(a.out);
  for (int64_t i = 0; i < d.t_act * sc.h * sc.V; ++i) ASSERT_TRUE(std::isfinite(out[i])) << i;
}

// Issue 51: a plan edited and re-sealed with plan_digest is outside the contract, but forward and
// workspace_bytes still refuse its inconsistent vectors and metadata offsets before anything is
// written (an offset near 2^62 made mha_prefill read before the metadata; an extra DCP chunk made
// workspace_bytes read past the context chunks).
TEST(LayerErrors, ResealedPlansAreRefusedBeforeAWrite) {
  ErrorStep e;
  const StepData& d = e.d;
  Tensor ws = Tensor::empty({e.need * 2 + 4096}, DType::u8);
  const Context ctx{nullptr, Precision::reference};
  ASSERT_FALSE(d.plan.context.chunks.empty());
  ASSERT_GT(d.plan.context.chunks[0].total, 0);
  ASSERT_FALSE(d.plan.decode.runs.empty());
  const std::vector<std::pair<const char*, std::function<void(Plan&)>>> edits = {
      {"prefill_qsl offset near 2^62", [](Plan& p) { p.metadata.prefill_qsl = int64_t(1) << 62; }},
      {"prefill_qsl offset wrapping to -1 words", [](Plan& p) { p.metadata.prefill_qsl = (int64_t(1) << 62) - 1; }},
      {"chunk_cu offset near 2^62", [](Plan& p) { p.metadata.chunk_cu[0] = int64_t(1) << 62; }},
      {"chunk_cu offset negative", [](Plan& p) { p.metadata.chunk_cu[0] = -2; }},
      {"chunk_starts past the end", [](Plan& p) { p.metadata.chunk_starts[0] = static_cast<int64_t>(p.metadata.data.size()); }},
      {"chunk_cu entry missing", [](Plan& p) { p.metadata.chunk_cu.pop_back(); }},
      {"an extra DCP chunk", [](Plan& p) { p.dcp_chunks.emplace_back(); }},
      {"an extra context chunk", [](Plan& p) { p.context.chunks.push_back(p.context.chunks[0]); }},
      // Found by fuzz_step: block columns near 2^62 overflowed the decode scratch's key count.
      {"decode run block_cols near 2^62", [](Plan& p) { p.decode.runs[0].block_cols = int64_t(1) << 62; }},
      {"decode run s_q near 2^62", [](Plan& p) { p.decode.runs[0].s_q = int64_t(1) << 62; }},
      {"decode run past int64", [](Plan& p) { p.decode.runs[0].req_begin = std::numeric_limits<int64_t>::min(); }},
      {"split counts summing past int64",
       [](Plan& p) { p.split.num_decodes = p.split.num_prefills = int64_t(1) << 62; }},
      {"config with page size 0", [](Plan& p) { p.config.page_size = 0; }},
  };
  for (const auto& [what, edit] : edits) {
    Plan plan = d.plan;
    edit(plan);
    plan.seal = plan_digest(plan);
    EXPECT_THROW((void)e.layer.workspace_bytes(plan), Error) << what;
    EXPECT_THROW(e.layer.forward(plan, e.a.args(), e.cb.cache, ws.view(), ctx), Error) << what;
    for (double x : to_doubles(e.a.out)) ASSERT_TRUE(std::isnan(x)) << what << ": out was written";
    ASSERT_EQ(bytes_of(e.cb.storage), e.cache_before) << what << ": the cache was written";
  }
}

TEST(LayerErrors, SparseLayerNeedsTopkIndices) {
  Scenario sc;
  sc.sparse = true;
  sc.reqs = {{5, 1}, {0, 4}};
  const StepData d = make_step(sc);
  const MlaAttention layer(sc.options(Device::cpu(), DType::f64), d.weight);
  CacheBuffer cb = make_cache(d, Device::cpu());
  DeviceArgs a = device_args(d, Device::cpu(), DType::f64);
  Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8);
  ForwardArgs args = a.args();
  args.topk_indices = {};
  EXPECT_THROW(layer.forward(d.plan, args, cb.cache, ws.view()), Error);
  args.topk_indices = a.topk.view().slice(1, 0, sc.topk - 1);
  EXPECT_THROW(layer.forward(d.plan, args, cb.cache, ws.view()), Error);
  for (double x : to_doubles(a.out)) ASSERT_TRUE(std::isnan(x));
}

// The exact workspace is enough and nothing past it is written (canary bytes), in every mode.
TEST(LayerWorkspace, ExactSizeSufficesAndStaysInside) {
  std::vector<Scenario> scenarios;
  Scenario dense;
  dense.decode_threshold = 2;
  dense.reqs = {{5, 2}, {30, 1}, {20, 7}, {47, 5}, {0, 9}};
  dense.context_workspace_rows = 48;
  scenarios.push_back(dense);
  Scenario decode_only;
  decode_only.reqs = {{5, 1}, {30, 1}};
  scenarios.push_back(decode_only);
  Scenario sparse;
  sparse.sparse = true;
  sparse.format = CacheFormat::fp8_ds_mla;
  sparse.h = 32;
  sparse.P = sparse.V = 8;
  sparse.max_model_len = 40;
  sparse.sparse_workspace_rows = 40;
  sparse.reqs = {{30, 1}, {10, 5}, {15, 5}, {0, 20}};
  scenarios.push_back(sparse);
  for (const Scenario& sc : scenarios) {
    const StepData d = make_step(sc);
    const MlaAttention layer(sc.options(Device::cpu(), DType::f64), d.weight);
    CacheBuffer cb = make_cache(d, Device::cpu());
    DeviceArgs a = device_args(d, Device::cpu(), DType::f64);
    const int64_t need = static_cast<int64_t>(layer.workspace_bytes(d.plan));
    Tensor ws = Tensor::empty({need + 4096}, DType::u8);
    std::memset(ws.data(), 0xA5, static_cast<std::size_t>(need + 4096));
    layer.forward(d.plan, a.args(), cb.cache, ws.view().slice(0, 0, need), Context{nullptr, Precision::reference});
    const auto* p = static_cast<const uint8_t*>(ws.data());
    for (int64_t i = need; i < need + 4096; ++i) ASSERT_EQ(p[i], 0xA5) << "byte " << i - need << " past the workspace";
    EXPECT_LE(error_ratio(to_doubles(a.out), naive_layer(d, cb.cache), d), 1.0);
  }
}

// Issue 14: a bound past int64 throws instead of wrapping into a small workspace forward() would overrun.
TEST(LayerWorkspace, HugeBoundsThrow) {
  Scenario sc;
  sc.max_model_len = 300;
  sc.max_num_seqs = 4;
  sc.decode_threshold = 1;
  reseed(3);
  const Tensor w = random_tensor({sc.h * (sc.P + sc.V), kL}, DType::bf16);
  const MlaAttention layer(sc.options(Device::cpu(), DType::bf16), w);
  const PlannerConfig pc = sc.config();
  EXPECT_GT(layer.max_workspace_bytes(pc, 1000), 0u);
  EXPECT_THROW(layer.max_workspace_bytes(pc, int64_t(1) << 56), Error);
  PlannerConfig big = pc;
  big.context_workspace_rows = int64_t(1) << 60;
  EXPECT_THROW(layer.max_workspace_bytes(big, 1000), Error);
}

// Issue 51: the decode-run part of max_workspace_bytes enumerates only the runs that can split or
// take the balanced schedule's scratch; it equals the old exhaustive maximum over every (s_q, b)
// pair, and no longer takes time in proportion to n * ln(n) (44 s at max_num_seqs = 10^5).
int64_t exhaustive_decode_scratch(const PlannerConfig& c, int64_t n, const LayerOptions& o) {
  int64_t best = 0;
  const int64_t max_sq = std::min(n, c.decode_threshold), h = o.dims.num_heads, w = c.dcp.world_size;
  const int64_t max_len = (c.max_model_len + c.page_size - 1) / c.page_size * c.page_size;
  const int64_t local = dcp_local_length(max_len, {c.dcp.world_size, 0, c.dcp.interleave});
  const int64_t cols = std::max<int64_t>(1, (local + c.page_size - 1) / c.page_size);
  for (int64_t s_q = 1; s_q <= max_sq; ++s_q)
    for (int64_t b = 1; b <= std::min(c.max_num_seqs, n / s_q); ++b) {
      const int64_t bytes =
          w > 1 ? static_cast<int64_t>(dcp_mqa_decode_workspace_bytes(
                      b, s_q, h, cols, c.page_size, o.dtype, c.dcp.world_size, o.device,
                      decode_num_splits(b * s_q, 1, h * w, cols * c.page_size, c.num_sms)))
                : static_cast<int64_t>(mqa_decode_workspace_bytes(b, s_q, h, max_len, o.device,
                                                                  decode_num_splits(b, s_q, h, max_len, c.num_sms)));
      best = std::max(best, bytes);
    }
  return best;
}

TEST(LayerWorkspace, DecodeBoundEqualsTheExhaustiveMaximumQuickly) {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  int checked = 0;
  for (const Device dev : devices)
    for (int w : {1, 2, 4})
      for (int h : {1, 16, 128})
        for (int sms : {0, 8, 132})
          for (int64_t threshold : {1, 40})
            for (int64_t seqs : {7, 300})
              for (int64_t n : {50, 700}) {
                PlannerConfig c;
                c.dims.num_heads = h;
                c.page_size = 16;
                c.max_model_len = 500;
                c.max_num_seqs = seqs;
                c.decode_threshold = threshold;
                c.num_sms = sms;
                c.dcp = {w, 0, 1};
                LayerOptions o;
                o.dims = c.dims;
                o.device = dev;
                o.dtype = dev.is_cuda() ? DType::bf16 : DType::f32;
                const int64_t got = layer_detail::bound_shape(c, n, o).decode_scratch_bytes;
                ASSERT_EQ(got, exhaustive_decode_scratch(c, n, o))
                    << to_string(dev) << " W " << w << " h " << h << " sms " << sms << " threshold " << threshold
                    << " seqs " << seqs << " n " << n;
                ++checked;
              }
  EXPECT_GT(checked, 0);
  // The size that took 44 s: 10^5 sequences, 10^6 tokens, any query length a decode.
  for (int w : {1, 2}) {
    PlannerConfig c;
    c.dims.num_heads = 16;
    c.page_size = 64;
    c.max_model_len = 4096;
    c.max_num_seqs = 100000;
    c.decode_threshold = 1000000;
    c.num_sms = 132;
    c.dcp = {w, 0, 1};
    LayerOptions o;
    o.dims = c.dims;
    o.dtype = DType::f32;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_GE(layer_detail::bound_shape(c, 1000000, o).decode_scratch_bytes, 0);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0) << "W " << w;
  }
}

TEST(LayerWorkspace, BoundCoversRandomPlans) {
  std::mt19937_64 g(7);
  struct Config {
    Scenario sc;
    int64_t n;
  };
  std::vector<Config> configs;
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    Scenario sc;
    sc.format = f;
    sc.max_model_len = 300;
    sc.max_num_seqs = 12;
    sc.decode_threshold = 3;
    sc.require_uniform = true;
    configs.push_back({sc, 200});
    sc.context_workspace_rows = 64;  // many chunks
    sc.page_size = 8;
    configs.push_back({sc, 400});
  }
  for (int h : {4, 32}) {
    Scenario sc;
    sc.sparse = true;
    sc.format = CacheFormat::fp8_ds_mla;
    sc.h = h;
    sc.max_model_len = 120;
    sc.max_num_seqs = 10;
    sc.decode_threshold = 2;
    sc.require_uniform = true;
    sc.sparse_workspace_rows = 150;
    configs.push_back({sc, 300});
    // The mode against the head rule: 4 heads separate, 32 heads mixed batch.
    sc.sparse_prefill_mode = h == 4 ? SparsePrefillMode::separate : SparsePrefillMode::mixed_batch;
    configs.push_back({sc, 300});
    sc.sparse_prefill_mode = SparsePrefillMode::automatic;
    sc.format = CacheFormat::bf16;
    configs.push_back({sc, 300});
  }
  for (const Config& cfg : configs) {
    reseed(3);
    const Tensor w = random_tensor({cfg.sc.h * (cfg.sc.P + cfg.sc.V), kL}, DType::bf16);
    const MlaAttention layer(cfg.sc.options(Device::cpu(), DType::bf16), w);
    const PlannerConfig pc = cfg.sc.config();
    const std::size_t bound = layer.max_workspace_bytes(pc, cfg.n);
    std::size_t largest = 0;
    int plans = 0;
    for (int i = 0; i < 300; ++i) {
      const BatchDesc b = random_batch(pc, cfg.n, g);
      Plan p;
      try {
        p = make_plan(b, pc);
      } catch (const Error&) {
        continue;  // a draw the planner refuses (e.g. non-uniform decodes) says nothing about the bound
      }
      ++plans;
      const std::size_t need = layer.workspace_bytes(p);
      largest = std::max(largest, need);
      ASSERT_LE(need, bound) << "plan " << i << " (" << p.num_reqs << " requests, " << p.num_tokens << " tokens, "
                             << p.context.chunks.size() << " chunks)";
      ASSERT_LE(p.metadata.bytes(), max_step_metadata_bytes(pc, cfg.n)) << "plan " << i;
    }
    EXPECT_GT(plans, 100);
    EXPECT_GT(largest, 0u);
  }
}

}  // namespace
}  // namespace mla::test::layer

namespace mla::test::layer {
namespace {

// LayerOptions::fp8_prefill: refused off fp8 / fp8_ds_mla caches, in sparse layers and with bad scales; on an fp8
// cache the CPU layer runs it: decode rows as without it (bit for bit), prefill rows moved within a few percent.
TEST(LayerFp8Prefill, RefusedWhereItDoesNotApplyAndRunsOnFp8Caches) {
  Scenario sc;
  sc.reqs = {{20, 1}, {10, 6}, {0, 9}};
  sc.decode_threshold = 1;
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::f64}) {
    sc.format = f;
    const StepData d = make_step(sc);
    LayerOptions o = sc.options(Device::cpu(), DType::f64);
    o.fp8_prefill = true;
    EXPECT_THROW(MlaAttention(o, d.weight), Error) << to_string(f);
  }
  sc.format = CacheFormat::fp8;
  const StepData d = make_step(sc);
  LayerOptions o = sc.options(Device::cpu(), DType::f64);
  o.fp8_prefill = true;
  o.fp8_prefill_scales.k = -1.0f;
  EXPECT_THROW(MlaAttention(o, d.weight), Error) << "negative scale";
  o.fp8_prefill_scales = {1.0f / 64, 1.0f / 64, 1.0f / 64};
  auto run = [&](const LayerOptions& lo) {
    const MlaAttention layer(lo, d.weight);
    CacheBuffer cb = make_cache(d, Device::cpu());
    DeviceArgs a = device_args(d, Device::cpu(), DType::f64);
    Tensor ws = Tensor::empty({static_cast<int64_t>(layer.workspace_bytes(d.plan))}, DType::u8);
    layer.forward(d.plan, a.args(), cb.cache, ws.view());
    return to_doubles(a.out);
  };
  LayerOptions plain = o;
  plain.fp8_prefill = false;
  const std::vector<double> got = run(o), ref = run(plain);
  const int64_t row = static_cast<int64_t>(got.size()) / d.T, t_dec = 1;
  double max_ref = 0, max_err = 0;
  for (int64_t t = 0; t < d.t_act; ++t)
    for (int64_t i = 0; i < row; ++i) {
      const double g = got[t * row + i], r = ref[t * row + i];
      if (t < t_dec) {
        ASSERT_EQ(g, r) << "decode token " << t;
      } else {
        max_ref = std::max(max_ref, std::fabs(r));
        max_err = std::max(max_err, std::fabs(g - r));
      }
    }
  EXPECT_GT(max_err, 0.0) << "the prefill ran on codes";
  EXPECT_LE(max_err, 0.125 * max_ref) << "the fp8 allowance";
}

}  // namespace
}  // namespace mla::test::layer
