// SPDX-License-Identifier: Apache-2.0
#pragma once
// The TCP rendezvous of a group of processes on one or several hosts (torchrun's MASTER_ADDR /
// MASTER_PORT): rank 0 listens, the other ranks connect, announce themselves and receive what rank 0
// hands out (an NCCL id; for the CPU socket group, the Unix socket it listens on).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "mla/comm.h"

namespace mla::dist {

// What the group agrees on; every rank must ask for the same kind.
enum class RendezvousKind : uint32_t { cpu_socket = 1, nccl_id = 2 };

// The port the rendezvous listens on, from the environment: MLA_DCP_PORT when set, else MASTER_PORT + 1
// (torchrun's own store holds MASTER_PORT while the workers run); 0 when neither is set. Throws
// mla::Error naming the variable when it is not a port number.
int tcp_rendezvous_port_from_env();

// Rank 0 listens on `port` (every interface of the address family of `host`) until the world_size - 1
// other ranks have connected and announced (rank, world_size, kind), then sends each `payload` (at most
// 64 KiB). Ranks > 0 connect to host:port (retrying while rank 0 is not yet listening) and return rank 0's
// payload; rank 0 returns its own. Every frame read is checked (magic, version, sizes, rank range, no rank
// twice, the same world size and kind) before it is used; a mismatch fails every rank with mla::Error
// saying which rank disagreed. A connection that does not speak the protocol is dropped and not counted.
// Everything is bounded by `timeout`.
std::string tcp_rendezvous(const std::string& host, int port, int world_size, int rank, RendezvousKind kind,
                           const std::string& payload, std::chrono::milliseconds timeout);

// The communicator of this process's rank through the TCP rendezvous (env.master_addr, env.master_port):
// CUDA: rank 0's NCCL id; CPU: the socket group on a Unix socket of rank 0's host (every rank on that
// host, checked by host name).
std::unique_ptr<Communicator> make_tcp_process_communicator(const ProcessGroupEnv& env, Device device);

}  // namespace mla::dist
