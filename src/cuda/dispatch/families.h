// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA kernel families that have a dispatch table (variant_table.h), their launch arguments, and
// the accessors the public variant API (src/ops/variants.cpp) and the launchers use. Plain C++.
//
// Each Args struct is what every variant of the family receives: the validated views of the public op
// (include/mla/ops.h documents shapes), by reference, valid for the duration of the launch only.
#include <cstdint>
#include <vector>

#include "cuda/dispatch/variant_table.h"
#include "mla/cache.h"
#include "mla/indexer.h"
#include "mla/ops.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla::cuda::dispatch {

struct DecodeArgs {
  const TensorView& q;            // [b, s_q, h_q, d_qk]
  const KVCache& cache;
  const TensorView& block_table;  // [b, max_blocks] i32
  const TensorView& seq_lens;     // [b] i32
  const TensorView& out;          // [b, s_q, h_q, d_v]
  const TensorView& lse;          // [b, s_q, h_q] f32 or undefined
  double softmax_scale;
  bool causal;
  const TensorView& workspace;    // split-KV scratch (may be undefined)
  const Context& ctx;
  int num_splits;                 // planned splits (the variant may use fewer when the workspace is short)
  bool whole_requests = false;    // host-known near-uniform lengths (mla/ops.h mqa_decode): a schedule hint
  bool batch_invariant = false;   // exactly num_splits uniform splits, a kernel by the row count (mla/ops.h)
  bool fp8_compute = false;       // e4m3 products allowed (mla/ops.h mqa_decode: the fp8-compute bound)
};

struct SparseArgs {
  const TensorView& q;            // [t, h_q, d_qk]
  const KVCache& kv;
  const TensorView& indices;      // [t, topk] i32
  const TensorView& topk_length;  // [t] i32 or undefined
  const TensorView& out;          // [t, h_q, d_v]
  const TensorView& lse;          // [t, h_q] f32 or undefined
  double softmax_scale;
  const SparseOptions& opts;      // DeepSeek-V4 inputs (sink, extra cache, whole-row values); opts.any() false: none
  const Context& ctx;
};

struct PrefillArgs {
  const TensorView& q;        // [total_q, h, d_nope + d_rope]
  const TensorView& k_nope;   // [total_k, h, d_nope]
  const TensorView& k_pe;     // [total_k, h or 1, d_rope]
  const TensorView& v;        // [total_k, h, d_v]
  const TensorView& cu_seqlens_q;
  const TensorView& cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
  const TensorView& out;      // [total_q, h, d_v]
  const TensorView& lse;      // [h, total_q] f32 or undefined
  double softmax_scale;
  bool causal;
  const PrefillOptions& opts;  // fp8 compute (the sm90_fp8 variant only) and its workspace
  const Context& ctx;
};

// Lightning-indexer logits (mla/indexer.h): prefill (cache == nullptr: k, k_scale, row_starts,
// row_ends) or paged decode (cache, block_table, seq_lens, s_q); the unused views are undefined.
struct IndexerLogitsArgs {
  const TensorView& q;            // [T, h, 128] e4m3
  const TensorView& weights;      // [T, h] f32
  const TensorView& k;            // [Tk, 128] e4m3
  const TensorView& k_scale;      // [Tk] f32
  const TensorView& row_starts;   // [T] i32
  const TensorView& row_ends;     // [T] i32
  const IndexerKCache* cache;
  const TensorView& block_table;  // [b, max_blocks] i32
  const TensorView& seq_lens;     // [b] i32
  int64_t s_q;
  const TensorView& logits;       // [T, N] f32
  const Context& ctx;
};

// Defined next to each family's launcher (src/cuda/<family>/launch.cu).
Table<DecodeArgs>& mqa_decode_table();
Table<SparseArgs>& sparse_mqa_table();
Table<PrefillArgs>& mha_prefill_table();
Table<IndexerLogitsArgs>& indexer_logits_table();

// Every family, in a fixed order (families.cpp).
std::vector<Family*> all_families();

// Compute capability of CUDA device `device` as major * 10 + minor (cached per device).
int device_cc(int device);

}  // namespace mla::cuda::dispatch
