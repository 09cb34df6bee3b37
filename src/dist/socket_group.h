// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU socket group's wire format (src/dist/process_group.cpp), for the group itself and for the
// tests and the fuzz target that play a peer which lies.
//
// Every message is a Frame, then `text_len` bytes of error text, then `bytes` bytes of payload.
//   hello    rank p -> rank 0 once connected: kind kHello, rank p, bytes = the world size it expects.
//   welcome  rank 0 -> rank p when every rank is there: kind kHello, rank p, bytes = the world size;
//            or the group's failure (text_len > 0, bytes 0), which rank p then throws.
//   request  rank p -> rank 0 per collective: its kind, rank p, the dtype, bytes = its input bytes.
//   reply    rank 0 -> rank p: the same kind, rank p and dtype, bytes = rank p's output bytes; or the
//            collective's failure (text_len > 0, bytes 0), which every rank then throws.
// A receiver compares the whole frame with what its own call expects (kind, rank, dtype, sizes,
// text_len <= kMaxText) before it reads one byte of what follows, and reads the payload into memory
// sized by its own call, never by the frame. Any mismatch fails the collective on every rank.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "mla/comm.h"

namespace mla::dist {

struct SocketFrame {
  static constexpr uint32_t kMagic = 0x32616c6d;  // "mla2"
  static constexpr uint32_t kMaxText = 4096;      // error texts are cut to this many bytes
  enum Kind : uint32_t { kHello = 1, kAllGather = 2, kAllToAll = 3, kReduceScatter = 4 };
  uint32_t magic = kMagic;
  uint32_t kind = 0;
  int32_t rank = -1;      // hello / request: the sender; welcome / reply: the addressee
  int32_t dtype = -1;     // the collective's DType value (-1 in hello / welcome)
  int64_t bytes = 0;      // payload bytes that follow; the world size in hello / welcome
  uint32_t text_len = 0;  // error text bytes that follow (welcome / reply only)
  uint32_t reserved = 0;  // 0
};
static_assert(sizeof(SocketFrame) == 32, "the frame is sent as raw bytes");

// A rank of a socket group over stream sockets that are already connected (the descriptors are
// adopted and closed by the communicator): rank 0 takes fds[p] as rank p's connection (fds[0]
// unused), a rank p > 0 takes fds[0] as its connection to rank 0. The hello / welcome exchange runs
// as after a rendezvous, so a peer that lies is refused the same way. For tests and fuzzing.
std::unique_ptr<Communicator> socket_communicator_from_fds(int world_size, int rank, std::vector<int> fds,
                                                           std::chrono::milliseconds timeout);

}  // namespace mla::dist
