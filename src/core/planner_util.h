// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internal helpers shared by the planner translation units (src/core/planner*.cpp).
#include <cstdint>
#include <vector>

#include "mla/plan.h"

namespace mla::detail {

// Packs plan.metadata from the plan's prefill, context-chunk and sparse fields (planner_step.cpp).
void fill_step_metadata(Plan& plan);

// query_start_loc starts at 0 and never decreases; throws mla::Error naming `op` otherwise.
void check_query_start_loc(const std::vector<int32_t>& query_start_loc, const char* op);

}  // namespace mla::detail
