// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-KV combine of mqa_decode as a host call, shared by every decode kernel that writes partials (the
// portable engine's uniform splits, the sm90 kernels' uniform and balanced schedules), and the workspace layout
// those partials live in. Arch-neutral (compiled for every GPU target).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mqa_params.h"
#include "mla/plan.h"

namespace mla::cuda::combine {

inline constexpr int kMaxSplits = kDecodeMaxSplits;  // uniform splits per request row (the planner's bound)
inline constexpr int kMaxMergedSplits = 256;          // partials one combine row merges (balanced: <= its CTAs)
inline constexpr int kMaxDv = 512;                    // a partial O row's stride in floats
inline constexpr int kThreads = 128;                  // threads of a combine CTA (one CTA per output row)

// Partials a combine thread loads at once (split_kv_kernel's kBatch): 16 where a uniform row merges more than 8
// splits (one round trip for up to 16; 127 registers, four CTAs an SM); else 8 (at most 64 registers, eight CTAs an
// SM: the balanced schedule's rows — most of them two or three partials — and short uniform rows fill the machine
// in half the waves).
constexpr int combine_batch(int num_splits, bool balanced) { return !balanced && num_splits > 8 ? 16 : 8; }

// Workspace layout for S uniform splits: partial LSE [b, S, M] fp32, then (256-byte aligned) partial O
// [b, S, M, 512] fp32, M = s_q * h_q.
inline int64_t ws_lse_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  return (b * splits * s_q * h_q * 4 + 255) / 256 * 256;
}
inline int64_t ws_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  if (splits <= 1) return 0;
  return ws_lse_bytes(b, s_q, h_q, splits) + b * splits * s_q * h_q * kMaxDv * 4;
}

struct SplitKvParams {
  MqaRowParams rows;      // out [b, s_q, h_q, d_v] (activation type rows.act), lse [b, s_q, h_q] or null
  int32_t num_splits;     // uniform: partials per request
  const float* ws_lse;    // [b, num_splits, s_q * h_q] partial LSE (or the balanced slots below)
  const float* ws_o;      // [b, num_splits, s_q * h_q, 512] partial O / l
  // The sm90 balanced schedule (core/decode_balance.h): request g's partials are the slots ws_meta[2g] ..
  // + ws_meta[2g + 1] - 1 of ws_lse [slots, s_q * h_q] / ws_o [slots, s_q * h_q, 512]; ws_meta[2g + 1] <= 1:
  // the attention kernel wrote the request itself. nullptr: the uniform layout above.
  const int32_t* ws_meta;
};

// Merges the partials of b requests into p.rows' out / lse on `stream` (combine/merge_rule.cuh). p.rows.pdl: a
// programmatic dependent launch (cuda/common/launch.h launch_kernel): its CTAs may be scheduled while the
// attention kernel still runs and wait for it on the device.
void launch_split_kv(const SplitKvParams& p, int64_t b, cudaStream_t stream);

}  // namespace mla::cuda::combine
