// SPDX-License-Identifier: Apache-2.0
// DCP collectives with the in-process group (mla/comm.h make_local_group): W threads play W ranks on
// the CPU. Checked: all_gather / all_to_all block placement; dcp_mqa_decode (causal s_q 1 and 3) and
// dcp_sparse_mqa over W shards equal one process attending the whole cache for all W·h_q heads;
// mismatched collectives and a missing rank throw on every rank instead of hanging. The dense decode in
// each exchange (all-to-all, AG+RS, all-to-all over two half-batches). The socket group (one rank per
// process; here threads of one process over its Unix socket): the same placement, a decode through it,
// and a rank that fails or never connects makes the others throw within the timeout. The lockstep
// wrapper (ranks as threads on CUDA): no rank enqueues before all arrived, none returns before all enqueued.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "attention_test_util.h"
#include "dcp_v4_test_util.h"
#include "dist/socket_group.h"
#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "support/test_util.h"

namespace mla {
namespace {

// Runs body(rank, comm) on W threads; returns the error text of each rank ("" = returned normally).
std::vector<std::string> on_ranks(std::vector<std::unique_ptr<Communicator>>& group,
                                  const std::function<void(int, Communicator&)>& body) {
  std::vector<std::string> err(group.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < group.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(static_cast<int>(r), *group[r]);
      } catch (const std::exception& e) {
        err[r] = e.what();
        if (err[r].empty()) err[r] = "(empty error)";
      }
    });
  for (auto& t : threads) t.join();
  return err;
}

// all_gather, all_to_all and reduce_scatter of W ranks through `group`: blocks land where comm.h says.
void expect_collectives_place_blocks(std::vector<std::unique_ptr<Communicator>>& group) {
  const int w = static_cast<int>(group.size());
  std::vector<Tensor> gathered(w), exchanged(w), reduced(w);
  const auto err = on_ranks(group, [&](int r, Communicator& c) {
    Tensor in = Tensor::empty({2, 2}, DType::i32), a2a = Tensor::empty({w, 2}, DType::i32);
    for (int i = 0; i < 4; ++i) static_cast<int32_t*>(in.data())[i] = 100 * r + i;
    for (int j = 0; j < w; ++j)
      for (int i = 0; i < 2; ++i) static_cast<int32_t*>(a2a.data())[j * 2 + i] = 100 * r + 10 * j + i;
    gathered[r] = Tensor::empty({w * 2, 2}, DType::i32);
    exchanged[r] = Tensor::empty({w, 2}, DType::i32);
    c.all_gather(in, gathered[r], {});
    c.all_to_all(a2a, exchanged[r], {});
    Tensor rs = Tensor::empty({w, 3}, DType::f32);
    for (int j = 0; j < w; ++j)
      for (int i = 0; i < 3; ++i) static_cast<float*>(rs.data())[j * 3 + i] = static_cast<float>(1000 * j + 10 * r + i);
    reduced[r] = Tensor::empty({3}, DType::f32);
    c.reduce_scatter(rs, reduced[r], {});
    c.synchronize({});
  });
  for (int r = 0; r < w; ++r) {
    ASSERT_EQ(err[r], "");
    const std::vector<int32_t> g = test::to_ints(gathered[r]), x = test::to_ints(exchanged[r]);
    for (int p = 0; p < w; ++p)
      for (int i = 0; i < 4; ++i) EXPECT_EQ(g[p * 4 + i], 100 * p + i);
    for (int p = 0; p < w; ++p)  // block p of my out = block r of rank p's in
      for (int i = 0; i < 2; ++i) EXPECT_EQ(x[p * 2 + i], 100 * p + 10 * r + i);
    const std::vector<double> sum = test::to_doubles(reduced[r]);  // Σ_p block r of rank p's in
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sum[i], w * (1000.0 * r + i) + 10.0 * w * (w - 1) / 2);
  }
}

TEST(DcpGroup, AllGatherAndAllToAllPlaceBlocks) {
  auto group = make_local_group(3);
  expect_collectives_place_blocks(group);
}

TEST(DcpGroup, MismatchAndMissingRankThrowEverywhere) {
  {
    auto group = make_local_group(2);
    const auto err = on_ranks(group, [&](int r, Communicator& c) {
      Tensor in = Tensor::zeros({r + 1}, DType::f32), out = Tensor::zeros({2 * (r + 1)}, DType::f32);
      c.all_gather(in, out, {});
    });
    for (const std::string& e : err) EXPECT_NE(e.find("rank 0 called"), std::string::npos) << e;
  }
  {
    auto group = make_local_group(3, std::chrono::milliseconds(200));
    const auto err = on_ranks(group, [&](int r, Communicator& c) {
      if (r == 2) throw Error("rank 2 gave up");
      Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({12}, DType::f32);
      c.all_gather(in, out, {});
    });
    EXPECT_NE(err[0].find("not every rank"), std::string::npos) << err[0];
    EXPECT_NE(err[1].find("not every rank"), std::string::npos) << err[1];
    // The group stays broken: a later collective throws at once.
    EXPECT_THROW(group[0]->synchronize({}), Error);
  }
  auto group = make_local_group(2);
  Tensor in = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(group[0]->all_gather(in, Tensor::zeros({7}, DType::f32), {}), Error);  // refused before waiting
  EXPECT_THROW(group[0]->all_to_all(Tensor::zeros({3}, DType::f32), Tensor::zeros({3}, DType::f32), {}), Error);
  EXPECT_THROW(make_local_group(0), Error);
}

// A rank that only counts the collectives it is asked to enqueue, and checks on entry that every rank
// of the group has arrived at this collective (what make_lockstep_group promises).
class CountingComm final : public Communicator {
 public:
  CountingComm(int r, int w, std::atomic<int>& arrived, std::atomic<int>& enqueued)
      : r_(r), w_(w), arrived_(arrived), enqueued_(enqueued) {}
  int rank() const override { return r_; }
  int world_size() const override { return w_; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "counting"; }
  void all_gather(const TensorView&, const TensorView&, const Context&) override { enqueue(); }
  void all_to_all(const TensorView&, const TensorView&, const Context&) override { enqueue(); }
  void reduce_scatter(const TensorView&, const TensorView&, const Context&) override { enqueue(); }
  void synchronize(const Context&) override {}
  int64_t calls = 0, early = 0;  // enqueues of this rank; of those, entered before every rank arrived

 private:
  void enqueue() {
    ++calls;
    if (arrived_.load() < w_ * calls) ++early;
    std::this_thread::sleep_for(std::chrono::milliseconds(r_ * 3));  // slow enqueues: the others must wait
    ++enqueued_;
  }
  int r_, w_;
  std::atomic<int>& arrived_;
  std::atomic<int>& enqueued_;
};

TEST(DcpGroup, LockstepGroupEnqueuesInLockstep) {
  {  // the wrapped in-process group still places every block
    auto group = make_lockstep_group(make_local_group(3), std::chrono::seconds(60));
    expect_collectives_place_blocks(group);
  }
  const int w = 3, n = 20;
  std::atomic<int> arrived{0}, enqueued{0};
  std::vector<std::unique_ptr<Communicator>> inner;
  std::vector<CountingComm*> spies;
  for (int r = 0; r < w; ++r) {
    inner.push_back(std::make_unique<CountingComm>(r, w, arrived, enqueued));
    spies.push_back(static_cast<CountingComm*>(inner.back().get()));
  }
  auto group = make_lockstep_group(std::move(inner), std::chrono::seconds(60));
  std::vector<int64_t> late(w, 0);  // returns of a rank before every rank had enqueued that collective
  const Tensor t = Tensor::zeros({4}, DType::f32);
  const auto err = on_ranks(group, [&](int r, Communicator& c) {
    for (int i = 1; i <= n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds((r + i) % w));  // ranks arrive in varying order
      ++arrived;
      if (i % 3 == 0) c.all_to_all(t, t, {});
      else if (i % 3 == 1) c.all_gather(t, t, {});
      else c.reduce_scatter(t, t, {});
      if (enqueued.load() < w * i) ++late[static_cast<std::size_t>(r)];
    }
  });
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(err[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(spies[static_cast<std::size_t>(r)]->calls, n);
    EXPECT_EQ(spies[static_cast<std::size_t>(r)]->early, 0) << "rank " << r << " enqueued before every rank arrived";
    EXPECT_EQ(late[static_cast<std::size_t>(r)], 0) << "rank " << r << " returned before every rank enqueued";
  }
}

TEST(DcpGroup, LockstepGroupMissingRankThrowsNotHangs) {
  auto group = make_lockstep_group(make_local_group(3, std::chrono::seconds(60)), std::chrono::milliseconds(200));
  const auto err = on_ranks(group, [&](int r, Communicator& c) {
    if (r == 1) throw Error("rank 1 gave up");
    Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({12}, DType::f32);
    c.all_gather(in, out, {});
  });
  EXPECT_NE(err[0].find("waited 200 ms before collective call 1"), std::string::npos) << err[0];
  EXPECT_NE(err[2].find("lockstep group"), std::string::npos) << err[2];
  Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({12}, DType::f32);
  EXPECT_THROW(group[0]->all_gather(in, out, {}), Error);  // unusable after the timeout
  // Communicators out of rank order, a null one, no communicator at all, a zero timeout: refused.
  auto two = make_local_group(2);
  std::swap(two[0], two[1]);
  EXPECT_THROW(make_lockstep_group(std::move(two), std::chrono::seconds(1)), Error);
  std::vector<std::unique_ptr<Communicator>> holes(2);
  EXPECT_THROW(make_lockstep_group(std::move(holes), std::chrono::seconds(1)), Error);
  EXPECT_THROW(make_lockstep_group({}, std::chrono::seconds(1)), Error);
  EXPECT_THROW(make_lockstep_group(make_local_group(2), std::chrono::milliseconds(0)), Error);
}

// Shard r of a PagedBatch as a cache of its own (rows copied byte for byte) and its local block table.
struct Shard {
  CacheBuffer cb;
  Tensor table;
  std::vector<std::vector<int32_t>> rows;
};
Shard shard_of(const test::PagedBatch& pb, const std::vector<int32_t>& lens, int64_t page, const DcpLayout& l,
               int64_t max_blocks) {
  const int64_t b = static_cast<int64_t>(lens.size());
  Shard s{test::nan_cache(pb.cb.cache.format, b * max_blocks + 1, page), {}, {}};
  s.cb.cache.scale = pb.cb.cache.scale;
  const int64_t bytes = cache_entry_bytes(pb.cb.cache.format, pb.cb.cache.d_qk);
  for (int64_t r = 0; r < b; ++r) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < max_blocks; ++j) row.push_back(static_cast<int32_t>(r * max_blocks + j + 1));
    for (int64_t p = 0; p < lens[static_cast<std::size_t>(r)]; ++p)
      if (dcp_owner(p, l) == l.rank) {
        const int64_t lp = dcp_local_position(p, l);
        std::memcpy(const_cast<uint8_t*>(test::row_ptr(s.cb.cache, row[static_cast<std::size_t>(lp / page)] * page + lp % page)),
                    test::row_ptr(pb.cb.cache, pb.slots[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)]),
                    static_cast<std::size_t>(bytes));
      }
    s.rows.push_back(row);
  }
  s.table = test::int_tensor_2d(s.rows);
  return s;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
    }
  }
}

TEST(DcpGroup, DecodeEqualsWholeCache) {
  test::reseed(51);
  const int64_t page = 16, h = 2, mb = 9;
  const std::vector<int32_t> lens = {70, 0, 5, 129};
  const int64_t b = static_cast<int64_t>(lens.size());
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla})
    for (int64_t s_q : {1, 3})
      for (int w : {2, 3})
        for (DcpExchange ex : {DcpExchange::all_to_all, DcpExchange::allgather_reduce_scatter,
                               DcpExchange::all_to_all_overlap}) {
        const std::string what = std::string(to_string(f)) + " s_q " + std::to_string(s_q) + " W " + std::to_string(w) +
                                 " " + to_string(ex);
        test::PagedBatch pb = test::paged_batch(f, page, lens, mb);
        // The group's heads: rank r holds heads [r·h, (r+1)·h) of q_all.
        Tensor q_all = test::random_tensor({b, s_q, w * h, 576}, DType::f32);
        Tensor want = Tensor::empty({b, s_q, w * h, 512}, DType::f32), want_lse = Tensor::empty({b, s_q, w * h}, DType::f32);
        mqa_decode(q_all, pb.cb.cache, pb.block_table, pb.seq_lens, want, want_lse, 0.08, true, {});
        std::vector<Tensor> out(w), lse(w);
        auto group = make_local_group(w);
        const auto err = on_ranks(group, [&](int r, Communicator& c) {
          const DcpLayout l{w, r, 2};
          Shard s = shard_of(pb, lens, page, l, mb);
          std::vector<int32_t> ql(static_cast<std::size_t>(b * s_q));
          dcp_local_query_lengths(lens, s_q, true, l, ql);
          Tensor q = Tensor::empty({b, s_q, h, 576}, DType::f32);
          copy(q, q_all.view().slice(2, r * h, (r + 1) * h));
          out[r] = test::poisoned({b, s_q, h, 512}, DType::f32);
          lse[r] = test::poisoned({b, s_q, h}, DType::f32);
          Tensor ws = Tensor::empty(
              {static_cast<int64_t>(
                  dcp_mqa_decode_workspace_bytes(b, s_q, h, mb, page, DType::f32, w, Device::cpu(), 0, ex))},
              DType::u8);
          dcp_mqa_decode(c, q, s.cb.cache, s.table, test::int_tensor(ql), out[r], lse[r], 0.08, ws, {}, 0, ex);
          c.synchronize({});
        });
        std::vector<double> got, got_lse;
        for (int64_t x = 0; x < b * s_q; ++x)
          for (int r = 0; r < w; ++r) {
            ASSERT_EQ(err[r], "") << what;
            const std::vector<double> o = test::to_doubles(out[r]), l = test::to_doubles(lse[r]);
            got.insert(got.end(), o.begin() + x * h * 512, o.begin() + (x + 1) * h * 512);
            got_lse.insert(got_lse.end(), l.begin() + x * h, l.begin() + (x + 1) * h);
          }
        expect_close(got, test::to_doubles(want), 2e-5, what + " out");
        expect_close(got_lse, test::to_doubles(want_lse), 2e-5, what + " lse");
      }
}

TEST(DcpGroup, SparseEqualsWholeCache) {
  test::reseed(52);
  const int64_t page = 16, h = 2, mb = 6, topk = 20;
  const std::vector<int32_t> lens = {90, 40, 7};
  const int64_t b = static_cast<int64_t>(lens.size());
  const int w = 4;
  test::PagedBatch pb = test::paged_batch(CacheFormat::fp8_ds_mla, page, lens, mb);
  const std::vector<int32_t> flat = test::to_ints(pb.block_table);
  std::vector<std::vector<int32_t>> pos(static_cast<std::size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    std::uniform_int_distribution<int32_t> u(-2, lens[static_cast<std::size_t>(r)] - 1);
    for (int64_t k = 0; k < topk; ++k) pos[r].push_back(std::max(-1, u(test::rng())));
  }
  auto slots = [&](std::vector<std::vector<int32_t>> p, auto&& table_of) {
    for (int64_t r = 0; r < b; ++r)
      for (int32_t& x : p[r])
        if (x >= 0) x = table_of(r, x / page) * static_cast<int32_t>(page) + x % page;
    return test::int_tensor_2d(p);
  };
  Tensor q_all = test::random_tensor({b, w * h, 576}, DType::f32);
  Tensor want = Tensor::empty({b, w * h, 512}, DType::f32), want_lse = Tensor::empty({b, w * h}, DType::f32);
  sparse_mqa(q_all, pb.cb.cache, slots(pos, [&](int64_t r, int64_t j) { return flat[r * mb + j]; }), {}, want, want_lse,
             0.07);
  std::vector<Tensor> out(w), lse(w);
  auto group = make_local_group(w);
  const auto err = on_ranks(group, [&](int r, Communicator& c) {
    const DcpLayout l{w, r, 1};
    Shard s = shard_of(pb, lens, page, l, mb);
    std::vector<std::vector<int32_t>> local = pos;
    for (auto& row : local) dcp_filter_topk(row, l);
    Tensor q = Tensor::empty({b, h, 576}, DType::f32);
    copy(q, q_all.view().slice(1, r * h, (r + 1) * h));
    out[r] = test::poisoned({b, h, 512}, DType::f32);
    lse[r] = test::poisoned({b, h}, DType::f32);
    Tensor ws = Tensor::empty({static_cast<int64_t>(dcp_sparse_mqa_workspace_bytes(b, h, DType::f32, w))}, DType::u8);
    dcp_sparse_mqa(c, q, s.cb.cache, slots(local, [&](int64_t rr, int64_t j) { return s.rows[rr][j]; }), {}, out[r],
                   lse[r], 0.07, ws);
  });
  std::vector<double> got, got_lse;
  for (int64_t x = 0; x < b; ++x)
    for (int r = 0; r < w; ++r) {
      ASSERT_EQ(err[r], "");
      const std::vector<double> o = test::to_doubles(out[r]), l = test::to_doubles(lse[r]);
      got.insert(got.end(), o.begin() + x * h * 512, o.begin() + (x + 1) * h * 512);
      got_lse.insert(got_lse.end(), l.begin() + x * h, l.begin() + (x + 1) * h);
    }
  expect_close(got, test::to_doubles(want), 2e-5, "sparse out");
  expect_close(got_lse, test::to_doubles(want_lse), 2e-5, "sparse lse");
}

// The DeepSeek-V4 step (dcp_sparse_mqa with SparseOptions, dcp_compact_topk; dcp_v4_test_util.h): W = 2 and 4
// threads, each holding its shard of the window and the compressed cache (own interleaves), equal one
// sparse_mqa over the whole caches for the group's heads (float64 oracle): bf16 rows, v4 records, and V4.1's v41
// window with a v41_fp4 compressed cache; 16 and 64 heads; with the sink and without; lonely tokens (no valid
// row anywhere: out 0, lse = the sink exactly, which W sinks would move by ln W), tokens whose rows one rank
// holds, -1 entries, entries past the request's count, valid lengths shorter than the rows (the rows past them
// valid positions of poisoned-if-read caches). Compacted lists, and the filtered (-1 in place) lists once.
TEST(DcpGroup, SparseV4EqualsWholeCache) {
  namespace v4 = test::dcp_v4;
  struct Case {
    CacheFormat main, extra;
    int64_t page_main, page_extra;
    int im, ie;  // interleaves of the window and the compressed cache
  };
  const Case cases[] = {{CacheFormat::bf16, CacheFormat::bf16, 16, 4, 1, 1},
                        {CacheFormat::v4, CacheFormat::v4, 64, 4, 2, 4},
                        {CacheFormat::v41, CacheFormat::v41_fp4, 16, 8, 16, 1}};
  uint64_t seed = 500;
  for (const Case& c : cases)
    for (int64_t h : {16, 64}) {
      const v4::Problem pr = v4::make_problem(
          c.main, c.extra, c.page_main, c.page_extra, h, 9, seed++, [&](int64_t p) { return (p / c.im) % 4 == 0; },
          [&](int64_t e) { return (e / c.ie) % 4 == 0; });
      for (bool sink : {true, false}) {
        const v4::Result want = v4::reference(pr, sink);
        const std::vector<double> wo = test::to_doubles(want.out), wl = test::to_doubles(want.lse);
        for (int w : {2, 4})
          for (v4::Localize how : {v4::Localize::compact, v4::Localize::filter}) {
            if (how == v4::Localize::filter && (h != 16 || w != 4)) continue;
            const std::string what = std::string(to_string(c.main)) + " + " + to_string(c.extra) + " h " +
                                     std::to_string(h) + " W " + std::to_string(w) + (sink ? " sink" : "") +
                                     (how == v4::Localize::filter ? " filtered" : "");
            SCOPED_TRACE(what);
            std::vector<Tensor> out(w), lse(w);
            auto group = make_local_group(w);
            const auto err = on_ranks(group, [&](int r, Communicator& comm) {
              v4::Result res = v4::rank_step(comm, pr, {w, r, c.im}, {w, r, c.ie}, 0, Device::cpu(), DType::f32, sink,
                                             how, v4::poison_host);
              out[r] = res.out;
              lse[r] = res.lse;
            });
            for (int r = 0; r < w; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
            const int64_t hq = h / w;
            const std::vector<double> go = v4::assemble(out, pr.t(), hq * v4::kDqk), gl = v4::assemble(lse, pr.t(), hq);
            expect_close(go, wo, 2e-5, what + " out");
            expect_close(gl, wl, 2e-5, what + " lse");
            // Tokens 1 and 2 have no valid row on any rank: out 0 and lse = the sink itself (one sink, not W).
            for (int64_t tok : {1, 2})
              for (int64_t hh = 0; hh < h; ++hh) {
                const double s = sink ? static_cast<const float*>(pr.sink.data())[hh] : -INFINITY;
                EXPECT_EQ(gl[static_cast<std::size_t>(tok * h + hh)], s) << "token " << tok << " head " << hh;
                for (int64_t x = 0; x < v4::kDqk; ++x)
                  ASSERT_EQ(go[static_cast<std::size_t>((tok * h + hh) * v4::kDqk + x)], 0.0);
              }
          }
      }
    }
}

// The V4 step refuses a sink of the group's heads (it takes the rank's own) on every rank, before any
// collective: no rank is left waiting.
TEST(DcpGroup, SparseV4RefusesTheGroupsSinkEverywhere) {
  namespace v4 = test::dcp_v4;
  const int w = 2;
  const v4::Problem pr = v4::make_problem(CacheFormat::bf16, CacheFormat::bf16, 16, 4, 4, 3, 77,
                                          [](int64_t) { return true; }, [](int64_t) { return true; });
  auto group = make_local_group(w, std::chrono::milliseconds(2000));
  const auto err = on_ranks(group, [&](int, Communicator& comm) {
    const int64_t t = pr.t(), hq = pr.h / w;
    Tensor q = Tensor::zeros({t, hq, v4::kDqk}, DType::f32), out = Tensor::empty({t, hq, v4::kDqk}, DType::f32);
    Tensor rows = test::int_tensor_2d(std::vector<std::vector<int32_t>>(static_cast<std::size_t>(t), {-1}));
    const CacheBuffer cb = allocate_cache(CacheFormat::bf16, 1, 16, Device::cpu(), 1.0f, 512, 64);
    SparseOptions o;
    o.attn_sink = pr.sink.view();  // [h], not [h / W]
    o.values_include_rope = true;
    Tensor ws = Tensor::empty({static_cast<int64_t>(dcp_sparse_mqa_workspace_bytes(t, hq, DType::f32, w, 512, 512))},
                              DType::u8);
    dcp_sparse_mqa(comm, q, cb.cache, rows, {}, out, {}, pr.scale, o, ws);
  });
  for (int r = 0; r < w; ++r) EXPECT_NE(err[r].find("attn_sink"), std::string::npos) << err[r];
}

// W socket-group ranks on W threads (each connects as a process would; rank 0 listens on `path`).
std::vector<std::unique_ptr<Communicator>> socket_group(const std::string& path, int w,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<std::unique_ptr<Communicator>> group(static_cast<std::size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] { group[static_cast<std::size_t>(r)] = make_socket_communicator(path, w, r, timeout); });
  for (auto& t : threads) t.join();
  return group;
}

std::string socket_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("mla_dcp_") + name + "_" + std::to_string(::getpid())))
      .string();
}

TEST(DcpSocketGroup, CollectivesPlaceBlocks) {
  auto group = socket_group(socket_path("place"), 3);
  expect_collectives_place_blocks(group);
  EXPECT_EQ(group[1]->backend(), "socket");
}

TEST(DcpSocketGroup, DecodeThroughSocketsEqualsLocalGroup) {
  test::reseed(53);
  const int64_t page = 16, h = 2, mb = 9, b = 2;
  const std::vector<int32_t> lens = {70, 33};
  const int w = 2;
  test::PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, lens, mb);
  Tensor q_all = test::random_tensor({b, 1, w * h, 576}, DType::f32);
  std::vector<std::vector<double>> got(2);
  for (int kind = 0; kind < 2; ++kind) {
    auto group = kind == 0 ? make_local_group(w) : socket_group(socket_path("decode"), w);
    std::vector<Tensor> out(w);
    const auto err = on_ranks(group, [&](int r, Communicator& c) {
      const DcpLayout l{w, r, 1};
      Shard s = shard_of(pb, lens, page, l, mb);
      std::vector<int32_t> ql(static_cast<std::size_t>(b));
      dcp_local_query_lengths(lens, 1, true, l, ql);
      Tensor q = Tensor::empty({b, 1, h, 576}, DType::f32);
      copy(q, q_all.view().slice(2, r * h, (r + 1) * h));
      out[r] = test::poisoned({b, 1, h, 512}, DType::f32);
      Tensor ws = Tensor::empty(
          {static_cast<int64_t>(dcp_mqa_decode_workspace_bytes(b, 1, h, mb, page, DType::f32, w, Device::cpu()))},
          DType::u8);
      dcp_mqa_decode(c, q, s.cb.cache, s.table, test::int_tensor(ql), out[r], {}, 0.08, ws);
    });
    for (int r = 0; r < w; ++r) {
      ASSERT_EQ(err[r], "");
      const std::vector<double> o = test::to_doubles(out[r]);
      got[kind].insert(got[kind].end(), o.begin(), o.end());
    }
  }
  EXPECT_EQ(got[0], got[1]);  // the same bytes moved: bit-equal
}

TEST(DcpSocketGroup, DeadOrAbsentRankThrowsNotHangs) {
  {  // rank 2 never starts: ranks 0 and 1 throw within the timeout
    std::vector<std::string> err(2);
    std::vector<std::thread> threads;
    const std::string path = socket_path("absent");
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          make_socket_communicator(path, 3, r, std::chrono::milliseconds(300));
        } catch (const std::exception& e) {
          err[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_NE(err[0].find("only 1 of the other ranks connected"), std::string::npos) << err[0];
  }
  {  // rank 1 dies (its connection closes) before a collective: the others throw naming it
    auto group = socket_group(socket_path("dead"), 3, std::chrono::milliseconds(2000));
    group[1].reset();
    std::vector<std::string> err(3);
    std::vector<std::thread> threads;
    for (int r : {0, 2})
      threads.emplace_back([&, r] {
        try {
          Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({12}, DType::f32);
          group[static_cast<std::size_t>(r)]->all_gather(in, out, {});
        } catch (const std::exception& e) {
          err[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_NE(err[0].find("rank 1 of 3 failed"), std::string::npos) << err[0];
    EXPECT_NE(err[2].find("rank 1 of 3 failed"), std::string::npos) << err[2];
    EXPECT_THROW(group[0]->synchronize({}), Error);  // unusable afterwards
  }
  {  // rank 0 (the relay) dies: the others throw naming it
    auto group = socket_group(socket_path("root"), 2, std::chrono::milliseconds(2000));
    group[0].reset();
    Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({8}, DType::f32);
    try {
      group[1]->all_gather(in, out, {});
      ADD_FAILURE() << "rank 1 did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 closed its connection"), std::string::npos) << e.what();
    }
  }
  {  // a mismatch: every rank throws
    auto group = socket_group(socket_path("mismatch"), 2);
    const auto err = on_ranks(group, [&](int r, Communicator& c) {
      Tensor in = Tensor::zeros({r + 1}, DType::f32), out = Tensor::zeros({2 * (r + 1)}, DType::f32);
      c.all_gather(in, out, {});
    });
    for (const std::string& e : err) EXPECT_NE(e.find("rank 0 called"), std::string::npos) << e;
  }
}

// A peer that lies (issue 51): the frames are checked against the caller's own collective before a
// payload byte is read, and every rank throws.
using dist::SocketFrame;

dist::SocketFrame frame(uint32_t kind, int rank, int32_t dtype, int64_t bytes) {
  SocketFrame f;
  f.kind = kind;
  f.rank = rank;
  f.dtype = dtype;
  f.bytes = bytes;
  return f;
}

int connect_to(const std::string& path) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

void send_bytes(int fd, const void* p, std::size_t n) { ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), ssize_t(n)); }

TEST(DcpSocketGroup, LyingPeerIsRefusedOnEveryRankBeforeItsPayload) {
  // Ranks 0 and 2 call all_gather of 1024 floats; "rank 1" announces a 1-byte payload. The old relay
  // sized its buffer by the peer's word and sent rank 0's heap bytes past it to every rank.
  const std::string path = socket_path("liar");
  std::vector<std::unique_ptr<Communicator>> group(3);
  std::vector<std::string> err(3);
  std::vector<Tensor> outs(3);
  std::vector<std::thread> threads;
  for (int r : {0, 2})
    threads.emplace_back([&, r] {
      try {
        group[r] = make_socket_communicator(path, 3, r, std::chrono::milliseconds(5000));
        Tensor in = Tensor::zeros({1024}, DType::f32);
        outs[r] = test::poisoned({3 * 1024}, DType::f32);
        group[r]->all_gather(in, outs[r], {});
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  const int fd = connect_to(path);
  ASSERT_GE(fd, 0);
  const SocketFrame hello = frame(SocketFrame::kHello, 1, -1, 3);
  send_bytes(fd, &hello, sizeof hello);
  SocketFrame w{};
  ASSERT_EQ(::recv(fd, &w, sizeof w, MSG_WAITALL), ssize_t(sizeof w));
  EXPECT_EQ(w.kind, SocketFrame::kHello);
  EXPECT_EQ(w.bytes, 3);
  const SocketFrame lie = frame(SocketFrame::kAllGather, 1, static_cast<int32_t>(DType::f32), 1);
  send_bytes(fd, &lie, sizeof lie);
  send_bytes(fd, "x", 1);
  // The liar's reply: the failure, no payload.
  SocketFrame r{};
  ASSERT_EQ(::recv(fd, &r, sizeof r, MSG_WAITALL), ssize_t(sizeof r));
  EXPECT_EQ(r.bytes, 0);
  EXPECT_GT(r.text_len, 0u);
  for (auto& t : threads) t.join();
  ::close(fd);
  for (int k : {0, 2})
    EXPECT_NE(err[k].find("rank 0 called all_gather of 4096 bytes (f32) but rank 1 called all_gather of 1 bytes"),
              std::string::npos)
        << "rank " << k << ": " << err[k];
  const Tensor fresh = test::poisoned({3 * 1024}, DType::f32);
  EXPECT_EQ(std::memcmp(outs[2].data(), fresh.data(), fresh.nbytes()), 0);  // nothing written
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(DcpSocketGroup, LyingRootIsRefusedBeforeItsPayload) {
  // Rank 1 over a socket pair; this test plays rank 0 and answers with frames that do not match.
  struct Case {
    SocketFrame reply;
    const char* want;
  };
  const int32_t f32 = static_cast<int32_t>(DType::f32);
  const std::vector<Case> cases = {
      {frame(SocketFrame::kAllGather, 1, f32, 7), "rank 0 answered with all_gather of 7 bytes"},
      {frame(SocketFrame::kAllToAll, 1, f32, 32), "rank 0 answered with all_to_all"},
      {frame(SocketFrame::kAllGather, 0, f32, 32), "for rank 0"},
      {frame(SocketFrame::kAllGather, 1, static_cast<int32_t>(DType::i32), 32), "(i32)"},
      [&] {
        Case c{frame(SocketFrame::kAllGather, 1, f32, 0), "answered with all_gather of 0 bytes"};
        c.reply.text_len = SocketFrame::kMaxText + 1;  // an error text longer than any the group sends
        return c;
      }(),
  };
  for (const Case& c : cases) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const SocketFrame welcome = frame(SocketFrame::kHello, 1, -1, 2);
    send_bytes(sv[1], &welcome, sizeof welcome);
    auto rank1 = dist::socket_communicator_from_fds(2, 1, {sv[0]}, std::chrono::milliseconds(2000));
    send_bytes(sv[1], &c.reply, sizeof c.reply);
    send_bytes(sv[1], std::vector<char>(64, 'z').data(), 64);  // bytes the frame promises, never read
    Tensor in = Tensor::zeros({4}, DType::f32), out = test::poisoned({8}, DType::f32);
    const Tensor fresh = test::poisoned({8}, DType::f32);
    try {
      rank1->all_gather(in, out, {});
      ADD_FAILURE() << "accepted " << c.want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.want), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(out.data(), fresh.data(), fresh.nbytes()), 0) << c.want;
    EXPECT_THROW(rank1->synchronize({}), Error);
    ::close(sv[1]);
  }
}

TEST(DcpSocketGroup, HelloOfAnotherWorldFailsEveryRank) {
  const std::string path = socket_path("world");
  std::vector<std::string> err(2);
  std::thread root([&] {
    try {
      make_socket_communicator(path, 3, 0, std::chrono::milliseconds(5000));
    } catch (const std::exception& e) {
      err[0] = e.what();
    }
  });
  std::thread good([&] {
    try {
      make_socket_communicator(path, 3, 2, std::chrono::milliseconds(5000));
    } catch (const std::exception& e) {
      err[1] = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int fd = connect_to(path);
  ASSERT_GE(fd, 0);
  const SocketFrame hello = frame(SocketFrame::kHello, 1, -1, 4);  // a group of 4
  send_bytes(fd, &hello, sizeof hello);
  root.join();
  good.join();
  ::close(fd);
  for (const std::string& e : err) EXPECT_NE(e.find("a group of 4"), std::string::npos) << e;
}

TEST(DcpSocketGroup, RendezvousRemovesOnlyItsOwnSocket) {
  // A file at the rendezvous path is not the group's: refused, left in place (it used to be unlinked).
  const std::string path = socket_path("keep");
  { std::ofstream(path) << "precious"; }
  EXPECT_THROW(make_socket_communicator(path, 2, 0, std::chrono::milliseconds(200)), Error);
  std::ifstream in(path);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "precious");
  std::filesystem::remove(path);
  // The group's own socket is gone after a failed rendezvous (rank 1 never came).
  EXPECT_THROW(make_socket_communicator(path, 2, 0, std::chrono::milliseconds(100)), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace mla
