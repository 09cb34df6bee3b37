// SPDX-License-Identifier: Apache-2.0
// The TCP rendezvous of process groups (torchrun's MASTER_ADDR / MASTER_PORT; src/dist/tcp_rendezvous.h)
// over loopback, ranks as threads: the payload reaches every rank; hostile or mismatched peers are refused
// with a message naming them, strays are dropped, an absent rank 0 or peer is an error within the timeout;
// the CPU group it sets up runs collectives. tests/python/test_dcp.py runs it across processes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dist/tcp_rendezvous.h"
#include "mla/comm.h"
#include "mla/error.h"

namespace mla {
namespace {

using dist::RendezvousKind;
using std::chrono::milliseconds;

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(s);
  return ntohs(a.sin_port);
}

// A raw client of 127.0.0.1:port (retries while nothing listens); -1 when it never connects.
int raw_connect(int port) {
  for (int i = 0; i < 200; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(milliseconds(10));
  }
  return -1;
}

struct Result {
  std::string value, error;
};

// tcp_rendezvous on one thread per rank; world[r] / kind[r] as rank r was started.
std::vector<Result> run_ranks(int port, std::vector<int> world, std::vector<RendezvousKind> kind, milliseconds timeout,
                              const std::string& payload = "the id") {
  std::vector<Result> out(world.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < world.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        out[r].value = dist::tcp_rendezvous("127.0.0.1", port, world[r], static_cast<int>(r), kind[r],
                                            r == 0 ? payload : "", timeout);
      } catch (const Error& e) {
        out[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

const auto kNccl = RendezvousKind::nccl_id;
const auto kCpu = RendezvousKind::cpu_socket;

TEST(TcpRendezvous, EveryRankGetsRankZerosPayload) {
  const std::string id(128, '\x07');
  const auto got = run_ranks(free_port(), {4, 4, 4, 4}, {kNccl, kNccl, kNccl, kNccl}, milliseconds(10000), id);
  for (const Result& r : got) {
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.value, id);
  }
}

TEST(TcpRendezvous, MismatchedRanksFailEveryRank) {
  {  // rank 1 started with another WORLD_SIZE
    const auto got = run_ranks(free_port(), {2, 3}, {kCpu, kCpu}, milliseconds(5000));
    EXPECT_NE(got[0].error.find("rank 1 was started with WORLD_SIZE 3, rank 0 with 2"), std::string::npos)
        << got[0].error;
    EXPECT_EQ(got[1].error, got[0].error);  // rank 0's word reaches the rank that disagreed
  }
  {  // a CUDA rank in a CPU group
    const auto got = run_ranks(free_port(), {2, 2}, {kCpu, kNccl}, milliseconds(5000));
    EXPECT_NE(got[0].error.find("rank 1 asks for a CUDA group, rank 0 for a CPU group"), std::string::npos)
        << got[0].error;
    EXPECT_EQ(got[1].error, got[0].error);
  }
}

TEST(TcpRendezvous, HostileFramesAreCheckedBeforeUse) {
  const int port = free_port();
  Result rank0;
  std::thread t([&] {
    try {
      rank0.value = dist::tcp_rendezvous("127.0.0.1", port, 3, 0, kNccl, "id", milliseconds(10000));
    } catch (const Error& e) {
      rank0.error = e.what();
    }
  });
  // A stray connection that does not speak the protocol is dropped and does not count as a rank.
  const int stray = raw_connect(port);
  ASSERT_GE(stray, 0);
  const char junk[20] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(stray, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
  // A peer claiming a rank outside the world: rank 0 refuses the group and tells it why.
  const int liar = raw_connect(port);
  ASSERT_GE(liar, 0);
  const uint32_t hello[5] = {0x526c616d, 1, static_cast<uint32_t>(kNccl), 7, 3};
  ASSERT_EQ(::send(liar, hello, sizeof hello, 0), static_cast<ssize_t>(sizeof hello));
  uint32_t reply[3] = {};
  ASSERT_EQ(::recv(liar, reply, sizeof reply, MSG_WAITALL), static_cast<ssize_t>(sizeof reply));
  EXPECT_EQ(reply[0], 0x416c616du);
  EXPECT_EQ(reply[1], 1u);  // error
  std::string text(reply[2], '\0');
  ASSERT_EQ(::recv(liar, text.data(), text.size(), MSG_WAITALL), static_cast<ssize_t>(text.size()));
  t.join();
  ::close(stray);
  ::close(liar);
  EXPECT_NE(rank0.error.find("a peer announced itself as rank 7 (WORLD_SIZE 3)"), std::string::npos) << rank0.error;
  EXPECT_EQ(text, rank0.error);
}

TEST(TcpRendezvous, MalformedReplyIsRefused) {
  // Something that is not an mla rank 0 listens on the port and answers garbage.
  const int port = free_port();
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  std::thread server([&] {
    const int c = ::accept(s, nullptr, nullptr);
    uint32_t hello[5];
    ::recv(c, hello, sizeof hello, MSG_WAITALL);
    const uint32_t reply[3] = {0x416c616d, 0, 1u << 30};  // a payload length past the limit
    ::send(c, reply, sizeof reply, 0);
    ::close(c);
  });
  std::string err;
  try {
    dist::tcp_rendezvous("127.0.0.1", port, 2, 1, kNccl, "", milliseconds(5000));
  } catch (const Error& e) {
    err = e.what();
  }
  server.join();
  ::close(s);
  EXPECT_NE(err.find("answered with a malformed frame"), std::string::npos) << err;
}

TEST(TcpRendezvous, AbsentRanksAreErrorsNotHangs) {
  {
    const auto got = run_ranks(free_port(), {2}, {kCpu}, milliseconds(300));
    EXPECT_NE(got[0].error.find("only 0 of the other ranks connected"), std::string::npos) << got[0].error;
  }
  std::string err;
  try {
    dist::tcp_rendezvous("127.0.0.1", free_port(), 2, 1, kCpu, "", milliseconds(300));
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("rank 1 of 2 could not reach rank 0 at 127.0.0.1:"), std::string::npos) << err;
  EXPECT_THROW(dist::tcp_rendezvous("", 1234, 2, 1, kCpu, "", milliseconds(300)), Error);
  EXPECT_THROW(dist::tcp_rendezvous("127.0.0.1", 0, 2, 1, kCpu, "", milliseconds(300)), Error);
  EXPECT_THROW(dist::tcp_rendezvous("127.0.0.1", 1234, 2, 2, kCpu, "", milliseconds(300)), Error);
}

TEST(TcpRendezvous, PortFromEnvironment) {
  ::unsetenv("MLA_DCP_PORT");
  ::setenv("MASTER_PORT", "29500", 1);
  EXPECT_EQ(dist::tcp_rendezvous_port_from_env(), 29501);  // torchrun's store keeps MASTER_PORT
  ::setenv("MLA_DCP_PORT", "41000", 1);
  EXPECT_EQ(dist::tcp_rendezvous_port_from_env(), 41000);
  ::setenv("MLA_DCP_PORT", "70000", 1);
  EXPECT_THROW(dist::tcp_rendezvous_port_from_env(), Error);
  ::unsetenv("MLA_DCP_PORT");
  ::setenv("MASTER_PORT", "65535", 1);
  EXPECT_THROW(dist::tcp_rendezvous_port_from_env(), Error);
  ::setenv("MASTER_PORT", "x1", 1);
  EXPECT_THROW(dist::tcp_rendezvous_port_from_env(), Error);
  ::unsetenv("MASTER_PORT");
  EXPECT_EQ(dist::tcp_rendezvous_port_from_env(), 0);
}

TEST(TcpRendezvous, ProcessCommunicatorOverTcp) {
  // make_process_communicator chooses the TCP rendezvous when only MASTER_ADDR / port are given.
  const int port = free_port(), w = 3;
  std::vector<std::unique_ptr<Communicator>> group(w);
  std::vector<std::string> err(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      ProcessGroupEnv env;
      env.rank = r;
      env.world_size = w;
      env.master_addr = "127.0.0.1";
      env.master_port = port;
      env.timeout = milliseconds(10000);
      try {
        group[r] = make_process_communicator(env, Device::cpu());
      } catch (const Error& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) ASSERT_EQ(err[r], "") << r;
  threads.clear();
  std::vector<std::vector<float>> out(w, std::vector<float>(w));
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      float in = static_cast<float>(10 + r);
      group[r]->all_gather(TensorView(&in, DType::f32, {1}, Device::cpu()),
                           TensorView(out[r].data(), DType::f32, {w}, Device::cpu()), {});
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(group[r]->backend(), "socket");
    EXPECT_EQ(out[r], (std::vector<float>{10, 11, 12}));
  }
}

}  // namespace
}  // namespace mla
