// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fused quantising V up-projection with an explicit schedule (up_proj_quant.cu). mla::up_project_quantized
// on CUDA runs core/up_proj_schedule.h's choice for the device; the GPU tests (tests/gpu/
// test_output_quant_gpu.cpp) run every schedule through this entry point against the unfused reference.
#include <cstdint>

#include "core/up_proj_schedule.h"
#include "mla/block_ops.h"

namespace mla::cuda {

// Whether `device` runs split schedules: thread-block clusters (sm_90 and later) and this build's kernels compiled
// for them (not only the compute_80 PTX).
bool up_proj_splits_supported(int device);

// Whether `device` runs the Hopper mainloop (up_proj::Schedule::hopper): compute capability 9.0 with this build's
// sm_90a kernels.
bool up_proj_hopper_supported(int device);

// The schedule up_project_quantized runs for o_lat [rows, heads, L] and w_uv [heads, L, V] on `device`
// (core/up_proj_schedule.h with the device's SM count; splits only where supported).
up_proj::Schedule up_proj_planned_schedule(int64_t rows, int64_t heads, int64_t L, int64_t V, int device);

// up_project_quantized with `sched` instead of the planner's schedule. Refused (mla::Error, nothing written):
// a tile of other than 16, 64 or 128 rows (the Hopper mainloop: 64 or 128), a split of other than 1, 2, 4 or 8,
// more splits than latent steps (32 wide; the Hopper mainloop's 64), a split on a device without thread-block
// clusters (before sm_90), the Hopper mainloop on a device other than sm_90a. Arguments as
// mla::up_project_quantized, which checks them (this entry point checks only what the kernel needs).
void up_project_quantized_with(const TensorView& o_lat, const TensorView& w_uv, OutputQuant key, const TensorView& codes,
                               const TensorView& scales, float scale, const up_proj::Schedule& sched,
                               const Context& ctx = {});

}  // namespace mla::cuda
