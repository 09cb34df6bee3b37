// SPDX-License-Identifier: Apache-2.0
// Launcher of merge_attn_states: POD params from the validated views, one kernel per activation type
// (bf16 / f16 / f32), vector variant when every row start is 16-byte aligned (8-byte for fp8 output)
// and D is a multiple of 8.
#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"
#include "mla/ops.h"
#include "cuda/attention/combine/n_way_kernel.cuh"
#include "cuda/merge/kernel.cuh"

namespace mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 128;  // (token, head) pairs per block: D = 128 gives 8 chunks per thread

template <class Act, bool kFp8Out>
void launch_merge(const merge::MergeParams& p, bool vec, const Context& ctx) {
  const unsigned grid = grid_for(p.num_tokens * p.num_heads, kRows, "merge_attn_states");
  if (vec) merge::merge_kernel<Act, kFp8Out, true, kRows, kThreads><<<grid, kThreads, 0, stream_of(ctx)>>>(p);
  else merge::merge_kernel<Act, kFp8Out, false, kRows, kThreads><<<grid, kThreads, 0, stream_of(ctx)>>>(p);
  check_launch("merge_attn_states");
}

}  // namespace

void merge_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& prefix,
                       const TensorView& prefix_lse, const TensorView& suffix, const TensorView& suffix_lse,
                       int64_t prefill_tokens_with_context, float output_scale, const Context& ctx) {
  DeviceGuard guard(prefix.device);
  merge::MergeParams p{};
  p.prefix = prefix.data;
  p.suffix = suffix.data;
  p.out = out.data;
  p.prefix_lse = static_cast<const float*>(prefix_lse.data);
  p.suffix_lse = static_cast<const float*>(suffix_lse.data);
  p.out_lse = out_lse.defined() ? static_cast<float*>(out_lse.data) : nullptr;
  p.prefix_stride_t = prefix.stride[0];
  p.suffix_stride_t = suffix.stride[0];
  p.head_stride = prefix.stride[1];
  p.out_stride_t = out.stride[0];
  p.out_stride_h = out.stride[1];
  p.plse_stride_h = prefix_lse.stride[0];
  p.plse_stride_t = prefix_lse.stride[1];
  p.slse_stride_h = suffix_lse.stride[0];
  p.slse_stride_t = suffix_lse.stride[1];
  if (p.out_lse) {
    p.olse_stride_h = out_lse.stride[0];
    p.olse_stride_t = out_lse.stride[1];
  }
  p.num_tokens = prefix.size(0);
  p.num_heads = prefix.size(1);
  p.head_dim = static_cast<int>(prefix.size(2));
  p.tokens_with_context = prefill_tokens_with_context < 0 ? p.num_tokens : prefill_tokens_with_context;
  p.out_scale = output_scale;
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_dim == 0) return;

  const bool fp8_out = output_scale != 0.0f;
  const int64_t out_chunk = fp8_out ? 8 : 16;  // alignment of 8 output values (f32: two 16-byte halves)
  auto ok = [](const void* ptr, int64_t align) { return dev::aligned_to(ptr, align); };
  // Strides are in elements: a multiple of 8 keeps every 8-value chunk on its alignment.
  const bool vec = p.head_dim % 8 == 0 && ok(p.prefix, 16) && ok(p.suffix, 16) && ok(p.out, out_chunk) &&
                   (p.num_tokens == 1 || (p.prefix_stride_t % 8 == 0 && p.suffix_stride_t % 8 == 0 &&
                                          p.out_stride_t % 8 == 0)) &&
                   (p.num_heads == 1 || (p.head_stride % 8 == 0 && p.out_stride_h % 8 == 0));
  dispatch_activation(prefix.dtype, "merge_attn_states", [&](auto act) {
    if (fp8_out) launch_merge<decltype(act), true>(p, vec, ctx);
    else launch_merge<decltype(act), false>(p, vec, ctx);
  });
}

void combine_attn_states(const TensorView& out, const TensorView& out_lse, const TensorView& parts,
                         const TensorView& part_lses, const TensorView& attn_sink, const Context& ctx) {
  static_assert(merge::kCombineSlots >= kCombineMaxParts, "one factor slot per part");
  DeviceGuard guard(parts.device);
  merge::CombineParams p{};
  p.parts = parts.data;
  p.part_lses = static_cast<const float*>(part_lses.data);
  p.out = out.data;
  p.out_lse = out_lse.defined() ? static_cast<float*>(out_lse.data) : nullptr;
  p.sink = attn_sink.defined() ? static_cast<const float*>(attn_sink.data) : nullptr;
  p.sink_stride = attn_sink.defined() ? attn_sink.stride[0] : 0;
  p.part_stride_n = parts.stride[0];
  p.part_stride_t = parts.stride[1];
  p.part_stride_h = parts.stride[2];
  p.lse_stride_n = part_lses.stride[0];
  p.lse_stride_t = part_lses.stride[1];
  p.lse_stride_h = part_lses.stride[2];
  p.out_stride_t = out.stride[0];
  p.out_stride_h = out.stride[1];
  if (p.out_lse) {
    p.olse_stride_t = out_lse.stride[0];
    p.olse_stride_h = out_lse.stride[1];
  }
  p.num_parts = parts.size(0);
  p.num_tokens = parts.size(1);
  p.num_heads = parts.size(2);
  p.head_dim = static_cast<int>(parts.size(3));
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows == 0) return;
  // Element strides that are multiples of 8 keep every 8-value chunk 16-byte aligned (f32: two halves).
  const bool vec = p.head_dim % 8 == 0 && dev::aligned_to(p.parts, 16) && dev::aligned_to(p.out, 16) &&
                   p.part_stride_n % 8 == 0 && p.part_stride_t % 8 == 0 && p.part_stride_h % 8 == 0 &&
                   p.out_stride_t % 8 == 0 && p.out_stride_h % 8 == 0;
  const unsigned grid = grid_for(rows, merge::kCombineWarps, "combine_attn_states");
  dispatch_activation(parts.dtype, "combine_attn_states", [&](auto act) {
    using Act = decltype(act);
    if (vec)
      launch_kernel(merge::combine_kernel<Act, true>, grid, merge::kCombineWarps * 32, 0, stream_of(ctx), ctx.pdl,
                    "combine_attn_states", p);
    else
      launch_kernel(merge::combine_kernel<Act, false>, grid, merge::kCombineWarps * 32, 0, stream_of(ctx), ctx.pdl,
                    "combine_attn_states", p);
  });
}

}  // namespace mla::cuda
