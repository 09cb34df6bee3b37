// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the CPU socket group's frames (issue 51; src/dist/socket_group.h). One rank of a group
// of 2 or 3 runs over socket pairs; the input plays every other rank and writes what they send —
// hello / welcome and request / reply frames built from the input (each field kept, edited to a
// hostile value, or replaced), their error texts and payloads (complete, cut or longer), or raw
// bytes — then closes its write side, so a frame that promises more than was sent ends at EOF.
// The rank under test then calls one collective (all_gather, all_to_all or reduce_scatter of f32
// or i32 / f64 tensors of any small size). Contract:
//   * it returns only when every frame matched its own call exactly (kind, rank, dtype, sizes), and
//     then its output is what those payloads give; otherwise it throws mla::Error, its output is
//     untouched, and the group refuses every later call;
//   * rank 0 answers every peer only with well-formed frames: the failure (text, no payload) or
//     exactly that peer's output bytes;
//   * nothing else escapes, no byte past a buffer is read (ASan), no call hangs.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "dist/socket_group.h"
#include "fuzz/fuzz_util.h"

using namespace mla;
using namespace mla::fuzz;
using dist::SocketFrame;

namespace {

struct Call {
  uint32_t kind;
  DType dtype;
  int64_t n;  // elements of one block
};

// Input and output element counts of one rank's call.
std::pair<int64_t, int64_t> sizes(const Call& c, int w) {
  if (c.kind == SocketFrame::kAllGather) return {c.n, c.n * w};
  if (c.kind == SocketFrame::kAllToAll) return {c.n * w, c.n * w};
  return {c.n * w, c.n};
}

void send_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k <= 0) return;  // the buffer is full: the rest is cut
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}

std::vector<char> drain(int fd) {
  std::vector<char> v;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (k <= 0) return v;
    v.insert(v.end(), buf, buf + k);
  }
}

// A frame as the input has it: the correct one, with fields edited to hostile values.
SocketFrame frame(Input& in, SocketFrame f) {
  const int edits = in.byte() % 4 == 0 ? static_cast<int>(in.range(1, 3)) : 0;
  for (int e = 0; e < edits; ++e) {
    switch (in.byte() % 7) {
      case 0: f.magic ^= 1u << (in.byte() % 32); break;
      case 1: f.kind = static_cast<uint32_t>(in.hostile(0, 5)); break;
      case 2: f.rank = static_cast<int32_t>(in.hostile(-1, 3)); break;
      case 3: f.dtype = static_cast<int32_t>(in.hostile(-1, 8)); break;
      case 4: f.bytes = in.hostile(-1, std::clamp<int64_t>(f.bytes, -1, 1 << 20) + 8); break;
      case 5: f.text_len = static_cast<uint32_t>(in.hostile(0, 5000)); break;
      default: f.reserved = static_cast<uint32_t>(in.range(1, 255)); break;
    }
  }
  return f;
}

// What one peer sends: the frame, an error text and payload bytes as the input says.
void send_message(int fd, Input& in, const SocketFrame& f, const std::vector<char>& payload) {
  if (in.byte() % 16 == 0) {  // raw bytes
    std::vector<char> raw(static_cast<std::size_t>(in.range(0, 80)));
    for (char& c : raw) c = static_cast<char>(in.byte());
    send_all(fd, raw.data(), raw.size());
    return;
  }
  send_all(fd, &f, sizeof f);
  std::string text(std::min<uint32_t>(f.text_len, 64), 'e');
  send_all(fd, text.data(), text.size());
  const int64_t cut = in.byte() % 8 == 0 ? in.range(0, static_cast<int64_t>(payload.size()) + 8) : -1;
  std::vector<char> body = payload;
  if (cut >= 0) body.resize(static_cast<std::size_t>(cut), 'x');
  send_all(fd, body.data(), body.size());
}

std::vector<char> payload_of(Input& in, int64_t bytes) {
  std::vector<char> v(static_cast<std::size_t>(bytes));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>(in.byte() ^ (i * 37));
  return v;
}

// Rank 0's answer to a peer, as a well-formed frame must look.
void check_reply(const std::vector<char>& got, const Call& c, int peer, int64_t out_bytes, bool failed) {
  if (got.empty()) return;  // nothing said yet (it failed before this collective's answers)
  FUZZ_REQUIRE(got.size() >= sizeof(SocketFrame), "rank 0 sent %zu bytes, less than a frame", got.size());
  SocketFrame f;
  std::memcpy(&f, got.data(), sizeof f);
  FUZZ_REQUIRE(f.magic == SocketFrame::kMagic && f.rank == peer && f.text_len <= SocketFrame::kMaxText,
               "rank 0 sent a malformed frame to rank %d", peer);
  FUZZ_REQUIRE(f.kind == c.kind, "rank 0 answered %u to a call of %u", f.kind, c.kind);
  if (f.text_len > 0) {
    FUZZ_REQUIRE(f.bytes == 0 && got.size() == sizeof f + f.text_len && failed,
                 "rank 0's failure frame to rank %d has a payload or it did not fail", peer);
    return;
  }
  FUZZ_REQUIRE(!failed && f.bytes == out_bytes && got.size() == sizeof f + static_cast<std::size_t>(out_bytes),
               "rank 0 answered rank %d with %lld bytes, its output has %lld", peer, static_cast<long long>(f.bytes),
               static_cast<long long>(out_bytes));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  const int w = static_cast<int>(in.range(2, 3));
  const int me = in.flag() ? 0 : static_cast<int>(in.range(1, w - 1));
  const DType dtypes[] = {DType::f32, DType::i32, DType::f64};
  Call call{in.pick({uint32_t{SocketFrame::kAllGather}, uint32_t{SocketFrame::kAllToAll},
                     uint32_t{SocketFrame::kReduceScatter}}),
            in.pick(dtypes), in.range(1, 40)};
  if (call.kind == SocketFrame::kReduceScatter && call.dtype == DType::i32) call.dtype = DType::f32;  // sums: floats
  const int64_t es = static_cast<int64_t>(dtype_size(call.dtype));
  const auto [n_in, n_out] = sizes(call, w);
  const int32_t dt = static_cast<int32_t>(call.dtype);

  // Socket pairs: ours[p] is the tested rank's end towards p (rank 0: one per peer; else one to 0).
  std::vector<int> ours(static_cast<std::size_t>(w), -1), theirs(static_cast<std::size_t>(w), -1);
  for (int p = 0; p < w; ++p) {
    if (p == me || (me != 0 && p != 0)) continue;
    int sv[2];
    FUZZ_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair failed");
    ours[static_cast<std::size_t>(p)] = sv[0];
    theirs[static_cast<std::size_t>(p)] = sv[1];
  }
  // What the other ranks send, written up front (they are only bytes in the socket buffers).
  std::vector<std::vector<char>> payloads(static_cast<std::size_t>(w));
  for (int p = 0; p < w; ++p) {
    const int fd = theirs[static_cast<std::size_t>(p)];
    if (fd < 0) continue;
    SocketFrame hello;
    hello.kind = SocketFrame::kHello;
    hello.rank = me == 0 ? p : me;
    hello.bytes = w;
    send_message(fd, in, frame(in, hello), {});
    SocketFrame req;
    req.kind = call.kind;
    req.rank = me == 0 ? p : me;
    req.dtype = dt;
    req.bytes = (me == 0 ? n_in : n_out) * es;
    payloads[static_cast<std::size_t>(p)] = payload_of(in, req.bytes);
    send_message(fd, in, frame(in, req), payloads[static_cast<std::size_t>(p)]);
    ::shutdown(fd, SHUT_WR);
  }

  Tensor in_t = Tensor::empty({n_in}, call.dtype), out_t = Tensor::empty({n_out}, call.dtype);
  for (int64_t i = 0; i < n_in * es; ++i) static_cast<uint8_t*>(in_t.data())[i] = static_cast<uint8_t>(i * 7 + me);
  mla::fuzz::fill(out_t, kPoisonA);
  std::unique_ptr<Communicator> comm;
  bool failed = rejects([&] { comm = dist::socket_communicator_from_fds(w, me, ours, std::chrono::milliseconds(2000)); });
  if (!failed) {
    failed = rejects([&] {
      if (call.kind == SocketFrame::kAllGather) comm->all_gather(in_t, out_t, {});
      if (call.kind == SocketFrame::kAllToAll) comm->all_to_all(in_t, out_t, {});
      if (call.kind == SocketFrame::kReduceScatter) comm->reduce_scatter(in_t, out_t, {});
    });
    if (failed) FUZZ_REQUIRE(rejects([&] { comm->synchronize({}); }), "a failed group accepted a later call");
  }
  const std::vector<uint8_t> out = bytes_of(out_t);
  if (failed)
    FUZZ_REQUIRE(poison_violation(out, kPoisonA, out, kPoisonA, true) < 0, "a failed collective wrote its output");
  // What the tested rank sent back.
  for (int p = 0; p < w; ++p) {
    const int fd = theirs[static_cast<std::size_t>(p)];
    if (fd < 0) continue;
    std::vector<char> got = drain(fd);
    ::close(fd);
    if (me != 0) continue;  // a rank > 0 sends its own hello and request, checked by rank 0's side above
    // Past the welcome (a frame and its text), the collective's answer.
    if (got.size() < sizeof(SocketFrame)) continue;
    SocketFrame wf;
    std::memcpy(&wf, got.data(), sizeof wf);
    FUZZ_REQUIRE(wf.magic == SocketFrame::kMagic && wf.kind == SocketFrame::kHello && wf.rank == p &&
                     wf.text_len <= SocketFrame::kMaxText,
                 "rank 0's welcome to rank %d is malformed", p);
    const std::size_t skip = sizeof wf + wf.text_len;
    FUZZ_REQUIRE(got.size() >= skip, "rank 0's welcome text to rank %d is cut", p);
    if (wf.text_len > 0) {
      FUZZ_REQUIRE(failed && got.size() == skip, "rank 0 refused rank %d but went on", p);
      continue;
    }
    check_reply(std::vector<char>(got.begin() + static_cast<std::ptrdiff_t>(skip), got.end()), call, p, n_out * es,
                failed);
  }
  if (failed || call.kind == SocketFrame::kReduceScatter) return 0;
  // Accepted: the output is the blocks the payloads give (rank order; this rank's own input included;
  // reduce_scatter's sums of arbitrary bytes are not compared).
  std::vector<const char*> ins(static_cast<std::size_t>(w));
  for (int p = 0; p < w; ++p)
    ins[static_cast<std::size_t>(p)] = p == me ? static_cast<const char*>(in_t.data()) : payloads[static_cast<std::size_t>(p)].data();
  if (me != 0) {
    FUZZ_REQUIRE(std::memcmp(out.data(), payloads[0].data(), out.size()) == 0,
                 "rank %d accepted, but its output is not rank 0's reply", me);
    return 0;
  }
  const int64_t block = call.n * es;
  for (int p = 0; p < w; ++p) {
    // all_gather: block p is rank p's input; all_to_all: block p is block 0 (this rank's) of rank p's.
    FUZZ_REQUIRE(std::memcmp(out.data() + p * block, ins[static_cast<std::size_t>(p)], static_cast<std::size_t>(block)) == 0,
                 "rank 0 accepted, but block %d of its output is not rank %d's input", p, p);
  }
  return 0;
}
