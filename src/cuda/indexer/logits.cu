// SPDX-License-Identifier: Apache-2.0
// Launchers of the indexer logits (kernel family "indexer_logits", variants best first):
//   sm90_tma  paged decode, pages by TMA into an mbarrier ring (logits_tma.cuh): h <= 64, 16-byte aligned
//             q heads and cache blocks, page_size 8, 16, 32 or a multiple of 64
//   sm90      wgmma fp8 kernel, cp.async (logits_sm90.cuh): h <= 64, 16-byte aligned q heads and key rows
//   portable  CUDA-core kernel (logits_portable.cuh): anything
#include <cuda_runtime.h>

#include <cstdlib>

#include "cuda/common/launch.h"
#include "cuda/cuda_ops.h"
#include "cuda/dispatch/families.h"
#include "cuda/indexer/logits_portable.cuh"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/indexer/logits_sm90.cuh"
#include "cuda/indexer/logits_tma.cuh"

namespace mla::cuda {

namespace indexer {
CacheRef cache_ref(const IndexerKCache& c);  // launch.cu
}  // namespace indexer

namespace {

using dispatch::IndexerLogitsArgs;

indexer::LogitsParams make_params(const IndexerLogitsArgs& a) {
  indexer::LogitsParams p{};
  p.q = static_cast<const uint8_t*>(a.q.data);
  p.q_row = a.q.stride[0];
  p.q_head = a.q.stride[1];
  p.w = static_cast<const float*>(a.weights.data);
  p.w_row = a.weights.stride[0];
  p.w_head = a.weights.stride[1];
  p.logits = static_cast<float*>(a.logits.data);
  p.out_row = a.logits.stride[0];
  p.num_rows = a.q.size(0);
  p.h = a.q.size(1);
  p.n_cols = a.logits.size(1);
  p.paged = a.cache != nullptr;
  if (p.paged) {
    if (a.cache->page_size() > 0x7fffffff) throw Error("indexer_logits_decode: page_size must fit int32");
    p.cache = indexer::cache_ref(*a.cache);
    p.block_table = static_cast<const int32_t*>(a.block_table.data);
    p.bt_row = a.block_table.stride[0];
    p.max_blocks = a.block_table.size(1);
    p.seq_lens = static_cast<const int32_t*>(a.seq_lens.data);
    p.sl_stride = a.seq_lens.stride[0];
    p.s_q = a.s_q;
  } else {
    p.k = static_cast<const uint8_t*>(a.k.data);
    p.k_row = a.k.stride[0];
    p.k_scale = static_cast<const float*>(a.k_scale.data);
    p.k_scale_stride = a.k_scale.stride[0];
    p.row_starts = static_cast<const int32_t*>(a.row_starts.data);
    p.rs_stride = a.row_starts.stride[0];
    p.row_ends = static_cast<const int32_t*>(a.row_ends.data);
    p.re_stride = a.row_ends.stride[0];
    p.s_q = 1;
  }
  return p;
}

bool aligned16(const void* ptr, int64_t stride) { return dev::aligned_to(ptr, 16) && stride % 16 == 0; }

const char* supports_sm90(const IndexerLogitsArgs& a) {
  if (a.q.size(1) > 64) return "more than 64 heads";
  if (!aligned16(a.q.data, a.q.stride[0]) || a.q.stride[1] % 16 != 0) return "q heads not 16-byte aligned";
  if (a.cache != nullptr) {
    if (!aligned16(a.cache->data.data, a.cache->num_blocks() > 1 ? a.cache->data.stride[0] : 0))
      return "cache blocks not 16-byte aligned";
  } else if (!aligned16(a.k.data, a.k.size(0) > 1 ? a.k.stride[0] : 0)) {
    return "k rows not 16-byte aligned";
  }
  return nullptr;
}

int num_sms(int device) {
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "indexer_logits: SM count");
  return n;
}

// Rows per CTA: decode groups the s_q rows of a request (their keys are shared), prefill takes 4
// consecutive rows (neighbouring rows of a chunk see overlapping key ranges).
int rows_per_cta(const indexer::LogitsParams& p) {
  const int64_t rows = p.paged ? p.s_q : p.num_rows;
  return rows >= 3 ? 4 : static_cast<int>(rows);
}

template <int G>
void launch_sm90(const indexer::LogitsParams& p, int64_t num_groups, int64_t groups_per_req, const Context& ctx,
                 int device) {
  using Tr = indexer::Sm90Traits;
  const int64_t tiles = (p.n_cols + Tr::kTileKeys - 1) / Tr::kTileKeys;
  int64_t chunk_tiles = (tiles * num_groups + int64_t{8} * num_sms(device) - 1) / (int64_t{8} * num_sms(device));
  chunk_tiles = chunk_tiles < 2 ? 2 : (chunk_tiles > 64 ? 64 : chunk_tiles);
  const int64_t chunks = (tiles + chunk_tiles - 1) / chunk_tiles;
  const unsigned grid = grid_for(chunks * num_groups, 1, "indexer_logits");
  auto* kernel = indexer::logits_sm90_kernel<G>;
  constexpr int smem = Tr::smem_bytes(G);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "indexer_logits: shared-memory limit");
  kernel<<<grid, Tr::kThreads, smem, stream_of(ctx)>>>(p, chunk_tiles * Tr::kTileKeys, num_groups, groups_per_req);
  check_launch("indexer_logits (sm90)");
}

void run_sm90(const IndexerLogitsArgs& a) {
  DeviceGuard guard(a.q.device);
  const indexer::LogitsParams p = make_params(a);
  const int G = rows_per_cta(p);
  const int64_t per_req = p.paged ? (p.s_q + G - 1) / G : 1;
  const int64_t num_groups = p.paged ? a.seq_lens.size(0) * per_req : (p.num_rows + G - 1) / G;
  if (G == 1) launch_sm90<1>(p, num_groups, per_req, a.ctx, a.q.device.index);
  else if (G == 2) launch_sm90<2>(p, num_groups, per_req, a.ctx, a.q.device.index);
  else launch_sm90<4>(p, num_groups, per_req, a.ctx, a.q.device.index);
}

const char* supports_tma(const IndexerLogitsArgs& a) {
  if (a.cache == nullptr) return "prefill (contiguous K): sm90 runs it";
  if (const char* why = supports_sm90(a)) return why;
  const int64_t ps = a.cache->page_size();
  if (!(ps == 8 || ps == 16 || ps == 32 || (ps % 64 == 0 && ps <= 0x7fffffff)))
    return "page_size not 8, 16, 32 or a multiple of 64";
  if (a.cache->num_blocks() > 0x7fffffff) return "more than 2^31 - 1 cache blocks";
  return nullptr;
}

// The sm90_tma grid aims at one wave of resident CTAs: each CTA start costs a block-table and a first-tile DRAM
// latency, and two or four waves of shorter CTAs were slower at every context length measured (docs/INDEXER.md).
constexpr int kTmaWaves = 1;

// The chunk of key columns per CTA: about kTmaWaves waves of resident CTAs over the whole grid (a CTA
// per (row group, chunk)), at least 8 tiles (512 keys) per CTA so the ring's fill is amortised. The
// chunks split the logits width, not the requests' lengths (those live on the device): a batch of very
// different lengths leaves the CTAs of short requests' far chunks with nothing to do (docs/INDEXER.md §6).
template <int G>
void launch_tma(const indexer::LogitsParams& p, const IndexerKCache& cache, int64_t num_groups, int64_t groups_per_req,
                const Context& ctx, int device) {
  using Tr = indexer::TmaTraits<G>;
  auto* kernel = indexer::logits_tma_kernel<G>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
             "indexer_logits: shared-memory limit");
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, Tr::kSmemBytes),
             "indexer_logits: occupancy");
  const int64_t resident = int64_t{per_sm < 1 ? 1 : per_sm} * num_sms(device);
  const int64_t tiles = (p.n_cols + Tr::kTileKeys - 1) / Tr::kTileKeys;
  int64_t chunks = kTmaWaves * resident / num_groups;
  chunks = chunks < 1 ? 1 : chunks;
  int64_t chunk_tiles = (tiles + chunks - 1) / chunks;
  chunk_tiles = chunk_tiles < 8 ? 8 : chunk_tiles;
  chunks = (tiles + chunk_tiles - 1) / chunk_tiles;
  const unsigned grid = grid_for(chunks * num_groups, 1, "indexer_logits");
  // The codes of the cache as a 3-D tensor {128 B, page_size rows, num_blocks}; a box is `rows` keys of one
  // page, 128B-swizzled. The scales (after the codes in each block) are not in the map: bulk copies.
  const int64_t ps = cache.page_size(), rows = ps < Tr::kTileKeys ? ps : Tr::kTileKeys;
  ptx::TmaTensor t;
  t.base = cache.data.data;
  t.dtype = DType::u8;
  t.rank = 3;
  t.dims[0] = 128;
  t.dims[1] = ps;
  t.dims[2] = cache.num_blocks();
  t.strides[0] = 1;
  t.strides[1] = 128;
  // One block: its stride is never used (any multiple of 16 satisfies the encoder).
  t.strides[2] = cache.num_blocks() > 1 ? cache.data.stride[0] : (ps * kIndexerEntryBytes + 15) / 16 * 16;
  t.box[0] = 128;
  t.box[1] = static_cast<int32_t>(rows);
  t.box[2] = 1;
  t.swizzle = ptx::TmaSwizzle::b128;
  t.l2_promotion_bytes = 256;
  const CUtensorMap map = ptx::make_tensor_map(t, "indexer_logits (sm90_tma)");
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream_of(ctx)>>>(map, p, chunk_tiles * Tr::kTileKeys, num_groups,
                                                                  groups_per_req);
  check_launch("indexer_logits (sm90_tma)");
}

void run_tma(const IndexerLogitsArgs& a) {
  DeviceGuard guard(a.q.device);
  const indexer::LogitsParams p = make_params(a);
  const int G = rows_per_cta(p);
  const int64_t per_req = (p.s_q + G - 1) / G;
  const int64_t num_groups = a.seq_lens.size(0) * per_req;
  if (num_groups == 0 || p.n_cols == 0) return;
  if (G == 1) launch_tma<1>(p, *a.cache, num_groups, per_req, a.ctx, a.q.device.index);
  else if (G == 2) launch_tma<2>(p, *a.cache, num_groups, per_req, a.ctx, a.q.device.index);
  else launch_tma<4>(p, *a.cache, num_groups, per_req, a.ctx, a.q.device.index);
}

void run_portable(const IndexerLogitsArgs& a) {
  DeviceGuard guard(a.q.device);
  const indexer::LogitsParams p = make_params(a);
  const int64_t chunks = (p.n_cols + indexer::kPortableThreads - 1) / indexer::kPortableThreads;
  const unsigned grid = grid_for(chunks * p.num_rows, 1, "indexer_logits");
  indexer::logits_portable_kernel<<<grid, indexer::kPortableThreads, 0, stream_of(a.ctx)>>>(p, chunks);
  check_launch("indexer_logits (portable)");
}

}  // namespace

dispatch::Table<IndexerLogitsArgs>& dispatch::indexer_logits_table() {
  static Table<IndexerLogitsArgs> table(
      "indexer_logits",
      {{{"sm90_tma", 90, 90,
         "paged decode: pages by TMA into a 5-stage mbarrier ring, producer warp + wgmma fp8 warpgroup; h <= 64, "
         "16-byte aligned rows, page_size 8, 16, 32 or a multiple of 64"},
        supports_tma, run_tma},
       {{"sm90", 90, 90, "wgmma fp8 (keys x heads per 64-key tile), cp.async ring; h <= 64, 16-byte aligned rows"},
        supports_sm90, run_sm90},
       {{"portable", 80, 0, "CUDA cores, one key per thread; any h and alignment"}, nullptr, run_portable}});
  return table;
}

void indexer_logits_prefill(const TensorView& q, const TensorView& weights, const TensorView& k,
                            const TensorView& k_scale, const TensorView& row_starts, const TensorView& row_ends,
                            const TensorView& logits, const Context& ctx) {
  const TensorView none{};
  dispatch::indexer_logits_table().run(
      {q, weights, k, k_scale, row_starts, row_ends, nullptr, none, none, 1, logits, ctx},
      dispatch::device_cc(q.device.index));
}

void indexer_logits_decode(const TensorView& q, const TensorView& weights, const IndexerKCache& cache,
                           const TensorView& block_table, const TensorView& seq_lens, int64_t s_q,
                           const TensorView& logits, const Context& ctx) {
  const TensorView none{};
  dispatch::indexer_logits_table().run(
      {q, weights, none, none, none, none, &cache, block_table, seq_lens, s_q, logits, ctx},
      dispatch::device_cc(q.device.index));
}

}  // namespace mla::cuda
