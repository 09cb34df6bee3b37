// SPDX-License-Identifier: Apache-2.0
// The in-process communicator (mla/comm.h): W ranks as W threads sharing one rendezvous. A collective
// is two barriers: after the first every rank has published its buffers and reads its peers' inputs
// straight into its own output; the second keeps every input alive until all peers have read it.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/check.h"
#include "core/numeric.h"
#include "dist/collective_check.h"
#include "mla/comm.h"

namespace mla {
namespace {

struct Rendezvous {
  int world = 1;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  int64_t generation = 0;
  int arrived = 0;
  bool broken = false;
  std::string why;
  struct Slot {
    const char* in = nullptr;
    int64_t bytes = 0;  // bytes of one rank's input
    std::string what;   // collective and dtype: must agree across ranks
  };
  std::vector<Slot> slots;

  // Blocks until all `world` ranks arrived (or throws: timeout, or the group broke earlier).
  void barrier(int rank, const char* what) {
    std::unique_lock lk(mu);
    if (broken) throw Error(why);
    const int64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lk, timeout, [&] { return generation != gen || broken; })) {
      broken = true;
      why = fmt::format("local group: rank {} waited {} ms in {} and not every rank of {} arrived (a peer failed "
                        "or called another collective); the group is unusable",
                        rank, timeout.count(), what, world);
      cv.notify_all();
    }
    if (broken) throw Error(why);
  }
  void fail(std::string message) {
    std::lock_guard lk(mu);
    if (!broken) {
      broken = true;
      why = std::move(message);
    }
    cv.notify_all();
  }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Rendezvous> r, int rank) : r_(std::move(r)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return r_->world; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "local"; }

  void all_gather(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t bytes = dist::check_all_gather(in, out, world_size(), Device::cpu(), "all_gather");
    exchange("all_gather", in, bytes, [&](int peer, const char* peer_in) {
      std::memcpy(static_cast<char*>(out.data) + peer * bytes, peer_in, static_cast<std::size_t>(bytes));
    });
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t block = dist::check_all_to_all(in, out, world_size(), Device::cpu(), "all_to_all");
    exchange("all_to_all", in, block * world_size(), [&](int peer, const char* peer_in) {
      std::memcpy(static_cast<char*>(out.data) + peer * block, peer_in + rank_ * block,
                  static_cast<std::size_t>(block));
    });
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t n = dist::check_reduce_scatter(in, out, world_size(), Device::cpu(), "reduce_scatter");
    const int64_t block = n * static_cast<int64_t>(in.element_size());
    std::vector<const char*> peers(static_cast<std::size_t>(world_size()));
    exchange("reduce_scatter", in, block * world_size(), [&](int peer, const char* peer_in) {
      peers[static_cast<std::size_t>(peer)] = peer_in + rank_ * block;
      if (peer == world_size() - 1) dist::sum_blocks(out.data, peers, n, in.dtype);
    });
  }
  void synchronize(const Context&) override {
    std::lock_guard lk(r_->mu);
    if (r_->broken) throw Error(r_->why);
  }

 private:
  template <class Read>
  void exchange(const char* what, const TensorView& in, int64_t bytes, Read&& read) {
    Rendezvous& r = *r_;
    {
      std::lock_guard lk(r.mu);
      r.slots[static_cast<std::size_t>(rank_)] = {static_cast<const char*>(in.data), bytes,
                                                  fmt::format("{} of {} bytes ({})", what, bytes, to_string(in.dtype))};
    }
    r.barrier(rank_, what);
    // Every rank sees the same slots, so a mismatch is found (and thrown) by all of them alike.
    std::string mismatch;
    for (int p = 0; p < r.world && mismatch.empty(); ++p)
      if (r.slots[static_cast<std::size_t>(p)].what != r.slots[0].what)
        mismatch = fmt::format("local group: rank 0 called {} but rank {} called {}", r.slots[0].what, p,
                               r.slots[static_cast<std::size_t>(p)].what);
    if (mismatch.empty())
      for (int p = 0; p < r.world; ++p) read(p, r.slots[static_cast<std::size_t>(p)].in);
    r.barrier(rank_, what);
    if (!mismatch.empty()) {
      r.fail(mismatch);
      throw Error(mismatch);
    }
  }

  std::shared_ptr<Rendezvous> r_;
  int rank_;
};

}  // namespace

namespace dist {
void sum_blocks(void* out, const std::vector<const char*>& blocks, int64_t n, DType dtype) {
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (const char* b : blocks) {
      if (dtype == DType::f64) acc += reinterpret_cast<const double*>(b)[i];
      else if (dtype == DType::f32) acc += reinterpret_cast<const float*>(b)[i];
      else acc += num::bf16_to_float(reinterpret_cast<const uint16_t*>(b)[i]);
    }
    if (dtype == DType::f64) static_cast<double*>(out)[i] = acc;
    else if (dtype == DType::f32) static_cast<float*>(out)[i] = static_cast<float>(acc);
    else static_cast<uint16_t*>(out)[i] = num::float_to_bf16(static_cast<float>(acc));
  }
}
}  // namespace dist

std::vector<std::unique_ptr<Communicator>> make_local_group(int world_size, std::chrono::milliseconds timeout) {
  MLA_CHECK(world_size >= 1 && world_size <= 4096, "make_local_group: world_size must be in [1, 4096], got {}",
            world_size);
  MLA_CHECK(timeout.count() > 0, "make_local_group: the timeout must be positive, got {} ms", timeout.count());
  auto r = std::make_shared<Rendezvous>();
  r->world = world_size;
  r->timeout = timeout;
  r->slots.resize(static_cast<std::size_t>(world_size));
  std::vector<std::unique_ptr<Communicator>> group;
  for (int i = 0; i < world_size; ++i) group.push_back(std::make_unique<LocalCommunicator>(r, i));
  return group;
}

}  // namespace mla
