// SPDX-License-Identifier: Apache-2.0
// Launcher of the sm90 mqa_decode variant (kernel_small.cuh, kernel_seesaw.cuh): which launches it takes, the KV tensor map,
// the split-KV workspace (the portable family's layout and combine kernel, decode/combine.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/decode/combine.h"
#include "cuda/decode/traits.cuh"
#include "cuda/decode_sm90/launch_kernels.cuh"
#include "cuda/decode_sm90/variant.h"
#include "core/decode_balance.h"
#include "mla/error.h"
#include "runtime/device_api.h"

namespace mla::cuda::decode_sm90 {

static_assert(balance::kMaxCtas <= decode::kMaxCombineSplits, "the combine merges up to one partial per CTA");

namespace {

// MLA_DECODE_SM90_SCHEDULE=uniform turns the balanced schedule off (a laboratory switch for A/B
// measurements with `mla bench`; read once). Anything else: automatic.
enum class Schedule { automatic, uniform };
Schedule schedule_mode() {
  static const Schedule mode =
      env_choice("MLA_DECODE_SM90_SCHEDULE", Schedule::automatic, {{"uniform", Schedule::uniform}});
  return mode;
}

// The small kernel's start (params.h q_batch / warm; docs/DECODE.md "Small batch"), for A/B measurements
// with MLA_DECODE_SM90_START: qbatch (default since the ninth session: the query loads all in flight;
// nvidia-h200 2026-11-23, varlen b 128 h 16 −5..−8% in both paired rounds, b 4 and uniform b 128 unchanged;
// `*Decode*:*Sparse*:LayerGraph*` 706 cases, 0 failed under it), cold (the query rows loaded by a loop,
// one round trip per iteration), warm (qbatch, and the kernel a programmatic dependent launch that first
// prefetches the call's inputs into L2). Read once.
enum class Start { cold, qbatch, warm };
Start start_mode() {
  static const Start s =
      env_choice("MLA_DECODE_SM90_START", Start::qbatch, {{"warm", Start::warm}, {"cold", Start::cold}});
  return s;
}

// Stage 1's full barriers in the next seesaw schedule of the bf16 cache without multicast (source.cuh PagedPanelKeys;
// MLA_DECODE_SM90_PANELS, read once): auto (default) a barrier per panel when a request has more than 16 query rows,
// else one per V half (PagedKeys); panel; group.
// Same-call A/B, nvidia-h200, 2026-11-25 (one barrier per half / per panel, 5 rounds, ms): b 128 h 128 s_k 4096
// 0.301-0.344 / 0.293-0.305, s_k 8192 0.545-0.620 / 0.527-0.534, h 64 even; but b 4 h 16 s_k 1024 (16 rows on the
// seesaw tile) 0.0174-0.0185 / 0.0185-0.0193.
enum class Panels { automatic, panel, group };
Panels panel_mode() {
  static const Panels m =
      env_choice("MLA_DECODE_SM90_PANELS", Panels::automatic, {{"panel", Panels::panel}, {"group", Panels::group}});
  return m;
}
bool stage1_panels(int64_t m_rows) {
  const Panels m = panel_mode();
  return m == Panels::panel || (m == Panels::automatic && m_rows > 16);
}

// Which kernel runs 17..32 query rows per request (MLA_DECODE_SM90_ROWS32, read once): seesaw (default: bf16
// and fp8 per-tensor caches run one 64-row tile of the seesaw kernel, half of its rows padding, uniform
// split-KV schedule; fp8_ds_mla keeps the N 32 small kernel), small (every format on the N 32 small kernel,
// the balanced schedule for bf16) or all (fp8_ds_mla on the seesaw tile too). The N 32 kernel took 1.40x
// the h 16 time for the same bytes; the padded seesaw tile is memory-bound there. Same-run A/Bs, nvidia-h200,
// ms: bf16 (2026-11-23, c553037, small / seesaw) b 128 h 32 s_k 4096 0.251-0.254 / 0.181-0.183, s_q 2 h 16
// s_k 8192 0.439-0.462 / 0.334-0.339, h 32 varlen s_k <= 8192 0.300-0.328 / 0.269-0.288, b 4 h 32 s_k 1024
// 0.055-0.057 / 0.027-0.029 (`*Decode*` GPU tests under seesaw: 487 passed); fp8 (2026-11-23, eleventh
// session, 2f80a68 + the row-producer divisor, small / seesaw) h 32 s_k 4096 0.376-0.395 / 0.307-0.334,
// s_q 2 h 16 s_k 8192 0.747-0.772 / 0.619-0.678; fp8_ds_mla the other way: 0.288-0.304 / 0.341-0.358 and
// 0.530-0.570 / 0.557-0.593 (`*Decode*` under all: 488 passed). docs/DECODE.md "32 rows on the seesaw kernel".
// Since the raw kernel runs N 32 (kernel_raw.cuh; ping-pong) the default is automatic: bf16 on the seesaw tile, both
// code formats on the raw kernel; seesaw is the earlier default (fp8 per-tensor on the seesaw tile too).
enum class Rows32 { automatic, small, seesaw, all };
Rows32 rows32_mode() {
  static const Rows32 m = env_choice("MLA_DECODE_SM90_ROWS32", Rows32::automatic,
                                     {{"small", Rows32::small}, {"seesaw", Rows32::seesaw}, {"all", Rows32::all}});
  return m;
}

// Which kernel runs 9..16 query rows per request (MLA_DECODE_SM90_ROWS16, read once): auto (default) puts a
// bf16 cache's small batches, b <= kRows16SeesawBatch with a context bound (max_blocks · page_size) of at most
// kRows16SeesawKeys, on the seesaw tile (three quarters of its rows padding,
// uniform split-KV schedule) and the rest on the N 16 small kernel (balanced schedule); seesaw puts every
// batch of a bf16 or fp8 per-tensor cache there; small none. Same-run A/Bs, nvidia-h200, 2026-11-24, twelfth
// session (docs/DECODE.md "16 rows on the seesaw tile"), small / seesaw, ms: b 4 s_k 1024 0.028-0.032 /
// 0.025-0.026; b 4 varlen 4096 0.045-0.046 / 0.029-0.034; b 8 4096 0.048 / 0.037-0.038; b 8 varlen 8192
// 0.056-0.057 / 0.043-0.047; b 16 4096 0.058-0.060 / 0.047-0.049; b 16 varlen 8192 0.065-0.067 / 0.059-0.063;
// but b 32 varlen 4096 0.060-0.063 / 0.063-0.066, b 128 varlen 8192 0.207-0.210 / 0.266-0.301 (the uniform
// schedule), b 128 s_k 4096 0.195-0.197 / 0.180-0.181, s_k 8192 even, fp8 b 128 0.208-0.239 / 0.314-0.331.
// `*Decode*` GPU tests under seesaw: 489 passed.
// Long contexts keep the small kernel: at b 8, s_k 512K..1M the balanced schedule streams at 103% of the copy
// ceiling (2.21 ms at 1M) and the seesaw tile's uniform split-KV schedule at 93% (2.42 ms; nvidia-h200-x2,
// 2026-11-24, the dcp bench's one-GPU rows); the launcher bounds the context by max_blocks · page_size.
enum class Rows16 { automatic, small, seesaw };
constexpr int64_t kRows16SeesawBatch = 16, kRows16SeesawKeys = 16384;
Rows16 rows16_mode() {
  static const Rows16 m =
      env_choice("MLA_DECODE_SM90_ROWS16", Rows16::automatic, {{"small", Rows16::small}, {"seesaw", Rows16::seesaw}});
  return m;
}

// KV cache as a 3-D tensor [num_blocks][page_size][576] for TMA: boxes of 64 columns x box_rows rows of
// one page, 128-byte swizzled (the layout the wgmma descriptors read).
CUtensorMap paged_tensor_map(const KVCache& cache, int32_t box_rows, const char* what) {
  ptx::TmaTensor t;
  t.base = cache.data.data;
  t.dtype = DType::bf16;
  t.rank = 3;
  t.dims[0] = Traits::kDqk;
  t.dims[1] = cache.page_size();
  t.dims[2] = cache.num_blocks();
  t.strides[0] = 1;
  t.strides[1] = cache.data.stride[1];
  t.strides[2] = cache.data.stride[0];
  t.box[0] = Traits::kPanelCols;
  t.box[1] = box_rows;
  t.box[2] = 1;
  t.swizzle = ptx::TmaSwizzle::b128;
  t.l2_promotion_bytes = 256;
  return ptx::make_tensor_map(t, what);
}

// fp8 / fp8_ds_mla cache for the raw-codes kernel's TMA path (raw_parts.cuh produce_raw): [num_blocks][page_size]
// [record / 4] int32 words, boxes of 168 words x 16 rows x 1 page = sixteen 672-byte slot rows, the 24 / 4 words
// past a 576 / 656-byte record read as zeros (out of the tensor's bounds; checked on nvidia-h200: a box wider than
// the tensor's inner extent is accepted and zero-filled). Whole 16-row runs need page_size % 16 == 0.
bool raw_rows_by_tma(const DecodeSm90Params::Gather& g) {
  return g.page_size % 16 == 0 && reinterpret_cast<uintptr_t>(g.cache) % 16 == 0 && g.stride_row_bytes % 16 == 0 &&
         g.stride_block_bytes % 16 == 0 && g.stride_row_bytes > 0 && g.stride_block_bytes > 0;
}
CUtensorMap raw_rows_tensor_map(const KVCache& cache, const DecodeSm90Params::Gather& g, const char* what) {
  ptx::TmaTensor t;
  t.base = g.cache;
  t.dtype = DType::i32;
  t.rank = 3;
  using Fp8 = RawTraits<16, CacheFormat::fp8>;
  using Ds = RawTraits<16, CacheFormat::fp8_ds_mla>;
  static_assert(Fp8::kStride == Ds::kStride && Fp8::kStride % 4 == 0, "one slot row for both formats");
  t.dims[0] = (cache.format == CacheFormat::fp8_ds_mla ? Ds::kRecordBytes : Fp8::kRecordBytes) / 4;
  t.dims[1] = g.page_size;
  t.dims[2] = cache.num_blocks();
  t.strides[0] = 1;
  t.strides[1] = g.stride_row_bytes / 4;
  t.strides[2] = g.stride_block_bytes / 4;
  t.box[0] = Fp8::kStride / 4;  // a box row is one slot row
  t.box[1] = 16;                // a producer warp's rows (produce_raw)
  t.box[2] = 1;
  t.swizzle = ptx::TmaSwizzle::none;
  t.l2_promotion_bytes = 256;
  return ptx::make_tensor_map(t, what);
}

}  // namespace

const char* supports(const dispatch::DecodeArgs& a) {
  const KVCache& c = a.cache;
  if (c.format != CacheFormat::bf16 && c.format != CacheFormat::fp8_ds_mla && c.format != CacheFormat::fp8)
    return "bf16, fp8 and fp8_ds_mla caches only";
  if (c.d_qk != Traits::kDqk || a.q.size(3) != Traits::kDqk) return "d_qk must be 576";
  if (a.out.size(3) != Traits::kDv) return "d_v must be 512";
  if (a.q.dtype != DType::bf16 || a.out.dtype != DType::bf16) return "bf16 q and out only";
  if (a.q.size(1) * a.q.size(2) > (int64_t(1) << 30)) return "s_q * h_q too large for one launch";
  if (c.num_blocks() >= (int64_t(1) << 31)) return "more than 2^31 cache pages";
  if (c.format != CacheFormat::bf16) {  // rows copied by the producer warps (16-byte copies), any page size
    const int64_t eb = static_cast<int64_t>(c.data.element_size());
    if (!aligned(c.data.data, 16) || c.data.stride[2] != 1 || (c.data.stride[1] * eb) % 16 != 0 ||
        (c.data.stride[0] * eb) % 16 != 0)
      return "cache rows must be contiguous with 16-byte aligned base and strides (16-byte copies)";
    if (c.page_size() >= (int64_t(1) << 30)) return "page_size too large";
    return nullptr;
  }
  const int64_t page = c.page_size();
  if (!(Traits::kBlockN % page == 0 || page % Traits::kBlockN == 0)) return "page_size must divide 64 or be a multiple of 64";
  // TMA: 16-byte aligned base and strides, contiguous rows.
  if (!aligned(c.data.data, 16) || c.data.stride[2] != 1 || (c.data.stride[1] * 2) % 16 != 0 ||
      (c.data.stride[0] * 2) % 16 != 0)
    return "cache rows must be contiguous with 16-byte aligned base and strides (TMA)";
  return nullptr;
}

void run(const dispatch::DecodeArgs& a) {
  const TensorView& q = a.q;
  const KVCache& cache = a.cache;
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  DeviceGuard guard(q.device);
  cudaStream_t stream = stream_of(a.ctx);

  DecodeSm90Params p{};
  p.rows = mqa::make_row_params(q, a.out, a.lse, /*has_i=*/true, a.softmax_scale);
  p.block_table = static_cast<const int32_t*>(a.block_table.data);
  p.block_table_stride = a.block_table.stride[0];
  p.max_blocks = a.block_table.size(1);
  p.num_blocks = cache.num_blocks();
  p.page_size = static_cast<int32_t>(cache.page_size());
  p.box_rows = std::min<int32_t>(p.page_size, Traits::kBlockN);
  p.seq_lens = static_cast<const int32_t*>(a.seq_lens.data);
  p.seq_lens_stride = a.seq_lens.stride[0];
  p.causal = a.causal ? 1 : 0;
  set_row_tiles(p, s_q * h_q);
  const bool quantized = cache.format != CacheFormat::bf16;
  const bool ds = cache.format == CacheFormat::fp8_ds_mla;
  const bool rows16_seesaw = p.tile_rows == 16 && ((!ds && rows16_mode() == Rows16::seesaw) ||
                                                    (!quantized && rows16_mode() == Rows16::automatic &&
                                                     b <= kRows16SeesawBatch &&
                                                     int64_t{p.max_blocks} * p.page_size <= kRows16SeesawKeys));
  const Rows32 r32 = rows32_mode();
  if ((p.tile_rows == 32 && (r32 == Rows32::all || (!ds && r32 == Rows32::seesaw) ||
                             (!quantized && r32 == Rows32::automatic))) ||
      rows16_seesaw) {
    p.tile_rows = Traits::kBlockM;
    p.m_tiles = 1;
  }
  p.out_pairs = out_pairs(a.out);

  // The balanced schedule where it applies and the workspace holds it (core/decode_balance.h: the
  // front end's mqa_decode_workspace_bytes sizes for it), else split-KV as planned (fewer splits when the
  // workspace holds fewer), the portable family's layout.
  const int64_t have = a.workspace.defined() && aligned(a.workspace.data, 16)
                           ? a.workspace.numel() * static_cast<int64_t>(a.workspace.element_size())
                           : 0;
  const int64_t m_rows = s_q * h_q;
  // fp8 / fp8_ds_mla: the uniform schedule only (the row-copying sources run one unit per CTA; the staged
  // source's raw stage leaves no room for the balanced schedule's exchange region; docs/DECODE.md "fp8 caches").
  // The seesaw kernel (64-row tiles) has no balanced schedule.
  const int ctas = schedule_mode() == Schedule::uniform || quantized || p.tile_rows > 32
                       ? 0
                       : balance::ctas_for(b, m_rows, sm_count(q.device.index));
  auto* base = static_cast<uint8_t*>(a.workspace.data);
  int splits = std::max(1, std::min(a.num_splits, decode::kMaxSplits));
  // The cluster merge (cluster_merge.cuh, docs/DECODE.md "Cluster merge"): the seesaw tile's 2..8 splits of a bf16
  // cache merge inside their cluster (no workspace, no combine launch) where all the grid's clusters are resident
  // at once, unless the multicast clusters the row tiles instead.
  const bool multicast = p.tile_rows > 32 && p.m_tiles % 2 == 0 && multicast_mode() == Multicast::on &&
                         seesaw_schedule() == SeesawSchedule::next;
  if (!quantized && p.tile_rows > 32 && !multicast && seesaw_schedule() == SeesawSchedule::next &&
      merge_mode() == Merge::cluster && splits >= 2 && splits <= ClusterMerge::kMaxSplits &&
      b * p.m_tiles <= seesaw_max_clusters<PagedKeys>(q.device.index, splits))
    p.cluster_merge = 1;
  if (ctas > 0 && balance::workspace_bytes(b, m_rows, ctas) <= have) {
    splits = 1;
    p.balanced = 1;
    p.ws_meta = reinterpret_cast<int32_t*>(base);
    p.ws_lse = reinterpret_cast<float*>(base + balance::meta_bytes(b));
    p.ws_o = reinterpret_cast<float*>(base + balance::meta_bytes(b) + balance::lse_bytes(b, m_rows, ctas));
  } else if (!p.cluster_merge) {
    while (splits > 1 && decode::ws_bytes(b, s_q, h_q, splits) > have) --splits;
    if (splits > 1) {
      p.ws_lse = reinterpret_cast<float*>(base);
      p.ws_o = reinterpret_cast<float*>(base + decode::ws_lse_bytes(b, s_q, h_q, splits));
    }
  }
  p.num_splits = splits;
  if (!quantized && p.tile_rows <= 32) {
    p.q_batch = start_mode() != Start::cold ? 1 : 0;
    p.warm = start_mode() == Start::warm ? 1 : 0;
  }
  if (p.tile_rows > 32) p.q_batch = seesaw_q_batch() ? 1 : 0;
  p.defer_s1 = defer_s1() ? 1 : 0;
  p.lazy_log2 = lazy_log2();

  const char* what = "mqa_decode (sm90)";
  const unsigned grid =
      p.balanced ? static_cast<unsigned>(ctas) : grid_for(int64_t{p.m_tiles} * b * splits, 1, what);
  if (quantized) {
    // fp8_ds_mla records / fp8 rows read by the producer warps through the block table (source.cuh
    // PagedRows) and converted to bf16 in shared memory: no staging copy in global memory.
    set_gather_cache(p.gather, cache);
    CUtensorMap map;
    std::memset(&map, 0, sizeof(map));
    if (raw_rows_by_tma(p.gather)) {
      try {  // a layout the copy engine cannot describe (e.g. a stride past 2^40 bytes) keeps the cp.async rows
        map = raw_rows_tensor_map(cache, p.gather, what);
        p.gather.raw_tma = 1;
      } catch (const Error&) {
        p.gather.raw_tma = 0;
      }
    }
    if (cache.format == CacheFormat::fp8_ds_mla)
      launch_copied<CacheFormat::fp8_ds_mla, PagedRows>(p, grid, stream, map, what);
    else
      launch_copied<CacheFormat::fp8, PagedRows>(p, grid, stream, map, what);
  } else {
    const CUtensorMap map = paged_tensor_map(cache, p.box_rows, what);
    if (multicast)
      launch_seesaw<PagedKeysT<true>>(p, grid, stream, map, what);  // clusters of the two row tiles (source.cuh)
    else if (p.tile_rows == Traits::kBlockM && seesaw_schedule() == SeesawSchedule::next && stage1_panels(m_rows))
      launch_seesaw_next<PagedPanelKeys>(p, grid, stream, map, what);
    else if (p.cluster_merge)
      launch_seesaw_clusters<PagedKeys>(p, grid, static_cast<unsigned>(p.num_splits), stream, map, what);  // the splits
    else
      launch_kernel<PagedKeys>(p, grid, stream, map, what);
  }
  if ((splits > 1 && !p.cluster_merge) || p.balanced) {
    DecodeParams cp{};
    cp.rows = p.rows;
    cp.num_splits = splits;
    cp.ws_lse = p.ws_lse;
    cp.ws_o = p.ws_o;
    cp.ws_meta = p.ws_meta;
    decode::launch_combine(cp, b, stream, /*dependent=*/true);
  }
}

#if defined(MLA_DECODE_TRACE) && MLA_DECODE_TRACE
bool trace_dump(uint64_t* out) {
  std::fill(out, out + kTraceCtas * kTraceEvents, uint64_t{0});
  check_cuda(trace_take_tu(out) && trace_take_sparse(out) ? cudaSuccess : cudaErrorUnknown, "decode trace");
  return true;
}
#else
bool trace_dump(uint64_t*) { return false; }
#endif

}  // namespace mla::cuda::decode_sm90
