// SPDX-License-Identifier: Apache-2.0
#pragma once
// Argument checks shared by the communicators (mla/comm.h): contiguous views on the communicator's
// device, one dtype, and the size relation of the collective. They run before any rank waits, so a
// bad call throws on its own rank (its peers then time out; see comm.h).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/check.h"
#include "mla/comm.h"
#include "mla/tensor.h"

namespace mla::dist {

inline void check_buffer(const TensorView& t, Device device, const char* what, const char* arg) {
  detail::check_defined(t, what, arg);
  detail::check_device_value(t.device, what, arg);
  MLA_CHECK(t.device == device, "{}: {} must be on {} (the communicator's device), got {}", what, arg,
            to_string(device), t.describe());
  MLA_CHECK(t.is_contiguous(), "{}: {} must be contiguous, got {}", what, arg, t.describe());
}

// Bytes of one rank's input.
inline int64_t check_all_gather(const TensorView& in, const TensorView& out, int world, Device device,
                                const char* what) {
  check_buffer(in, device, what, "in");
  check_buffer(out, device, what, "out");
  MLA_CHECK(in.dtype == out.dtype, "{}: in and out must share a dtype, got {} and {}", what, in.describe(),
            out.describe());
  MLA_CHECK(out.numel() == in.numel() * world, "{}: out must hold {} x in's {} elements, got {}", what, world,
            in.numel(), out.describe());
  return in.numel() * static_cast<int64_t>(in.element_size());
}

// Bytes of one block (in and out hold `world` blocks each).
inline int64_t check_all_to_all(const TensorView& in, const TensorView& out, int world, Device device,
                                const char* what) {
  check_buffer(in, device, what, "in");
  check_buffer(out, device, what, "out");
  MLA_CHECK(in.dtype == out.dtype && in.numel() == out.numel(),
            "{}: in and out must have one dtype and size, got {} and {}", what, in.describe(), out.describe());
  MLA_CHECK(in.numel() % world == 0, "{}: in must split into {} equal blocks, got {}", what, world, in.describe());
  return in.numel() / world * static_cast<int64_t>(in.element_size());
}

// Elements of one block (in holds `world` blocks, out one). dtype f32 or bf16 (CPU groups: f64 too).
inline int64_t check_reduce_scatter(const TensorView& in, const TensorView& out, int world, Device device,
                                    const char* what) {
  check_buffer(in, device, what, "in");
  check_buffer(out, device, what, "out");
  MLA_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * world,
            "{}: in must hold {} blocks of out's dtype and size, got {} and {}", what, world, in.describe(),
            out.describe());
  MLA_CHECK(in.dtype == DType::f32 || in.dtype == DType::bf16 || (device.is_cpu() && in.dtype == DType::f64),
            "{}: sums f32 or bf16 (CPU: f64 too), got {}", what, in.describe());
  return out.numel();
}

// comms[r] is rank r of a group of comms.size() >= 1 communicators, none null: what the wrappers of a
// whole group (make_lockstep_group, make_peer_group) need before they pair the ranks up. Throws
// mla::Error starting with `what` (the caller) and saying what was expected and what was got.
void check_group_ranks(const std::vector<std::unique_ptr<Communicator>>& comms, const char* what);

// out[i] = Σ_p blocks[p][i] for `n` elements of dtype (f32, bf16 or f64), summed in double, rounded once.
void sum_blocks(void* out, const std::vector<const char*>& blocks, int64_t n, DType dtype);

}  // namespace mla::dist
