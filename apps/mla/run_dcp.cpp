// SPDX-License-Identifier: Apache-2.0
// `mla run --dcp N`: the layer of the trace run by a decode-context-parallel group of N ranks, one
// thread each (CPU: the in-process group; CUDA: NCCL, one GPU per rank), or one process each
// (--dcp-procs / torchrun-style environment: CPU the socket group, CUDA NCCL). See run_internal.h
// (DcpGroup) and docs/SCALE.md.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "mla/comm.h"
#include "mla/dcp.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "mla/step.h"
#include "run_internal.h"

namespace mla::app {

// One rank: its communicator, heads (layer), planner, shard, workspace, metadata buffers and step
// inputs (on the CPU the host buffers are the device ones).
struct DcpGroup::Rank {
  int r = 0;
  Device dev;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<MlaAttention> layer;
  PlannerConfig planner;
  CacheBuffer cache;
  Tensor workspace, meta;
  PinnedBuffer staging;
  Tensor q_host, slots_host;                                   // this rank's heads of q; its slot mapping
  Tensor q, kv_c, k_pe, slots, table, lens, topk, out;         // on dev
  Tensor out_host;
  double seconds = 0;
  std::string error;
  // Where the rank's thread is (the threads mode's watchdog reads it): a phase or the last collective
  // entered / left, and when that changed.
  std::mutex where_mu;
  std::string where = "starting";
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  void mark(std::string w) {
    std::lock_guard<std::mutex> lock(where_mu);
    where = std::move(w);
    since = std::chrono::steady_clock::now();
  }
};

namespace {

constexpr auto kGroupTimeout = std::chrono::seconds(120);

Tensor on(Device dev, std::initializer_list<int64_t> shape, DType t) { return Tensor::empty(shape, t, dev); }

// The leading elements of a buffer viewed with a step's shape.
TensorView lead(const Tensor& t, std::initializer_list<int64_t> shape) {
  return TensorView(t.data(), t.dtype(), shape, t.device());
}

// Host -> rank buffer (the first `shape` elements of both).
void upload(const Tensor& dst, const void* src, std::initializer_list<int64_t> shape) {
  const TensorView d = lead(dst, shape);
  copy(d, TensorView(const_cast<void*>(src), dst.dtype(), shape, Device::cpu()));
}

// The rank's communicator, recording each collective it enters and leaves through `mark` (Rank::mark), so
// that the watchdog below can say where a stalled group stopped.
class TracedCommunicator final : public Communicator {
 public:
  TracedCommunicator(std::unique_ptr<Communicator> inner, std::function<void(std::string)> mark)
      : inner_(std::move(inner)), mark_(std::move(mark)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device device() const override { return inner_->device(); }
  std::string backend() const override { return inner_->backend(); }
  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    traced("all_gather", [&] { inner_->all_gather(in, out, ctx); });
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    traced("all_to_all", [&] { inner_->all_to_all(in, out, ctx); });
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    traced("reduce_scatter", [&] { inner_->reduce_scatter(in, out, ctx); });
  }
  void synchronize(const Context& ctx) override {
    traced("synchronize", [&] { inner_->synchronize(ctx); });
  }

 private:
  template <class F>
  void traced(const char* what, F&& f) {
    const int64_t n = ++calls_;
    mark_(fmt::format("inside {} (collective call {})", what, n));
    f();
    mark_(fmt::format("after {} (collective call {})", what, n));
  }
  std::unique_ptr<Communicator> inner_;
  std::function<void(std::string)> mark_;
  int64_t calls_ = 0;
};

// Runs fn(rank) on one thread per rank; rethrows the first rank's error (the others fail on their
// collectives within the group's timeout instead of waiting forever). With `watchdog` (CUDA ranks): a
// thread blocked inside a CUDA or NCCL call is past any timeout of the communicator, so when no rank has
// moved (Rank::mark) for kStall, the process reports where each rank is and exits instead of hanging
// (a stall of ranks as threads on nvidia-h200-x2 is how the lockstep group came about, docs/SCALE.md; threads
// stuck in a driver call cannot be cancelled, so exiting is the only way out).
template <class Ranks, class Fn>
void on_every_rank(Ranks& ranks, Fn&& fn, bool watchdog = false) {
  constexpr auto kStall = kGroupTimeout + std::chrono::seconds(60);
  std::mutex mu;
  std::condition_variable cv;
  std::size_t done = 0;
  std::vector<std::thread> threads;
  for (auto& rk : ranks)
    threads.emplace_back([&, r = rk.get()] {
      try {
        r->error.clear();
        fn(*r);
      } catch (const std::exception& e) {
        r->error = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        ++done;
      }
      cv.notify_all();
    });
  if (watchdog) {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return done == ranks.size(); })) {
      const auto now = std::chrono::steady_clock::now();
      auto last = std::chrono::steady_clock::time_point::min();
      for (auto& rk : ranks) {
        std::lock_guard<std::mutex> w(rk->where_mu);
        last = std::max(last, rk->since);
      }
      if (now - last < kStall) continue;
      std::string msg = fmt::format("mla: error: --dcp: no rank of the group made progress for {} s (ranks as threads of "
                                    "one process); ",
                                    std::chrono::duration_cast<std::chrono::seconds>(now - last).count());
      for (auto& rk : ranks) {
        std::lock_guard<std::mutex> w(rk->where_mu);
        msg += fmt::format("rank {}: {} ({} s ago); ", rk->r, rk->where,
                           std::chrono::duration_cast<std::chrono::seconds>(now - rk->since).count());
      }
      msg += "run the group as processes instead (--dcp-procs)\n";
      std::fputs(msg.c_str(), stderr);
      std::fflush(nullptr);
      std::_Exit(3);
    }
  }
  for (auto& t : threads) t.join();
  for (auto& rk : ranks)
    if (!rk->error.empty()) throw Error(fmt::format("--dcp: rank {}: {}", rk->r, rk->error));
}

}  // namespace

DcpGroup::DcpGroup(const RunConfig& cfg, const Tensor& kv_b_proj) : cfg_(cfg) {
  const int w = cfg.dcp;
  const int64_t h = cfg.dims.num_heads, hr = h / w, P = cfg.dims.qk_nope_head_dim, R = cfg.dims.qk_rope_head_dim,
                V = cfg.dims.v_head_dim, L = cfg.dims.kv_lora_rank, tmax = cfg.trace.token_budget;
  const int64_t tables = cfg.trace.max_num_seqs * cfg.trace.max_blocks_per_request();
  const int64_t topk_width = cfg.sparse ? cfg.dims.index_topk : 0;
  entry_bytes_ = cache_entry_bytes(cfg.format);
  page_bytes_ = cfg.trace.page_size * entry_bytes_;
  std::vector<std::unique_ptr<Communicator>> local;
  NcclId id{};
  const bool procs = cfg.dcp_rank >= 0;
  if (procs) {  // this process is one rank: the group's other ranks are processes
    auto rk = std::make_unique<Rank>();
    rk->r = cfg.dcp_rank;
    rk->dev = cfg.device;
    ranks_.push_back(std::move(rk));
  } else {
    if (cfg.cuda) id = nccl_make_id();
    else local = make_local_group(w, kGroupTimeout);
    for (int r = 0; r < w; ++r) {
      auto rk = std::make_unique<Rank>();
      rk->r = r;
      rk->dev = cfg.cuda ? Device::cuda(cfg.device.index + r) : Device::cpu();
      if (!cfg.cuda) rk->comm = std::move(local[static_cast<std::size_t>(r)]);
      ranks_.push_back(std::move(rk));
    }
  }
  // NCCL ranks must start together: one thread each.
  // The decode's small all_gather / all-to-all by direct stores into the other GPUs (mla/comm.h, peer
  // exchange) unless MLA_DCP_PEER=0; NCCL for the rest and where peers cannot map each other's memory.
  const char* peer_env = std::getenv("MLA_DCP_PEER");
  const bool peer = cfg.cuda && !(peer_env && std::string(peer_env) == "0");
  std::vector<std::string> no_peer(static_cast<std::size_t>(w));
  on_every_rank(ranks_, [&](Rank& rk) {
    rk.mark("creating its communicator");
    if (procs) {
      rk.comm = make_process_communicator(process_group_env(), rk.dev);
      if (peer) rk.comm = make_peer_communicator(std::move(rk.comm), kGroupTimeout, std::size_t{8} << 20, &no_peer[0]);
    } else if (cfg.cuda) {
      rk.comm = make_nccl_communicator(id, w, rk.r, rk.dev.index, kGroupTimeout);
    }
  }, cfg.cuda && !procs);
  if (cfg.cuda && !procs) {  // threads driving GPUs through NCCL: collectives in lockstep (mla/comm.h says why)
    std::vector<std::unique_ptr<Communicator>> comms;
    for (auto& rk : ranks_) comms.push_back(std::move(rk->comm));
    if (peer) {
      try {
        comms = make_peer_group(std::move(comms), kGroupTimeout);
      } catch (const Error& e) {  // comms unchanged: NCCL does every collective
        no_peer[0] = e.what();
      }
    }
    comms = make_lockstep_group(std::move(comms), kGroupTimeout);
    for (int r = 0; r < w; ++r) ranks_[static_cast<std::size_t>(r)]->comm = std::move(comms[static_cast<std::size_t>(r)]);
  }
  if (peer && !no_peer[0].empty() && (!procs || cfg.dcp_rank == 0))
    std::fprintf(stderr, "mla: note: --dcp: no peer exchange (%s); NCCL moves every collective\n", no_peer[0].c_str());
  on_every_rank(ranks_, [&](Rank& rk) {
    const Device dev = rk.dev;
    rk.comm = std::make_unique<TracedCommunicator>(std::move(rk.comm), [&rk](std::string what) { rk.mark(std::move(what)); });
    rk.mark("building its layer and buffers");
    rk.planner = rank_planner_config(cfg, rk.r, dev);
    LayerOptions lo = layer_options(cfg);
    lo.dims.num_heads = static_cast<int>(hr);
    lo.device = dev;
    lo.dcp_comm = rk.comm.get();
    const int64_t rows = hr * (P + V);  // kv_b_proj rows of one rank's heads
    rk.layer = std::make_unique<MlaAttention>(lo, kv_b_proj.view().slice(0, rk.r * rows, (rk.r + 1) * rows));
    rk.cache = allocate_cache(cfg.format, cfg.trace.pool_blocks(), cfg.trace.page_size, dev, cfg.fp8_scale);
    poison(rk.cache.storage.data(), dev, static_cast<std::size_t>(rk.cache.storage.nbytes()));
    const std::size_t ws = rk.layer->max_workspace_bytes(rk.planner, tmax);
    rk.workspace = on(dev, {static_cast<int64_t>(std::max<std::size_t>(ws, 1))}, DType::u8);
    rk.staging = PinnedBuffer(max_step_metadata_bytes(rk.planner, tmax));
    rk.meta = on(dev, {static_cast<int64_t>(std::max<std::size_t>(rk.staging.size(), 16))}, DType::u8);
    rk.q_host = Tensor::empty({tmax, hr, P + R}, DType::bf16);
    rk.slots_host = Tensor::empty({tmax}, DType::i64);
    rk.out_host = Tensor::empty({tmax, hr * V}, DType::bf16);
    rk.q = on(dev, {tmax, hr, P + R}, DType::bf16);
    rk.kv_c = on(dev, {tmax, L}, DType::bf16);
    rk.k_pe = on(dev, {tmax, R}, DType::bf16);
    rk.slots = on(dev, {tmax}, DType::i64);
    rk.table = on(dev, {tables}, DType::i32);
    rk.lens = on(dev, {cfg.trace.max_num_seqs}, DType::i32);
    rk.topk = on(dev, {std::max<int64_t>(1, tmax * topk_width)}, DType::i32);
    rk.out = on(dev, {tmax, hr * V}, DType::bf16);
    if (procs) gather_ = on(dev, {std::max(w * tmax * hr * V * 2, w * page_bytes_)}, DType::u8);
    synchronize(dev);
    rk.mark("built");
  }, cfg.cuda && !procs);
}

DcpGroup::~DcpGroup() = default;

double DcpGroup::forward(const StepBatch& batch, const Inputs& in, uint16_t* out, bool warm_up) {
  const int w = cfg_.dcp;
  const int64_t T = batch.num_tokens(), nr = batch.num_reqs(), mb = batch.max_blocks, page = cfg_.trace.page_size;
  const int64_t h = cfg_.dims.num_heads, hr = h / w, P = cfg_.dims.qk_nope_head_dim, R = cfg_.dims.qk_rope_head_dim,
                V = cfg_.dims.v_head_dim, L = cfg_.dims.kv_lora_rank, qw = P + R;
  BatchDesc desc;
  desc.query_start_loc = batch.query_start_loc;
  desc.seq_lens = batch.seq_lens;
  pages_.clear();
  rank_pages_.clear();
  on_every_rank(ranks_, [&](Rank& rk) {
    rk.mark("planning and uploading the step");
    const DcpLayout l{w, rk.r, cfg_.dcp_interleave};
    const Plan plan = make_plan(desc, rk.planner);
    // This rank's heads of q; its tokens' local slots (the owner's shard only, -1 elsewhere).
    auto* q = static_cast<uint16_t*>(rk.q_host.data());
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(q + t * hr * qw, in.q + (t * h + rk.r * hr) * qw, static_cast<std::size_t>(hr * qw) * 2);
    auto* slots = static_cast<int64_t*>(rk.slots_host.data());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = batch.token_pos[static_cast<std::size_t>(t)], q_req = batch.token_req[static_cast<std::size_t>(t)];
      if (dcp_owner(pos, l) != rk.r) {
        slots[t] = -1;
        continue;
      }
      const int64_t lp = dcp_local_position(pos, l);
      slots[t] = int64_t{batch.block_table[static_cast<std::size_t>(q_req * mb + lp / page)]} * page + lp % page;
    }
    upload(rk.q, q, {T, hr, qw});
    upload(rk.slots, slots, {T});
    upload(rk.kv_c, in.kv_c, {T, L});
    upload(rk.k_pe, in.k_pe, {T, R});
    upload(rk.table, batch.block_table.data(), {nr * mb});
    upload(rk.lens, batch.seq_lens.data(), {nr});
    ForwardArgs a;
    a.q = lead(rk.q, {T, hr, qw});
    a.kv_c = lead(rk.kv_c, {T, L});
    a.k_pe = lead(rk.k_pe, {T, R});
    a.slot_mapping = lead(rk.slots, {T});
    a.block_table = lead(rk.table, {nr, mb});
    a.seq_lens = lead(rk.lens, {nr});
    if (in.topk) {
      upload(rk.topk, in.topk, {T, in.topk_width});
      a.topk_indices = lead(rk.topk, {T, in.topk_width});
    }
    a.out = lead(rk.out, {T, hr * V});
    a.metadata = rk.meta.view();
    const TensorView ws = rk.workspace.view();
    if (warm_up) {  // untimed (library handles, first launches); rewriting the same rows is idempotent
      rk.mark("in the warm-up forward");
      upload_step_metadata(plan, rk.staging.view(), rk.meta.view());
      rk.layer->forward(plan, a, rk.cache.cache, ws);
      rk.comm->synchronize({});
    }
    poison(a.out.data, rk.dev, static_cast<std::size_t>(T * hr * V) * 2);
    synchronize(rk.dev);
    const auto t0 = std::chrono::steady_clock::now();
    rk.mark("in the timed forward");
    upload_step_metadata(plan, rk.staging.view(), rk.meta.view());
    rk.layer->forward(plan, a, rk.cache.cache, ws);
    rk.comm->synchronize({});
    synchronize(rk.dev);
    rk.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (cfg_.dcp_rank < 0) {
      copy(lead(rk.out_host, {T, hr * V}), a.out);
      const auto* o = static_cast<const uint16_t*>(rk.out_host.data());
      for (int64_t t = 0; t < T; ++t)  // heads of rank r are columns [r·hr·V, (r+1)·hr·V) of the layer's output
        std::memcpy(out + (t * h + rk.r * hr) * V, o + t * hr * V, static_cast<std::size_t>(hr * V) * 2);
      return;
    }
    // One process per rank: every rank's heads through the group (untimed), [W, T, hr·V] -> [T, h·V].
    const int64_t n = T * hr * V;
    rk.comm->all_gather(TensorView(a.out.data, DType::u8, {n * 2}, rk.dev), lead(gather_, {w * n * 2}),
                        {});
    rk.comm->synchronize({});
    std::vector<uint16_t> all(static_cast<std::size_t>(w * n));
    copy(TensorView(all.data(), DType::u8, {w * n * 2}, Device::cpu()), lead(gather_, {w * n * 2}));
    for (int r = 0; r < w; ++r)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(out + (t * h + r * hr) * V, all.data() + r * n + t * hr * V, static_cast<std::size_t>(hr * V) * 2);
  }, cfg_.cuda && cfg_.dcp_rank < 0);
  double secs = 0;
  for (const auto& rk : ranks_) secs = std::max(secs, rk->seconds);
  return secs;
}

const uint8_t* DcpGroup::page(const StepBatch& batch, int64_t block) {
  auto& bytes = pages_[block];
  if (!bytes.empty()) return bytes.data();
  bytes.assign(static_cast<std::size_t>(page_bytes_), 0xff);
  const int64_t page = cfg_.trace.page_size, mb = batch.max_blocks;
  // Rank r's page b on the host (a copy from the device, once per check).
  auto rank_page = [&](int r, int64_t b) -> const uint8_t* {
    if (cfg_.dcp_rank >= 0) {  // processes: page b of every rank's shard through the group, once per check
      auto& mine = rank_pages_[b * cfg_.dcp + r];
      if (!mine.empty()) return mine.data();
      Rank& me = *ranks_[0];
      const TensorView blk = me.cache.cache.data.select(0, b);
      const int64_t w = cfg_.dcp;
      me.comm->all_gather(TensorView(blk.data, DType::u8, {page_bytes_}, me.dev), lead(gather_, {w * page_bytes_}), {});
      me.comm->synchronize({});
      std::vector<uint8_t> all(static_cast<std::size_t>(w * page_bytes_));
      copy(TensorView(all.data(), DType::u8, {w * page_bytes_}, Device::cpu()), lead(gather_, {w * page_bytes_}));
      for (int64_t p = 0; p < w; ++p)
        rank_pages_[b * w + p].assign(all.begin() + p * page_bytes_, all.begin() + (p + 1) * page_bytes_);
      return rank_pages_[b * w + r].data();
    }
    const TensorView blk = ranks_[static_cast<std::size_t>(r)]->cache.cache.data.select(0, b);
    if (!cfg_.cuda) return static_cast<const uint8_t*>(blk.data);
    auto& host = rank_pages_[b * cfg_.dcp + r];
    if (host.empty()) {
      host.resize(static_cast<std::size_t>(page_bytes_));
      const int64_t elems = page_bytes_ / static_cast<int64_t>(blk.element_size());
      copy(TensorView(host.data(), blk.dtype, {elems}, Device::cpu()), blk.reshape({elems}));
    }
    return host.data();
  };
  for (int64_t q = 0; q < batch.num_reqs(); ++q) {
    const int64_t len = batch.seq_lens[static_cast<std::size_t>(q)];
    for (int64_t j = 0; j * page < len; ++j) {
      if (batch.block_table[static_cast<std::size_t>(q * mb + j)] != block) continue;
      for (int64_t pos = j * page; pos < std::min(len, (j + 1) * page); ++pos) {
        const DcpLayout l{cfg_.dcp, 0, cfg_.dcp_interleave};
        const int owner = dcp_owner(pos, l);
        const int64_t lp = dcp_local_position(pos, l);
        const int64_t b = batch.block_table[static_cast<std::size_t>(q * mb + lp / page)];
        std::memcpy(bytes.data() + (pos - j * page) * entry_bytes_, rank_page(owner, b) + (lp % page) * entry_bytes_,
                    static_cast<std::size_t>(entry_bytes_));
      }
      return bytes.data();
    }
  }
  return bytes.data();  // not a page of this batch: every row 0xff
}

int launch_dcp_processes(int world, std::chrono::milliseconds grace) {
  std::vector<std::string> args;  // this process's command line, as the children run it
  {
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (std::size_t i = 0; i < all.size();) {
      const std::size_t end = all.find('\0', i);
      args.push_back(all.substr(i, end == std::string::npos ? std::string::npos : end - i));
      i = end == std::string::npos ? all.size() : end + 1;
    }
  }
  if (args.empty()) throw Error("--dcp-procs: cannot read this process's command line (/proc/self/cmdline)");
  std::string dir = (std::filesystem::temp_directory_path() / "mla_dcp_XXXXXX").string();
  if (!::mkdtemp(dir.data())) throw Error(fmt::format("--dcp-procs: cannot create a directory under /tmp: {}",
                                                      std::strerror(errno)));
  const std::string rendezvous = dir + "/rendezvous";
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      throw Error(fmt::format("--dcp-procs: fork failed: {}", std::strerror(errno)));
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MLA_DCP_RENDEZVOUS", rendezvous.c_str(), 1);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "--dcp-procs: rank %d: exec failed: %s\n", r, std::strerror(errno));
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  // Wait for all; the first rank that fails stops the others (they would wait for it until the timeout).
  int code = 0, failed = -1, left = world;
  std::vector<bool> done(static_cast<std::size_t>(world));
  std::chrono::steady_clock::time_point stop_at{};
  bool terminated = false, killed = false;
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      const int r = static_cast<int>(it - pids.begin());
      done[static_cast<std::size_t>(r)] = true;
      --left;
      const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (rc != 0 && failed < 0 && !terminated) {
        failed = r;
        code = rc;
        std::fprintf(stderr, "--dcp-procs: rank %d of %d %s %d; stopping the other ranks\n", r, world,
                     WIFEXITED(status) ? "exited with code" : "was killed by signal",
                     WIFEXITED(status) ? rc : WTERMSIG(status));
        for (int p = 0; p < world; ++p)
          if (!done[static_cast<std::size_t>(p)]) ::kill(pids[static_cast<std::size_t>(p)], SIGTERM);
        terminated = true;
        stop_at = std::chrono::steady_clock::now() + grace;
      } else if (rc != 0 && code == 0 && !terminated) {
        code = rc;
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (terminated && !killed && std::chrono::steady_clock::now() > stop_at) {
      for (int p = 0; p < world; ++p)
        if (!done[static_cast<std::size_t>(p)]) ::kill(pids[static_cast<std::size_t>(p)], SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return code;
}

void DcpGroup::release(int32_t block) {
  for (auto& rk : ranks_)
    poison(rk->cache.cache.data.select(0, block).data, rk->dev, static_cast<std::size_t>(page_bytes_));
}

}  // namespace mla::app
