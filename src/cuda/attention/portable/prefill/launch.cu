// SPDX-License-Identifier: Apache-2.0
// Launcher of the portable mha_prefill (kernel.cuh): the parameters, one CTA per (64-row query tile, head,
// request).
#include <cuda_runtime.h>

#include <string>

#include "cuda/attention/portable/prefill/kernel.cuh"
#include "cuda/attention/portable/prefill/launch.h"
#include "cuda/common/launch.h"

namespace mla::cuda::prefill {
namespace {

bool rows_aligned16(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[0] % 8 == 0 && t.stride[1] % 8 == 0 &&
         t.size(2) % 8 == 0;
}

}  // namespace

const char* supports_portable(const dispatch::PrefillArgs& a) {
  return a.opts.fp8 ? "fp8 compute runs on sm90_fp8 only (an sm_90 device)" : nullptr;
}

void run_portable(const dispatch::PrefillArgs& a) {
  const TensorView &q = a.q, &k_nope = a.k_nope, &k_pe = a.k_pe, &v = a.v, &cu_seqlens_q = a.cu_seqlens_q,
                   &cu_seqlens_k = a.cu_seqlens_k, &out = a.out, &lse = a.lse;
  const int64_t max_seqlen_q = a.max_seqlen_q;  // max_seqlen_k: keys are streamed, no bound needed
  const double softmax_scale = a.softmax_scale;
  const bool causal = a.causal;
  const Context& ctx = a.ctx;
  using prefill::Traits;
  const int64_t d_nope = k_nope.size(2), d_rope = k_pe.size(2), d_v = v.size(2);
  if (d_nope + d_rope > Traits::kMaxDqk || d_v > Traits::kMaxDv)
    throw Error("mha_prefill: the CUDA kernel supports d_nope + d_rope <= " + std::to_string(Traits::kMaxDqk) +
                " and d_v <= " + std::to_string(Traits::kMaxDv) + ", got " + std::to_string(d_nope) + " + " +
                std::to_string(d_rope) + " and " + std::to_string(d_v));
  if (max_seqlen_q <= 0) return;  // no request has a query row
  DeviceGuard guard(q.device);

  PrefillParams p{};
  p.q = static_cast<const uint16_t*>(q.data);
  p.q_stride_t = q.stride[0];
  p.q_stride_h = q.stride[1];
  p.k_nope = static_cast<const uint16_t*>(k_nope.data);
  p.kn_stride_t = k_nope.stride[0];
  p.kn_stride_h = k_nope.stride[1];
  p.k_pe = static_cast<const uint16_t*>(k_pe.data);
  p.kp_stride_t = k_pe.stride[0];
  p.kp_stride_h = k_pe.stride[1];
  p.v = static_cast<const uint16_t*>(v.data);
  p.v_stride_t = v.stride[0];
  p.v_stride_h = v.stride[1];
  p.cu_q = static_cast<const int32_t*>(cu_seqlens_q.data);
  p.cu_k = static_cast<const int32_t*>(cu_seqlens_k.data);
  p.cu_q_stride = cu_seqlens_q.stride[0];
  p.cu_k_stride = cu_seqlens_k.stride[0];
  p.out = static_cast<uint16_t*>(out.data);
  p.out_stride_t = out.stride[0];
  p.out_stride_h = out.stride[1];
  if (lse.defined()) {
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_h = lse.stride[0];
    p.lse_stride_t = lse.stride[1];
  }
  p.total_q = q.size(0);
  p.total_k = k_nope.size(0);
  const int64_t batch = cu_seqlens_q.size(0) - 1, heads = q.size(1);
  const int64_t q_tiles = (max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (batch > INT32_MAX || heads > INT32_MAX || q_tiles > INT32_MAX)
    throw Error("mha_prefill: problem too large for one launch");
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(heads);
  p.q_tiles = static_cast<int32_t>(q_tiles);
  p.d_nope = static_cast<int32_t>(d_nope);
  p.d_rope = static_cast<int32_t>(d_rope);
  p.d_v = static_cast<int32_t>(d_v);
  p.causal = causal ? 1 : 0;
  p.vec16 = rows_aligned16(q) && rows_aligned16(k_nope) && rows_aligned16(k_pe) && rows_aligned16(v) ? 1 : 0;
  p.scale_log2 = static_cast<float>(softmax_scale * 1.4426950408889634);

  const unsigned grid = grid_for(q_tiles * heads * batch, 1, "mha_prefill");
  check_cuda(cudaFuncSetAttribute(prefill::mha_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Traits::kSmem),
             "mha_prefill: shared-memory limit");
  prefill::mha_prefill_kernel<<<grid, Traits::kThreads, Traits::kSmem, stream_of(ctx)>>>(p);
  check_launch("mha_prefill");
}

}  // namespace mla::cuda::prefill
