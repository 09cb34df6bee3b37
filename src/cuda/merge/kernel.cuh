// SPDX-License-Identifier: Apache-2.0
#pragma once
// merge_attn_states (semantics §7, edge rules [PIN] of ops.h):
//   p, s = prefix/suffix lse with +-inf read as -inf; both -inf -> out = prefix, lse = -inf;
//   otherwise m = max(p, s), wp = exp(p - m), ws = exp(s - m), out = prefix * wp/(wp+ws) +
//   suffix * ws/(wp+ws) (scale factors first), lse = ln(wp + ws) + m; NaN propagates.
//   Tokens t >= tokens_with_context: out = suffix, lse = suffix_lse (raw).
// fp32 arithmetic on inputs of the activation type Act (bf16 / f16 / f32); an Act output is rounded
// once, an fp8 output is e4m3_satfinite(out / out_scale).
//
// Schedule (common/row_stream.cuh): a "row" is one (token, head) pair. Phase 1 computes the pair's
// two factors and writes its lse; phase 2 streams D/8 chunks of 8 values per pair: 16-byte loads of
// prefix and suffix (32-byte for f32), one 16-byte (bf16 / f16; f32: 32) or 8-byte (fp8) store. Bytes
// per pair (bf16): 4D read, 2D (or D) written. Copy modes read only the side they copy.
#include <cstdint>

#include "cuda/common/act_type.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/row_stream.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/merge/params.h"

namespace mla::cuda::merge {

enum Mode : int { kMerge = 0, kCopyPrefix = 1, kCopySuffix = 2 };

struct PairInfo {
  int64_t p_off, s_off, o_off;  // element offsets of the pair's rows in prefix, suffix, out
  float fp, fs;                 // merge factors
  int mode;
};

template <class Act, bool kFp8Out, bool kVec>
struct MergeOp {
  using RowInfo = PairInfo;
  using In = typename Act::Storage;
  struct Chunk {
    dev::Array<In, 8> p, s;
  };
  MergeParams p;

  __device__ RowInfo resolve(int64_t q) const {
    const int64_t t = q / p.num_heads, h = q - t * p.num_heads;
    PairInfo r;
    r.p_off = t * p.prefix_stride_t + h * p.head_stride;
    r.s_off = t * p.suffix_stride_t + h * p.head_stride;
    r.o_off = t * p.out_stride_t + h * p.out_stride_h;
    r.fp = r.fs = 0.0f;
    const float s_raw = p.suffix_lse[h * p.slse_stride_h + t * p.slse_stride_t];
    float lse;
    if (t >= p.tokens_with_context) {
      r.mode = kCopySuffix;
      lse = s_raw;
    } else {
      float pl = p.prefix_lse[h * p.plse_stride_h + t * p.plse_stride_t], sl = s_raw;
      if (isinf(pl)) pl = -INFINITY;
      if (isinf(sl)) sl = -INFINITY;
      if (pl == -INFINITY && sl == -INFINITY) {
        r.mode = kCopyPrefix;
        lse = -INFINITY;
      } else {
        r.mode = kMerge;
        const float m = (isnan(pl) || isnan(sl)) ? NAN : fmaxf(pl, sl);
        const float wp = expf(pl - m), ws = expf(sl - m), sum = wp + ws;
        r.fp = wp / sum;
        r.fs = ws / sum;
        lse = logf(sum) + m;
      }
    }
    if (p.out_lse) p.out_lse[h * p.olse_stride_h + t * p.olse_stride_t] = lse;
    return r;
  }
  __device__ bool active(const RowInfo&) const { return true; }
  __device__ int chunks_per_row() const { return (p.head_dim + 7) / 8; }

  // Copy modes load the copied side into v.p (a run-time choice between v.p and v.s would put the
  // chunk array in local memory).
  __device__ void load(const RowInfo& r, int64_t, int c, Chunk& v) const {
    const int col = 8 * c, n = min(8, p.head_dim - col);
    const In* prefix = static_cast<const In*>(p.prefix);
    const In* suffix = static_cast<const In*>(p.suffix);
    const In* first = r.mode == kCopySuffix ? suffix + r.s_off : prefix + r.p_off;
    dev::load_chunk<kVec>(v.p, first + col, n);
    if (r.mode == kMerge) dev::load_chunk<kVec>(v.s, suffix + r.s_off + col, n);
  }

  __device__ void store(const RowInfo& r, int64_t, int c, const Chunk& v) const {
    const int col = 8 * c, n = min(8, p.head_dim - col);
    if (!kFp8Out && r.mode != kMerge) {  // copies into the inputs' type are bit copies
      dev::store_chunk<kVec>(static_cast<In*>(p.out) + r.o_off + col, v.p, n);
      return;
    }
    float x[8];
    if (r.mode == kMerge) {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = Act::to_float(v.p.v[i]) * r.fp + Act::to_float(v.s.v[i]) * r.fs;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = Act::to_float(v.p.v[i]);
    }
    if constexpr (kFp8Out) {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = x[i] / p.out_scale;
      dev::Array<uint8_t, 8> q;
      dev::float_to_e4m3(x, q);
      dev::store_chunk<kVec>(static_cast<uint8_t*>(p.out) + r.o_off + col, q, n);
    } else {
      dev::Array<In, 8> o;
#pragma unroll
      for (int i = 0; i < 8; ++i) o.v[i] = Act::from_float(x[i]);
      dev::store_chunk<kVec>(static_cast<In*>(p.out) + r.o_off + col, o, n);
    }
  }
};

// Vector variants: at least 4 blocks (32 warps) per SM. Left free, the fp8-output variant took 68
// registers, 3 blocks per SM, and ran at 72% of the copy bandwidth instead of 90% (docs/PERFORMANCE.md).
// The element-wise variants (misaligned views) would spill under that cap and keep their registers,
// as do f32 inputs (twice the chunk registers; not a bandwidth-tuned path).
template <class Act, bool kFp8Out, bool kVec, int kRows, int kThreads>
__global__ void __launch_bounds__(kThreads, kVec && sizeof(typename Act::Storage) == 2 ? 4 : 1)
    merge_kernel(MergeParams p) {
  dev::stream_rows<kRows, kThreads, 4>(MergeOp<Act, kFp8Out, kVec>{p}, p.num_tokens * p.num_heads);
}

}  // namespace mla::cuda::merge
