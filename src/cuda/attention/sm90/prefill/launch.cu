// SPDX-License-Identifier: Apache-2.0
// Launcher of the sm90 mha_prefill variant (kernel.cuh): which launches it takes, the four TMA tensor
// maps (q, k_nope, k_pe, v as [rows, heads, columns] with the views' strides), the grid.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/launch.h"
#include "cuda/common/ptx/tensor_map.h"
#include "runtime/device_api.h"
#include "cuda/attention/sm90/common/prefill_schedule.h"
#include "cuda/attention/sm90/prefill/kernel.cuh"
#include "cuda/attention/sm90/prefill/variant.h"

namespace mla::cuda::prefill_sm90 {
namespace {

// One head in the tensor map: a head stride of 0 (k_pe shared by all heads) or a single head (any stride).
bool one_head(const TensorView& t) { return t.stride[1] == 0 || t.size(1) == 1; }

// A [rows, heads, cols] bf16 view TMA can read: 16-byte aligned base, contiguous columns, row and head
// strides positive multiples of 16 bytes below 2^40 (the head stride 0 only where `shared_head`).
bool tma_view(const TensorView& t, bool shared_head) {
  const auto ok_stride = [](int64_t s) { return s > 0 && (s * 2) % 16 == 0 && s < (int64_t(1) << 38); };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[2] == 1 && ok_stride(t.stride[0]) &&
         (ok_stride(t.stride[1]) || t.size(1) == 1 || (shared_head && t.stride[1] == 0));
}

// Tensor map of a [rows, heads, cols] view: boxes of 64 columns x 1 head x 128 rows, 128-byte swizzled
// (the panels kernel.cuh's wgmma descriptors read). A head stride of 0 gives a one-head map.
CUtensorMap map_of(const TensorView& t, const char* what) {
  const bool single = one_head(t);
  ptx::TmaTensor m;
  m.base = t.data;
  m.dtype = DType::bf16;
  m.rank = 3;
  m.dims[0] = t.size(2);
  m.dims[1] = single ? 1 : t.size(1);
  m.dims[2] = t.size(0);
  m.strides[0] = 1;
  m.strides[1] = single ? t.stride[0] : t.stride[1];  // unused for one head; any legal value
  m.strides[2] = t.stride[0];
  m.box[0] = Traits::kPanelCols;
  m.box[1] = 1;
  m.box[2] = Traits::kBlockN;  // = kBlockM: Q boxes are 128 rows too
  m.swizzle = ptx::TmaSwizzle::b128;
  m.l2_promotion_bytes = 256;
  return ptx::make_tensor_map(m, what);
}

}  // namespace

const char* supports(const dispatch::PrefillArgs& a) {
  using T = Traits;
  if (a.opts.fp8) return "fp8 compute runs on sm90_fp8 only";
  if (a.k_nope.size(2) != T::kDNope || a.k_pe.size(2) != T::kDRope || a.v.size(2) != T::kDv ||
      a.q.size(2) != T::kDqk)
    return "d_nope 128, d_rope 64, d_v 128 only";
  for (const TensorView* t : {&a.q, &a.k_nope, &a.k_pe, &a.v, &a.out})
    if (t->dtype != DType::bf16) return "bf16 q, k, v and out only";
  if (!(a.softmax_scale > 0) || !std::isfinite(a.softmax_scale)) return "softmax_scale must be positive and finite";
  if (a.q.size(0) == 0 || a.k_nope.size(0) == 0) return "no query or key rows";
  if (a.q.size(0) >= (int64_t(1) << 31) || a.k_nope.size(0) >= (int64_t(1) << 31))
    return "more than 2^31 query or key rows (TMA coordinates are 32-bit)";
  if (!tma_view(a.q, false) || !tma_view(a.k_nope, false) || !tma_view(a.k_pe, true) || !tma_view(a.v, false))
    return "q, k_nope, k_pe and v need contiguous rows with 16-byte aligned base and strides (TMA)";
  return nullptr;
}

namespace {

// Schedules of run_kernel (kernel.cuh, Schedule): one CTA per unit, persistent pairs, or the choice by
// unit count that the default variant makes.
enum class Sched { one_per_cta, persistent, automatic };
// kernel.cuh's kOpts of the variants in use: the half first tile only. The early next-unit loads and the
// per-warp releases measured slower (interleaved A/B: docs/design/prefill_sm90.md) and run only in sm90_loads.
constexpr int kAllOpts = kHalfFirstTile;

template <bool kPingpong, Sched kSched, int kOpts = kAllOpts>
void run_kernel(const dispatch::PrefillArgs& a) {
  using T = Traits;
  if (a.max_seqlen_q <= 0) return;  // no request has a query row
  DeviceGuard guard(a.q.device);

  PrefillParams p{};
  p.kp_stride_h = one_head(a.k_pe) ? 0 : a.k_pe.stride[1];  // 0: the kernel reads head 0 of the one-head map
  prefill_io::set_io(p, a);
  p.total_q = a.q.size(0);
  p.total_k = a.k_nope.size(0);
  const int64_t batch = a.cu_seqlens_q.size(0) - 1, heads = a.q.size(1);
  const int64_t q_tiles = (a.max_seqlen_q + T::kBlockM - 1) / T::kBlockM;
  if (batch > INT32_MAX || heads > INT32_MAX || q_tiles > INT32_MAX)
    throw Error("mha_prefill (sm90): problem too large for one launch");
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(heads);
  p.q_tiles = static_cast<int32_t>(q_tiles);
  p.d_nope = T::kDNope;
  p.d_rope = T::kDRope;
  p.d_v = T::kDv;
  p.causal = a.causal ? 1 : 0;
  p.scale_log2 = static_cast<float>(a.softmax_scale * 1.4426950408889634);

  const CUtensorMap q_map = map_of(a.q, "mha_prefill (sm90): q");
  const CUtensorMap kn_map = map_of(a.k_nope, "mha_prefill (sm90): k_nope");
  const CUtensorMap kp_map = map_of(a.k_pe, "mha_prefill (sm90): k_pe");
  const CUtensorMap v_map = map_of(a.v, "mha_prefill (sm90): v");
  const int64_t units = q_tiles * heads * batch;
  const int sms = cuda_rt::device_info(a.q.device.index).sm_count;
  // `automatic`: the rule of both prefill kernels (common/prefill_schedule.h); `persistent` (sm90_persist) wherever
  // two units per SM fill the machine.
  const bool persistent = kSched == Sched::persistent ? units >= 2 * int64_t{sms}
                          : kSched == Sched::automatic && prefill_io::use_persistent(a.causal, q_tiles, units, sms);
  const unsigned grid = persistent ? grid_for(std::min<int64_t>((units + 1) / 2, sms), 1, "mha_prefill (sm90)")
                                   : grid_for(units, 1, "mha_prefill (sm90)");
  auto kernel = mha_prefill_sm90_kernel<kPingpong, false, kOpts>;
  if constexpr (kSched != Sched::one_per_cta)  // no persistent instantiation where it never runs
    if (persistent) kernel = mha_prefill_sm90_kernel<kPingpong, true, kOpts>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
             "mha_prefill (sm90): shared-memory limit");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream_of(a.ctx)>>>(q_map, kn_map, kp_map, v_map, p, units);
  check_launch("mha_prefill (sm90)");
}

}  // namespace

void run(const dispatch::PrefillArgs& a) { run_kernel<true, Sched::automatic>(a); }
void run_one_per_cta(const dispatch::PrefillArgs& a) { run_kernel<true, Sched::one_per_cta>(a); }
void run_persistent(const dispatch::PrefillArgs& a) { run_kernel<true, Sched::persistent>(a); }
void run_no_pingpong(const dispatch::PrefillArgs& a) { run_kernel<false, Sched::one_per_cta>(a); }
void run_opts_none(const dispatch::PrefillArgs& a) { run_kernel<true, Sched::automatic, 0>(a); }
void run_opts_loads(const dispatch::PrefillArgs& a) {
  run_kernel<true, Sched::automatic, kHalfFirstTile | kEarlyNext | kWarpRelease>(a);
}

}  // namespace mla::cuda::prefill_sm90
