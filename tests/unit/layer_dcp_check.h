// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DCP layer check shared by the CPU test (in-process thread group, float64) and the GPU test (NCCL,
// one thread and GPU per rank, bf16): W ranks each hold h/W of the layer's heads and the positions of
// every request's cache they own; a step on the group (decodes, and mixed steps whose prefills have
// context in several chunks) must equal the same step of one layer with all heads over the whole cache (CPU: float64 to 1e-5; GPU: the bf16 rule against the float64 layer),
// and every new token must land bit-exact in its owner's shard only (slot −1 elsewhere).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "attention_test_util.h"
#include "cache_test_util.h"
#include "layer_test_util.h"
#include "mla/comm.h"
#include "mla/dcp.h"

namespace mla::test::dcp_layer {

using layer::kL;
using layer::kR;
using layer::Scenario;
using layer::StepData;

struct RankResult {
  std::vector<double> out;  // [T, h_r * V]
  Tensor cache;             // host copy of the shard after the step
  KVCache view;             // descriptor of `cache`
  std::vector<std::vector<int32_t>> table;
  std::string error;
};

// How the ranks run: their communicator (made inside the rank's thread: NCCL ranks must start
// together), device, layer dtype and precision.
struct GroupSetup {
  std::function<std::unique_ptr<Communicator>(int rank)> comm;
  std::function<Device(int rank)> device;
  DType dtype = DType::f64;
  Precision precision = Precision::reference;
};

inline Tensor on(const Tensor& t, Device dev) { return dev.is_cpu() ? t : t.to(dev); }

// Rank r's step: its heads, its shard (context rows copied from the single-layer cache before the
// step), its slot mapping and block table, a plan made for its place in the group.
inline void run_rank(const StepData& d, const CacheBuffer& global_before, int w, int r, int interleave,
                     const GroupSetup& g, RankResult& res) {
  const Scenario& sc = d.sc;
  const int64_t page = sc.page_size, hr = sc.h / w, T = d.T;
  const Device dev = g.device(r);
  std::unique_ptr<Communicator> comm = g.comm(r);
  const DcpLayout l{w, r, interleave};
  PlannerConfig cfg = sc.config();
  cfg.dims.num_heads = static_cast<int>(hr);
  cfg.dcp = l;
  const Plan plan = make_plan(BatchDesc{d.plan.query_start_loc, d.plan.seq_lens, T, sc.decode_seq_len_bound}, cfg);
  // Shard: request q owns blocks [q * mb, (q + 1) * mb); every row starts NaN.
  const int64_t nr = d.plan.num_reqs;
  int64_t mb = 1;
  for (int64_t q = 0; q < nr; ++q)  // rank 0's shard is the longest: the plan's runs are sized for it
    mb = std::max<int64_t>(
        mb, (dcp_local_length(std::max<int64_t>(d.plan.seq_lens[q], sc.decode_seq_len_bound), {w, 0, interleave}) +
             page - 1) / page + 1);
  CacheBuffer host = allocate_cache(sc.format, nr * mb + 1, page, Device::cpu(), sc.fp8_scale);
  std::memset(host.storage.data(), 0xff, host.storage.nbytes());
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
        std::memcpy(const_cast<uint8_t*>(row_ptr(host.cache, local_slot(q, pos))),
                    row_ptr(global_before.cache, int64_t{d.bt[q][pos / page]} * page + pos % page),
                    static_cast<std::size_t>(bytes));
  Tensor storage = on(host.storage, dev);
  KVCache cache = host.cache;
  cache.data = storage.view();
  std::vector<int64_t> slots(static_cast<std::size_t>(T), -1);
  for (int64_t t = 0; t < d.t_act; ++t)
    if (dcp_owner(d.token_pos[t], l) == r) slots[t] = local_slot(d.token_req[t], d.token_pos[t]);

  LayerOptions o = sc.options(dev, g.dtype);
  o.dims.num_heads = static_cast<int>(hr);
  o.dcp_comm = comm.get();
  const int64_t per_head = int64_t(sc.P) + sc.V;
  const MlaAttention layer(o, d.weight.view().slice(0, r * hr * per_head, (r + 1) * hr * per_head));
  Tensor q = Tensor::empty({T, hr, sc.P + kR}, g.dtype);
  copy(q, layer::convert(d.q, g.dtype, Device::cpu()).view().slice(1, r * hr, (r + 1) * hr));
  const Tensor qd = on(q, dev), kv_c = layer::convert(d.kv_c, g.dtype, dev), k_pe = layer::convert(d.k_pe, g.dtype, dev);
  const Tensor slot_t = on(int64_tensor(slots), dev), table_t = on(int_tensor_2d(res.table), dev);
  const Tensor seq_t = on(d.seq_lens, dev);
  Tensor out = poisoned({T, hr * sc.V}, g.dtype, dev);
  ForwardArgs a;
  a.q = qd;
  a.kv_c = kv_c;
  a.k_pe = k_pe;
  a.slot_mapping = slot_t;
  a.block_table = table_t;
  a.seq_lens = seq_t;
  a.out = out;
  Tensor topk;
  if (sc.sparse) {
    topk = on(d.topk, dev);
    a.topk_indices = topk;
  }
  PinnedBuffer staging;
  Tensor meta;
  if (dev.is_cuda()) {  // the plan's metadata (local key counts) uploaded once, as a step does
    staging = PinnedBuffer(plan.metadata.bytes());
    meta = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(staging.size()), 16)}, DType::u8, dev);
    upload_step_metadata(plan, staging.view(), meta);
    a.metadata = meta;
  }
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(layer.workspace_bytes(plan), 1))}, DType::u8, dev);
  layer.forward(plan, a, cache, ws, Context{nullptr, g.precision});
  comm->synchronize({});
  res.out = to_doubles(out);
  res.cache = dev.is_cpu() ? storage : storage.to(Device::cpu());
  res.view = host.cache;
  res.view.data = res.cache.view();
}

// Runs the step on W ranks (one thread each) and returns the group's output assembled as one layer's
// [T_act, h * V] (token-major, heads in rank order); checks the cache placement of the new tokens
// against `single` (the one-layer run of the same step).
inline std::vector<double> run_group(const StepData& d, const layer::LayerRun& single, int w, int interleave,
                                     const GroupSetup& g) {
  const Scenario& sc = d.sc;
  const CacheBuffer before = layer::make_cache(d, Device::cpu());
  std::vector<RankResult> res(static_cast<std::size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      try {
        run_rank(d, before, w, r, interleave, g, res[r]);
      } catch (const std::exception& e) {
        res[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(res[r].error, "") << "rank " << r;
    if (!res[r].error.empty()) return all;
  }
  const int64_t hr = sc.h / w, V = sc.V;
  for (int64_t t = 0; t < d.t_act; ++t)
    for (int r = 0; r < w; ++r)
      all.insert(all.end(), res[r].out.begin() + t * hr * V, res[r].out.begin() + (t + 1) * hr * V);
  // Each new token is in its owner's shard, bit for bit as the single layer wrote it.
  const int64_t bytes = cache_entry_bytes(sc.format, kL + kR), page = sc.page_size;
  for (int64_t t = 0; t < d.t_act; ++t) {
    const int64_t pos = d.token_pos[t], q = d.token_req[t];
    const int owner = dcp_owner(pos, {w, 0, interleave});
    const int64_t lp = dcp_local_position(pos, {w, owner, interleave});
    const uint8_t* got = row_ptr(res[owner].view, int64_t{res[owner].table[q][lp / page]} * page + lp % page);
    const uint8_t* want = row_ptr(single.cache_view, int64_t{d.bt[q][pos / page]} * page + pos % page);
    EXPECT_EQ(std::memcmp(got, want, static_cast<std::size_t>(bytes)), 0) << "token " << t;
  }
  return all;
}

// The decode scenarios both tests run: varlen s_q 1-2 decodes, then CUDA-graph padding with a bound.
inline std::vector<Scenario> scenarios(CacheFormat f) {
  Scenario sc;
  sc.format = f;
  sc.h = 4;
  sc.decode_threshold = 2;
  sc.reqs = {{40, 1}, {70, 2}, {5, 1}, {1, 1}, {33, 2}};
  Scenario padded = sc;
  padded.pad_tokens = 3;
  padded.decode_seq_len_bound = 128;
  padded.min_table_blocks = 9;  // the single layer's table covers the bound too
  // Mixed: decodes, an extend with context, a long-context prefill and a fresh one; a small context
  // workspace makes several chunks, so shares of ranks start mid-turn and end in partial turns.
  Scenario mixed = sc;
  mixed.reqs = {{40, 1}, {70, 2}, {50, 6}, {97, 9}, {0, 5}};
  mixed.context_workspace_rows = 64;
  // Sparse: every token through the top-k MQA over the shards (positions past seq_len, outside the
  // table and -1 among the indices, as make_step writes them).
  Scenario sparse = mixed;
  sparse.sparse = true;
  sparse.topk = 16;
  return {sc, padded, mixed, sparse};
}

}  // namespace mla::test::dcp_layer
