// SPDX-License-Identifier: Apache-2.0
#pragma once
// One step's plan on the device, FlashInfer's plan/run split: the host plans once per step
// (make_plan, mla/plan.h), writes the plan's packed metadata into a pinned host buffer it owns and
// copies it into a device buffer it owns with one async copy (upload_step_metadata); every layer's
// forward() of that step reads only the device copy and never allocates, synchronises or uploads.
// Sizes: plan.metadata.bytes() for one plan, max_step_metadata_bytes(config, max_num_tokens) to
// allocate both buffers once.
//
//   PinnedBuffer staging(max_step_metadata_bytes(pc, max_tokens));
//   Tensor meta = Tensor::empty({int64_t(staging.size())}, DType::u8, device);
//   per step: Plan plan = make_plan(batch, pc);
//             upload_step_metadata(plan, staging.view(), meta, ctx);
//             for each layer: layer.forward(plan, {..., .metadata = meta}, cache, ws, ctx);
#include <cstddef>
#include <memory>

#include "mla/plan.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

// Page-locked host memory (cudaHostAlloc) where a CUDA device is present, ordinary heap memory
// otherwise: the staging buffer of upload_step_metadata. Copies share the memory.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  void* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  bool pinned() const { return pinned_; }
  TensorView view() const;  // u8 [size] (Device::cpu())

 private:
  std::shared_ptr<void> data_;
  std::size_t size_ = 0;
  bool pinned_ = false;
};

// Writes plan.metadata into `staging` (u8 [>= plan.metadata.bytes()], contiguous host memory).
void write_step_metadata(const Plan& plan, const TensorView& staging);

// write_step_metadata, then one stream-ordered copy of the bytes into `device_metadata` (u8
// [>= plan.metadata.bytes()], contiguous, 16-byte aligned, on the device the step runs on) on
// ctx.stream; a CPU device_metadata is copied at once. Nothing is copied for a plan without metadata
// (dense decode-only). The staging bytes must not change until the stream has run the copy. Staging
// must be pinned (PinnedBuffer) for the copy to be asynchronous and capturable: a CUDA graph captured
// around this call and the layers replays the copy, so rewrite the staging buffer with
// write_step_metadata of the replayed plan before each replay.
void upload_step_metadata(const Plan& plan, const TensorView& staging, const TensorView& device_metadata,
                          const Context& ctx = {});

}  // namespace mla
