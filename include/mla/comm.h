// SPDX-License-Identifier: Apache-2.0
#pragma once
// Collective communication for decode context parallelism (semantics §13). A Communicator is one
// rank's handle on a group of W ranks, one device each (or one thread each, for the in-process CPU
// group). Every rank calls the same collectives in the same order with views of the same shape and
// dtype; a rank that does not arrive within the group's timeout makes the others throw mla::Error
// (never hang). Collectives take contiguous views; CUDA ones are stream-ordered on ctx.stream.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Device device() const = 0;
  virtual std::string backend() const = 0;  // "local" or "nccl"

  // out holds W blocks of in's bytes: block r = rank r's `in` (out.numel() == W · in.numel()).
  virtual void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) = 0;
  // in and out hold W equal blocks: block j of rank i's `in` becomes block i of rank j's `out`.
  virtual void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) = 0;
  // in holds W equal blocks; out (one block) = the sum over ranks i of block r of rank i's `in` (this
  // rank r). dtype f32 or bf16 (CPU groups: f64 too; sums in fp32 or better, rounded once on the CPU;
  // NCCL sums in the dtype).
  virtual void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) = 0;
  // Waits until every collective this rank issued has completed (CUDA: its stream work too), or
  // throws mla::Error when the group's timeout passes first (a peer failed or never arrived).
  virtual void synchronize(const Context& ctx) = 0;
};

// ---- in-process group: W ranks as W threads of one process, CPU tensors -----------------------
// Returns the W communicators of one group; hand communicator r to the thread that plays rank r.
// A collective waits at most `timeout` for every rank to arrive, then throws on every rank that
// waited; a rank that arrives with a different shape, dtype or collective makes all of them throw.
std::vector<std::unique_ptr<Communicator>> make_local_group(
    int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// ---- NCCL: one rank per GPU, in one process (threads) or across processes ---------------------
// Whether this build has NCCL (CMake found it with CUDA).
bool nccl_available();
// An NCCL unique id (128 opaque bytes): rank 0 creates it and every rank must receive the same bytes
// (a file, the launcher's environment, or any out-of-band channel).
using NcclId = std::array<char, 128>;
NcclId nccl_make_id();
// The id as 256 hex characters and back (for environment variables and files).
std::string nccl_id_to_hex(const NcclId& id);
NcclId nccl_id_from_hex(const std::string& hex);
// This process's rank of a W-rank group on CUDA device `device`. The communicator is created
// non-blocking: initialisation and every collective are bounded by `timeout`; on a timeout or an
// asynchronous NCCL error the communicator is aborted and mla::Error names the rank and the cause.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int world_size, int rank, int device,
                                                     std::chrono::milliseconds timeout = std::chrono::seconds(120));

// This process's rank of a group the caller already has: `nccl_comm` is an ncclComm_t (an engine's
// context-parallel group) on CUDA device `device`; rank and world size are the communicator's. The caller
// keeps ownership: it must outlive the result, which never finalizes or aborts it. Collectives and
// synchronize are bounded by `timeout` as above; on a timeout or an asynchronous NCCL error mla::Error says
// so and the result is unusable (the caller decides whether to abort its communicator). Blocking and
// non-blocking communicators both work.
std::unique_ptr<Communicator> make_nccl_communicator_from(void* nccl_comm, int device,
                                                          std::chrono::milliseconds timeout = std::chrono::seconds(120));

// ---- ranks as threads of one process on CUDA: lockstep enqueue ----------------------------------------
// Ranks of one NCCL group that are threads of one process (one GPU each) can deadlock: some driver calls
// take a process-wide lock and wait until every GPU of the process drains its queue (cuBLASLt's first use
// of a kernel sets its attributes that way), so a rank that is inside one while another rank's GPU holds
// a collective's kernel waiting for this rank never returns (seen on nvidia-h200-x2: docs/SCALE.md).
// make_lockstep_group wraps such a group's communicators so that every collective is enqueued in
// lockstep: no rank enqueues collective n before every rank has called it, and none returns before every
// rank has enqueued it. Then whatever a GPU queue holds has all its peers enqueued and finishes without
// any host thread, so waiting for it cannot deadlock. Costs two host rendezvous per collective; a rank
// that does not arrive within `timeout` makes the others throw mla::Error (and the group stays unusable).
// comms[r] must be rank r's communicator; hand result r to the thread that plays rank r. Processes (one
// rank each) need none of this.
std::vector<std::unique_ptr<Communicator>> make_lockstep_group(std::vector<std::unique_ptr<Communicator>> comms,
                                                               std::chrono::milliseconds timeout);

// ---- peer exchange: direct GPU-to-GPU stores within one host ------------------------------------------
// A DCP decode step exchanges tens of KiB per collective, where NCCL's fixed cost per collective (not
// bandwidth) is the price. These wrap a CUDA group so that all_gather and all_to_all of blocks up to
// about window_bytes / (2·W) (multiples of 16 bytes, 16-byte aligned) are one kernel each that stores
// this rank's blocks straight into the other ranks' windows (device memory every rank maps: peer access
// between threads, CUDA IPC between processes) and waits for theirs; reduce_scatter, larger or unaligned
// calls and synchronize go to the wrapped communicator. A kernel waits at most `timeout` for a peer,
// then the next synchronize() throws mla::Error and the group is unusable. Same results, bit for bit,
// as the wrapped collectives. W <= 8 ranks on one host.
// Ranks as threads of one process: comms[r] = rank r's communicator (CUDA); the windows are made and
// mapped on the calling thread (no collective). The communicators move into the result only when every
// window is mapped; on a throw (no peer access, ...) comms is left as it was. Wrap the result in
// make_lockstep_group (above).
std::vector<std::unique_ptr<Communicator>> make_peer_group(std::vector<std::unique_ptr<Communicator>>&& comms,
                                                           std::chrono::milliseconds timeout,
                                                           std::size_t window_bytes = std::size_t{8} << 20);
// One rank per process: a collective call (every rank calls it, through `inner`). Returns the peer
// communicator, or `inner` itself when some rank cannot map every window (other hosts, no peer access,
// a CPU communicator, W == 1, no CUDA in this build), with the reason in *why_not.
std::unique_ptr<Communicator> make_peer_communicator(std::unique_ptr<Communicator> inner,
                                                     std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                                     std::size_t window_bytes = std::size_t{8} << 20,
                                                     std::string* why_not = nullptr);

// ---- processes: one rank per process (torchrun-style) --------------------------------------------
// A CPU group across processes of one host: rank 0 listens on the Unix socket `path` (which must not
// exist: rank 0 creates the socket and removes only that socket, once every rank is connected or the
// group fails), ranks 1..W-1 connect to it within `timeout`. Rank 0 relays every collective (the bytes
// go through it), checks each rank's frame (collective, rank, dtype, sizes) against its own call before
// reading its payload, and answers every rank; a mismatch, a rank that dies or stays away makes every
// rank throw mla::Error naming it within `timeout`, and the group is unusable afterwards. For tests and
// CPU runs of the process launcher.
std::unique_ptr<Communicator> make_socket_communicator(const std::string& path, int world_size, int rank,
                                                       std::chrono::milliseconds timeout = std::chrono::seconds(60));

// This process's place in a group, from the environment as torchrun sets it: RANK, WORLD_SIZE,
// LOCAL_RANK (default RANK); MLA_DCP_RENDEZVOUS: a path every rank knows (CPU: the socket rank 0
// listens on; CUDA: the file through which rank 0 hands its NCCL id to the others, written atomically;
// it must not exist before the group starts); MLA_NCCL_ID: the id as 256 hex digits instead of the
// file (a launcher that made the id itself). Without either, MASTER_ADDR (torchrun's, for ranks on
// several hosts): rank 0 listens on TCP port MLA_DCP_PORT, default MASTER_PORT + 1 (torchrun's store
// holds MASTER_PORT), and hands the others its NCCL id (CPU: the path of its socket group, every rank
// on rank 0's host). MLA_DCP_TIMEOUT_MS: the group's timeout (default 120000).
struct ProcessGroupEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string rendezvous, nccl_id_hex;
  std::string master_addr;  // MASTER_ADDR ("" = unset)
  int master_port = 0;      // the TCP rendezvous's port (MLA_DCP_PORT, else MASTER_PORT + 1; 0 = unset)
  std::chrono::milliseconds timeout{120000};
};
// Whether RANK and WORLD_SIZE are set; throws mla::Error when they are malformed or out of range.
bool process_group_env_present();
ProcessGroupEnv process_group_env();
// The communicator of this process's rank. device: CPU -> make_socket_communicator(rendezvous);
// CUDA -> NCCL on that device (the id from nccl_id_hex, else through the rendezvous file: rank 0
// creates it, the others wait for it up to the timeout). With neither rendezvous nor nccl_id_hex but
// master_addr and master_port: the TCP rendezvous above.
std::unique_ptr<Communicator> make_process_communicator(const ProcessGroupEnv& env, Device device);

}  // namespace mla
