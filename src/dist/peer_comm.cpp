// SPDX-License-Identifier: Apache-2.0
// Peer communicators (mla/comm.h make_peer_group / make_peer_communicator): all_gather and all_to_all
// of at most the window's slot by runtime/peer_exchange (stores into the peers' windows), everything
// else by the wrapped communicator. Setup: ranks as threads exchange their windows' records on the host
// (no collective, so no GPU waits on another thread while a window is made); ranks as processes through
// two all_gathers of the wrapped communicator (the records, then whether every rank mapped every window:
// all ranks agree on using the windows or none does).
#include <cstring>
#include <string>
#include <utility>

#include "core/check.h"
#include "dist/collective_check.h"
#include "dist/forwarding_comm.h"
#include "mla/comm.h"
#if MLA_WITH_CUDA
#include "runtime/peer_exchange.h"
#endif

namespace mla {

namespace {

// The argument checks of both builds (with CUDA or not): bad arguments are refused alike, before a
// window is made or a collective called, and a refused make_peer_group leaves comms as it was.
void check_peer_group_args(const std::vector<std::unique_ptr<Communicator>>& comms, std::chrono::milliseconds timeout) {
  MLA_CHECK(timeout.count() > 0, "make_peer_group: the timeout must be positive, got {} ms", timeout.count());
  dist::check_group_ranks(comms, "make_peer_group");
  for (std::size_t r = 0; r < comms.size(); ++r)
    MLA_CHECK(comms[r]->device().is_cuda(), "make_peer_group: communicator {} is on {}, expected a CUDA device", r,
              to_string(comms[r]->device()));
}

void check_peer_communicator_args(const Communicator* inner, std::chrono::milliseconds timeout) {
  MLA_CHECK(inner != nullptr, "make_peer_communicator: the communicator is null");
  MLA_CHECK(timeout.count() > 0, "make_peer_communicator: the timeout must be positive, got {} ms", timeout.count());
  MLA_CHECK(inner->world_size() >= 1 && inner->rank() >= 0 && inner->rank() < inner->world_size(),
            "make_peer_communicator: expected rank 0..W-1 of a group of W >= 1, got rank {} of {}", inner->rank(),
            inner->world_size());
}

}  // namespace

#if MLA_WITH_CUDA

namespace {

class PeerCommunicator final : public dist::ForwardingCommunicator {
 public:
  PeerCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<cuda_rt::PeerWindow> win)
      : ForwardingCommunicator(std::move(inner)), win_(std::move(win)) {}
  std::string backend() const override { return ForwardingCommunicator::backend() + "+peer"; }
  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    const int64_t bytes = dist::check_all_gather(in, out, world_size(), device(), "peer all_gather");
    usable();
    if (fits(bytes, in, out)) return win_->all_gather(in.data, out.data, static_cast<std::size_t>(bytes), ctx.stream);
    ForwardingCommunicator::all_gather(in, out, ctx);
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    const int64_t block = dist::check_all_to_all(in, out, world_size(), device(), "peer all_to_all");
    usable();
    if (fits(block, in, out)) return win_->all_to_all(in.data, out.data, static_cast<std::size_t>(block), ctx.stream);
    ForwardingCommunicator::all_to_all(in, out, ctx);
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    usable();
    ForwardingCommunicator::reduce_scatter(in, out, ctx);
  }
  void synchronize(const Context& ctx) override {
    usable();
    ForwardingCommunicator::synchronize(ctx);
    if (win_->timed_out()) {
      broken_ = true;
      throw Error(fmt::format("peer exchange: rank {} of {}: a collective waited longer than the group's timeout for "
                              "a peer (a rank failed or called fewer collectives); the group is unusable",
                              rank(), world_size()));
    }
  }

 private:
  bool fits(int64_t bytes, const TensorView& in, const TensorView& out) const {
    return bytes > 0 && bytes % 16 == 0 && static_cast<std::size_t>(bytes) <= win_->max_block() &&
           reinterpret_cast<std::uintptr_t>(in.data) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out.data) % 16 == 0;
  }
  void usable() const {
    if (broken_) throw Error(fmt::format("peer exchange: rank {}: the group is unusable after a timeout", rank()));
  }
  std::unique_ptr<cuda_rt::PeerWindow> win_;
  bool broken_ = false;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_peer_group(std::vector<std::unique_ptr<Communicator>>&& comms,
                                                           std::chrono::milliseconds timeout, std::size_t window_bytes) {
  check_peer_group_args(comms, timeout);
  const int w = static_cast<int>(comms.size());
  MLA_CHECK(w <= cuda_rt::kMaxPeerRanks, "make_peer_group: expected at most {} communicators, got {}",
            cuda_rt::kMaxPeerRanks, w);
  std::vector<std::unique_ptr<cuda_rt::PeerWindow>> wins;
  std::vector<cuda_rt::PeerRecord> records;
  for (int r = 0; r < w; ++r) {
    wins.push_back(std::make_unique<cuda_rt::PeerWindow>(comms[static_cast<std::size_t>(r)]->device().index, r, w,
                                                         window_bytes));
    wins.back()->set_timeout_ns(static_cast<unsigned long long>(timeout.count()) * 1000000ull);
    records.push_back(wins.back()->record());
  }
  for (auto& win : wins) win->open(records);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < w; ++r)
    out.push_back(std::make_unique<PeerCommunicator>(std::move(comms[static_cast<std::size_t>(r)]),
                                                     std::move(wins[static_cast<std::size_t>(r)])));
  return out;
}

std::unique_ptr<Communicator> make_peer_communicator(std::unique_ptr<Communicator> inner,
                                                     std::chrono::milliseconds timeout, std::size_t window_bytes,
                                                     std::string* why_not) {
  check_peer_communicator_args(inner.get(), timeout);
  const int w = inner->world_size(), r = inner->rank();
  const Device dev = inner->device();
  auto refuse = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return std::move(inner);
  };
  if (!dev.is_cuda()) return refuse("the communicator is not on a CUDA device");
  if (w == 1) return refuse("a group of one rank has nothing to exchange");
  if (w > cuda_rt::kMaxPeerRanks) return refuse(fmt::format("groups of more than {} ranks", cuda_rt::kMaxPeerRanks));
  // Every rank takes part in both all_gathers whatever fails locally: a failure is a message, not a throw.
  std::string failure;
  std::unique_ptr<cuda_rt::PeerWindow> win;
  cuda_rt::PeerRecord mine{};
  try {
    win = std::make_unique<cuda_rt::PeerWindow>(dev.index, r, w, window_bytes);
    win->set_timeout_ns(static_cast<unsigned long long>(timeout.count()) * 1000000ull);
    mine = win->record();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const int64_t rec = static_cast<int64_t>(mine.size());
  Tensor one = Tensor::empty({rec}, DType::u8, dev), all = Tensor::empty({rec * w}, DType::u8, dev);
  copy(one.view(), TensorView(mine.data(), DType::u8, {rec}, Device::cpu()));
  inner->all_gather(one.view(), all.view(), {});
  inner->synchronize({});
  std::vector<char> host(static_cast<std::size_t>(rec * w));
  copy(TensorView(host.data(), DType::u8, {rec * w}, Device::cpu()), all.view());
  if (failure.empty()) {
    std::vector<cuda_rt::PeerRecord> records(static_cast<std::size_t>(w));
    for (int p = 0; p < w; ++p) std::memcpy(records[static_cast<std::size_t>(p)].data(), host.data() + p * rec, static_cast<std::size_t>(rec));
    try {
      win->open(records);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  int32_t ok = failure.empty() ? 1 : 0;
  Tensor flag = Tensor::empty({1}, DType::i32, dev), flags = Tensor::empty({w}, DType::i32, dev);
  copy(flag.view(), TensorView(&ok, DType::i32, {1}, Device::cpu()));
  inner->all_gather(flag.view(), flags.view(), {});
  inner->synchronize({});
  std::vector<int32_t> oks(static_cast<std::size_t>(w));
  copy(TensorView(oks.data(), DType::i32, {w}, Device::cpu()), flags.view());
  for (int p = 0; p < w; ++p)
    if (oks[static_cast<std::size_t>(p)] != 1)
      return refuse(p == r ? failure : fmt::format("rank {} could not map the group's windows", p));
  return std::make_unique<PeerCommunicator>(std::move(inner), std::move(win));
}

#else  // no CUDA in this build

std::vector<std::unique_ptr<Communicator>> make_peer_group(std::vector<std::unique_ptr<Communicator>>&& comms,
                                                           std::chrono::milliseconds timeout, std::size_t) {
  check_peer_group_args(comms, timeout);
  throw Error("make_peer_group: this build of mla has no CUDA backend");
}
std::unique_ptr<Communicator> make_peer_communicator(std::unique_ptr<Communicator> inner,
                                                     std::chrono::milliseconds timeout, std::size_t,
                                                     std::string* why_not) {
  check_peer_communicator_args(inner.get(), timeout);
  if (why_not) *why_not = "this build of mla has no CUDA backend";
  return inner;
}

#endif

}  // namespace mla
