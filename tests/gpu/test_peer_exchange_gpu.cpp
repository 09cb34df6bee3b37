// SPDX-License-Identifier: Apache-2.0
// The peer exchange (mla/comm.h make_peer_group; runtime/peer_exchange.cu): ranks as threads, one GPU
// each (every GPU up to 4; W = 1 on a one-GPU machine still runs the kernel's own-block path and its
// epochs). all_gather / all_to_all put every byte where NCCL does, over many calls (both window
// parities, blocks of 16 B to the slot's size; larger or unaligned blocks go to NCCL), also replayed
// from a CUDA graph (the epoch lives on the device); dcp_mqa_decode through it equals NCCL's bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "gpu_test_util.h"
#include "support/test_util.h"
#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/ops.h"

namespace mla {
namespace {

int gpus() { return std::min(cuda_device_count(), 4); }

// W NCCL ranks (a thread each), then the peer windows and the lockstep wrapper.
std::vector<std::unique_ptr<Communicator>> peer_group(int w, std::vector<Communicator*>* nccl = nullptr) {
  const NcclId id = nccl_make_id();
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(w));
  std::vector<std::thread> init;
  for (int r = 0; r < w; ++r)
    init.emplace_back([&, r] { comms[r] = make_nccl_communicator(id, w, r, r, std::chrono::seconds(60)); });
  for (auto& t : init) t.join();
  if (nccl)
    for (auto& c : comms) nccl->push_back(c.get());
  return make_lockstep_group(make_peer_group(std::move(comms), std::chrono::seconds(60)), std::chrono::seconds(60));
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto nb = static_cast<int64_t>(t.nbytes());
  std::vector<uint8_t> v(t.nbytes());
  copy(TensorView(v.data(), DType::u8, {nb}, Device::cpu()), TensorView(t.data(), DType::u8, {nb}, t.device()));
  return v;
}

// Rank r's input byte i of a call: a value no other (rank, call, i) repeats often.
uint8_t pattern(int r, int call, int64_t i) { return static_cast<uint8_t>((r * 131 + call * 29 + i * 7 + (i >> 8)) & 255); }

template <class F>
std::vector<std::string> on_ranks(int w, F&& body) {
  std::vector<std::string> err(static_cast<std::size_t>(w));
  std::vector<std::thread> ts;
  for (int r = 0; r < w; ++r)
    ts.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

TEST(PeerExchangeGpu, BlocksLandWhereNcclPutsThem) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const int w = gpus();
  auto group = peer_group(w);
  EXPECT_NE(group[0]->backend().find("peer"), std::string::npos) << group[0]->backend();
  // 16 B .. the slot (8 MiB window: (8 MiB - 256) / 2W rounded down to 256), past it, and unaligned.
  const int64_t slot = ((int64_t{8} << 20) - 256) / (2 * w) / 256 * 256;
  const std::vector<int64_t> sizes = {16, 4112, 65536 + 48, slot, slot + 16, 24, 1 << 20, 16};
  const auto err = on_ranks(w, [&](int r) {
    const Device dev = Device::cuda(r);
    Communicator& c = *group[static_cast<std::size_t>(r)];
    int call = 0;
    for (int64_t n : sizes) {
      for (int gather = 0; gather < 2; ++gather, ++call) {
        const int64_t in_bytes = gather ? n : n * w;
        std::vector<uint8_t> in(static_cast<std::size_t>(in_bytes));
        for (int64_t i = 0; i < in_bytes; ++i) in[static_cast<std::size_t>(i)] = pattern(r, call, i);
        Tensor din = Tensor::empty({in_bytes}, DType::u8, dev), dout = Tensor::empty({n * w}, DType::u8, dev);
        copy(din.view(), TensorView(in.data(), DType::u8, {in_bytes}, Device::cpu()));
        if (gather) c.all_gather(din.view(), dout.view(), {});
        else c.all_to_all(din.view(), dout.view(), {});
        c.synchronize({});
        const std::vector<uint8_t> got = bytes_of(dout);
        for (int p = 0; p < w; ++p)  // block p: rank p's input (all_gather) / block r of rank p's (all_to_all)
          for (int64_t i = 0; i < n; ++i) {
            const uint8_t want = pattern(p, call, gather ? i : r * n + i);
            if (got[static_cast<std::size_t>(p * n + i)] != want)
              throw Error("call " + std::to_string(call) + " (" + (gather ? "all_gather" : "all_to_all") + ", " +
                          std::to_string(n) + " B): block " + std::to_string(p) + " byte " + std::to_string(i) +
                          " wrong");
          }
      }
    }
    // A CUDA graph of three all_gathers, replayed twice: each replay moves the inputs of that moment.
    cudaSetDevice(r);
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const Context ctx{s, Precision::fast};
    const int64_t n = 4096;
    Tensor din = Tensor::empty({n}, DType::u8, dev), dout[3];
    for (auto& t : dout) t = Tensor::empty({n * w}, DType::u8, dev);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) throw Error("capture failed");
    for (auto& t : dout) c.all_gather(din.view(), t.view(), ctx);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
      throw Error("graph instantiation failed");
    for (int rep = 0; rep < 2; ++rep, ++call) {
      std::vector<uint8_t> in(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = pattern(r, call, i);
      copy(din.view(), TensorView(in.data(), DType::u8, {n}, Device::cpu()));
      group[static_cast<std::size_t>(r)]->synchronize({});
      if (cudaGraphLaunch(ge, s) != cudaSuccess) throw Error("graph launch failed");
      c.synchronize(ctx);
      for (auto& t : dout) {
        const std::vector<uint8_t> got = bytes_of(t);
        for (int p = 0; p < w; ++p)
          for (int64_t i = 0; i < n; ++i)
            if (got[static_cast<std::size_t>(p * n + i)] != pattern(p, call, i))
              throw Error("graph replay " + std::to_string(rep) + ": block " + std::to_string(p) + " wrong");
      }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < w; ++r) EXPECT_EQ(err[static_cast<std::size_t>(r)], "") << "rank " << r;
}

// No library call changes the calling thread's current device: making the group (the windows are mapped on
// this thread, one per GPU) and every rank's collectives leave each thread on the device it chose. A caller's
// plain cudaMalloc or default-stream kernel after them must still land on that device.
TEST(PeerExchangeGpu, LeavesEveryThreadsCurrentDevice) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const int w = gpus();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto group = peer_group(w);
  int cur = -1;
  ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
  EXPECT_EQ(cur, 0) << "making the peer group moved the main thread to device " << cur;
  const auto err = on_ranks(w, [&](int r) {
    const int mine = w - 1 - r;  // a device other than the rank's own wherever there are two or more
    if (cudaSetDevice(mine) != cudaSuccess) throw Error("cudaSetDevice failed");
    const Device dev = Device::cuda(r);
    Tensor in = Tensor::empty({256}, DType::u8, dev), out = Tensor::empty({256 * w}, DType::u8, dev);
    Tensor back = Tensor::empty({256 * w}, DType::u8, dev);
    Communicator& c = *group[static_cast<std::size_t>(r)];
    c.all_gather(in.view(), out.view(), {});
    c.all_to_all(out.view(), back.view(), {});
    c.synchronize({});
    int now = -1;
    cudaGetDevice(&now);
    if (now != mine) throw Error("rank " + std::to_string(r) + "'s collectives moved its thread to device " + std::to_string(now));
  });
  for (int r = 0; r < w; ++r) EXPECT_EQ(err[static_cast<std::size_t>(r)], "") << "rank " << r;
}

TEST(PeerExchangeGpu, DcpDecodeEqualsNcclBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const int w = gpus();
  std::vector<Communicator*> nccl;
  auto group = peer_group(w, &nccl);
  const int64_t b = 5, h = 16, page = 64, mb = 24;
  const std::vector<int32_t> lens = {1500, 0, 37, 1200, 700};
  std::vector<std::vector<uint8_t>> out_peer(w), out_nccl(w), lse_peer(w), lse_nccl(w);
  std::vector<Tensor> cache_host, q_host;  // the test's random generator is not for threads: draw here
  test::reseed(71);
  const int64_t cache_elems = (b * mb + 1) * page * 576;
  for (int r = 0; r < w; ++r) {
    cache_host.push_back(test::random_tensor({cache_elems}, DType::bf16));
    q_host.push_back(test::random_tensor({b, 1, h, 576}, DType::bf16));
  }
  const auto err = on_ranks(w, [&](int r) {
    const Device dev = Device::cuda(r);
    CacheBuffer cb = allocate_cache(CacheFormat::bf16, b * mb + 1, page, dev);
    if (static_cast<int64_t>(cb.storage.nbytes()) != cache_elems * 2) throw Error("unexpected bf16 cache size");
    copy(TensorView(cb.storage.data(), DType::bf16, {cache_elems}, dev), cache_host[static_cast<std::size_t>(r)].view());
    std::vector<std::vector<int32_t>> rows(static_cast<std::size_t>(b));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < mb; ++j) rows[i].push_back(static_cast<int32_t>(i * mb + j + 1));
    std::vector<int32_t> local(static_cast<std::size_t>(b));
    dcp_local_query_lengths(lens, 1, false, {w, r, 1}, local);
    const Tensor table = test::int_tensor_2d(rows, dev), ql = test::int_tensor(local, dev);
    const Tensor q = q_host[static_cast<std::size_t>(r)].to(dev);
    const auto wsb = static_cast<int64_t>(dcp_mqa_decode_workspace_bytes(b, 1, h, mb, page, DType::bf16, w, dev));
    Tensor ws = Tensor::empty({wsb}, DType::u8, dev);
    for (int via_peer = 0; via_peer < 2; ++via_peer) {
      Tensor out = test::poisoned({b, 1, h, 512}, DType::bf16, dev), lse = test::poisoned({b, 1, h}, DType::f32, dev);
      Communicator& c = via_peer ? *group[static_cast<std::size_t>(r)] : *nccl[static_cast<std::size_t>(r)];
      for (int rep = 0; rep < 3; ++rep)  // repeated: the windows' epochs advance, results stay
        dcp_mqa_decode(c, q, cb.cache, table, ql, out, lse, 0.06, ws.view(), {});
      group[static_cast<std::size_t>(r)]->synchronize({});
      (via_peer ? out_peer : out_nccl)[r] = bytes_of(out);
      (via_peer ? lse_peer : lse_nccl)[r] = bytes_of(lse);
    }
  });
  for (int r = 0; r < w; ++r) {
    ASSERT_EQ(err[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_TRUE(out_peer[r] == out_nccl[r]) << "rank " << r << ": outputs differ";
    EXPECT_TRUE(lse_peer[r] == lse_nccl[r]) << "rank " << r << ": LSEs differ";
  }
}

}  // namespace
}  // namespace mla
