// SPDX-License-Identifier: Apache-2.0
// DCP collectives over NCCL on CUDA (mla/comm.h, mla/dcp.h): one thread per GPU, one NCCL rank each
// (W = every GPU of the machine, up to 4; on a one-GPU machine W = 1 still runs the gather / reorder /
// exchange / combine path). dcp_mqa_decode (causal s_q 1 and 2; every DcpExchange) and dcp_sparse_mqa over the W shards
// are compared with the float64 CPU oracle attending the whole cache, at the bf16 rule plus the
// extra rounding of the bf16 partials (two bf16 quanta of max|ref|). The DeepSeek-V4 step (dcp_sparse_mqa with
// SparseOptions over shards of both caches, dcp_compact_topk) on W = 2 and 4 GPUs (skipped on one), also with
// every shard's rows past 4 GiB into its caches (64-bit row addresses).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "attention_gpu_util.h"
#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "mla/variants.h"
#include "runtime/device_api.h"
#include "unit/attention_test_util.h"
#include "unit/dcp_v4_test_util.h"

namespace mla {
namespace {

int gpus() { return std::min(cuda_device_count(), 4); }

// Rows of the positions rank l.rank owns, copied into a host cache of its own; block table [b, mb].
struct HostShard {
  CacheBuffer cb;
  std::vector<std::vector<int32_t>> rows;
};
HostShard host_shard(const test::PagedBatch& pb, const std::vector<int32_t>& lens, int64_t page, const DcpLayout& l,
                     int64_t mb) {
  HostShard s{test::nan_cache(pb.cb.cache.format, static_cast<int64_t>(lens.size()) * mb + 1, page), {}};
  s.cb.cache.scale = pb.cb.cache.scale;
  const int64_t bytes = cache_entry_bytes(pb.cb.cache.format, pb.cb.cache.d_qk);
  for (std::size_t r = 0; r < lens.size(); ++r) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < mb; ++j) row.push_back(static_cast<int32_t>(static_cast<int64_t>(r) * mb + j + 1));
    for (int64_t p = 0; p < lens[r]; ++p)
      if (dcp_owner(p, l) == l.rank) {
        const int64_t lp = dcp_local_position(p, l);
        std::memcpy(const_cast<uint8_t*>(test::row_ptr(s.cb.cache, row[static_cast<std::size_t>(lp / page)] * page + lp % page)),
                    test::row_ptr(pb.cb.cache, pb.slots[r][static_cast<std::size_t>(p)]), static_cast<std::size_t>(bytes));
      }
    s.rows.push_back(row);
  }
  return s;
}

KVCache on_device(const CacheBuffer& host, Tensor& storage, Device dev) {
  storage = host.storage.to(dev);
  KVCache c = host.cache;
  c.data.data = storage.data();
  c.data.device = dev;
  return c;
}

TEST(DcpGpu, NcclDecodeAndSparseMatchWholeCache) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const int w = gpus();
  test::reseed(61);
  const int64_t page = 64, mb = 40;
  const std::vector<int32_t> lens = {2000, 0, 37, 2500, 700};
  const int64_t b = static_cast<int64_t>(lens.size());
  // Heads per rank: 16, and 64 / W where that differs, so that every W runs a 64-row problem on each rank
  // (the sparse op attends W h heads per rank; the decode op W h rows per request).
  std::vector<int64_t> heads = {16};
  if (64 / w != 16) heads.push_back(64 / w);
  for (const int64_t h : heads)
  for (CacheFormat f : test::kDeviceFormats)
    for (int64_t s_q : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << to_string(f) << " s_q " << s_q << " W " << w << " h " << h);
      const NcclId id = nccl_make_id();  // one id per communicator group: NCCL refuses a reused one
      test::PagedBatch pb = test::paged_batch(f, page, lens, mb);
      Tensor q_all = test::random_tensor({b, s_q, w * h, 576}, DType::bf16);
      Tensor want = Tensor::empty({b, s_q, w * h, 512}, DType::f64), want_lse = Tensor::empty({b, s_q, w * h}, DType::f64);
      mqa_decode(q_all, pb.cb.cache, pb.block_table, pb.seq_lens, want, want_lse, 0.06, true, {}, test::reference_ctx());
      // Sparse: token r of request r attends 64 random positions below its length (-1 where empty).
      std::vector<std::vector<int32_t>> pos(static_cast<std::size_t>(b));
      for (int64_t r = 0; r < b; ++r)
        for (int k = 0; k < 64; ++k)
          pos[r].push_back(lens[r] ? std::uniform_int_distribution<int32_t>(0, lens[r] - 1)(test::rng()) : -1);
      const std::vector<int32_t> flat = test::to_ints(pb.block_table);
      auto slots = [&](std::vector<std::vector<int32_t>> p, const std::vector<std::vector<int32_t>>& table) {
        for (int64_t r = 0; r < b; ++r)
          for (int32_t& x : p[r])
            if (x >= 0) x = table[r][static_cast<std::size_t>(x / page)] * static_cast<int32_t>(page) + x % page;
        return test::int_tensor_2d(p);
      };
      std::vector<std::vector<int32_t>> global_table;
      for (int64_t r = 0; r < b; ++r) global_table.emplace_back(flat.begin() + r * mb, flat.begin() + (r + 1) * mb);
      Tensor q_tok4 = Tensor::empty({b, 1, w * h, 576}, DType::bf16);
      copy(q_tok4, q_all.view().slice(1, 0, 1));
      const TensorView q_tok = q_tok4.view().reshape({b, w * h, 576});
      Tensor swant = Tensor::empty({b, w * h, 512}, DType::f64), swant_lse = Tensor::empty({b, w * h}, DType::f64);
      sparse_mqa(q_tok, pb.cb.cache, slots(pos, global_table), {}, swant, swant_lse, 0.06, test::reference_ctx());

      constexpr DcpExchange kExchanges[] = {DcpExchange::all_to_all, DcpExchange::allgather_reduce_scatter,
                                            DcpExchange::all_to_all_overlap};
      std::vector<Tensor> outs[3], lses[3], sout(w), slse(w);
      for (int e = 0; e < 3; ++e) {
        outs[e].resize(w);
        lses[e].resize(w);
      }
      std::vector<std::string> err(w);
      std::vector<std::thread> ranks;
      // The rank threads never choose a current device (every thread stays on device 0): each call must run on
      // the device of its tensors and communicator, null streams included.
      for (int r = 0; r < w; ++r)
        ranks.emplace_back([&, r] {
          try {
            const Device dev = Device::cuda(r);
            auto comm = make_nccl_communicator(id, w, r, r, std::chrono::seconds(60));
            const DcpLayout l{w, r, 1};
            HostShard hs = host_shard(pb, lens, page, l, mb);
            Tensor storage;
            const KVCache cache = on_device(hs.cb, storage, dev);
            std::vector<int32_t> ql(static_cast<std::size_t>(b * s_q));
            dcp_local_query_lengths(lens, s_q, true, l, ql);
            Tensor q = Tensor::empty({b, s_q, h, 576}, DType::bf16);
            copy(q, q_all.view().slice(2, r * h, (r + 1) * h));
            const Tensor qd = q.to(dev), table = test::int_tensor_2d(hs.rows, dev), qlens = test::int_tensor(ql, dev);
            for (int e = 0; e < 3; ++e) {  // every exchange; the NaN-poisoned workspace shows unwritten reads
              outs[e][r] = test::poisoned({b, s_q, h, 512}, DType::bf16, dev);
              lses[e][r] = test::poisoned({b, s_q, h}, DType::f32, dev);
              const auto wsb = static_cast<int64_t>(
                  dcp_mqa_decode_workspace_bytes(b, s_q, h, mb, page, DType::bf16, w, dev, 0, kExchanges[e]));
              const Tensor poison = test::poisoned({(wsb + 1) / 2}, DType::bf16, dev);
              const TensorView ws(poison.data(), DType::u8, {wsb}, dev);
              dcp_mqa_decode(*comm, qd, cache, table, qlens, outs[e][r], lses[e][r], 0.06, ws, {}, 0, kExchanges[e]);
            }
            // Sparse, s_q = 1 tokens (the first query of each request).
            std::vector<std::vector<int32_t>> local = pos;
            for (auto& row : local) dcp_filter_topk(row, l);
            Tensor qs = Tensor::empty({b, h, 576}, DType::bf16);
            copy(qs, q_tok.slice(1, r * h, (r + 1) * h));
            sout[r] = test::poisoned({b, h, 512}, DType::bf16, dev);
            slse[r] = test::poisoned({b, h}, DType::f32, dev);
            Tensor sws = Tensor::empty({static_cast<int64_t>(dcp_sparse_mqa_workspace_bytes(b, h, DType::bf16, w))},
                                       DType::u8, dev);
            dcp_sparse_mqa(*comm, qs.to(dev), cache, slots(local, hs.rows).to(dev), {}, sout[r], slse[r], 0.06, sws);
            comm->synchronize({});
          } catch (const std::exception& e) {
            err[r] = e.what();
          }
        });
      for (auto& t : ranks) t.join();
      for (int r = 0; r < w; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
      // The sm90 converter and seesaw kernels read fp8_ds_mla rows (sparse_mqa, mqa_decode) as their bf16 upconvert
      // (fp8: exact codes; docs/SEMANTICS.md §14.9); automatic selection runs one of them above 32 rows per request.
      // Each rank runs the group's W h heads over its shard: dcp_sparse_mqa gathers every rank's queries (W h heads per token),
      // and dcp_mqa_decode runs each (request, query) row as a request whose W queries are the ranks' head
      // blocks (W h rows).
      const bool sparse_up = test::ran_upconverted("sparse_mqa", f);
      const bool decode_up = test::ran_upconverted("mqa_decode", f);
      if (sparse_up || decode_up) {
        const CacheBuffer up = test::upconverted_cache(pb.cb.cache);
        if (sparse_up) sparse_mqa(q_tok, up.cache, slots(pos, global_table), {}, swant, swant_lse, 0.06, test::reference_ctx());
        if (decode_up)
          mqa_decode(q_all, up.cache, pb.block_table, pb.seq_lens, want, want_lse, 0.06, true, {}, test::reference_ctx());
      }
      auto assemble = [&](std::vector<Tensor>& parts, int64_t rows, int64_t per_row) {
        std::vector<double> all;
        std::vector<std::vector<double>> host;
        for (Tensor& t : parts) host.push_back(test::to_doubles(t));
        for (int64_t x = 0; x < rows; ++x)
          for (int r = 0; r < w; ++r)
            all.insert(all.end(), host[r].begin() + x * per_row, host[r].begin() + (x + 1) * per_row);
        return all;
      };
      for (int e = 0; e < 3; ++e) {
        SCOPED_TRACE(to_string(kExchanges[e]));
        EXPECT_EQ(test::check_close(assemble(outs[e], b * s_q, h * 512), test::to_doubles(want), DType::bf16, 8e-3), "");
        EXPECT_EQ(test::check_close(assemble(lses[e], b * s_q, h), test::to_doubles(want_lse), DType::f32, 1e-5), "");
      }
      EXPECT_EQ(test::check_close(assemble(sout, b, h * 512), test::to_doubles(swant), DType::bf16, 8e-3), "");
      EXPECT_EQ(test::check_close(assemble(slse, b, h), test::to_doubles(swant_lse), DType::f32, 1e-5), "");
    }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

namespace v4 = test::dcp_v4;

// A device cache poisoned with 0xff bytes by a device memset (caches of several GiB: no host copy).
void poison_device(CacheBuffer& cb) {
  cuda_rt::memset(cb.storage.data(), cb.storage.device().index, 0xff, cb.storage.nbytes());
}

// Runs the V4 step of problem `pr` on W GPUs (NCCL, one thread per GPU) and compares each rank's heads with the
// float64 oracle over the whole caches: bf16 rule plus two bf16 quanta of max|ref| for the output (the partials
// travel in bf16), 1e-5 for the LSE; the lonely tokens 1 and 2 give out 0 and lse = the sink exactly (one sink, not
// W). block_base: the first block of every shard's rows (a large one puts them past 4 GiB into the caches).
void check_v4_group(const v4::Problem& pr, int w, int im, int ie, bool sink, int64_t block_base, const std::string& what) {
  SCOPED_TRACE(what);
  const v4::Result want = v4::reference(pr, sink);
  const NcclId id = nccl_make_id();
  std::vector<Tensor> out(w), lse(w);
  std::vector<std::string> err(w);
  std::vector<std::thread> ranks;
  for (int r = 0; r < w; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto comm = make_nccl_communicator(id, w, r, r, std::chrono::seconds(60));
        v4::Result res = v4::rank_step(*comm, pr, {w, r, im}, {w, r, ie}, block_base, Device::cuda(r), DType::bf16,
                                       sink, v4::Localize::compact, poison_device);
        out[r] = res.out;
        lse[r] = res.lse;
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < w; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  const int64_t h = pr.h, hq = h / w;
  const std::vector<double> go = v4::assemble(out, pr.t(), hq * v4::kDqk), gl = v4::assemble(lse, pr.t(), hq);
  EXPECT_EQ(test::check_close(go, test::to_doubles(want.out), DType::bf16, 8e-3), "") << "out";
  EXPECT_EQ(test::check_close(gl, test::to_doubles(want.lse), DType::f32, 1e-5), "") << "lse";
  for (int64_t tok : {1, 2})
    for (int64_t hh = 0; hh < h; ++hh) {
      const double s = sink ? static_cast<const float*>(pr.sink.data())[hh] : -INFINITY;
      EXPECT_EQ(gl[static_cast<std::size_t>(tok * h + hh)], s) << "token " << tok << " head " << hh;
      for (int64_t x = 0; x < v4::kDqk; ++x) ASSERT_EQ(go[static_cast<std::size_t>((tok * h + hh) * v4::kDqk + x)], 0.0);
    }
}

std::vector<int> v4_worlds() {
  std::vector<int> ws;
  for (int w : {2, 4})
    if (w <= gpus()) ws.push_back(w);
  return ws;
}

// bf16 rows, v4 records, V4.1's v41 window + v41_fp4 compressed cache; 16 and 64 heads of the group; with and
// without the sink; W = 2 and 4 (the GPUs present).
TEST(DcpGpu, SparseV4NcclMatchesWholeCache) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs (nvidia-h100-x2 / x4)";
  struct Case {
    CacheFormat main, extra;
    int64_t page_main, page_extra;
    int im, ie;
  };
  const Case cases[] = {{CacheFormat::bf16, CacheFormat::bf16, 64, 64, 1, 1},
                        {CacheFormat::v4, CacheFormat::v4, 64, 4, 2, 4},
                        {CacheFormat::v41, CacheFormat::v41_fp4, 16, 64, 16, 1}};
  uint64_t seed = 600;
  for (const Case& c : cases)
    for (int64_t h : {16, 64}) {
      const v4::Problem pr = v4::make_problem(
          c.main, c.extra, c.page_main, c.page_extra, h, 9, seed++, [&](int64_t p) { return (p / c.im) % 4 == 0; },
          [&](int64_t e) { return (e / c.ie) % 4 == 0; });
      for (bool sink : {true, false})
        for (int w : v4_worlds())
          check_v4_group(pr, w, c.im, c.ie, sink,
                         0, std::string(to_string(c.main)) + " + " + to_string(c.extra) + " h " + std::to_string(h) +
                                " W " + std::to_string(w) + (sink ? " sink" : ""));
    }
}

// Host-offloaded sparse caches reach millions of rows: every shard's rows sit past 4 GiB into its caches
// (window v41 528 B and compressed v41_fp4 288 B rows, page 64: rows from ~15M on), so a 32-bit byte address or
// row product anywhere in the step (localize, convert, the kernels' record reads) reads the wrong row (poisoned).
TEST(DcpGpu, SparseV4RowsPast4GiB) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs (nvidia-h100-x2 / x4)";
  const int64_t page = 64;
  const int64_t block_base = ((int64_t{1} << 32) + page * 288 - 1) / (page * 288) + 1;  // past 4 GiB in both caches
  const v4::Problem pr = v4::make_problem(CacheFormat::v41, CacheFormat::v41_fp4, page, page, 16, 9, 700,
                                          [](int64_t p) { return p % 4 == 0; }, [](int64_t e) { return e % 4 == 0; });
  const int w = gpus() >= 4 ? 4 : 2;
  check_v4_group(pr, w, 1, 1, true, block_base, "v41 + v41_fp4 past 4 GiB W " + std::to_string(w));
}

TEST(DcpGpu, CompactTopkMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(85);
  const int64_t t = 300, k = 700;
  std::vector<int32_t> lens = {5000, 0, 77, 131072}, req, valid;
  std::vector<std::vector<int32_t>> idx(static_cast<std::size_t>(t));
  std::uniform_int_distribution<int32_t> u(-5, 140000), v(-3, static_cast<int32_t>(k) + 40);
  for (int64_t i = 0; i < t; ++i) {
    req.push_back(static_cast<int32_t>(i % 5) - (i % 7 == 0 ? 9 : 0));
    valid.push_back(v(test::rng()));
    for (int64_t j = 0; j < k; ++j) idx[i].push_back(u(test::rng()));
  }
  const Device gpu = Device::cuda(0);
  const Tensor r = test::int_tensor(req), l = test::int_tensor(lens), x = test::int_tensor_2d(idx), vl = test::int_tensor(valid);
  for (DcpLayout lay : {DcpLayout{2, 0, 1}, DcpLayout{4, 3, 64}, DcpLayout{1, 0, 1}})
    for (bool lengths : {true, false}) {
      Tensor want = Tensor::empty({t, k}, DType::i32), wn = Tensor::empty({t}, DType::i32);
      Tensor got = test::poisoned({t, k}, DType::i32, gpu), gn = test::poisoned({t}, DType::i32, gpu);
      dcp_compact_topk(r, l, x, lengths ? vl.view() : TensorView{}, want, wn, lay);
      const Tensor rd = r.to(gpu), ld = l.to(gpu), xd = x.to(gpu), vd = vl.to(gpu);
      dcp_compact_topk(rd, ld, xd, lengths ? vd.view() : TensorView{}, got, gn, lay);
      EXPECT_EQ(test::to_ints(got), test::to_ints(want));
      EXPECT_EQ(test::to_ints(gn), test::to_ints(wn));
    }
}

TEST(DcpGpu, LocalizeTopkMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU();
  test::reseed(82);
  const int64_t t = 300, k = 2048;
  std::vector<int32_t> lens = {5000, 0, 77, 131072}, req;
  std::vector<std::vector<int32_t>> idx(static_cast<std::size_t>(t));
  std::uniform_int_distribution<int32_t> u(-5, 140000);
  for (int64_t i = 0; i < t; ++i) {
    req.push_back(static_cast<int32_t>(i % 5) - (i % 7 == 0 ? 9 : 0));
    for (int64_t j = 0; j < k; ++j) idx[i].push_back(u(test::rng()));
  }
  const Tensor r = test::int_tensor(req), l = test::int_tensor(lens), x = test::int_tensor_2d(idx);
  for (DcpLayout lay : {DcpLayout{2, 0, 1}, DcpLayout{4, 3, 64}}) {
    Tensor want = Tensor::empty({t, k}, DType::i32), got = Tensor::empty({t, k}, DType::i32, Device::cuda(0));
    dcp_localize_topk(r, l, x, want, lay);
    dcp_localize_topk(r.to(Device::cuda(0)), l.to(Device::cuda(0)), x.to(Device::cuda(0)), got, lay);
    EXPECT_EQ(test::to_ints(got), test::to_ints(want));
  }
}

}  // namespace
}  // namespace mla
