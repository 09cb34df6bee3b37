// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Communicator that forwards every call to the one it wraps. The wrappers of src/dist (lockstep,
// peer) derive from it and override only the calls they change, so a new Communicator virtual is
// forwarded by them all from one place. (apps/mla/run_dcp.cpp's TracedCommunicator cannot use it: apps
// see only mla/, core/ and runtime/.)
#include <memory>
#include <string>
#include <utility>

#include "mla/comm.h"

namespace mla::dist {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device device() const override { return inner_->device(); }
  std::string backend() const override { return inner_->backend(); }
  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    inner_->all_gather(in, out, ctx);
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    inner_->all_to_all(in, out, ctx);
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    inner_->reduce_scatter(in, out, ctx);
  }
  void synchronize(const Context& ctx) override { inner_->synchronize(ctx); }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace mla::dist
