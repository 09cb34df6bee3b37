// SPDX-License-Identifier: Apache-2.0
// Small pieces of one forward step: workspace and metadata views, row copies and the two
// head-batched products that move between the MHA head space (P, V) and the latent space (L).
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "layer/layer_internal.h"
#include "mla/block_ops.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla::layer_detail {

TensorView Step::view(const Region& r, DType t, std::initializer_list<int64_t> shape) const {
  TensorView v(ws + r.offset, t, shape, opt.device);
  // Sizes come from the same plan as the layout; a mismatch is a bug in this file set, not bad input.
  MLA_CHECK(v.numel() * static_cast<int64_t>(dtype_size(t)) <= r.bytes,
            "MlaAttention: internal error: view {} exceeds its workspace region of {} bytes", v.describe(), r.bytes);
  return v;
}

TensorView Step::meta_view(int64_t at, int64_t n) const {
  const auto words = static_cast<int64_t>(plan.metadata.data.size());  // no sum or product can overflow
  MLA_CHECK(at >= 0 && n >= 0 && at <= words && n <= words - at,
            "MlaAttention: internal error: metadata [{}, {}) outside the plan's {} bytes", at, at + n,
            plan.metadata.bytes());
  return TensorView(static_cast<uint8_t*>(meta) + at * 4, DType::i32, {n}, opt.device);
}

TensorView Step::unquantised_out() const {
  if (opt.out_quant == OutputQuant::none) return args.out;
  return view(layout.out_stage, opt.dtype, {facts.t_act, dims.h * dims.V});
}

bool Step::fused_out() const {
  if (!opt.device.is_cuda() || opt.out_quant == OutputQuant::none) return false;
  const int64_t unit = std::max<int64_t>(output_quant_group(opt.out_quant), 16);
  return dims.V % unit == 0 && dims.L % 8 == 0;
}

int64_t Step::fused_rows() const {
  if (!fused_out()) return 0;
  const int64_t n = opt.sparse ? facts.t_act : facts.t_dec;
  // From sm_90 on: cuBLAS's bmm and the pass. The fused product's Hopper mainloop beats them alone at h 128, 64..128
  // rows (up_proj::hopper_fuses), but not inside the layer's step (nvidia-h200, same call: the step x1.011-1.056
  // slower at h 128, b 64 / 128, every cache format). Before sm_90: always fused.
  return plan.config.compute_capability < 90 ? n : 0;
}

std::pair<TensorView, TensorView> Step::quantised_rows(int64_t t0, int64_t t1) const {
  const TensorView codes = args.out.slice(0, t0, t1);
  if (opt.out_quant == OutputQuant::nvfp4) return {codes, args.out_scales.slice(0, t0, t1)};
  if (output_quant_group(opt.out_quant) > 0) return {codes, args.out_scales.slice(1, t0, t1)};
  return {codes, TensorView{}};
}

TensorView Step::out_rows(int64_t t0, int64_t t1) const {
  const TensorView o = unquantised_out();
  const std::array<int64_t, 3> shape{t1 - t0, dims.h, dims.V}, stride{o.stride[0], dims.V, 1};
  return TensorView(o.ptr_at({t0, 0}), o.dtype, shape, stride, o.device);
}

void copy_rows(const TensorView& dst, const TensorView& src, const Context& ctx) {
  const int64_t n = dst.shape[0], h = dst.shape[1];
  const std::size_t es = dst.element_size(), width = static_cast<std::size_t>(dst.shape[2]) * es;
  if (n == 0 || h == 0 || width == 0) return;
  if (dst.device.is_cpu()) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < h; ++j) std::memcpy(dst.ptr_at({t, j}), src.ptr_at({t, j}), width);
    return;
  }
#if MLA_WITH_CUDA
  // One kernel for the whole grid of rows (a kernel node that PDL chains, not copy-engine nodes): byte strides.
  const auto es64 = static_cast<int64_t>(es);
  cuda_rt::copy_rows_async(dst.data, dst.stride[0] * es64, dst.stride[1] * es64, src.data, src.stride[0] * es64,
                           src.stride[1] * es64, n, h, static_cast<int64_t>(width), ctx.stream, dst.device.index,
                           ctx.pdl);
#else
  (void)ctx;
  throw Error("MlaAttention: CUDA tensors in a build without the CUDA backend");
#endif
}

TensorView broadcast_heads(const TensorView& rope, int64_t h) {
  const std::array<int64_t, 3> shape{rope.shape[0], h, rope.shape[1]}, stride{rope.stride[0], 0, 1};
  return TensorView(rope.data, rope.dtype, shape, stride, rope.device);
}

void absorb_queries(const Step& s, int64_t t0, int64_t t1, const TensorView& q_abs) {
  const Dims& d = s.dims;
  const TensorView q = s.args.q.slice(0, t0, t1);
  // (h, n, P) x (h, P, L) -> (h, n, L), written straight into the first L columns of q_abs.
  bmm(q.slice(2, 0, d.P).transpose(0, 1), s.layer.w_uk_t(), q_abs.slice(2, 0, d.L).transpose(0, 1), 1.0f, 0.0f,
      s.ctx);
  copy_rows(q_abs.slice(2, d.L, d.L + d.R), q.slice(2, d.P, d.P + d.R), s.ctx);
}

void up_project(const Step& s, const TensorView& o_lat, int64_t t0) {
  const int64_t n = o_lat.shape[0];
  if (n == 0) return;
  if (t0 == 0 && n == s.fused_rows()) {
    // The product and its quantisation in one pass (§15); the rows that end the actual tokens also
    // write the padding rows after them.
    const int64_t end = n == s.facts.t_act ? s.args.out.size(0) : n;
    const auto [codes, scales] = s.quantised_rows(0, end);
    up_project_quantized(o_lat, s.layer.w_uv(), s.opt.out_quant, codes, scales, s.opt.out_scale, s.ctx);
    return;
  }
  // (h, n, L) x (h, L, V) -> (h, n, V), written into out rows viewed [n, h, V].
  bmm(o_lat.transpose(0, 1), s.layer.w_uv(), s.out_rows(t0, t0 + n).transpose(0, 1), 1.0f, 0.0f, s.ctx);
}

}  // namespace mla::layer_detail
