// SPDX-License-Identifier: Apache-2.0
// Launcher of the sm90 sparse_mqa variants (sm90_small, sm90_raw, sm90_seesaw; variant.h): the sm90 decode kernels
// over gathered rows, a token being one "request" of s_q = 1 whose keys are its top-k cache rows. bf16 rows:
// small/kernel.cuh with GatherKeys for h_q <= 32, seesaw/kernel.cuh with GroupRows above; fp8_ds_mla records:
// raw/kernel.cuh (IndexedRows) for h_q <= 32, seesaw/kernel.cuh with CrossKeys / InplaceKeys above. Which kernel
// runs is core/decode_regime.h's rule unless a variant is forced. One CTA per (row tile, token); for small T
// (the raw kernel, and the seesaw but its crossover) a token's top-k is split over a thread-block cluster of 2..8
// CTAs that merge through distributed shared memory (no workspace: the op has none), graph-capturable (no host
// sync).
// Algorithm, roles, shared memory: docs/design/attention_sm90.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/sparse_split.h"
#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/convert/launch.h"
#include "cuda/attention/sm90/raw/launch.h"
#include "cuda/attention/sm90/seesaw/launch.h"
#include "cuda/attention/sm90/small/launch.h"
#include "cuda/attention/sm90/variant.h"

namespace mla::cuda::decode_sm90 {

namespace {

// The converter kernel's small-T split (core/sparse_split.h record_splits) for an fp8_ds_mla call: its ranks per (row
// tile, token), 1 where it does not split (many tokens, batch-invariant calls, DeepSeek-V4 options: their own rule).
// It reads the device's SM count and cluster residency (cached per device), so arguments that are not on a CUDA
// device (a selection asked on the host alone: tests/unit/test_dispatch_cc.cpp) never split.
int convert_ds_splits(const dispatch::SparseArgs& a) {
  const int64_t h = a.q.size(1), m_tiles = (h + Traits::kBlockM - 1) / Traits::kBlockM;
  if (a.kv.format != CacheFormat::fp8_ds_mla || a.opts.any() || !a.q.device.is_cuda()) return 1;
  const int dev = a.q.device.index;
  const int64_t tiles = (a.indices.size(1) + Traits::kBlockN - 1) / Traits::kBlockN;
  static_assert(sparse_split::kMaxSplits <= ClusterMerge::kMaxSplits, "the merge takes every split");
  return sparse_split::record_splits(
      m_tiles * a.q.size(0), tiles, sm_count(dev), [&](int s) { return convert_ds_indexed_max_clusters(dev, s); },
      a.opts.batch_invariant);
}

decode_regime::Problem problem_of(const dispatch::SparseArgs& a) {
  return {.format = a.kv.format,
          .rows = a.q.size(1),
          .batch = a.q.size(0),
          .sparse = true,
          .batch_invariant = a.opts.batch_invariant,
          .v4 = a.opts.any(),
          // read by the rule above one row tile only: no device query on the calls it does not decide
          .convert_splits = a.q.size(1) > Traits::kBlockM && convert_ds_splits(a) > 1};
}

// 16-byte reads of a record cache's rows (the converter's V4 path): aligned base and page stride, and rows 16 bytes
// apart (v4's bodies are packed 576 bytes apart by the format: only the page stride matters).
bool record_rows_aligned(const KVCache& c) {
  const int64_t eb = static_cast<int64_t>(c.data.element_size());
  const bool rows = c.format == CacheFormat::v4 || (c.data.stride[1] * eb) % 16 == 0;
  return aligned(c.data.data, 16) && c.data.stride[2] == 1 && (c.data.stride[0] * eb) % 16 == 0 && rows;
}

// Q [tokens, h_q, 512] as the V4 kernels' TMA boxes read it (v4_indexed.cu q_map_of): a 16-byte aligned base,
// contiguous rows, and each stride of a dimension longer than 1 a positive multiple of 16 bytes below 2^40; at most
// 2^31 tokens (32-bit box coordinates).
bool q_rows_tma(const TensorView& q) {
  auto ok = [&](int d) {
    const int64_t bytes = q.stride[d] * 2;
    return q.size(d) == 1 || (bytes > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40));
  };
  return aligned(q.data, 16) && q.stride[2] == 1 && ok(0) && ok(1) && q.size(0) <= INT32_MAX;
}

// What the converter's DeepSeek-V4 path needs (nullptr), else why not.
const char* supports_v4(const dispatch::SparseArgs& a) {
  const KVCache& c = a.kv;
  const SparseExtraCache& x = a.opts.extra;
  const CacheFormat fe = x.defined() ? x.kv.format : c.format;
  if (!a.opts.values_include_rope) return "DeepSeek-V4 options on sm90: whole-row values (values_include_rope) only";
  if (!convert_v4_supports(c.format, fe))
    return "DeepSeek-V4 on sm90: record caches v4 + v4, v41 + v41, v41 + v41_fp4 or v41_fp4 + v41_fp4";
  if (a.q.size(2) != 512 || a.out.size(2) != 512) return "DeepSeek-V4 on sm90: d_qk = d_v = 512";
  if (a.q.dtype != DType::bf16 || a.out.dtype != DType::bf16) return "bf16 q and out only";
  if (!q_rows_tma(a.q)) return "q rows must be contiguous with 16-byte aligned base and strides (TMA)";
  if (a.opts.out_rotation.rope_dim > kConvertRotMaxDim) return "an output rotation of at most the last 64 columns";
  if (!record_rows_aligned(c) || (x.defined() && !record_rows_aligned(x.kv)))
    return "cache rows must be contiguous with 16-byte aligned base and strides (16-byte copies)";
  if (c.num_blocks() * c.page_size() > INT32_MAX || (x.defined() && x.kv.num_blocks() * x.kv.page_size() > INT32_MAX))
    return "more than 2^31 cache rows";
  if (a.indices.stride[1] != 1 || (x.defined() && x.indices.stride[1] != 1)) return "index rows must be contiguous";
  if (a.q.size(1) > (int64_t(1) << 30) || a.indices.size(1) > (int64_t(1) << 30) ||
      (x.defined() && x.indices.size(1) > (int64_t(1) << 30)))
    return "h_q or topk too large";
  return nullptr;
}

// What every sm90 sparse kernel needs (nullptr), else why not.
const char* supports_common(const dispatch::SparseArgs& a) {
  const KVCache& c = a.kv;
  if (a.opts.any()) return supports_v4(a);
  if (c.format != CacheFormat::bf16 && c.format != CacheFormat::fp8_ds_mla)
    return "bf16 and fp8_ds_mla caches only (fp8 per-tensor: not yet)";
  if (c.d_qk != Traits::kDqk || a.q.size(2) != Traits::kDqk) return "d_qk must be 576";
  if (a.out.size(2) != Traits::kDv) return "d_v must be 512";
  if (a.q.dtype != DType::bf16 || a.out.dtype != DType::bf16) return "bf16 q and out only";
  const int64_t eb = static_cast<int64_t>(c.data.element_size());
  if (!aligned(c.data.data, 16) || c.data.stride[2] != 1 || (c.data.stride[1] * eb) % 16 != 0 ||
      (c.data.stride[0] * eb) % 16 != 0)
    return "cache rows must be contiguous with 16-byte aligned base and strides (16-byte copies)";
  if (c.num_blocks() * c.page_size() > INT32_MAX) return "more than 2^31 cache rows";
  if (a.indices.stride[1] != 1) return "index rows must be contiguous";
  if (a.q.size(1) > (int64_t(1) << 30) || a.indices.size(1) > (int64_t(1) << 30)) return "h_q or topk too large";
  return nullptr;
}

const char* supports_kernel(const dispatch::SparseArgs& a, decode_regime::Kernel k) {
  if (const char* why = supports_common(a)) return why;
  return decode_regime::supports(problem_of(a), k);
}

void run_kernel(const dispatch::SparseArgs& a, decode_regime::Kernel kernel) {
  const TensorView& q = a.q;
  const KVCache& c = a.kv;
  const int64_t t = q.size(0), h_q = q.size(1);
  DeviceGuard guard(q.device);
  cudaStream_t stream = stream_of(a.ctx);

  DecodeSm90Params p{};
  p.rows = mqa::make_row_params(q, a.out, a.lse, /*has_i=*/false, a.softmax_scale, a.ctx);
  p.num_splits = 1;
  const decode_regime::Regime regime = decode_regime::tile_for(problem_of(a), kernel);
  set_row_tiles(p, regime);
  p.out_pairs = out_pairs(a.out);
  DecodeSm90Params::Gather& g = p.gather;
  set_gather_cache(g, c);
  g.topk = static_cast<int32_t>(a.indices.size(1));
  g.indices = static_cast<const int32_t*>(a.indices.data);
  g.indices_stride = a.indices.stride[0];
  if (a.topk_length.defined()) {
    g.topk_length = static_cast<const int32_t*>(a.topk_length.data);
    g.topk_length_stride = a.topk_length.stride[0];
  }

  if (a.opts.any()) {  // DeepSeek-V4: the converter over the two lists (supports_v4)
    const SparseExtraCache& x = a.opts.extra;
    if (x.defined()) {
      DecodeSm90Params::Extra& e = p.extra;
      const int64_t eb = static_cast<int64_t>(x.kv.data.element_size());
      e.cache = static_cast<const uint8_t*>(x.kv.data.data);
      e.stride_block_bytes = x.kv.data.stride[0] * eb;
      e.stride_row_bytes = x.kv.data.stride[1] * eb;
      e.num_slots = x.kv.num_blocks() * x.kv.page_size();
      e.page_size = static_cast<int32_t>(x.kv.page_size());
      e.page_div = make_fast_divisor(static_cast<uint32_t>(e.page_size));
      e.topk = static_cast<int32_t>(x.indices.size(1));
      e.indices = static_cast<const int32_t*>(x.indices.data);
      e.indices_stride = x.indices.stride[0];
      if (x.topk_length.defined()) {
        e.topk_length = static_cast<const int32_t*>(x.topk_length.data);
        e.topk_length_stride = x.topk_length.stride[0];
      }
    }
    if (a.opts.attn_sink.defined()) {
      p.sink = static_cast<const float*>(a.opts.attn_sink.data);
      p.sink_stride = a.opts.attn_sink.stride[0];
    }
    p.rot = dev::out_rotation_of(a.opts.out_rotation);
    const CacheFormat fe = x.defined() ? x.kv.format : c.format;
    {  // the small-T split (core/sparse_split.h record_splits), both tiles
      const int dev = q.device.index;
      const bool n16 = convert_v4_n16(p);
      const int64_t tiles = (int64_t{g.topk} + Traits::kBlockN - 1) / Traits::kBlockN +
                            (x.defined() ? (int64_t{p.extra.topk} + Traits::kBlockN - 1) / Traits::kBlockN : 0);
      static_assert(sparse_split::kMaxSplits <= ClusterMerge::kMaxSplits, "the merge takes every split");
      const int splits = sparse_split::record_splits(
          int64_t{p.m_tiles} * t, tiles, sm_count(dev),
          [&](int s) { return convert_v4_max_clusters(c.format, fe, n16, dev, s); }, a.opts.batch_invariant);
      if (splits > 1) {
        p.num_splits = splits;
        p.cluster_merge = 1;
      }
    }
    // The unsplit 64-row kernel over V4.1 main records is persistent (convert/kernel.cuh): one CTA a SM at most,
    // each over units blockIdx.x, + grid, ... (a CTA fills a SM: 232 KB of shared memory).
    // grid_for on the whole count first: it refuses more units than a launch (and the kernel's int unit index) holds.
    unsigned grid = grid_for(int64_t{p.m_tiles} * t * p.num_splits, 1, "sparse_mqa (sm90, DeepSeek-V4)");
    if (!p.cluster_merge && !convert_v4_n16(p) && convert_v4_persistent(c.format))
      grid = std::min<unsigned>(grid, static_cast<unsigned>(sm_count(q.device.index)));
    launch_convert_v4_indexed(c.format, fe, p, grid, stream, "sparse_mqa (sm90, DeepSeek-V4)");
    return;
  }
  // The small-T split (core/sparse_split.h): the raw kernel, the converter over fp8_ds_mla records and the seesaw over
  // bf16 rows (the seesaw over fp8_ds_mla records runs unsplit: the rule takes the converter wherever a split pays).
  const bool seesaw_split = regime.kernel == decode_regime::Kernel::seesaw && c.format == CacheFormat::bf16;
  if (regime.kernel == decode_regime::Kernel::convert) {  // the converter's own small-T split, clusters of any size
    const int splits = convert_ds_splits(a);
    if (splits > 1) {
      p.num_splits = splits;
      p.cluster_merge = 1;
    }
  } else if (regime.kernel == decode_regime::Kernel::raw || seesaw_split) {
    const int dev = q.device.index;
    const int64_t tiles = (g.topk + Traits::kBlockN - 1) / Traits::kBlockN;
    auto max_clusters = [&](int s) {
      return seesaw_split ? seesaw_group_rows_max_clusters(dev, s) : raw_ds_indexed_max_clusters(dev, p.tile_rows, s);
    };
    static_assert(sparse_split::kMaxSplits <= ClusterMerge::kMaxSplits, "the merge takes every split");
    const int splits = sparse_split::cluster_splits(int64_t{p.m_tiles} * t, tiles, sm_count(dev), max_clusters,
                                                    a.opts.batch_invariant);
    if (splits > 1) {
      p.num_splits = splits;
      p.cluster_merge = 1;
    }
  }
  const unsigned grid = grid_for(int64_t{p.m_tiles} * t * p.num_splits, 1, "sparse_mqa (sm90)");
  const char* what = "sparse_mqa (sm90)";
  // The gathering kernels issue no TMA (p.gather.raw_tma 0).
  if (c.format == CacheFormat::bf16) {
    if (regime.kernel == decode_regime::Kernel::seesaw)
      launch_seesaw_group_rows(p, grid, stream, what);
    else
      launch_small_gathered(p, grid, stream, what);
  } else if (regime.kernel == decode_regime::Kernel::raw) {
    launch_raw_ds_indexed(p, grid, stream, what);
  } else if (regime.kernel == decode_regime::Kernel::convert) {
    launch_convert_ds_indexed(p, grid, stream, what);
  } else {
    launch_seesaw_ds_indexed(p, grid, stream, what);
  }
}

}  // namespace

using decode_regime::Kernel;
const char* supports_sparse_small(const dispatch::SparseArgs& a) { return supports_kernel(a, Kernel::small); }
const char* supports_sparse_raw(const dispatch::SparseArgs& a) { return supports_kernel(a, Kernel::raw); }
const char* supports_sparse_seesaw(const dispatch::SparseArgs& a) { return supports_kernel(a, Kernel::seesaw); }
const char* supports_sparse_convert(const dispatch::SparseArgs& a) { return supports_kernel(a, Kernel::convert); }
bool prefers_sparse_small(const dispatch::SparseArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::small; }
bool prefers_sparse_raw(const dispatch::SparseArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::raw; }
bool prefers_sparse_seesaw(const dispatch::SparseArgs& a) {
  return decode_regime::preferred(problem_of(a)) == Kernel::seesaw;
}
void run_sparse_small(const dispatch::SparseArgs& a) { run_kernel(a, Kernel::small); }
void run_sparse_raw(const dispatch::SparseArgs& a) { run_kernel(a, Kernel::raw); }
void run_sparse_seesaw(const dispatch::SparseArgs& a) { run_kernel(a, Kernel::seesaw); }
bool prefers_sparse_convert(const dispatch::SparseArgs& a) {
  return decode_regime::preferred(problem_of(a)) == Kernel::convert;
}
void run_sparse_convert(const dispatch::SparseArgs& a) { run_kernel(a, Kernel::convert); }

}  // namespace mla::cuda::decode_sm90
