// SPDX-License-Identifier: Apache-2.0
// Bad arguments to the group wrappers of mla/comm.h, on the CPU (no GPU needed, with or without CUDA in
// the build): make_peer_group, make_peer_communicator and make_lockstep_group refuse empty groups, null
// entries, ranks out of order, mismatched world sizes and non-positive timeouts with an mla::Error naming
// the function and what it expected, before any collective or window; make_peer_group leaves its
// argument as it was; make_peer_communicator hands a communicator it cannot wrap back with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cache_test_util.h"
#include "mla/comm.h"

namespace mla {
namespace {

using std::chrono::milliseconds;
using Comms = std::vector<std::unique_ptr<Communicator>>;

// Claims a rank, a group and a device and counts the collectives it is asked for. A claimed CUDA device
// is never touched: these inputs must be refused before anything uses it.
class ClaimComm final : public Communicator {
 public:
  ClaimComm(int rank, int world, Device device, int* calls) : rank_(rank), world_(world), device_(device), calls_(calls) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return device_; }
  std::string backend() const override { return "claim"; }
  void all_gather(const TensorView&, const TensorView&, const Context&) override { ++*calls_; }
  void all_to_all(const TensorView&, const TensorView&, const Context&) override { ++*calls_; }
  void reduce_scatter(const TensorView&, const TensorView&, const Context&) override { ++*calls_; }
  void synchronize(const Context&) override { ++*calls_; }

 private:
  int rank_, world_;
  Device device_;
  int* calls_;
};

// One ClaimComm per (rank, world) pair, all on `device`.
Comms claims(const std::vector<std::pair<int, int>>& ranks, Device device, int* calls) {
  Comms c;
  for (const auto& [r, w] : ranks) c.push_back(std::make_unique<ClaimComm>(r, w, device, calls));
  return c;
}

void expect_error(const std::string& e, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(e.find(p), std::string::npos) << "expected \"" << p << "\" in: " << e;
}

// Refused groups that both wrappers of a whole group check alike (dist::check_group_ranks), each
// message starting with the caller's name.
struct GroupCase {
  std::string name;
  std::function<Comms(int*)> make;
  milliseconds timeout;
  std::string want;  // after "<caller>: "
};

std::vector<GroupCase> bad_groups() {
  const Device gpu = Device::cuda(0);
  return {
      {"empty", [](int*) { return Comms{}; }, milliseconds(1000), "expected at least one communicator, got none"},
      {"null entry",
       [=](int* n) {
         Comms c = claims({{0, 2}}, gpu, n);
         c.push_back(nullptr);
         return c;
       },
       milliseconds(1000), "communicator 1 is null, expected rank 1 of 2"},
      {"out of order", [=](int* n) { return claims({{1, 2}, {0, 2}}, gpu, n); }, milliseconds(1000),
       "communicator 0 must be rank 0 of a group of 2, got rank 1 of 2"},
      {"mismatched world", [=](int* n) { return claims({{0, 2}, {1, 3}}, gpu, n); }, milliseconds(1000),
       "communicator 1 must be rank 1 of a group of 2, got rank 1 of 3"},
      {"part of a larger group", [=](int* n) { return claims({{0, 3}, {1, 3}}, gpu, n); }, milliseconds(1000),
       "communicator 0 must be rank 0 of a group of 2, got rank 0 of 3"},
      {"zero timeout", [=](int* n) { return claims({{0, 2}, {1, 2}}, gpu, n); }, milliseconds(0),
       "the timeout must be positive, got 0 ms"},
      {"negative timeout", [=](int* n) { return claims({{0, 2}, {1, 2}}, gpu, n); }, milliseconds(-5),
       "the timeout must be positive, got -5 ms"},
  };
}

TEST(PeerGroupArgs, RefusesBadGroupsAndLeavesThemAsTheyWere) {
  for (const GroupCase& c : bad_groups()) {
    SCOPED_TRACE(c.name);
    int calls = 0;
    Comms comms = c.make(&calls);
    std::vector<const Communicator*> before;
    for (const auto& p : comms) before.push_back(p.get());
    expect_error(test::error_of([&] { make_peer_group(std::move(comms), c.timeout); }), {"make_peer_group: " + c.want});
    ASSERT_EQ(comms.size(), before.size());  // taken by && and moved only on success
    for (std::size_t r = 0; r < before.size(); ++r) EXPECT_EQ(comms[r].get(), before[r]);
    EXPECT_EQ(calls, 0);
  }
}

TEST(PeerGroupArgs, LockstepGroupNamesItselfForTheSameCases) {
  for (const GroupCase& c : bad_groups()) {
    SCOPED_TRACE(c.name);
    int calls = 0;
    expect_error(test::error_of([&] { make_lockstep_group(c.make(&calls), c.timeout); }),
                 {"make_lockstep_group: " + c.want});
    EXPECT_EQ(calls, 0);
  }
}

TEST(PeerGroupArgs, RefusesCpuCommunicatorsWithoutWaiting) {
  // A real CPU group with a short timeout: a collective called by mistake would throw after 200 ms.
  Comms local = make_local_group(2, milliseconds(200));
  const Communicator* first = local[0].get();
  expect_error(test::error_of([&] { make_peer_group(std::move(local), std::chrono::seconds(1)); }),
               {"make_peer_group: communicator 0 is on cpu, expected a CUDA device"});
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].get(), first);
  int calls = 0;
  Comms mixed = claims({{0, 2}}, Device::cuda(0), &calls);
  mixed.push_back(std::make_unique<ClaimComm>(1, 2, Device::cpu(), &calls));
  expect_error(test::error_of([&] { make_peer_group(std::move(mixed), std::chrono::seconds(1)); }),
               {"make_peer_group: communicator 1 is on cpu, expected a CUDA device"});
  EXPECT_EQ(calls, 0);
}

TEST(PeerGroupArgs, RefusesWhatThisBuildCannotMap) {
  int calls = 0;
#if MLA_WITH_CUDA
  std::vector<std::pair<int, int>> nine;
  for (int r = 0; r < 9; ++r) nine.emplace_back(r, 9);
  expect_error(test::error_of([&] { make_peer_group(claims(nine, Device::cuda(0), &calls), std::chrono::seconds(1)); }),
               {"make_peer_group: expected at most 8 communicators, got 9"});
#else
  expect_error(
      test::error_of([&] { make_peer_group(claims({{0, 2}, {1, 2}}, Device::cuda(0), &calls), std::chrono::seconds(1)); }),
      {"make_peer_group: this build of mla has no CUDA backend"});
#endif
  EXPECT_EQ(calls, 0);
}

TEST(PeerCommunicatorArgs, RefusesNullBadTimeoutsAndBadRanks) {
  int calls = 0;
  expect_error(test::error_of([&] { make_peer_communicator(nullptr, std::chrono::seconds(1)); }),
               {"make_peer_communicator: the communicator is null"});
  for (const int64_t ms : {0, -1}) {
    auto c = std::make_unique<ClaimComm>(0, 2, Device::cuda(0), &calls);
    expect_error(test::error_of([&] { make_peer_communicator(std::move(c), milliseconds(ms)); }),
                 {"make_peer_communicator: the timeout must be positive, got " + std::to_string(ms) + " ms"});
  }
  for (const auto& [r, w] : std::vector<std::pair<int, int>>{{2, 2}, {-1, 2}, {0, 0}}) {
    auto c = std::make_unique<ClaimComm>(r, w, Device::cuda(0), &calls);
    expect_error(test::error_of([&] { make_peer_communicator(std::move(c), std::chrono::seconds(1)); }),
                 {"make_peer_communicator: expected rank 0..W-1 of a group of W >= 1",
                  "got rank " + std::to_string(r) + " of " + std::to_string(w)});
  }
  EXPECT_EQ(calls, 0);
}

// What make_peer_communicator cannot wrap comes back untouched, with the reason in *why_not.
TEST(PeerCommunicatorArgs, HandsBackWhatItCannotWrapWithTheReason) {
  int calls = 0;
  const std::string no_cuda = "this build of mla has no CUDA backend";
  const std::vector<std::tuple<std::string, std::pair<int, int>, Device, std::string>> cases = {
      {"cpu", {0, 2}, Device::cpu(), MLA_WITH_CUDA ? "the communicator is not on a CUDA device" : no_cuda},
      {"one rank", {0, 1}, Device::cuda(0), MLA_WITH_CUDA ? "a group of one rank has nothing to exchange" : no_cuda},
      {"nine ranks", {3, 9}, Device::cuda(0), MLA_WITH_CUDA ? "groups of more than 8 ranks" : no_cuda},
  };
  for (const auto& [name, rank, device, want] : cases) {
    SCOPED_TRACE(name);
    auto c = std::make_unique<ClaimComm>(rank.first, rank.second, device, &calls);
    const Communicator* raw = c.get();
    std::string why;
    auto back = make_peer_communicator(std::move(c), std::chrono::seconds(1), std::size_t{8} << 20, &why);
    EXPECT_EQ(back.get(), raw);
    EXPECT_EQ(why, want);
    back = make_peer_communicator(std::move(back), std::chrono::seconds(1));  // no why_not: still handed back
    EXPECT_EQ(back.get(), raw);
  }
  // A real CPU rank whose peers never call: a collective by mistake would throw after 200 ms.
  Comms local = make_local_group(2, milliseconds(200));
  const Communicator* raw = local[1].get();
  std::string why;
  EXPECT_EQ(make_peer_communicator(std::move(local[1]), std::chrono::seconds(1), std::size_t{8} << 20, &why).get(), raw);
  EXPECT_EQ(why, MLA_WITH_CUDA ? "the communicator is not on a CUDA device" : no_cuda);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace mla
