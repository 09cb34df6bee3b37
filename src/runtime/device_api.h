// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host-callable CUDA runtime helpers with plain C++ signatures, so that core/ and the CLI can use
// device memory without including CUDA headers. Only compiled when MLA_WITH_CUDA. Every call checks
// its CUDA status and throws mla::Error with the CUDA error string.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mla/types.h"

namespace mla::cuda_rt {

int device_count();  // 0 when no driver / no device (never throws)
struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::size_t total_mem = 0, l2_bytes = 0, smem_per_block_optin = 0;
};
// The device's facts, read once per device and cached for the process (the one device-info cache: the
// dispatch tables' compute capability, the planner's and launchers' SM count read it). Thread-safe.
const DeviceInfo& device_info(int device);

void* malloc(std::size_t bytes, int device);
void free(void* p, int device) noexcept;
// Page-locked (pinned) host memory (cudaHostAlloc, portable): copies from it are truly asynchronous
// and can be captured in CUDA graphs.
void* host_alloc(std::size_t bytes);
void host_free(void* p) noexcept;
// Synchronous copy between any two devices (host <-> device, device <-> device).
void memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);
void memset(void* dst, int device, int value, std::size_t bytes);
// Stream-ordered copy (stream = cudaStream_t of `device`, the device whose memory is written; nullptr: that
// device's legacy default stream, whatever the calling thread's current device is). Host memory should be
// pinned for true asynchrony; pageable host memory makes the call return only after the host buffer was staged.
void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream, int device);
void memset_async(void* dst, int value, std::size_t bytes, void* stream, int device);
// Stream-ordered 2-D copy (cudaMemcpy2DAsync): `height` rows of `width` bytes, row r read at
// src + r * spitch and written at dst + r * dpitch (the DCP collectives' row moves).
void memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                    std::size_t height, void* stream, int device);
// Stream-ordered copy of an [n][h] grid of rows of `width` bytes by a kernel: row (t, j) read at
// src + t * src_s0 + j * src_s1 and written at dst + t * dst_s0 + j * dst_s1 (byte strides; the two ranges do
// not overlap). The widest of 16 / 8 / 4 / 2 / 1-byte accesses that width, strides and both addresses allow.
// Where the device runs sm_90 code and `pdl` is set, the kernel goes out as a programmatic dependent launch that
// keeps DESIGN.md's invariant (it waits for the previous grid before it reads, then lets the next one start): in a
// captured step it is a kernel node that chains with the kernels beside it, where cudaMemcpy2DAsync is a
// copy-engine node that a dependent launch cannot follow early. The layer places q_pe beside the absorbed query
// with it.
void copy_rows_async(void* dst, int64_t dst_s0, int64_t dst_s1, const void* src, int64_t src_s0, int64_t src_s1,
                     int64_t n, int64_t h, int64_t width, void* stream, int device, bool pdl);
void synchronize(int device);
// This thread's second stream on `device` (created on first use: non-blocking, highest priority), for
// work that overlaps the caller's stream (the DCP decode's exchange of one half-batch while the other
// attends). Lives as long as the thread.
void* side_stream(int device);
// Stream-ordered join: work enqueued on `waiting` after this call starts only after everything
// enqueued on `signalling` before it (an event of this thread, recorded and waited on; capturable).
void stream_wait(void* waiting, void* signalling, int device);
// Throws mla::Error if the last launch on this thread failed ("<what>: <cuda error>").
void check_last(const char* what);

// Makes `device` this thread's current CUDA device for the guard's lifetime and restores the previous one
// after: no library call leaves the caller's current device changed (a caller's cudaMalloc or default-stream
// launch after it must still land where the caller put it). Throws mla::Error naming `who` when the device
// cannot be used.
class ScopedDevice {
 public:
  ScopedDevice(int device, const char* who);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace mla::cuda_rt
