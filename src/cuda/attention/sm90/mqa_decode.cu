// SPDX-License-Identifier: Apache-2.0
// Launcher of the sm90 mqa_decode variants (sm90_small, sm90_raw, sm90_seesaw, sm90_convert, sm90_fp8c; variant.h): which launches each kernel
// takes (core/decode_regime.h supports), the KV tensor maps, the schedule (balanced, uniform split-KV, cluster merge)
// and the split-KV workspace (the arch-neutral layout and combine, combine/split_kv.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/launch.h"
#include "cuda/common/mqa_launch.h"
#include "cuda/common/ptx/tensor_map.h"
#include "cuda/attention/combine/split_kv.h"
#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/attention/sm90/convert/launch.h"
#include "cuda/attention/sm90/fp8c/launch.h"
#include "cuda/attention/sm90/raw/launch.h"
#include "cuda/attention/sm90/raw/traits.cuh"
#include "cuda/attention/sm90/seesaw/launch.h"
#include "cuda/attention/sm90/small/launch.h"
#include "cuda/attention/sm90/variant.h"
#include "core/decode_balance.h"
#include "core/decode_schedule.h"
#include "mla/error.h"
#include "runtime/device_api.h"

namespace mla::cuda::decode_sm90 {

static_assert(balance::kMaxCtas <= combine::kMaxMergedSplits, "the combine merges up to one partial per CTA");

namespace {

// KV cache as a 3-D tensor [num_blocks][page_size][576] of `dtype` for TMA: boxes of box_cols columns x box_rows
// rows of one page, 128-byte swizzled (the layout the wgmma descriptors read). bf16 (the seesaw and small kernels):
// 64 columns a box; the fp8 codes as u8 (the fp8-compute kernel): 128 columns a box, the fifth box of a row running
// past its 576 bytes reads zeros there (out of the tensor's bounds).
CUtensorMap paged_tensor_map(const KVCache& cache, DType dtype, int32_t box_cols, int32_t box_rows, const char* what) {
  ptx::TmaTensor t;
  t.base = cache.data.data;
  t.dtype = dtype;
  t.rank = 3;
  t.dims[0] = Traits::kDqk;
  t.dims[1] = cache.page_size();
  t.dims[2] = cache.num_blocks();
  t.strides[0] = 1;
  t.strides[1] = cache.data.stride[1];
  t.strides[2] = cache.data.stride[0];
  t.box[0] = box_cols;
  t.box[1] = box_rows;
  t.box[2] = 1;
  t.swizzle = ptx::TmaSwizzle::b128;
  t.l2_promotion_bytes = 256;
  return ptx::make_tensor_map(t, what);
}

// fp8 / fp8_ds_mla cache for the raw-codes kernel's TMA path (raw/parts.cuh produce_raw): [num_blocks][page_size]
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

// The small kernel's query rows by TMA (DecodeSm90Params::q_tma): q [b][s_q][h_q][576] bf16 as a 4-D tensor, one box
// of 64 columns x Hb heads x Ib query positions a panel, Hb Ib = N = tile_rows rows: N heads of one position when N
// divides h_q, whole positions (Hb = h_q, Ib = N / h_q) when h_q divides N; positions past s_q read as zeros. Needs a
// 16-byte aligned base, contiguous rows and strides that are positive multiples of 16 bytes below 2^40 (dimensions of
// extent 1 take a stand-in stride); otherwise, or for other tile shapes, the consumers load the rows themselves.
bool small_q_tma(const TensorView& q, int tile_rows) {
  const int64_t h_q = q.size(2);
  if (h_q % tile_rows != 0 && tile_rows % h_q != 0) return false;
  auto ok = [&](int d) {
    const int64_t bytes = q.stride[d] * 2;
    return q.size(d) == 1 || (bytes > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40));
  };
  return aligned(q.data, 16) && q.stride[3] == 1 && ok(0) && ok(1) && ok(2) && q.size(0) <= INT32_MAX;
}
CUtensorMap small_q_map(const TensorView& q, int tile_rows, const char* what) {
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  ptx::TmaTensor t;
  t.base = q.data;
  t.dtype = DType::bf16;
  t.rank = 4;
  t.dims[0] = Traits::kDqk;
  t.dims[1] = h_q;
  t.dims[2] = s_q;
  t.dims[3] = b;
  t.strides[0] = 1;
  t.strides[1] = h_q > 1 ? q.stride[2] : Traits::kDqk;
  t.strides[2] = s_q > 1 ? q.stride[1] : t.strides[1] * h_q;
  t.strides[3] = b > 1 ? q.stride[0] : t.strides[2] * s_q;
  const int64_t hb = std::min<int64_t>(h_q, tile_rows);
  t.box[0] = Traits::kPanelCols;
  t.box[1] = static_cast<int32_t>(hb);
  t.box[2] = static_cast<int32_t>(tile_rows / hb);
  t.box[3] = 1;
  t.swizzle = ptx::TmaSwizzle::b128;
  return ptx::make_tensor_map(t, what);
}

// The launch's problem for the regime rule (core/decode_regime.h).
decode_regime::Problem problem_of(const dispatch::DecodeArgs& a) {
  return {.format = a.cache.format,
          .rows = a.q.size(1) * a.q.size(2),
          .batch = a.q.size(0),
          .context_bound = a.block_table.size(1) * a.cache.page_size(),
          .batch_invariant = a.batch_invariant,
          .fp8_compute = a.fp8_compute,
          .planned_splits = std::max(1, std::min(a.num_splits, combine::kMaxSplits)),
          .sms = a.q.device.is_cuda() ? sm_count(a.q.device.index) : 0};  // 0: no small step (host-side choices)
}

// Whether a 64-key tile is whole pages or a whole number of tiles fill a page: the TMA boxes of one page's rows
// (PagedKeys, the fp8-compute kernel's loader).
bool pages_tile(int64_t page) { return Traits::kBlockN % page == 0 || page % Traits::kBlockN == 0; }

// What every sm90 decode kernel needs (nullptr), else why not.
const char* supports_common(const dispatch::DecodeArgs& a) {
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
  if (!pages_tile(c.page_size())) return "page_size must divide 64 or be a multiple of 64";
  // TMA: 16-byte aligned base and strides, contiguous rows.
  if (!aligned(c.data.data, 16) || c.data.stride[2] != 1 || (c.data.stride[1] * 2) % 16 != 0 ||
      (c.data.stride[0] * 2) % 16 != 0)
    return "cache rows must be contiguous with 16-byte aligned base and strides (TMA)";
  return nullptr;
}

const char* supports_kernel(const dispatch::DecodeArgs& a, decode_regime::Kernel k) {
  if (const char* why = supports_common(a)) return why;
  if (const char* why = decode_regime::supports(problem_of(a), k)) return why;
  // The fp8-compute kernel's TMA boxes (supports_common checked the alignment; the codes are bytes, validate_cache).
  if (k == decode_regime::Kernel::fp8c && !pages_tile(a.cache.page_size()))
    return "page_size must divide 64 or be a multiple of 64";
  return nullptr;
}

void run_kernel(const dispatch::DecodeArgs& a, decode_regime::Kernel kernel) {
  const TensorView& q = a.q;
  const KVCache& cache = a.cache;
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  DeviceGuard guard(q.device);
  cudaStream_t stream = stream_of(a.ctx);

  DecodeSm90Params p{};
  p.rows = mqa::make_row_params(q, a.out, a.lse, /*has_i=*/true, a.softmax_scale, a.ctx);
  p.block_table = static_cast<const int32_t*>(a.block_table.data);
  p.block_table_stride = a.block_table.stride[0];
  p.max_blocks = a.block_table.size(1);
  p.num_blocks = cache.num_blocks();
  p.page_size = static_cast<int32_t>(cache.page_size());
  p.box_rows = std::min<int32_t>(p.page_size, Traits::kBlockN);
  p.seq_lens = static_cast<const int32_t*>(a.seq_lens.data);
  p.seq_lens_stride = a.seq_lens.stride[0];
  p.causal = a.causal ? 1 : 0;
  const bool quantized = cache.format != CacheFormat::bf16;
  const decode_regime::Problem problem = problem_of(a);
  const decode_regime::Regime regime = decode_regime::tile_for(problem, kernel);
  set_row_tiles(p, regime);
  p.out_pairs = out_pairs(a.out);

  // The schedule (core/decode_schedule.h) from the facts: the device's SM count and resident clusters, the
  // workspace the caller gave (the front end's mqa_decode_workspace_bytes sizes it for the balanced schedule),
  // the planned splits and the caller's host knowledge of the lengths.
  const int64_t have = a.workspace.defined() && aligned(a.workspace.data, 16)
                           ? a.workspace.numel() * static_cast<int64_t>(a.workspace.element_size())
                           : 0;
  const int64_t m_rows = s_q * h_q;
  decode_schedule::Facts facts;
  facts.regime = regime;
  facts.format = cache.format;
  facts.batch = b;
  facts.rows = m_rows;
  facts.planned_splits = problem.planned_splits;
  facts.sms = problem.sms;
  facts.max_ws_splits = facts.planned_splits;
  while (facts.max_ws_splits > 1 && combine::ws_bytes(b, s_q, h_q, facts.max_ws_splits) > have) --facts.max_ws_splits;
  facts.workspace_bytes = have;
  const int step_splits = decode_regime::small_step_splits(problem);
  facts.ws_wg_partials = combine::ws_bytes(b, s_q, h_q, 2 * std::max(facts.planned_splits, step_splits)) <= have;
  facts.context_bound = problem.context_bound;
  if (regime.kernel == decode_regime::Kernel::seesaw && !quantized && facts.planned_splits >= 2 &&
      facts.planned_splits <= ClusterMerge::kMaxSplits)
    facts.max_clusters = seesaw_paged_max_clusters(q.device.index, facts.planned_splits);
  facts.whole_requests = a.whole_requests;
  facts.batch_invariant = a.batch_invariant;
  const decode_schedule::Schedule sched = decode_schedule::choose(facts);
  if (a.batch_invariant && sched.splits > facts.max_ws_splits)  // the front end checks this first
    throw Error("mqa_decode (sm90): batch_invariant needs a workspace that holds the " +
                std::to_string(sched.splits) + " planned splits");
  static_assert(decode_schedule::kMaxClusterSplits == ClusterMerge::kMaxSplits, "one cluster size");

  auto* base = static_cast<uint8_t*>(a.workspace.data);
  const int splits = sched.kind == decode_schedule::Kind::balanced ? 1 : sched.splits;
  const int parts = sched.wg_partials ? 2 * splits : splits;  // uniform partials a request
  const int ctas = sched.ctas;
  if (sched.kind == decode_schedule::Kind::cluster) p.cluster_merge = 1;
  if (sched.kind == decode_schedule::Kind::balanced) {
    p.balanced = 1;
    p.ws_meta = reinterpret_cast<int32_t*>(base);
    p.ws_lse = reinterpret_cast<float*>(base + balance::meta_bytes(b));
    p.ws_o = reinterpret_cast<float*>(base + balance::meta_bytes(b) + balance::lse_bytes(b, m_rows, ctas));
  } else if (splits > 1 && sched.combine) {
    p.wg_partials = sched.wg_partials ? 1 : 0;
    p.ws_lse = reinterpret_cast<float*>(base);
    p.ws_o = reinterpret_cast<float*>(base + combine::ws_lse_bytes(b, s_q, h_q, parts));
  }
  p.num_splits = splits;

  const char* what = "mqa_decode (sm90)";
  const unsigned grid =
      p.balanced ? static_cast<unsigned>(ctas) : grid_for(int64_t{p.m_tiles} * b * splits, 1, what);
  if (quantized) {
    // fp8_ds_mla records / fp8 rows read by the producer warps through the block table (source.cuh
    // PagedRows): exact codes into the raw kernel's registers, or expanded to bf16 in the seesaw's shared
    // memory; no staging copy in global memory.
    set_gather_cache(p.gather, cache);
    CUtensorMap map = no_tensor_map();
    if (raw_rows_by_tma(p.gather)) {
      try {  // a layout the copy engine cannot describe (e.g. a stride past 2^40 bytes) keeps the cp.async rows
        map = raw_rows_tensor_map(cache, p.gather, what);
        p.gather.raw_tma = 1;
      } catch (const Error&) {
        p.gather.raw_tma = 0;
      }
    }
    const bool ds = cache.format == CacheFormat::fp8_ds_mla;
    if (regime.kernel == decode_regime::Kernel::fp8c)
      launch_fp8c_paged(p, grid, stream, paged_tensor_map(cache, DType::u8, 128, p.box_rows, what), what);
    else if (regime.kernel == decode_regime::Kernel::convert)
      (ds ? launch_convert_ds_paged : launch_convert_fp8_paged)(p, grid, stream, what);
    else if (regime.kernel == decode_regime::Kernel::raw)
      (ds ? launch_raw_ds_paged : launch_raw_fp8_paged)(p, grid, stream, map, what);
    else
      (ds ? launch_seesaw_ds_paged : launch_seesaw_fp8_paged)(p, grid, stream, what);
  } else {
    const CUtensorMap map = paged_tensor_map(cache, DType::bf16, Traits::kPanelCols, p.box_rows, what);
    if (regime.kernel == decode_regime::Kernel::small) {
      // The uniform schedule's one unit a CTA takes its query rows by TMA (issued with the first block-table read)
      // at 32-row tiles (small/kernel.cuh kQByTma).
      p.q_tma = !p.balanced && p.tile_rows > 16 && small_q_tma(q, p.tile_rows) ? 1 : 0;
      launch_small_paged(p, grid, stream, map, p.q_tma ? small_q_map(q, p.tile_rows, what) : no_tensor_map(), what);
    }
    else
      launch_seesaw_paged(p, grid, stream, map, regime.stage1_panels, what);
  }
  if (sched.combine) {
    combine::launch_split_kv({p.rows, parts, p.ws_lse, p.ws_o, p.ws_meta}, b, stream);
  }
}

}  // namespace

using decode_regime::Kernel;
const char* supports_small(const dispatch::DecodeArgs& a) { return supports_kernel(a, Kernel::small); }
const char* supports_raw(const dispatch::DecodeArgs& a) { return supports_kernel(a, Kernel::raw); }
const char* supports_seesaw(const dispatch::DecodeArgs& a) { return supports_kernel(a, Kernel::seesaw); }
const char* supports_convert(const dispatch::DecodeArgs& a) { return supports_kernel(a, Kernel::convert); }
const char* supports_fp8c(const dispatch::DecodeArgs& a) { return supports_kernel(a, Kernel::fp8c); }
bool prefers_small(const dispatch::DecodeArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::small; }
bool prefers_raw(const dispatch::DecodeArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::raw; }
bool prefers_seesaw(const dispatch::DecodeArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::seesaw; }
bool prefers_convert(const dispatch::DecodeArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::convert; }
bool prefers_fp8c(const dispatch::DecodeArgs& a) { return decode_regime::preferred(problem_of(a)) == Kernel::fp8c; }
void run_small(const dispatch::DecodeArgs& a) { run_kernel(a, Kernel::small); }
void run_raw(const dispatch::DecodeArgs& a) { run_kernel(a, Kernel::raw); }
void run_seesaw(const dispatch::DecodeArgs& a) { run_kernel(a, Kernel::seesaw); }
void run_convert(const dispatch::DecodeArgs& a) { run_kernel(a, Kernel::convert); }
void run_fp8c(const dispatch::DecodeArgs& a) { run_kernel(a, Kernel::fp8c); }

#if defined(MLA_DECODE_TRACE) && MLA_DECODE_TRACE
namespace {
std::vector<TraceTake>& trace_units() {
  static std::vector<TraceTake> units;
  return units;
}
}  // namespace
bool trace_register(TraceTake take) {
  trace_units().push_back(take);
  return true;
}
bool trace_dump(uint64_t* out) {
  std::fill(out, out + kTraceCtas * kTraceStride, uint64_t{0});
  bool ok = true;
  for (const TraceTake take : trace_units()) ok = take(out) && ok;
  check_cuda(ok ? cudaSuccess : cudaErrorUnknown, "decode trace");
  return true;
}
#else
bool trace_dump(uint64_t*) { return false; }
#endif

}  // namespace mla::cuda::decode_sm90
