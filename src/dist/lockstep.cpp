// SPDX-License-Identifier: Apache-2.0
// make_lockstep_group (mla/comm.h): communicators of ranks that are threads of one process, each
// collective enqueued between two host rendezvous of the group (why: the comment in mla/comm.h).
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

#include "core/check.h"
#include "dist/collective_check.h"
#include "dist/forwarding_comm.h"
#include "mla/comm.h"

namespace mla {

namespace {

// A reusable barrier of W threads with a timeout. Once a wait times out the barrier is broken: every
// waiting and later arrival throws (a rank that stayed away leaves the group's collectives misaligned).
class HostRendezvous {
 public:
  HostRendezvous(int world, std::chrono::milliseconds timeout) : world_(world), timeout_(timeout) {}

  void arrive_and_wait(int rank, const char* where, int64_t call) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) throw Error(fmt::format("lockstep group: rank {}: the group is unusable after an earlier timeout", rank));
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || broken_; }) || generation_ == gen) {
      broken_ = true;
      cv_.notify_all();
      throw Error(fmt::format("lockstep group: rank {} waited {} ms {} collective call {} for the other ranks "
                              "(a rank failed, stayed away or called fewer collectives)",
                              rank, timeout_.count(), where, call));
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

// Forwards synchronize (it enqueues nothing for the peers: no rendezvous needed) and the queries.
class LockstepCommunicator final : public dist::ForwardingCommunicator {
 public:
  LockstepCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<HostRendezvous> group)
      : ForwardingCommunicator(std::move(inner)), group_(std::move(group)) {}
  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    lockstep([&] { ForwardingCommunicator::all_gather(in, out, ctx); });
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    lockstep([&] { ForwardingCommunicator::all_to_all(in, out, ctx); });
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    lockstep([&] { ForwardingCommunicator::reduce_scatter(in, out, ctx); });
  }

 private:
  template <class F>
  void lockstep(F&& enqueue) {
    const int64_t call = ++calls_;
    group_->arrive_and_wait(rank(), "before", call);
    // A rank whose enqueue throws (bad views) still arrives, so that the others fail on their own
    // checks or on the collective's timeout instead of on this rendezvous.
    try {
      enqueue();
    } catch (...) {
      group_->arrive_and_wait(rank(), "after", call);
      throw;
    }
    group_->arrive_and_wait(rank(), "after", call);
  }
  std::shared_ptr<HostRendezvous> group_;
  int64_t calls_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_lockstep_group(std::vector<std::unique_ptr<Communicator>> comms,
                                                               std::chrono::milliseconds timeout) {
  MLA_CHECK(timeout.count() > 0, "make_lockstep_group: the timeout must be positive, got {} ms", timeout.count());
  dist::check_group_ranks(comms, "make_lockstep_group");
  const int w = static_cast<int>(comms.size());
  auto group = std::make_shared<HostRendezvous>(w, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(comms.size());
  for (auto& c : comms) out.push_back(std::make_unique<LockstepCommunicator>(std::move(c), group));
  return out;
}

}  // namespace mla
