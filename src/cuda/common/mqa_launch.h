// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host-side construction of the MQA engine's parameters from validated views (the mqa_decode and sparse_mqa
// launchers under attention/portable/ and attention/sm90/). No CUDA headers needed; no fmt.
#include <cstdint>
#include <string>

#include "cuda/common/mqa_params.h"
#include "cuda/common/mqa_traits.cuh"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla::cuda::mqa {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Limits of the engine's tiles (DeepSeek: d_qk 576, d_v 512); the front end admits any d_qk.
inline void check_dims(const char* op, int64_t d_qk, int64_t d_v) {
  if (d_qk > Traits::kMaxDqk || d_v > Traits::kMaxDv)
    throw Error(std::string(op) + ": the CUDA kernel supports d_qk <= " + std::to_string(Traits::kMaxDqk) +
                " and d_v <= " + std::to_string(Traits::kMaxDv) + ", got d_qk = " + std::to_string(d_qk) +
                ", d_v = " + std::to_string(d_v));
}

inline MqaCacheParams make_cache_params(const KVCache& c) {
  MqaCacheParams p{};
  p.data = static_cast<const uint8_t*>(c.data.data);
  p.stride_block = c.data.stride[0];
  p.stride_row = c.data.stride[1];
  p.num_blocks = c.num_blocks();
  p.page_size = c.page_size();
  p.format = c.format;
  p.elem_bytes = static_cast<int32_t>(c.data.element_size());
  if (cache_format_info(c.format).record) {  // byte records; a v4 page is packed (validate_cache)
    p.direct = 0;
    p.record = 1;
    p.scale = 1.0f;
    p.row_bytes = static_cast<int32_t>(cache_entry_bytes(c.format, c.d_qk, c.d_rope));
    p.vec16 = aligned16(p.data) && (p.stride_block * p.elem_bytes) % 16 == 0 &&
              (page_row_bytes(c.format) != 0 || (p.stride_row * p.elem_bytes) % 16 == 0);
    return p;
  }
  dispatch_device_cache_format(c.format, [&](auto fmt) {
    using Fmt = decltype(fmt);
    p.direct = direct_format<Fmt>() ? 1 : 0;
    p.row_bytes = static_cast<int32_t>(Fmt::entry_bytes(c.d_qk, c.d_rope));
    p.scale = Fmt::kScale == CacheScale::per_tensor ? c.scale : 1.0f;
  });
  p.vec16 = aligned16(p.data) && (p.stride_block * p.elem_bytes) % 16 == 0 && (p.stride_row * p.elem_bytes) % 16 == 0 &&
            p.row_bytes % 16 == 0;
  return p;
}

// Rows of `groups` groups: q / out are [groups, s_q, h_q, d] (s_q = 1 with stride_i 0 for 3-D views).
inline MqaRowParams make_row_params(const TensorView& q, const TensorView& out, const TensorView& lse, bool has_i,
                                    double softmax_scale, const Context& ctx) {
  MqaRowParams r{};
  r.pdl = ctx.pdl ? 1 : 0;
  const int hd = has_i ? 2 : 1;  // head dim index
  r.q = q.data;
  r.q_stride_g = q.stride[0];
  r.q_stride_i = has_i ? q.stride[1] : 0;
  r.q_stride_h = q.stride[hd];
  r.out = out.data;
  r.act = q.dtype;
  r.out_stride_g = out.stride[0];
  r.out_stride_i = has_i ? out.stride[1] : 0;
  r.out_stride_h = out.stride[hd];
  if (lse.defined()) {
    r.lse = static_cast<float*>(lse.data);
    r.lse_stride_g = lse.stride[0];
    r.lse_stride_i = has_i ? lse.stride[1] : 0;
    r.lse_stride_h = lse.stride[hd];
  }
  r.groups = q.size(0);
  r.s_q = static_cast<int32_t>(has_i ? q.size(1) : 1);
  r.h_q = static_cast<int32_t>(q.size(hd));
  r.d_qk = static_cast<int32_t>(q.size(hd + 1));
  r.d_v = static_cast<int32_t>(out.size(hd + 1));
  r.q_vec16 = q.dtype == DType::bf16 && aligned16(r.q) && r.q_stride_g % 8 == 0 && r.q_stride_i % 8 == 0 && r.q_stride_h % 8 == 0;
  r.scale_log2 = static_cast<float>(softmax_scale * 1.4426950408889634);
  return r;
}

}  // namespace mla::cuda::mqa
