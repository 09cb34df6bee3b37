// MlaAttention's DCP mode on the CPU (LayerOptions::dcp_comm, PlannerConfig::dcp; semantics §13): W
// ranks (threads of the in-process group) each hold h/W of the layer's heads and the positions of
// every request's cache that they own. A decode step on the group must equal the same step of one
// layer with all heads over the whole cache, token for token and head for head, and every new token
// must land in its owner's shard only (slot −1 elsewhere).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "cache_test_util.h"
#include "attention_test_util.h"
#include "layer_test_util.h"
#include "mla/comm.h"
#include "mla/dcp.h"

namespace mla {
namespace {

using test::layer::kL;
using test::layer::kR;
using test::layer::Scenario;
using test::layer::StepData;

struct RankResult {
  std::vector<double> out;  // [T, h_r * V]
  Tensor cache;             // host cache after the step
  KVCache view;
  std::vector<std::vector<int32_t>> table;
  std::string error;
};

// Rank r's step: its heads, its shard (context rows copied from the single-layer cache before the
// step), its slot mapping and block table, a plan made for its place in the group.
void run_rank(const StepData& d, const CacheBuffer& global_before, int w, int r, int interleave, Communicator& comm,
              RankResult& res) {
  const Scenario& sc = d.sc;
  const int64_t page = sc.page_size, hr = sc.h / w, T = d.T;
  const DcpLayout l{w, r, interleave};
  PlannerConfig cfg = sc.config();
  cfg.dims.num_heads = static_cast<int>(hr);
  cfg.dcp = l;
  const Plan plan = make_plan(BatchDesc{d.plan.query_start_loc, d.plan.seq_lens, T, sc.decode_seq_len_bound}, cfg);
  // Shard: request q owns blocks [q * mb, (q + 1) * mb) of a cache with one spare NaN block.
  const int64_t nr = d.plan.num_reqs;
  int64_t mb = 1;
  for (int64_t q = 0; q < nr; ++q)  // rank 0's shard is the longest: the plan's runs are sized for it
    mb = std::max<int64_t>(
        mb, (dcp_local_length(std::max<int64_t>(d.plan.seq_lens[q], sc.decode_seq_len_bound), {w, 0, interleave}) +
             page - 1) / page + 1);
  CacheBuffer cb = allocate_cache(sc.format, nr * mb + 1, page, Device::cpu(), sc.fp8_scale);
  std::memset(cb.storage.data(), 0xff, cb.storage.nbytes());
  for (int64_t q = 0; q < nr; ++q) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < mb; ++j) row.push_back(static_cast<int32_t>(q * mb + j));
    res.table.push_back(row);
  }
  auto local_slot = [&](int64_t q, int64_t pos) {
    const int64_t lp = dcp_local_position(pos, l);
    return int64_t{res.table[q][lp / page]} * page + lp % page;
  };
  const int64_t bytes = cache_entry_bytes(sc.format, kL + kR);
  for (int64_t q = 0; q < nr; ++q)
    for (int64_t pos = 0; pos < sc.reqs[q].context; ++pos)
      if (dcp_owner(pos, l) == r)
        std::memcpy(const_cast<uint8_t*>(test::row_ptr(cb.cache, local_slot(q, pos))),
                    test::row_ptr(global_before.cache, int64_t{d.bt[q][pos / page]} * page + pos % page),
                    static_cast<std::size_t>(bytes));
  std::vector<int64_t> slots(static_cast<std::size_t>(T), -1);
  for (int64_t t = 0; t < d.t_act; ++t)
    if (dcp_owner(d.token_pos[t], l) == r) slots[t] = local_slot(d.token_req[t], d.token_pos[t]);

  LayerOptions o = sc.options(Device::cpu(), DType::f64);
  o.dims.num_heads = static_cast<int>(hr);
  o.dcp_comm = &comm;
  const int64_t per_head = int64_t(sc.P) + sc.V;
  const MlaAttention layer(o, d.weight.view().slice(0, r * hr * per_head, (r + 1) * hr * per_head));
  Tensor q = Tensor::empty({T, hr, sc.P + kR}, DType::f64);
  copy(q, test::layer::convert(d.q, DType::f64, Device::cpu()).view().slice(1, r * hr, (r + 1) * hr));
  Tensor out = test::poisoned({T, hr * sc.V}, DType::f64);
  ForwardArgs a;
  a.q = q;
  const Tensor kv_c = test::layer::convert(d.kv_c, DType::f64, Device::cpu()), k_pe = test::layer::convert(d.k_pe, DType::f64, Device::cpu());
  a.kv_c = kv_c;
  a.k_pe = k_pe;
  const Tensor slot_t = test::int64_tensor(slots), table_t = test::int_tensor_2d(res.table);
  a.slot_mapping = slot_t;
  a.block_table = table_t;
  a.seq_lens = d.seq_lens;
  a.out = out;
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(layer.workspace_bytes(plan), 1))}, DType::u8);
  layer.forward(plan, a, cb.cache, ws, Context{nullptr, Precision::reference});
  res.out = test::to_doubles(out);
  res.cache = cb.storage;
  res.view = cb.cache;
}

void check_group(const Scenario& sc, int w, int interleave) {
  SCOPED_TRACE(::testing::Message() << to_string(sc.format) << " W " << w << " I " << interleave);
  const StepData d = test::layer::make_step(sc);
  const CacheBuffer before = test::layer::make_cache(d, Device::cpu());
  const test::layer::LayerRun ref = test::layer::run_layer(d, Device::cpu(), DType::f64, Precision::reference);
  auto group = make_local_group(w);
  std::vector<RankResult> res(static_cast<std::size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      try {
        run_rank(d, before, w, r, interleave, *group[r], res[r]);
      } catch (const std::exception& e) {
        res[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) ASSERT_EQ(res[r].error, "") << "rank " << r;
  const int64_t hr = sc.h / w, V = sc.V;
  for (int64_t t = 0; t < d.t_act; ++t)
    for (int r = 0; r < w; ++r)
      for (int64_t x = 0; x < hr * V; ++x) {
        const double want = ref.out[static_cast<std::size_t>(t * sc.h * V + r * hr * V + x)];
        const double got = res[r].out[static_cast<std::size_t>(t * hr * V + x)];
        ASSERT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << "token " << t << " rank " << r << " col " << x;
      }
  // Each new token is in its owner's shard, bit for bit as the single layer wrote it.
  const int64_t bytes = cache_entry_bytes(sc.format, kL + kR), page = sc.page_size;
  for (int64_t t = 0; t < d.t_act; ++t) {
    const int64_t pos = d.token_pos[t], q = d.token_req[t];
    const int owner = dcp_owner(pos, {w, 0, interleave});
    const DcpLayout l{w, owner, interleave};
    const int64_t lp = dcp_local_position(pos, l);
    const uint8_t* got = test::row_ptr(res[owner].view, int64_t{res[owner].table[q][lp / page]} * page + lp % page);
    const uint8_t* want = test::row_ptr(ref.cache_view, int64_t{d.bt[q][pos / page]} * page + pos % page);
    EXPECT_EQ(std::memcmp(got, want, static_cast<std::size_t>(bytes)), 0) << "token " << t;
  }
}

TEST(LayerDcp, DecodeStepsEqualOneLayerOverTheWholeCache) {
  for (CacheFormat f : test::kAllFormats) {
    Scenario sc;
    sc.format = f;
    sc.h = 4;
    sc.decode_threshold = 2;
    sc.reqs = {{40, 1}, {70, 2}, {5, 1}, {1, 1}, {33, 2}};
    check_group(sc, 2, 1);
    check_group(sc, 4, 16);
    sc.pad_tokens = 3;  // CUDA-graph padding rows
    sc.decode_seq_len_bound = 128;
    sc.min_table_blocks = 9;  // the single layer's table covers the bound too
    check_group(sc, 2, 2);
  }
}

TEST(LayerDcp, RefusesMismatchedPlansAndPrefills) {
  Scenario sc;
  sc.reqs = {{10, 1}, {0, 4}};  // a prefill
  PlannerConfig cfg = sc.config();
  cfg.dcp = {2, 0, 1};
  EXPECT_THROW(make_plan(BatchDesc{{0, 1, 5}, {11, 4}}, cfg), Error);
  cfg.dcp = {2, 2, 1};
  EXPECT_THROW(cfg.validate(), Error);
  cfg.dcp = {2, 0, 3};  // interleave must divide the page size (16)
  EXPECT_THROW(cfg.validate(), Error);
  cfg.dcp = {2, 0, 1};
  cfg.sparse = true;
  cfg.dims.index_topk = 8;
  EXPECT_THROW(cfg.validate(), Error);

  // A DCP plan on a layer without a communicator, and the reverse: refused before anything is written.
  sc.reqs = {{10, 1}, {20, 1}};
  const StepData d = test::layer::make_step(sc);
  PlannerConfig c2 = sc.config();
  c2.dcp = {2, 1, 1};
  const Plan dcp_plan = make_plan(BatchDesc{d.plan.query_start_loc, d.plan.seq_lens}, c2);
  const MlaAttention plain(sc.options(Device::cpu(), DType::f32), d.weight);
  CacheBuffer cb = test::layer::make_cache(d, Device::cpu());
  test::layer::DeviceArgs a = test::layer::device_args(d, Device::cpu(), DType::f32);
  Tensor ws = Tensor::empty({1 << 20}, DType::u8);
  EXPECT_THROW(plain.forward(dcp_plan, a.args(), cb.cache, ws), Error);
  auto group = make_local_group(2);
  LayerOptions o = sc.options(Device::cpu(), DType::f32);
  o.dcp_comm = group[0].get();
  const MlaAttention with_comm(o, d.weight);
  EXPECT_THROW(with_comm.forward(d.plan, a.args(), cb.cache, ws), Error);   // plan without DCP
  EXPECT_THROW(with_comm.forward(dcp_plan, a.args(), cb.cache, ws), Error);  // plan for rank 1
  for (double v : test::to_doubles(a.out)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace mla
