// SPDX-License-Identifier: Apache-2.0
// Launcher of the sm90_fp8 mha_prefill variant: which launches it takes, the quantise pass (quantize.cuh) into the
// caller's workspace (core/prefill_fp8.h), the three TMA tensor maps over the codes, the attention grid
// (kernel.cuh). The instantiations of the family live here: quantize_rows_kernel<k, vec> (4),
// quantize_vt_kernel<vec> (2) and the attention kernel's two schedules (one CTA per unit, persistent;
// common/prefill_schedule.h's rule picks one per launch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/prefill_fp8.h"
#include "cuda/attention/sm90/prefill_fp8/kernel.cuh"
#include "cuda/attention/sm90/common/prefill_schedule.h"
#include "cuda/attention/sm90/prefill_fp8/plan.h"
#include "cuda/attention/sm90/prefill_fp8/quantize.cuh"
#include "cuda/attention/sm90/prefill_fp8/variant.h"
#include "cuda/common/launch.h"
#include "cuda/common/ptx/tensor_map.h"
#include "runtime/device_api.h"

namespace mla::cuda::prefill_sm90_fp8 {
namespace {

// Rows of 8 bf16 at 16-byte aligned addresses: base and the row / head strides (a head stride 0 included).
bool rows16(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[0] % 8 == 0 && t.stride[1] % 8 == 0 &&
         t.stride[2] == 1;
}

// Tensor map of a [heads][rows][cols] e4m3 region: boxes of 128 columns x 128 rows x 1 head, 128-byte swizzled.
CUtensorMap map_of(const uint8_t* base, int64_t cols, int64_t rows, int64_t heads, int32_t box_rows, const char* what) {
  ptx::TmaTensor m;
  m.base = base;
  m.dtype = DType::fp8_e4m3;
  m.rank = 3;
  m.dims[0] = cols;
  m.dims[1] = rows;
  m.dims[2] = heads;
  m.strides[0] = 1;
  m.strides[1] = cols;
  m.strides[2] = cols * rows;
  m.box[0] = Traits::kPanelCols;
  m.box[1] = box_rows;
  m.box[2] = 1;
  m.swizzle = ptx::TmaSwizzle::b128;
  m.l2_promotion_bytes = 256;
  return ptx::make_tensor_map(m, what);
}

}  // namespace

const char* supports(const dispatch::PrefillArgs& a) {
  if (!a.opts.fp8) return "fp8 compute off (PrefillOptions::fp8)";
  if (a.k_nope.size(2) != 128 || a.k_pe.size(2) != 64 || a.v.size(2) != Traits::kDv || a.q.size(2) != Traits::kDqk)
    return "d_nope 128, d_rope 64, d_v 128 only";
  for (const TensorView* t : {&a.q, &a.k_nope, &a.k_pe, &a.v, &a.out})
    if (t->dtype != DType::bf16) return "bf16 q, k, v and out only";
  if (!(a.softmax_scale > 0) || !std::isfinite(a.softmax_scale)) return "softmax_scale must be positive and finite";
  const int64_t batch = a.cu_seqlens_q.size(0) - 1;
  const prefill_fp8::Layout l = prefill_fp8::Layout::of(a.q.size(0), a.k_nope.size(0), a.q.size(1), batch);
  if (a.q.size(0) >= (int64_t(1) << 31) || l.k_rows >= (int64_t(1) << 31))
    return "more than 2^31 query or padded key rows (TMA coordinates are 32-bit)";
  const TensorView& ws = a.opts.workspace;
  if (!ws.defined() || static_cast<int64_t>(ws.numel() * ws.element_size()) < l.total ||
      reinterpret_cast<uintptr_t>(ws.data) % prefill_fp8::kBaseAlign != 0)
    return "a 16-byte aligned workspace of mha_prefill_workspace_bytes";
  return nullptr;
}

void run(const dispatch::PrefillArgs& a) {
  using T = Traits;
  if (a.max_seqlen_q <= 0) return;  // no request has a query row
  DeviceGuard guard(a.q.device);
  const cudaStream_t stream = stream_of(a.ctx);
  const int64_t batch = a.cu_seqlens_q.size(0) - 1, heads = a.q.size(1);
  const int64_t total_q = a.q.size(0), total_k = a.k_nope.size(0);
  const prefill_fp8::Layout l = prefill_fp8::Layout::of(total_q, total_k, heads, batch);
  uint8_t* ws = static_cast<uint8_t*>(a.opts.workspace.data);

  QuantizeParams qp{};
  qp.q = static_cast<const uint16_t*>(a.q.data);
  qp.q_stride_t = a.q.stride[0];
  qp.q_stride_h = a.q.stride[1];
  qp.q_stride_d = a.q.stride[2];
  qp.k_nope = static_cast<const uint16_t*>(a.k_nope.data);
  qp.kn_stride_t = a.k_nope.stride[0];
  qp.kn_stride_h = a.k_nope.stride[1];
  qp.kn_stride_d = a.k_nope.stride[2];
  qp.k_pe = static_cast<const uint16_t*>(a.k_pe.data);
  qp.kp_stride_t = a.k_pe.stride[0];
  qp.kp_stride_h = a.k_pe.size(1) == 1 ? 0 : a.k_pe.stride[1];
  qp.kp_stride_d = a.k_pe.stride[2];
  qp.v = static_cast<const uint16_t*>(a.v.data);
  qp.v_stride_t = a.v.stride[0];
  qp.v_stride_h = a.v.stride[1];
  qp.v_stride_d = a.v.stride[2];
  qp.cu_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  qp.cu_k_stride = a.cu_seqlens_k.stride[0];
  qp.q8 = ws + l.q_off;
  qp.k8 = ws + l.k_off;
  qp.vt8 = ws + l.v_off;
  qp.total_q = total_q;
  qp.total_k = total_k;
  qp.k_rows = l.k_rows;
  qp.batch = static_cast<int32_t>(batch);
  qp.heads = static_cast<int32_t>(heads);
  qp.q_scale = a.opts.q_scale;
  qp.k_scale = a.opts.k_scale;
  qp.v_scale = a.opts.v_scale;
  if (batch > INT32_MAX || heads > 65535) throw Error("mha_prefill (sm90_fp8): problem too large for one launch");

  const QuantScale qs = quant_scale(qp.q_scale), ks = quant_scale(qp.k_scale), vs = quant_scale(qp.v_scale);
  qp.q_recip = qs.recip;
  qp.k_recip = ks.recip;
  qp.v_recip = vs.recip;
  qp.q_div = static_cast<int32_t>(qs.division);
  qp.k_div = static_cast<int32_t>(ks.division);
  qp.v_div = static_cast<int32_t>(vs.division);

  using S = QuantizeShape;
  const bool vec_q = rows16(a.q), vec_k = rows16(a.k_nope) && rows16(a.k_pe), vec_v = rows16(a.v);
  const unsigned head_groups = static_cast<unsigned>((heads + S::kHeads - 1) / S::kHeads);
  if (total_q > 0) {
    const dim3 g(grid_for((total_q + S::kRows - 1) / S::kRows, 1, "mha_prefill (sm90_fp8)"), head_groups);
    if (vec_q)
      quantize_rows_kernel<false, true><<<g, S::kRowsThreads, 0, stream>>>(qp);
    else
      quantize_rows_kernel<false, false><<<g, S::kRowsThreads, 0, stream>>>(qp);
    check_launch("mha_prefill (sm90_fp8): quantize q");
  }
  if (l.k_rows > 0) {
    const dim3 g(grid_for(l.k_rows / S::kRows, 1, "mha_prefill (sm90_fp8)"), head_groups);
    if (vec_k)
      quantize_rows_kernel<true, true><<<g, S::kRowsThreads, 0, stream>>>(qp);
    else
      quantize_rows_kernel<true, false><<<g, S::kRowsThreads, 0, stream>>>(qp);
    check_launch("mha_prefill (sm90_fp8): quantize k");
    const dim3 gv(grid_for((l.k_rows + S::kVtRows - 1) / S::kVtRows, 1, "mha_prefill (sm90_fp8)"),
                  static_cast<unsigned>(heads));
    if (vec_v)
      quantize_vt_kernel<true><<<gv, S::kThreads, 0, stream>>>(qp);
    else
      quantize_vt_kernel<false><<<gv, S::kThreads, 0, stream>>>(qp);
    check_launch("mha_prefill (sm90_fp8): quantize v");
  }

  AttnParams p{};
  prefill_io::set_io(p, a);
  p.total_q = total_q;
  p.total_k = total_k;
  const int64_t q_tiles = (a.max_seqlen_q + T::kBlockM - 1) / T::kBlockM;
  if (q_tiles > INT32_MAX) throw Error("mha_prefill (sm90_fp8): problem too large for one launch");
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(heads);
  p.q_tiles = static_cast<int32_t>(q_tiles);
  p.causal = a.causal ? 1 : 0;
  p.scale_log2 = static_cast<float>(double(a.opts.q_scale) * a.opts.k_scale * a.softmax_scale * 1.4426950408889634);
  p.v_scale = a.opts.v_scale;

  const CUtensorMap q_map = map_of(qp.q8, T::kDqk, total_q, heads, T::kBlockM, "mha_prefill (sm90_fp8): q8");
  const CUtensorMap k_map = map_of(qp.k8, T::kDqk, l.k_rows, heads, T::kBlockN, "mha_prefill (sm90_fp8): k8");
  const CUtensorMap v_map = map_of(qp.vt8, l.k_rows, T::kDv, heads, T::kDv, "mha_prefill (sm90_fp8): vt8");
  const int64_t units = q_tiles * heads * batch;
  const int sms = cuda_rt::device_info(a.q.device.index).sm_count;
  const bool persistent = prefill_io::use_persistent(a.causal, q_tiles, units, sms);
  const unsigned grid = persistent ? grid_for(std::min<int64_t>((units + 1) / 2, sms), 1, "mha_prefill (sm90_fp8)")
                                   : grid_for(units, 1, "mha_prefill (sm90_fp8)");
  auto kernel = persistent ? mha_prefill_sm90_fp8_kernel<true> : mha_prefill_sm90_fp8_kernel<false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
             "mha_prefill (sm90_fp8): shared-memory limit");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(q_map, k_map, v_map, p, units);
  check_launch("mha_prefill (sm90_fp8)");
}

}  // namespace mla::cuda::prefill_sm90_fp8
