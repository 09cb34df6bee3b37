// SPDX-License-Identifier: Apache-2.0
#pragma once
// CPU backend entry points, called by the front ends in src/ops/ after validation (shapes, dtypes,
// devices checked). float64 accumulation when ctx.precision == Precision::reference.
#include "mla/block_ops.h"
#include "mla/indexer.h"
#include "mla/ops.h"

namespace mla::cpu {
#include "core/backend_ops.inc"
}  // namespace mla::cpu
