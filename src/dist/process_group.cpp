// SPDX-License-Identifier: Apache-2.0
// One rank per process (mla/comm.h): the torchrun-style environment, the CPU socket group, and the
// communicator of a process's rank (socket on the CPU, NCCL on CUDA with the id handed over through a
// file or the environment).
//
// The socket group is a star: rank 0 listens on a Unix socket, every other rank holds one connection
// to it. A collective: each rank r > 0 sends a header (what it calls, with its byte count) and its
// input; rank 0 reads them all, checks they agree, computes every rank's output and sends each its
// own, preceded by a status word (0 = ok, else an error text every rank then throws). Every read and
// write is bounded by the group's timeout (poll), so a dead or absent rank is an error, never a hang.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/collective_check.h"
#include "dist/socket_group.h"
#include "dist/tcp_rendezvous.h"
#include "mla/comm.h"

namespace mla {
namespace {

using Clock = std::chrono::steady_clock;

// A connected stream socket with deadline-bounded full reads and writes.
class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd) : fd_(fd) {}
  Channel(Channel&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Channel& operator=(Channel&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Channel() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool open() const { return fd_ >= 0; }
  // false on timeout or a closed peer (why says which); true when all bytes moved.
  bool write_all(const void* data, std::size_t n, Clock::time_point deadline, std::string& why) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      if (!wait(POLLOUT, deadline, why)) return false;
      const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k <= 0) {
        why = errno == EPIPE || errno == ECONNRESET ? "closed its connection (the process failed or exited)"
                                                    : fmt::format("broke its connection ({})", std::strerror(errno));
        return false;
      }
      p += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }
  bool read_all(void* data, std::size_t n, Clock::time_point deadline, std::string& why) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      if (!wait(POLLIN, deadline, why)) return false;
      const ssize_t k = ::recv(fd_, p, n, 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k == 0) {
        why = "closed its connection (the process failed or exited)";
        return false;
      }
      if (k < 0) {
        why = errno == ECONNRESET ? "closed its connection (the process failed or exited)"
                                  : fmt::format("broke its connection ({})", std::strerror(errno));
        return false;
      }
      p += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }

 private:
  bool wait(short events, Clock::time_point deadline, std::string& why) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        why = "did not answer in time";
        return false;
      }
      pollfd pfd{fd_, events, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        why = fmt::format("poll failed ({})", std::strerror(errno));
        return false;
      }
      if (r > 0) return true;  // readable / writable, or hung up: the read / write says which
    }
  }
  int fd_ = -1;
};

sockaddr_un socket_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  MLA_CHECK(!path.empty() && path.size() < sizeof(a.sun_path),
            "socket group: the rendezvous path must have 1..{} characters, got '{}'", sizeof(a.sun_path) - 1, path);
  std::memcpy(a.sun_path, path.c_str(), path.size());
  return a;
}

using Frame = dist::SocketFrame;

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case Frame::kHello: return "hello";
    case Frame::kAllGather: return "all_gather";
    case Frame::kAllToAll: return "all_to_all";
    case Frame::kReduceScatter: return "reduce_scatter";
  }
  return "an unknown message";
}

std::string describe(const Frame& f) {
  const bool known_dtype = f.dtype >= 0 && f.dtype <= static_cast<int32_t>(DType::i64);
  return fmt::format("{} of {} bytes ({})", kind_name(f.kind), f.bytes,
                     known_dtype ? to_string(static_cast<DType>(f.dtype)) : fmt::format("dtype {}", f.dtype));
}

// The socket file rank 0 bound: removed only while the path still names that very socket.
class BoundPath {
 public:
  BoundPath() = default;
  BoundPath(const BoundPath&) = delete;
  BoundPath& operator=(const BoundPath&) = delete;
  ~BoundPath() { remove(); }
  void adopt(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      path_ = path;
      dev_ = st.st_dev;
      ino_ = st.st_ino;
    }
  }
  void remove() {
    if (path_.empty()) return;
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ && st.st_ino == ino_)
      ::unlink(path_.c_str());
    path_.clear();
  }

 private:
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

class SocketCommunicator final : public Communicator {
 public:
  // Rank 0 listens on `path` (which must not exist: it creates the socket and removes only that);
  // the other ranks connect to it.
  SocketCommunicator(const std::string& path, int world, int rank, std::chrono::milliseconds timeout)
      : world_(world), rank_(rank), timeout_(timeout) {
    if (world == 1) return;
    const sockaddr_un addr = socket_address(path);
    const auto deadline = Clock::now() + timeout;
    if (rank == 0) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      MLA_CHECK(fd >= 0, "socket group: rank 0 cannot create a socket: {}", std::strerror(errno));
      Channel listener(fd);
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0)
        throw Error(fmt::format("socket group: rank 0: the rendezvous path {} already exists ({}); the group creates "
                                "its socket there and removes only that: remove it or choose a fresh path",
                                path, S_ISSOCK(st.st_mode) ? "a socket, maybe of a group still running" : "not a socket"));
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
        throw Error(fmt::format("socket group: rank 0 cannot listen on {}: {}", path, std::strerror(errno)));
      BoundPath bound;
      bound.adopt(path);
      if (::listen(fd, world) != 0)
        throw Error(fmt::format("socket group: rank 0 cannot listen on {}: {}", path, std::strerror(errno)));
      peers_.resize(static_cast<std::size_t>(world));
      for (int got = 1; got < world; ++got) {
        pollfd pfd{fd, POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0)
          refuse_peers(fmt::format("socket group: rank 0 of {}: only {} of the other ranks connected to {} within "
                                   "{} ms (did every rank start, with the same rendezvous?)",
                                   world, got - 1, path, timeout.count()),
                       deadline);
        Channel c(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
        if (!c.open()) refuse_peers(fmt::format("socket group: rank 0: accept failed: {}", std::strerror(errno)), deadline);
        Frame hello;
        std::string why;
        // A connection that does not say who it is, in the group's format, does not count.
        if (!c.read_all(&hello, sizeof hello, deadline, why) || hello.magic != Frame::kMagic) {
          --got;
          continue;
        }
        const int peer = hello.rank;
        if (!hello_ok(hello, peer) || peers_[static_cast<std::size_t>(peer)].open()) {
          const std::string error = fmt::format(
              "socket group: rank 0 of {}: a peer announced itself as rank {} of a group of {} (out of range, the "
              "wrong world size, or twice)",
              world, hello.rank, hello.bytes);
          send_status(c, Frame::kHello, peer, -1, 0, error, deadline);
          refuse_peers(error, deadline);
        }
        peers_[static_cast<std::size_t>(peer)] = std::move(c);
      }
      bound.remove();  // every rank is connected: the name is no longer needed
      welcome(deadline);
      return;
    }
    for (;;) {  // rank 0 may not listen yet: retry until the deadline
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      MLA_CHECK(fd >= 0, "socket group: rank {} cannot create a socket: {}", rank, std::strerror(errno));
      Channel c(fd);
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
        root_ = std::move(c);
        join(deadline, path);
        return;
      }
      if (Clock::now() > deadline)
        throw Error(fmt::format("socket group: rank {} of {} could not reach rank 0 at {} within {} ms: {}", rank,
                                world, path, timeout.count(), std::strerror(errno)));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Over connected sockets (dist::socket_communicator_from_fds).
  SocketCommunicator(int world, int rank, std::vector<int> fds, std::chrono::milliseconds timeout)
      : world_(world), rank_(rank), timeout_(timeout) {
    std::vector<Channel> channels;
    for (int fd : fds) channels.emplace_back(fd);  // adopted at once: closed on every path
    if (world == 1) return;
    const auto deadline = Clock::now() + timeout;
    if (rank > 0) {
      MLA_CHECK(!channels.empty() && channels[0].open(), "socket group: rank {} needs its connection to rank 0", rank);
      root_ = std::move(channels[0]);
      join(deadline, "its connection");
      return;
    }
    MLA_CHECK(static_cast<int>(channels.size()) == world, "socket group: rank 0 needs {} connections, got {}", world,
              channels.size());
    peers_.resize(static_cast<std::size_t>(world));
    for (int p = 1; p < world; ++p) {
      Channel& c = channels[static_cast<std::size_t>(p)];
      MLA_CHECK(c.open(), "socket group: rank 0 has no connection for rank {}", p);
      Frame hello;
      std::string why;
      if (!c.read_all(&hello, sizeof hello, deadline, why) || hello.magic != Frame::kMagic || !hello_ok(hello, p) ||
          hello.rank != p) {
        const std::string error = fmt::format("socket group: rank 0 of {}: the connection of rank {} {}", world, p,
                                              why.empty() ? "did not introduce itself as that rank" : why);
        send_status(c, Frame::kHello, p, -1, 0, error, deadline);
        refuse_peers(error, deadline);
      }
      peers_[static_cast<std::size_t>(p)] = std::move(c);
    }
    welcome(deadline);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "socket"; }

  void all_gather(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t bytes = dist::check_all_gather(in, out, world_, Device::cpu(), "socket all_gather");
    run(Frame::kAllGather, in, bytes, out, bytes * world_, [&](const std::vector<const char*>& ins, int, char* dst) {
      for (int p = 0; p < world_; ++p)
        std::memcpy(dst + p * bytes, ins[static_cast<std::size_t>(p)], static_cast<std::size_t>(bytes));
    });
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t block = dist::check_all_to_all(in, out, world_, Device::cpu(), "socket all_to_all");
    run(Frame::kAllToAll, in, block * world_, out, block * world_,
        [&](const std::vector<const char*>& ins, int to, char* dst) {
          for (int p = 0; p < world_; ++p)
            std::memcpy(dst + p * block, ins[static_cast<std::size_t>(p)] + to * block, static_cast<std::size_t>(block));
        });
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context&) override {
    const int64_t n = dist::check_reduce_scatter(in, out, world_, Device::cpu(), "socket reduce_scatter");
    const int64_t block = n * static_cast<int64_t>(in.element_size());
    run(Frame::kReduceScatter, in, block * world_, out, block,
        [&](const std::vector<const char*>& ins, int to, char* dst) {
          std::vector<const char*> blocks;
          for (const char* p : ins) blocks.push_back(p + to * block);
          dist::sum_blocks(dst, blocks, n, in.dtype);
        });
  }
  void synchronize(const Context&) override {
    if (!why_.empty()) throw Error(why_);
  }

 private:
  [[noreturn]] void fail(std::string why) {
    why_ = std::move(why);
    throw Error(why_);
  }

  bool hello_ok(const Frame& f, int peer) const {
    return f.kind == Frame::kHello && peer > 0 && peer < world_ && f.bytes == world_ && f.dtype == -1 &&
           f.text_len == 0 && f.reserved == 0;
  }

  // A status frame: ok (error empty: `bytes` of payload follow, sent by the caller) or the group's
  // failure text (cut to kMaxText). false when the peer cannot be told (it is gone).
  static bool send_status(Channel& c, uint32_t kind, int to, int32_t dtype, int64_t bytes, const std::string& error,
                          Clock::time_point deadline) {
    Frame f;
    f.kind = kind;
    f.rank = to;
    f.dtype = dtype;
    f.text_len = static_cast<uint32_t>(std::min<std::size_t>(error.size(), Frame::kMaxText));
    f.bytes = error.empty() ? bytes : 0;
    std::string ignored;
    return c.write_all(&f, sizeof f, deadline, ignored) && c.write_all(error.data(), f.text_len, deadline, ignored);
  }

  // Rank 0: tell every connected rank that the group failed, then throw.
  [[noreturn]] void refuse_peers(const std::string& error, Clock::time_point deadline) {
    for (int p = 1; p < static_cast<int>(peers_.size()); ++p)
      if (peers_[static_cast<std::size_t>(p)].open())
        send_status(peers_[static_cast<std::size_t>(p)], Frame::kHello, p, -1, 0, error, deadline);
    fail(error);
  }

  // Rank 0: every rank is connected; each gets its welcome.
  void welcome(Clock::time_point deadline) {
    for (int p = 1; p < world_; ++p)
      send_status(peers_[static_cast<std::size_t>(p)], Frame::kHello, p, -1, world_, "", deadline);
  }

  // A rank > 0: introduce itself, then wait for rank 0's welcome (or the group's failure).
  void join(Clock::time_point deadline, const std::string& where) {
    Frame hello;
    hello.kind = Frame::kHello;
    hello.rank = rank_;
    hello.bytes = world_;
    std::string why;
    if (!root_.write_all(&hello, sizeof hello, deadline, why))
      fail(fmt::format("socket group: rank {}: rank 0 at {}: {}", rank_, where, why));
    Frame w;
    if (!root_.read_all(&w, sizeof w, deadline, why))
      fail(fmt::format("socket group: rank {} of {}: rank 0 at {} {} before every rank joined (waited up to {} ms)",
                       rank_, world_, where, why, timeout_.count()));
    if (w.magic != Frame::kMagic || w.kind != Frame::kHello || w.rank != rank_ || w.dtype != -1 ||
        w.text_len > Frame::kMaxText || w.reserved != 0 || (w.text_len == 0 && w.bytes != world_) ||
        (w.text_len > 0 && w.bytes != 0))
      fail(fmt::format("socket group: rank {} of {}: rank 0 at {} answered with a malformed welcome", rank_, world_,
                       where));
    if (w.text_len > 0) {
      std::string text(w.text_len, '\0');
      if (!root_.read_all(text.data(), text.size(), deadline, why))
        fail(fmt::format("socket group: rank {} of {}: rank 0 at {} failed the group and then {}", rank_, world_,
                         where, why));
      fail(text);
    }
  }

  // One collective: in_bytes from every rank to rank 0, which writes out_bytes for rank `to` with
  // make(ins, to, dst) and sends them back. Every frame is checked against this rank's own call
  // before any payload byte is read, and payloads land in buffers sized by this call.
  template <class Make>
  void run(uint32_t kind, const TensorView& in, int64_t in_bytes, const TensorView& out, int64_t out_bytes,
           Make&& make) {
    const char* op = kind_name(kind);
    if (!why_.empty()) throw Error(fmt::format("socket group: rank {}: the group failed earlier: {}", rank_, why_));
    Frame mine;
    mine.kind = kind;
    mine.rank = rank_;
    mine.dtype = static_cast<int32_t>(in.dtype);
    mine.bytes = in_bytes;
    const auto* src = static_cast<const char*>(in.data);
    if (world_ == 1) {
      make(std::vector<const char*>{src}, 0, static_cast<char*>(out.data));
      return;
    }
    const auto deadline = Clock::now() + timeout_;
    std::string why;
    if (rank_ != 0) {
      if (!root_.write_all(&mine, sizeof mine, deadline, why) ||
          !root_.write_all(src, static_cast<std::size_t>(in_bytes), deadline, why))
        fail(fmt::format("socket group: rank {} of {}: {}: rank 0 {} (waited up to {} ms)", rank_, world_, op, why,
                         timeout_.count()));
      Frame r;
      if (root_.read_all(&r, sizeof r, deadline, why)) {
        if (r.magic != Frame::kMagic || r.kind != kind || r.rank != rank_ || r.dtype != mine.dtype ||
            r.reserved != 0 || r.text_len > Frame::kMaxText || (r.text_len > 0 && r.bytes != 0) ||
            (r.text_len == 0 && r.bytes != out_bytes))
          fail(fmt::format("socket group: rank {} of {}: {} of {} bytes: rank 0 answered with {} for rank {}; the "
                           "group is unusable",
                           rank_, world_, op, out_bytes, describe(r), r.rank));
        if (r.text_len > 0) {
          std::string text(r.text_len, '\0');
          if (root_.read_all(text.data(), text.size(), deadline, why)) fail(text);  // rank 0 reports the failure
        } else {
          std::vector<char> reply(static_cast<std::size_t>(out_bytes));
          if (root_.read_all(reply.data(), reply.size(), deadline, why)) {
            if (out_bytes > 0) std::memcpy(out.data, reply.data(), reply.size());
            return;
          }
        }
      }
      fail(fmt::format("socket group: rank {} of {}: {}: rank 0 {} (waited up to {} ms)", rank_, world_, op, why,
                       timeout_.count()));
    }
    // Rank 0: gather every input, check the calls agree, answer each rank.
    std::vector<std::vector<char>> bufs(static_cast<std::size_t>(world_));
    std::vector<const char*> ins(static_cast<std::size_t>(world_));
    ins[0] = src;
    std::string error;
    for (int p = 1; p < world_ && error.empty(); ++p) {
      Channel& c = peers_[static_cast<std::size_t>(p)];
      Frame h;
      if (!c.read_all(&h, sizeof h, deadline, why)) {
        error = fmt::format("socket group: rank {} of {} failed in {}: {} (rank 0 waited up to {} ms); the group "
                            "is unusable",
                            p, world_, op, why, timeout_.count());
        break;
      }
      if (h.magic != Frame::kMagic || h.rank != p || h.text_len != 0 || h.reserved != 0) {
        error = fmt::format("socket group: rank {} of {} sent a malformed frame in {} (as rank {}); the group is "
                            "unusable",
                            p, world_, op, h.rank);
        break;
      }
      if (h.kind != kind || h.dtype != mine.dtype || h.bytes != in_bytes) {
        error = fmt::format("socket group: rank 0 called {} but rank {} called {}", describe(mine), p, describe(h));
        break;
      }
      std::vector<char>& buf = bufs[static_cast<std::size_t>(p)];
      buf.resize(static_cast<std::size_t>(in_bytes));  // this rank's own size, never the frame's
      if (!c.read_all(buf.data(), buf.size(), deadline, why)) {
        error = fmt::format("socket group: rank {} of {} failed in {}: {} (rank 0 waited up to {} ms); the group "
                            "is unusable",
                            p, world_, op, why, timeout_.count());
        break;
      }
      ins[static_cast<std::size_t>(p)] = buf.data();
    }
    std::vector<char> reply;
    for (int p = 1; p < world_; ++p) {
      Channel& c = peers_[static_cast<std::size_t>(p)];
      if (error.empty()) {
        reply.resize(static_cast<std::size_t>(out_bytes));
        make(ins, p, reply.data());
      }
      std::string ignored;  // a peer that is gone cannot be told
      if (send_status(c, kind, p, mine.dtype, out_bytes, error, deadline) && error.empty())
        c.write_all(reply.data(), reply.size(), deadline, ignored);
    }
    if (!error.empty()) fail(error);
    make(ins, 0, static_cast<char*>(out.data));
  }

  int world_, rank_;
  std::chrono::milliseconds timeout_;
  Channel root_;                // ranks > 0: the connection to rank 0
  std::vector<Channel> peers_;  // rank 0: peers_[p] = rank p's connection
  std::string why_;             // set when the group failed
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  MLA_CHECK(errno == 0 && end && *end == '\0' && x >= 0 && x <= 1 << 20,
            "process group: {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::unique_ptr<Communicator> make_socket_communicator(const std::string& path, int world_size, int rank,
                                                       std::chrono::milliseconds timeout) {
  MLA_CHECK(world_size >= 1 && world_size <= 4096 && rank >= 0 && rank < world_size,
            "make_socket_communicator: need 0 <= rank < world_size <= 4096, got rank {} of {}", rank, world_size);
  MLA_CHECK(timeout.count() > 0, "make_socket_communicator: the timeout must be positive, got {} ms",
            timeout.count());
  return std::make_unique<SocketCommunicator>(path, world_size, rank, timeout);
}

std::unique_ptr<Communicator> dist::socket_communicator_from_fds(int world_size, int rank, std::vector<int> fds,
                                                                 std::chrono::milliseconds timeout) {
  if (!(world_size >= 1 && world_size <= 4096 && rank >= 0 && rank < world_size && timeout.count() > 0)) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    throw Error(fmt::format("socket_communicator_from_fds: need 0 <= rank < world_size <= 4096 and a positive "
                            "timeout, got rank {} of {}, {} ms",
                            rank, world_size, timeout.count()));
  }
  return std::make_unique<SocketCommunicator>(world_size, rank, std::move(fds), timeout);
}

bool process_group_env_present() { return std::getenv("RANK") && std::getenv("WORLD_SIZE"); }

ProcessGroupEnv process_group_env() {
  MLA_CHECK(process_group_env_present(), "process group: RANK and WORLD_SIZE must be set (torchrun-style)");
  ProcessGroupEnv e;
  e.rank = env_int("RANK", 0);
  e.world_size = env_int("WORLD_SIZE", 1);
  e.local_rank = env_int("LOCAL_RANK", e.rank);
  e.rendezvous = env_str("MLA_DCP_RENDEZVOUS");
  e.nccl_id_hex = env_str("MLA_NCCL_ID");
  e.master_addr = env_str("MASTER_ADDR");
  if (!e.master_addr.empty() && e.rendezvous.empty() && e.nccl_id_hex.empty())  // only then is the port used
    e.master_port = dist::tcp_rendezvous_port_from_env();
  e.timeout = std::chrono::milliseconds(env_int("MLA_DCP_TIMEOUT_MS", 120000));
  MLA_CHECK(e.world_size >= 1 && e.rank < e.world_size, "process group: RANK {} must be below WORLD_SIZE {}", e.rank,
            e.world_size);
  MLA_CHECK(e.timeout.count() > 0, "process group: MLA_DCP_TIMEOUT_MS must be positive");
  return e;
}

std::unique_ptr<Communicator> make_process_communicator(const ProcessGroupEnv& env, Device device) {
  if (env.world_size > 1 && env.rendezvous.empty() && env.nccl_id_hex.empty() && !env.master_addr.empty())
    return dist::make_tcp_process_communicator(env, device);
  if (device.is_cpu()) {
    MLA_CHECK(env.world_size == 1 || !env.rendezvous.empty(),
              "process group: a CPU group of {} ranks needs MLA_DCP_RENDEZVOUS (a socket path every rank knows) or "
              "MASTER_ADDR and MASTER_PORT (a TCP rendezvous)",
              env.world_size);
    return make_socket_communicator(env.rendezvous, env.world_size, env.rank, env.timeout);
  }
  NcclId id{};
  if (!env.nccl_id_hex.empty()) {
    id = nccl_id_from_hex(env.nccl_id_hex);
  } else {
    MLA_CHECK(!env.rendezvous.empty(),
              "process group: a CUDA group needs MLA_NCCL_ID (hex), MLA_DCP_RENDEZVOUS (a file path for the id) or "
              "MASTER_ADDR and MASTER_PORT (a TCP rendezvous)");
    if (env.rank == 0) {
      id = nccl_make_id();
      const std::string tmp = env.rendezvous + ".tmp" + std::to_string(::getpid());
      {
        std::ofstream f(tmp);
        f << nccl_id_to_hex(id);
        MLA_CHECK(f.good(), "process group: rank 0 cannot write {}", tmp);
      }
      // link() publishes the complete file atomically and, unlike rename(), never replaces a file
      // that is already there (the path must not exist before the group starts, mla/comm.h).
      const int linked = ::link(tmp.c_str(), env.rendezvous.c_str());
      const int err = errno;
      ::unlink(tmp.c_str());
      MLA_CHECK(linked == 0, "process group: rank 0 cannot create {}: {}", env.rendezvous,
                err == EEXIST ? "it already exists (remove it or choose a fresh path)" : std::strerror(err));
    } else {
      const auto deadline = Clock::now() + env.timeout;
      std::string hex;
      for (;;) {
        std::ifstream f(env.rendezvous);
        if (f && (f >> hex) && hex.size() == 256) break;
        if (Clock::now() > deadline)
          throw Error(fmt::format("process group: rank {} of {}: rank 0's NCCL id did not appear in {} within {} ms "
                                  "(did rank 0 start?)",
                                  env.rank, env.world_size, env.rendezvous, env.timeout.count()));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      id = nccl_id_from_hex(hex);
    }
  }
  return make_nccl_communicator(id, env.world_size, env.rank, device.index, env.timeout);
}

}  // namespace mla
