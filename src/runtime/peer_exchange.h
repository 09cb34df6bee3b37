// SPDX-License-Identifier: Apache-2.0
#pragma once
// Direct GPU-to-GPU all_gather / all_to_all for the ranks of one host (the DCP exchange of a decode
// step moves tens of KiB, where NCCL's per-collective latency, not bandwidth, sets the cost). Each
// rank allocates one window of device memory; every rank maps every other rank's window (CUDA peer
// access between threads of one process, CUDA IPC between processes), and a call stores this rank's
// blocks straight into the peers' windows, then counts its arrival there with a system-scope atomic.
// The protocol (why it is safe without a closing handshake) is written in peer_exchange.cu.
// Only compiled when MLA_WITH_CUDA.
#include <array>
#include <cstddef>
#include <vector>

namespace mla::cuda_rt {

constexpr int kMaxPeerRanks = 8;
// What a rank tells the others about its window (opaque bytes: process, device, address, IPC handle).
using PeerRecord = std::array<char, 128>;

class PeerWindow {
 public:
  // Allocates the window (at least 1 MiB) on `device` for rank `rank` of `world` (<= kMaxPeerRanks).
  PeerWindow(int device, int rank, int world, std::size_t bytes);
  ~PeerWindow();
  PeerWindow(const PeerWindow&) = delete;
  PeerWindow& operator=(const PeerWindow&) = delete;

  PeerRecord record() const;
  // Maps every other rank's window from its record (records[r] = rank r's). Throws mla::Error naming
  // the peer and the reason when one cannot be mapped (another host, no peer access, IPC refused).
  void open(const std::vector<PeerRecord>& records);
  // The largest block (bytes per rank) one call moves; blocks are multiples of 16 bytes, pointers
  // 16-byte aligned (the caller checks and takes another path otherwise).
  std::size_t max_block() const { return slot_; }
  // out [W blocks] = every rank's `in` block (rank order).
  void all_gather(const void* in, void* out, std::size_t block, void* stream);
  // Block j of this rank's `in` becomes block `rank` of rank j's `out`.
  void all_to_all(const void* in, void* out, std::size_t block, void* stream);
  // Whether a call gave up waiting for a peer (its `timeout` passed; the output is then garbage).
  // Synchronous: reads a flag of the window after the caller drained its stream.
  bool timed_out() const;
  void set_timeout_ns(unsigned long long ns) { timeout_ns_ = ns; }

 private:
  void launch(const void* in, void* out, std::size_t block, bool gather, void* stream);
  int device_, rank_, world_;
  std::size_t bytes_, slot_;
  char* base_ = nullptr;  // this rank's window
  std::array<char*, kMaxPeerRanks> peers_{};  // every rank's window as this device addresses it
  std::array<bool, kMaxPeerRanks> ipc_{};     // mapped through IPC (closed on destruction)
  unsigned long long timeout_ns_ = 120ull * 1000 * 1000 * 1000;
};

}  // namespace mla::cuda_rt
