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

}  // namespace mla
