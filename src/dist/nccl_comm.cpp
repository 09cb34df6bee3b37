// SPDX-License-Identifier: Apache-2.0
// The NCCL communicator (mla/comm.h). The communicator is created non-blocking (ncclConfig_t
// blocking = 0), so neither its initialisation nor a collective can block the host forever: every
// call that returns ncclInProgress is polled with ncclCommGetAsyncError, and synchronize() polls the
// stream, all bounded by the timeout; on expiry or an asynchronous error the communicator is aborted
// (ncclCommAbort) and mla::Error says which rank and why. Collectives move bytes (ncclUint8): the
// dtype only has to agree between ranks, as the views' checks make sure on each rank.
#include <cstring>
#include <string>
#include <thread>

#include "core/check.h"
#include "dist/collective_check.h"
#include "mla/comm.h"

#if MLA_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/device_api.h"
#endif

namespace mla {

std::string nccl_id_to_hex(const NcclId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : id) {
    s += digits[(static_cast<unsigned char>(c) >> 4) & 15];
    s += digits[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

NcclId nccl_id_from_hex(const std::string& hex) {
  MLA_CHECK(hex.size() == 256, "nccl_id_from_hex: expected 256 hex digits, got {} characters", hex.size());
  auto val = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(fmt::format("nccl_id_from_hex: '{}' is not a hex digit", c));
  };
  NcclId id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(val(hex[2 * i]) * 16 + val(hex[2 * i + 1]));
  return id;
}

#if MLA_WITH_NCCL

namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclId& id, int world, int rank, int device, std::chrono::milliseconds timeout)
      : world_(world), rank_(rank), device_(device), timeout_(timeout) {
    const cuda_rt::ScopedDevice on_device(device_, "nccl");
    ncclUniqueId uid;
    static_assert(sizeof(uid.internal) == sizeof(NcclId), "NCCL unique id size");
    std::memcpy(uid.internal, id.data(), id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error(fmt::format("nccl: rank {} of {} could not start its communicator: {}", rank, world,
                              ncclGetErrorString(r)));
    wait_ready("initialisation (did every rank start, with the same id?)");
  }
  // Over a communicator the caller made and keeps (an engine's group): never finalized or aborted here;
  // rank and size come from it, and it must live on `device`.
  NcclCommunicator(ncclComm_t comm, int device, std::chrono::milliseconds timeout)
      : comm_(comm), owned_(false), world_(0), rank_(0), device_(device), timeout_(timeout) {
    int cu_device = -1;
    check(ncclCommCount(comm_, &world_), "ncclCommCount");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCuDevice(comm_, &cu_device), "ncclCommCuDevice");
    if (cu_device != device)
      throw Error(fmt::format("make_nccl_communicator_from: the communicator lives on CUDA device {}, not {}",
                              cu_device, device));
  }
  ~NcclCommunicator() override {
    if (comm_ && owned_ && !aborted_) ncclCommAbort(comm_);  // non-blocking: abort never waits for peers
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return Device::cuda(device_); }
  std::string backend() const override { return "nccl"; }

  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    const int64_t bytes = dist::check_all_gather(in, out, world_, device(), "nccl all_gather");
    usable();
    const cuda_rt::ScopedDevice on_device(device_, "nccl");
    check(ncclAllGather(in.data, out.data, static_cast<size_t>(bytes), ncclUint8, comm_, stream(ctx)),
          "all_gather");
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    const int64_t block = dist::check_all_to_all(in, out, world_, device(), "nccl all_to_all");
    usable();
    const cuda_rt::ScopedDevice on_device(device_, "nccl");
    check(ncclGroupStart(), "all_to_all");
    for (int p = 0; p < world_; ++p) {
      check(ncclSend(static_cast<const char*>(in.data) + p * block, static_cast<size_t>(block), ncclUint8, p, comm_,
                     stream(ctx)),
            "all_to_all send");
      check(ncclRecv(static_cast<char*>(out.data) + p * block, static_cast<size_t>(block), ncclUint8, p, comm_,
                     stream(ctx)),
            "all_to_all recv");
    }
    check(ncclGroupEnd(), "all_to_all");
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    const int64_t n = dist::check_reduce_scatter(in, out, world_, device(), "nccl reduce_scatter");
    usable();
    const cuda_rt::ScopedDevice on_device(device_, "nccl");
    check(ncclReduceScatter(in.data, out.data, static_cast<size_t>(n), in.dtype == DType::f32 ? ncclFloat32 : ncclBfloat16,
                            ncclSum, comm_, stream(ctx)),
          "reduce_scatter");
  }
  void synchronize(const Context& ctx) override {
    usable();
    const cuda_rt::ScopedDevice on_device(device_, "nccl");
    const auto start = Clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream(ctx));
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady)
        throw Error(fmt::format("nccl: rank {}: the stream failed: {}", rank_, cudaGetErrorString(e)));
      poll_async("synchronize");
      if (Clock::now() - start > timeout_) fail("synchronize: the collectives did not finish in time (a peer failed?)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  static cudaStream_t stream(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }
  void usable() const {
    if (aborted_) throw Error(fmt::format("nccl: rank {}: the communicator was aborted earlier: {}", rank_, why_));
  }
  [[noreturn]] void fail(const std::string& what) {
    why_ = fmt::format("nccl: rank {} of {}: {} (waited up to {} ms); {}", rank_, world_, what, timeout_.count(),
                       owned_ ? "communicator aborted" : "the caller's communicator is unusable: abort it (ncclCommAbort)");
    aborted_ = true;
    if (owned_) ncclCommAbort(comm_);
    throw Error(why_);
  }
  void poll_async(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(fmt::format("{}: {}", what, ncclGetErrorString(r)));
    if (state != ncclSuccess && state != ncclInProgress) fail(fmt::format("{}: {}", what, ncclGetErrorString(state)));
  }
  // A non-blocking call returned: wait (bounded) until the communicator is no longer in progress.
  void wait_ready(const char* what) {
    const auto start = Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) fail(fmt::format("{}: {}", what, ncclGetErrorString(r)));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(fmt::format("{}: {}", what, ncclGetErrorString(state)));
      if (Clock::now() - start > timeout_) fail(fmt::format("{}: timed out", what));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void check(ncclResult_t r, const char* what) {
    if (r == ncclInProgress) return wait_ready(what);
    if (r != ncclSuccess) fail(fmt::format("{}: {}", what, ncclGetErrorString(r)));
  }

  ncclComm_t comm_ = nullptr;
  bool owned_ = true;
  int world_, rank_, device_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
  std::string why_;
};

}  // namespace

bool nccl_available() { return true; }

NcclId nccl_make_id() {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  MLA_CHECK(r == ncclSuccess, "nccl_make_id: {}", ncclGetErrorString(r));
  NcclId id;
  std::memcpy(id.data(), uid.internal, id.size());
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int world_size, int rank, int device,
                                                     std::chrono::milliseconds timeout) {
  MLA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
            "make_nccl_communicator: need 0 <= rank < world_size, got rank {} of {}", rank, world_size);
  MLA_CHECK(device >= 0, "make_nccl_communicator: device must be >= 0, got {}", device);
  MLA_CHECK(timeout.count() > 0, "make_nccl_communicator: the timeout must be positive, got {} ms", timeout.count());
  return std::make_unique<NcclCommunicator>(id, world_size, rank, device, timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator_from(void* nccl_comm, int device,
                                                          std::chrono::milliseconds timeout) {
  MLA_CHECK(nccl_comm != nullptr, "make_nccl_communicator_from: the ncclComm_t is null");
  MLA_CHECK(device >= 0, "make_nccl_communicator_from: device must be >= 0, got {}", device);
  MLA_CHECK(timeout.count() > 0, "make_nccl_communicator_from: the timeout must be positive, got {} ms",
            timeout.count());
  return std::make_unique<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), device, timeout);
}

#else  // no NCCL in this build

bool nccl_available() { return false; }
NcclId nccl_make_id() { throw Error("nccl_make_id: this build of mla has no NCCL (configure with CUDA and NCCL)"); }
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId&, int, int, int, std::chrono::milliseconds) {
  throw Error("make_nccl_communicator: this build of mla has no NCCL (configure with CUDA and NCCL)");
}
std::unique_ptr<Communicator> make_nccl_communicator_from(void*, int, std::chrono::milliseconds) {
  throw Error("make_nccl_communicator_from: this build of mla has no NCCL (configure with CUDA and NCCL)");
}

#endif

}  // namespace mla
