// SPDX-License-Identifier: Apache-2.0
// Decode context parallelism benchmark (`mla bench --ops dcp [--dcp N]`, issue 13): decode tokens per
// second of a long-context batch attended by one GPU (plain mqa_decode over the whole cache) and by a
// DCP group of N GPUs (dcp_mqa_decode: every rank holds 1/N of each request's cache and h/N of the
// layer's h heads, as tensor parallelism splits them; one NCCL rank per GPU, one host thread per rank
// in this process). Shapes: b = 8, s_q = 1, s_k ∈ {256K, 1M} (quick: 64K), h ∈ {16, 128} heads of the
// layer, bf16 cache, page 64. Time = max over ranks of each rank's median
// step, a step timed as 8 back to back between two events on the rank's stream (a host barrier
// lines the ranks up before each timing; caches of GBs: no L2 flush needed). bytes = b·s_k·1152 (the whole cache, read once across the group);
// FLOPs = 2·b·h·s_k·(576 + 512): one GPU's h heads over the whole context, the work a step of the
// batch costs whether one GPU or the group does it. For W > 1 each rank also times its attention alone
// (mqa_decode of the group's h heads over its shard, no collective): "attn" is the max over ranks of
// that median and "exch" the step minus it, the exchange's cost per step (gather, all-to-all, combine).
// W > 1 also times the other exchanges (DcpExchange: AG+RS, all-to-all over two overlapped
// half-batches), alternated with the default in two rounds; one row each. "graph" rows: the same 8
// steps captured once into a CUDA graph and replayed (W = 1 and each exchange), the speed-up against
// W = 1's graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {
namespace {

struct DcpShape {
  int64_t b, h, s_k, page;
};

// The exchanges, each through NCCL, and the default one through the peer windows (make_peer_group:
// the all_gather of q and the all-to-all by stores into the other GPU's memory, no NCCL kernel).
struct Variant {
  DcpExchange exchange;
  bool peer;
  const char* name;
};
constexpr Variant kExchanges[] = {{DcpExchange::all_to_all, false, "all_to_all"},
                                  {DcpExchange::allgather_reduce_scatter, false, "allgather_reduce_scatter"},
                                  {DcpExchange::all_to_all_overlap, false, "all_to_all_overlap"},
                                  {DcpExchange::all_to_all, true, "all_to_all peer"}};
constexpr int kNumExchanges = 4;

struct RankTimes {
  double step = 0, attn = 0;         // median ms of a step (all_to_all); of the rank's attention alone (W > 1)
  double exchange[kNumExchanges]{};  // W > 1: median ms of a step with each DcpExchange
  double graph[kNumExchanges]{};     // the same steps replayed from a CUDA graph (W = 1: graph[0]); 0 = not captured
};

// One rank's timed steps (median ms). world == 1: plain mqa_decode over the whole cache.
// nccl / peer: this rank's communicators (world > 1; peer may be null: its rows are then skipped).
RankTimes rank_steps(const DcpShape& s, int world, int rank, Communicator* nccl, Communicator* peer, int warmup,
                     int iters, std::barrier<>& sync, std::atomic<int>& capture_failures) {
  const Device dev = Device::cuda(rank);
  if (cudaSetDevice(rank) != cudaSuccess) throw Error("dcp bench: cannot select device " + std::to_string(rank));
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const Context ctx{stream, Precision::fast};
  Communicator* comm = nccl;  // the variant's communicator (step below)
  const DcpLayout l{world, rank, 1};
  const int64_t local = dcp_local_length(s.s_k, l);
  const int64_t pages = std::max<int64_t>(1, (local + s.page - 1) / s.page);
  CacheBuffer cb = allocate_cache(CacheFormat::bf16, s.b * pages, s.page, dev);
  fill_uniform(cb.storage, -1, 1, 71 + rank, stream);
  Tensor table_h = Tensor::empty({s.b, pages}, DType::i32);
  for (int64_t i = 0; i < s.b * pages; ++i) static_cast<int32_t*>(table_h.data())[i] = static_cast<int32_t>(i);
  Tensor table = table_h.to(dev);
  Tensor lens = Tensor::empty({s.b}, DType::i32);
  for (int64_t i = 0; i < s.b; ++i) static_cast<int32_t*>(lens.data())[i] = static_cast<int32_t>(local);
  lens = lens.to(dev);
  const int64_t h = s.h / world;  // this rank's heads; the all-gather gives every rank all s.h
  Tensor q = Tensor::empty({s.b, 1, h, 576}, DType::bf16, dev);
  fill_uniform(q, -1, 1, 81 + rank, stream);
  Tensor out = Tensor::empty({s.b, 1, h, 512}, DType::bf16, dev), lse = Tensor::empty({s.b, 1, h}, DType::f32, dev);
  std::size_t ws_bytes = mqa_decode_workspace_bytes(s.b, 1, h, pages * s.page, dev);
  if (world > 1)
    for (const Variant& v : kExchanges)
      ws_bytes = std::max(ws_bytes, dcp_mqa_decode_workspace_bytes(s.b, 1, h, pages, s.page, DType::bf16, world, dev,
                                                                   0, v.exchange));
  Tensor ws = Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(ws_bytes))}, DType::u8, dev);
  DcpExchange exchange = DcpExchange::all_to_all;
  auto step = [&] {
    if (world > 1) dcp_mqa_decode(*comm, q, cb.cache, table, lens, out, lse, 0.0416, ws, ctx, 0, exchange);
    else mqa_decode(q, cb.cache, table, lens, out, lse, 0.0416, true, ws_bytes ? ws.view() : TensorView{}, ctx);
  };
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  // kSteps steps back to back per timing (a serving step runs every layer so): the host's enqueue of
  // the next step overlaps the device work of the current one, as in a model's forward.
  constexpr int kSteps = 8;
  // Per sample: `calls` calls of fn covering kSteps steps (kSteps eager steps, or one graph launch of them).
  auto samples_ms = [&](auto&& fn, std::vector<float>& ms, int calls) {
    for (int i = 0; i < warmup + iters; ++i) {
      sync.arrive_and_wait();
      cudaEventRecord(a, stream);
      for (int k = 0; k < calls; ++k) fn();
      cudaEventRecord(z, stream);
      if (comm) comm->synchronize(ctx);
      cudaEventSynchronize(z);
      float t = 0;
      cudaEventElapsedTime(&t, a, z);
      if (i >= warmup) ms.push_back(t / kSteps);
    }
  };
  auto median = [](std::vector<float> ms) {
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  auto median_ms = [&](auto&& fn) {
    std::vector<float> ms;
    samples_ms(fn, ms, kSteps);
    return median(ms);
  };
  RankTimes r;
  if (world == 1) {
    r.step = median_ms(step);
  } else {  // the exchanges alternated (A B C A B C: run-to-run drift spreads over all), median of both rounds
    std::vector<float> ms[kNumExchanges];
    for (int round = 0; round < 2; ++round)
      for (int e = 0; e < kNumExchanges; ++e) {
        if (kExchanges[e].peer && !peer) continue;
        exchange = kExchanges[e].exchange;
        comm = kExchanges[e].peer ? peer : nccl;
        samples_ms(step, ms[e], kSteps);
      }
    for (int e = 0; e < kNumExchanges; ++e) r.exchange[e] = ms[e].empty() ? 0 : median(ms[e]);
    comm = nccl;
    r.step = r.exchange[0];
  }
  // The same kSteps steps captured once into a CUDA graph and replayed (as an engine runs its decode
  // steps): the launch gaps between the step's kernels and collectives go. Relaxed capture: the other
  // ranks' threads keep calling CUDA meanwhile. A rank whose capture fails makes every rank skip it.
  auto graph_ms = [&](auto&& fn) -> double {
    if (comm) comm->synchronize(ctx);
    cudaStreamSynchronize(stream);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (ok) {
      try {
        for (int k = 0; k < kSteps; ++k) fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dcp bench: rank %d: graph capture: %s\n", rank, e.what());
        ok = false;
      }
      ok = cudaStreamEndCapture(stream, &g) == cudaSuccess && ok && g &&
           cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    if (!ok) {
      cudaGetLastError();
      capture_failures.fetch_add(1);
    }
    sync.arrive_and_wait();  // every rank's capture is done: all replay, or none
    double med = 0;
    if (capture_failures.load() == 0) {
      std::vector<float> ms;
      samples_ms([&] { cudaGraphLaunch(ge, stream); }, ms, 1);
      med = median(ms);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return med;
  };
  for (int e = 0; e < (world > 1 ? kNumExchanges : 1); ++e) {
    if (world > 1 && kExchanges[e].peer && !peer) continue;
    exchange = kExchanges[e].exchange;
    comm = world > 1 && kExchanges[e].peer ? peer : nccl;
    r.graph[e] = graph_ms(step);
  }
  comm = nccl;
  if (world > 1) {  // the rank's attention alone: the group's s.h heads over its shard, as dcp_mqa_decode runs it
    Tensor qa = Tensor::empty({s.b, 1, s.h, 576}, DType::bf16, dev);
    fill_uniform(qa, -1, 1, 91 + rank, stream);
    Tensor oa = Tensor::empty({s.b, 1, s.h, 512}, DType::bf16, dev), la = Tensor::empty({s.b, 1, s.h}, DType::f32, dev);
    const std::size_t wa = mqa_decode_workspace_bytes(s.b, 1, s.h, pages * s.page, dev);
    Tensor wsa = Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(wa))}, DType::u8, dev);
    r.attn = median_ms([&] {
      mqa_decode(qa, cb.cache, table, lens, oa, la, 0.0416, false, wa ? wsa.view() : TensorView{}, ctx);
    });
  }
  cudaEventDestroy(a);
  cudaEventDestroy(z);
  cudaStreamDestroy(stream);
  return r;
}

RankTimes group_ms(const DcpShape& s, int world, int warmup, int iters) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(world));
  std::vector<Communicator*> nccl(static_cast<std::size_t>(world), nullptr), peer(nccl);
  std::vector<std::string> err(static_cast<std::size_t>(world));
  if (world > 1) {  // NCCL ranks start together (a thread each), then the peer windows on this thread
    const NcclId id = nccl_make_id();
    std::vector<std::thread> init;
    for (int r = 0; r < world; ++r)
      init.emplace_back([&, r] {
        try {
          comms[r] = make_nccl_communicator(id, world, r, r);
        } catch (const std::exception& e) {
          err[r] = e.what();
        }
      });
    for (auto& t : init) t.join();
    for (int r = 0; r < world; ++r)
      if (!err[r].empty()) throw Error("dcp bench, rank " + std::to_string(r) + ": " + err[r]);
    for (int r = 0; r < world; ++r) nccl[r] = comms[r].get();
    try {
      comms = make_peer_group(std::move(comms), std::chrono::seconds(120));
      for (int r = 0; r < world; ++r) peer[r] = comms[r].get();
    } catch (const std::exception& e) {  // the NCCL rows still run; make_peer_group left comms alone
      std::fprintf(stderr, "dcp bench: no peer exchange: %s\n", e.what());
    }
  }
  std::barrier<> sync(world);
  std::atomic<int> capture_failures{0};
  std::vector<RankTimes> ms(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        ms[r] = rank_steps(s, world, r, nccl[r], peer[r], warmup, iters, sync, capture_failures);
      } catch (const std::exception& e) {
        err[r] = e.what();
        sync.arrive_and_drop();  // let the other ranks' barriers proceed; their NCCL waits time out
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r)
    if (!err[r].empty()) throw Error("dcp bench, rank " + std::to_string(r) + ": " + err[r]);
  RankTimes worst;
  for (const RankTimes& t : ms) {
    worst.step = std::max(worst.step, t.step);
    worst.attn = std::max(worst.attn, t.attn);
    for (int e = 0; e < kNumExchanges; ++e) {
      worst.exchange[e] = std::max(worst.exchange[e], t.exchange[e]);
      worst.graph[e] = std::max(worst.graph[e], t.graph[e]);
    }
  }
  return worst;
}

void bench_dcp(BenchContext& ctx) {
  if (ctx.options().ops.empty()) {  // GBs of cache per GPU and every GPU of the machine: opt-in only
    std::printf("dcp: not part of the default run (name it: --ops dcp [--dcp N])\n");
    return;
  }
  const int gpus = cuda_device_count();
  const int n = ctx.options().dcp > 0 ? ctx.options().dcp : gpus;
  if (n > gpus)
    throw Error("dcp bench: --dcp " + std::to_string(n) + " needs that many GPUs, this machine has " + std::to_string(gpus));
  if (n > 1 && !nccl_available()) throw Error("dcp bench: this build has no NCCL");
  std::vector<DcpShape> shapes;
  for (int64_t s_k : ctx.quick() ? std::vector<int64_t>{65536} : std::vector<int64_t>{262144, 1048576})
    for (int64_t h : {16, 128})  // MLA_BENCH_DCP_H=16 (or 128): one head count only (a shorter call)
      if (!std::getenv("MLA_BENCH_DCP_H") || std::atoll(std::getenv("MLA_BENCH_DCP_H")) == h)
        shapes.push_back({8, h, s_k, 64});
  const int iters = std::max(5, ctx.options().iters / 3), warmup = std::max(2, ctx.options().warmup / 2);
  for (const DcpShape& s : shapes) {
    if (s.h % n != 0) continue;  // heads split evenly over the group
    double one = 0, one_graph = 0;
    for (int w : n > 1 ? std::vector<int>{1, n} : std::vector<int>{1}) {
      const RankTimes rt = group_ms(s, w, warmup, iters);
      const double ms = rt.step;
      if (w == 1) {
        one = ms;
        one_graph = rt.graph[0];
      }
      const double bytes = static_cast<double>(s.b) * s.s_k * 1152.0;
      const double flops = 2.0 * s.b * s.h * s.s_k * 1088.0;
      char cfg[200];
      int n_cfg = std::snprintf(cfg, sizeof cfg, "W=%d b=%lld h=%lld s_k=%lldK  %.0f tok/s  x%.2f", w,
                                static_cast<long long>(s.b), static_cast<long long>(s.h),
                                static_cast<long long>(s.s_k / 1024), s.b / (ms * 1e-3), one / ms);
      if (w > 1 && n_cfg > 0 && n_cfg < static_cast<int>(sizeof cfg))
        std::snprintf(cfg + n_cfg, sizeof cfg - n_cfg, "  attn %.3f ms exch %.0f us", rt.attn,
                      (ms - rt.attn) * 1e3);
      ctx.report("dcp_decode", cfg, ms, bytes, flops,
                 "bytes = b*s_k*1152 (whole cache, all ranks); FLOPs = 2*b*h*s_k*1088; tok/s = b / step time; "
                 "xN = speed-up over W=1; attn = a rank's attention alone, exch = step - attn");
      if (w > 1)
        for (int e = 1; e < kNumExchanges; ++e) {  // the other exchanges of the same run (alternated with it)
          const double me = rt.exchange[e];
          if (me <= 0) continue;
          std::snprintf(cfg, sizeof cfg, "W=%d b=%lld h=%lld s_k=%lldK %s  %.0f tok/s  x%.2f  exch %.0f us", w,
                        static_cast<long long>(s.b), static_cast<long long>(s.h),
                        static_cast<long long>(s.s_k / 1024), kExchanges[e].name, s.b / (me * 1e-3), one / me,
                        (me - rt.attn) * 1e3);
          ctx.report("dcp_decode", cfg, me, bytes, flops, "");
        }
      for (int e = 0; e < (w > 1 ? kNumExchanges : 1); ++e) {  // CUDA-graph replays (0: capture failed)
        const double g = rt.graph[e];
        if (g <= 0) continue;
        std::snprintf(cfg, sizeof cfg, "W=%d b=%lld h=%lld s_k=%lldK graph%s%s  %.0f tok/s  x%.2f (graph W=1)", w,
                      static_cast<long long>(s.b), static_cast<long long>(s.h), static_cast<long long>(s.s_k / 1024),
                      w > 1 ? " " : "", w > 1 ? kExchanges[e].name : "", s.b / (g * 1e-3),
                      one_graph > 0 ? one_graph / g : 0.0);
        ctx.report("dcp_decode", cfg, g, bytes, flops, "");
      }
    }
  }
}

}  // namespace

void register_dcp(Registry& r) {
  r.add("dcp", "decode context parallelism: tokens/s of 1 GPU vs N GPUs (--dcp N), b 8, s_k 256K / 1M", bench_dcp);
}

}  // namespace mla::bench
