// SPDX-License-Identifier: Apache-2.0
// The TCP rendezvous (dist/tcp_rendezvous.h). Frames, all fields little-endian host order (every rank
// runs this code on the same architecture):
//   hello (rank r > 0 -> rank 0): magic "mlaR", version, kind, rank, world_size   (5 x u32)
//   reply (rank 0 -> rank r):     magic "mlaA", status (0 ok, 1 error), length   (3 x u32), then
//                                 `length` bytes: the payload, or the error text every rank throws.
// Sockets are non-blocking and every wait is a poll bounded by the deadline, so an absent, dead or
// silent peer is an error, never a hang.
#include "dist/tcp_rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/check.h"

namespace mla::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x526c616d;  // "mlaR"
constexpr uint32_t kReplyMagic = 0x416c616d;  // "mlaA"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxPayload = 64 * 1024;

struct Hello {
  uint32_t magic, version, kind, rank, world;
};
struct Reply {
  uint32_t magic, status, length;
};

// An owned file descriptor.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int millis_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1000));
}

// Moves exactly n bytes (reading when `in`), waiting at most until the deadline. "" on success, else why not.
std::string transfer(int fd, void* data, std::size_t n, bool in, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = in ? ::recv(fd, p, n, 0) : ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0 && in) return "closed the connection";
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return fmt::format("broke the connection ({})", std::strerror(errno));
    if (Clock::now() >= deadline) return "did not answer in time";
    pollfd pfd{fd, static_cast<short>(in ? POLLIN : POLLOUT), 0};
    ::poll(&pfd, 1, std::max(1, millis_left(deadline)));
  }
  return {};
}

using AddrList = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

AddrList resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  MLA_CHECK(rc == 0 && res, "TCP rendezvous: cannot resolve MASTER_ADDR '{}': {}", host, ::gai_strerror(rc));
  return AddrList(res, ::freeaddrinfo);
}

Fd make_socket(int family) {
  Fd s(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  MLA_CHECK(s.fd >= 0, "TCP rendezvous: cannot create a socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

void send_reply(int fd, uint32_t status, std::string body, Clock::time_point deadline) {
  Reply r{kReplyMagic, status, static_cast<uint32_t>(body.size())};
  // A peer that is gone cannot be told; the caller reports the failure itself.
  if (transfer(fd, &r, sizeof r, false, deadline).empty()) transfer(fd, body.data(), body.size(), false, deadline);
}

std::string serve(const std::string& host, int port, int world, RendezvousKind kind, const std::string& payload,
                  std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const int family = resolve(host, port, true)->ai_family;
  Fd listener = make_socket(family);
  const int one = 1;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage any{};
  socklen_t len = 0;
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&any);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&any);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof *a;
  }
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&any), len) != 0 || ::listen(listener.fd, world) != 0)
    throw Error(fmt::format("TCP rendezvous: rank 0 cannot listen on port {}: {} (another process holds it? set "
                            "MLA_DCP_PORT to a free port, the same on every rank)",
                            port, std::strerror(errno)));
  std::vector<Fd> peers(static_cast<std::size_t>(world));
  std::string error;
  int joined = 0;
  while (joined < world - 1 && error.empty()) {
    pollfd pfd{listener.fd, POLLIN, 0};
    if (Clock::now() >= deadline) {
      error = fmt::format("TCP rendezvous: rank 0 of {}: only {} of the other ranks connected to port {} within {} ms "
                          "(did every rank start, with the same MASTER_ADDR and port?)",
                          world, joined, port, timeout.count());
      break;
    }
    if (::poll(&pfd, 1, std::max(1, millis_left(deadline))) <= 0) continue;
    Fd c(::accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (c.fd < 0) continue;
    Hello h{};
    // A connection gets a short while to say who it is: one that does not is dropped, not waited for.
    const auto hello_by = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!transfer(c.fd, &h, sizeof h, true, hello_by).empty() || h.magic != kHelloMagic) continue;
    if (h.version != kVersion)
      error = fmt::format("TCP rendezvous: a rank speaks protocol version {}, rank 0 version {} (mixed mla builds?)",
                          h.version, kVersion);
    else if (h.world != static_cast<uint32_t>(world))
      error = fmt::format("TCP rendezvous: rank {} was started with WORLD_SIZE {}, rank 0 with {}", h.rank, h.world,
                          world);
    else if (h.kind != static_cast<uint32_t>(kind))
      error = fmt::format("TCP rendezvous: rank {} asks for a {} group, rank 0 for a {} group (every rank must use "
                          "the same device kind)",
                          h.rank, h.kind == static_cast<uint32_t>(RendezvousKind::nccl_id) ? "CUDA" : "CPU",
                          kind == RendezvousKind::nccl_id ? "CUDA" : "CPU");
    else if (h.rank == 0 || h.rank >= static_cast<uint32_t>(world))
      error = fmt::format("TCP rendezvous: a peer announced itself as rank {} (WORLD_SIZE {})", h.rank, world);
    else if (peers[h.rank].fd >= 0)
      error = fmt::format("TCP rendezvous: two processes announced themselves as rank {}", h.rank);
    if (!error.empty()) {
      send_reply(c.fd, 1, error, deadline);
      break;
    }
    peers[h.rank] = std::move(c);
    ++joined;
  }
  for (Fd& p : peers)
    if (p.fd >= 0) send_reply(p.fd, error.empty() ? 0 : 1, error.empty() ? payload : error, deadline);
  if (!error.empty()) throw Error(error);
  return payload;
}

std::string join(const std::string& host, int port, int world, int rank, RendezvousKind kind,
                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const AddrList addrs = resolve(host, port, false);
  std::string last = "no address";
  for (;;) {  // rank 0 may not listen yet: retry until the deadline
    for (const addrinfo* a = addrs.get(); a; a = a->ai_next) {
      Fd s = make_socket(a->ai_family);
      if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          last = std::strerror(errno);
          continue;
        }
        pollfd pfd{s.fd, POLLOUT, 0};
        int err = 0;
        socklen_t n = sizeof err;
        if (::poll(&pfd, 1, std::max(1, millis_left(deadline))) <= 0 ||
            ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0 || err != 0) {
          last = err ? std::strerror(err) : "no answer";
          continue;
        }
      }
      Hello h{kHelloMagic, kVersion, static_cast<uint32_t>(kind), static_cast<uint32_t>(rank),
                    static_cast<uint32_t>(world)};
      std::string why = transfer(s.fd, &h, sizeof h, false, deadline);
      Reply r{};
      if (why.empty()) why = transfer(s.fd, &r, sizeof r, true, deadline);
      if (!why.empty())
        throw Error(fmt::format("TCP rendezvous: rank {} of {}: rank 0 at {}:{} {} (waited up to {} ms)", rank, world,
                                host, port, why, timeout.count()));
      if (r.magic != kReplyMagic || r.status > 1 || r.length > kMaxPayload)
        throw Error(fmt::format("TCP rendezvous: rank {}: {}:{} answered with a malformed frame (not an mla rank 0? "
                                "magic {:#x}, status {}, length {})",
                                rank, host, port, r.magic, r.status, r.length));
      std::string body(r.length, '\0');
      why = transfer(s.fd, body.data(), body.size(), true, deadline);
      if (!why.empty())
        throw Error(fmt::format("TCP rendezvous: rank {}: rank 0 at {}:{} {}", rank, host, port, why));
      if (r.status != 0) throw Error(body);  // rank 0's word for what went wrong
      return body;
    }
    if (Clock::now() >= deadline)
      throw Error(fmt::format("TCP rendezvous: rank {} of {} could not reach rank 0 at {}:{} within {} ms: {}", rank,
                              world, host, port, timeout.count(), last));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

int parse_port(const char* name, const char* v, int add) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  MLA_CHECK(errno == 0 && end != v && *end == '\0' && x >= 1 && x + add <= 65535,
            "process group: {}='{}' is not a TCP port{}", name, v, add ? " below 65535 (the rendezvous uses it + 1)" : "");
  return static_cast<int>(x + add);
}

}  // namespace

int tcp_rendezvous_port_from_env() {
  if (const char* v = std::getenv("MLA_DCP_PORT"); v && *v) return parse_port("MLA_DCP_PORT", v, 0);
  if (const char* v = std::getenv("MASTER_PORT"); v && *v) return parse_port("MASTER_PORT", v, 1);
  return 0;
}

std::string tcp_rendezvous(const std::string& host, int port, int world_size, int rank, RendezvousKind kind,
                           const std::string& payload, std::chrono::milliseconds timeout) {
  MLA_CHECK(!host.empty(), "TCP rendezvous: MASTER_ADDR is empty");
  MLA_CHECK(port >= 1 && port <= 65535, "TCP rendezvous: port {} is not in [1, 65535]", port);
  MLA_CHECK(world_size >= 1 && world_size <= 4096 && rank >= 0 && rank < world_size,
            "TCP rendezvous: need 0 <= rank < world_size <= 4096, got rank {} of {}", rank, world_size);
  MLA_CHECK(timeout.count() > 0, "TCP rendezvous: the timeout must be positive, got {} ms", timeout.count());
  MLA_CHECK(rank != 0 || payload.size() <= kMaxPayload, "TCP rendezvous: payload of {} bytes (at most {})",
            payload.size(), kMaxPayload);
  if (world_size == 1) return payload;
  return rank == 0 ? serve(host, port, world_size, kind, payload, timeout)
                   : join(host, port, world_size, rank, kind, timeout);
}

std::unique_ptr<Communicator> make_tcp_process_communicator(const ProcessGroupEnv& env, Device device) {
  MLA_CHECK(env.master_port > 0, "process group: MASTER_ADDR is set but neither MASTER_PORT nor MLA_DCP_PORT is");
  if (device.is_cpu()) {
    // The socket group runs over a Unix socket on rank 0's host; the rendezvous names it and the host.
    std::string payload;
    if (env.rank == 0)
      payload = host_name() + "\n" +
                (std::filesystem::temp_directory_path() /
                 fmt::format("mla_dcp_tcp_{}_{}.sock", env.master_port, static_cast<long>(::getpid())))
                    .string();
    const std::string got = tcp_rendezvous(env.master_addr, env.master_port, env.world_size, env.rank,
                                           RendezvousKind::cpu_socket, payload, env.timeout);
    const std::size_t nl = got.find('\n');
    MLA_CHECK(nl != std::string::npos && nl + 1 < got.size(), "TCP rendezvous: rank {}: rank 0 sent no socket path",
              env.rank);
    const std::string host = got.substr(0, nl), path = got.substr(nl + 1);
    MLA_CHECK(host == host_name(),
              "process group: rank {} runs on host '{}' and rank 0 on '{}': a CPU group needs every rank on one host "
              "(CUDA groups span hosts through NCCL)",
              env.rank, host_name(), host);
    return make_socket_communicator(path, env.world_size, env.rank, env.timeout);
  }
  std::string id;
  if (env.rank == 0) {
    const NcclId made = nccl_make_id();
    id.assign(made.begin(), made.end());
  }
  id = tcp_rendezvous(env.master_addr, env.master_port, env.world_size, env.rank, RendezvousKind::nccl_id, id,
                      env.timeout);
  NcclId nid{};
  MLA_CHECK(id.size() == nid.size(), "TCP rendezvous: rank {}: rank 0 sent an NCCL id of {} bytes, expected {}",
            env.rank, id.size(), nid.size());
  std::copy(id.begin(), id.end(), nid.begin());
  return make_nccl_communicator(nid, env.world_size, env.rank, device.index, env.timeout);
}

}  // namespace mla::dist
