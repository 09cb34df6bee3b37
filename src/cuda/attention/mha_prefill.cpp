// SPDX-License-Identifier: Apache-2.0
// The mha_prefill op on CUDA: its dispatch table (one entry per kernel or comparison schedule, best first;
// variant_table.h picks the first that can run the launch on the device). No kernel here: each entry's launcher
// lives with its kernel (sm90/prefill/launch.cu, portable/prefill/launch.cu).
#include <cstdint>

#include "cuda/attention/portable/prefill/launch.h"
#include "cuda/attention/sm90/prefill/variant.h"
#include "cuda/attention/sm90/prefill_fp8/variant.h"
#include "cuda/cuda_ops.h"
#include "cuda/dispatch/families.h"

namespace mla::cuda {

dispatch::Table<dispatch::PrefillArgs>& dispatch::mha_prefill_table() {
  static Table<PrefillArgs> table(
      "mha_prefill",
      {{{"sm90_fp8", 90, 90,
         "fp8 compute (PrefillOptions::fp8; src/cuda/attention/sm90/prefill_fp8): e4m3 q, k, v^T from a quantise pass, "
         "TMA + e4m3 wgmma, P as e4m3 register A; d_nope 128, d_rope 64, d_v 128; the only variant that runs fp8; "
         "persistent pairs of units for causal s_q <= 4096 with >= 2 units per SM, else one CTA per unit"},
        prefill_sm90_fp8::supports, prefill_sm90_fp8::run},
       {{"sm90", 90, 90,
         "TMA + wgmma, warp-specialised (src/cuda/attention/sm90/prefill): bf16, d_nope 128, d_rope 64, d_v 128; "
         "persistent pairs of units for causal s_q <= 4096 with >= 2 units per SM, else one CTA per unit"},
        prefill_sm90::supports, prefill_sm90::run},
       {{"sm90_1cta", 90, 90, "the sm90 kernel, always one CTA per unit (comparison)"}, prefill_sm90::supports,
        prefill_sm90::run_one_per_cta},
       {{"sm90_persist", 90, 90, "the sm90 kernel, always persistent (one CTA per SM over pairs of units) from 2 units "
                                 "per SM (comparison)"},
        prefill_sm90::supports, prefill_sm90::run_persistent},
       {{"sm90_nopp", 90, 90, "the sm90 kernel without the consumers' pingpong turns (comparison)"},
        prefill_sm90::supports, prefill_sm90::run_no_pingpong},
       {{"sm90_r0", 90, 90, "sm90 as of 6a95c2a: no half first tile (comparison)"}, prefill_sm90::supports,
        prefill_sm90::run_opts_none},
       {{"sm90_loads", 90, 90, "sm90 + early next-unit loads (persistent) + per-warp stage releases (comparison)"},
        prefill_sm90::supports, prefill_sm90::run_opts_loads},
       {{"portable", 80, 0, "mma.sync engine: d_nope + d_rope <= 192, d_v <= 128"}, prefill::supports_portable,
        prefill::run_portable}});
  return table;
}

void mha_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe, const TensorView& v,
                 const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const TensorView& out, const TensorView& lse, double softmax_scale, bool causal,
                 const PrefillOptions& opts, const Context& ctx) {
  dispatch::mha_prefill_table().run({q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                     lse, softmax_scale, causal, opts, ctx},
                                    dispatch::device_cc(q.device.index));
}

}  // namespace mla::cuda
