// SPDX-License-Identifier: Apache-2.0
// The host half of a step on the device: pinned staging memory and the one metadata upload per step
// (mla/step.h). The layer's forward() only reads what this file copied.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "mla/step.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla {

PinnedBuffer::PinnedBuffer(std::size_t bytes) : size_(bytes) {
#if MLA_WITH_CUDA
  if (cuda_device_count() > 0) {
    data_ = std::shared_ptr<void>(cuda_rt::host_alloc(bytes), [](void* p) { cuda_rt::host_free(p); });
    pinned_ = true;
    return;
  }
#endif
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  MLA_CHECK(p != nullptr, "PinnedBuffer: cannot allocate {} bytes", bytes);
  data_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

TensorView PinnedBuffer::view() const {
  return TensorView(data_.get(), DType::u8, {static_cast<int64_t>(size_)}, Device::cpu());
}

namespace {

void check_bytes(const TensorView& t, std::size_t need, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
  detail::check_ndim(t, 1, op, arg);
  detail::check_dtype(t, DType::u8, op, arg);
  MLA_CHECK(t.stride[0] == 1 || t.size(0) <= 1, "{}: {} must be contiguous, got {}", op, arg, t.describe());
  MLA_CHECK(static_cast<std::size_t>(t.size(0)) >= need,
            "{}: {} must hold the plan's {} metadata bytes (plan.metadata.bytes()), got {}", op, arg, need,
            t.describe());
}

}  // namespace

void write_step_metadata(const Plan& plan, const TensorView& staging) {
  constexpr const char* op = "write_step_metadata";
  const std::size_t bytes = plan.metadata.bytes();
  check_bytes(staging, bytes, op, "staging");
  MLA_CHECK(staging.device.is_cpu(), "{}: staging must be host memory, got {}", op, staging.describe());
  if (bytes > 0) std::memcpy(staging.data, plan.metadata.data.data(), bytes);
}

void upload_step_metadata(const Plan& plan, const TensorView& staging, const TensorView& device_metadata,
                          const Context& ctx) {
  constexpr const char* op = "upload_step_metadata";
  const std::size_t bytes = plan.metadata.bytes();
  // Both buffers are checked before the staging buffer is written: nothing is written when the
  // device copy cannot be made.
  check_bytes(staging, bytes, op, "staging");
  MLA_CHECK(staging.device.is_cpu(), "{}: staging must be host memory, got {}", op, staging.describe());
  check_bytes(device_metadata, bytes, op, "device_metadata");
  detail::check_device_value(device_metadata.device, op, "device_metadata");
  MLA_CHECK(bytes == 0 || reinterpret_cast<uintptr_t>(device_metadata.data) % 16 == 0,
            "{}: device_metadata must be 16-byte aligned, got address {}", op, device_metadata.data);
  MLA_CHECK(device_metadata.device.is_cpu() || device_metadata.device.index < cuda_device_count(),
            "{}: device_metadata is on {} but {} CUDA device(s) are present{}", op, to_string(device_metadata.device),
            cuda_device_count(), built_with_cuda() ? "" : " (this build of mla has no CUDA backend)");
  if (bytes > 0 && device_metadata.device.is_cpu()) {
    const auto s0 = reinterpret_cast<uintptr_t>(staging.data), d0 = reinterpret_cast<uintptr_t>(device_metadata.data);
    MLA_CHECK(s0 == d0 || s0 + bytes <= d0 || d0 + bytes <= s0,
              "{}: staging and device_metadata overlap without being the same buffer", op);
  }
  write_step_metadata(plan, staging);
  if (bytes == 0 || device_metadata.data == staging.data) return;
  if (device_metadata.device.is_cpu()) {
    std::memcpy(device_metadata.data, staging.data, bytes);
    return;
  }
#if MLA_WITH_CUDA
  cuda_rt::memcpy_async(device_metadata.data, staging.data, bytes, ctx.stream, device_metadata.device.index);
#else
  (void)ctx;  // a CUDA device_metadata was refused above
#endif
}

}  // namespace mla
