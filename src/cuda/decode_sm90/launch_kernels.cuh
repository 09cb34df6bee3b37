// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host side shared by the sm90 launchers (launch.cu: mqa_decode, launch_sparse.cu: sparse_mqa): the row
// tiling (which kernel takes a problem) and the launch of the chosen kernel for a key source.
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "cuda/common/launch.h"
#include "mla/cache.h"
#include "runtime/device_api.h"
#include "cuda/decode_sm90/kernel_seesaw.cuh"
#include "cuda/decode_sm90/kernel_raw.cuh"
#include "cuda/decode_sm90/kernel_small.cuh"

namespace mla::cuda::decode_sm90 {

// SMs of a device, read once (cudaGetDeviceProperties is far too slow for every call): the balanced schedule's
// grid (launch.cu), the small-T sparse split (launch_sparse.cu).
inline int sm_count(int device) {
  static std::array<std::atomic<int>, 64> cached{};
  if (device < 0 || device >= static_cast<int>(cached.size())) return cuda_rt::device_info(device).sm_count;
  int n = cached[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
  if (n == 0) {
    n = cuda_rt::device_info(device).sm_count;
    cached[static_cast<std::size_t>(device)].store(n, std::memory_order_relaxed);
  }
  return n;
}

// The A/B switches of this family: the choice whose text environment variable `name` holds, else
// `fallback` (unset or any other text). Each caller reads it once into a static.
template <class E>
E env_choice(const char* name, E fallback, std::initializer_list<std::pair<const char*, E>> choices) {
  if (const char* v = std::getenv(name))
    for (const auto& [text, e] : choices)
      if (std::strcmp(v, text) == 0) return e;
  return fallback;
}

// The seesaw kernels' Q prologue (kernel_seesaw.cuh load_seesaw_q): all loads in flight (default) or the loop
// (MLA_DECODE_SM90_SEESAW_Q=loop, for A/B). Read once.
inline bool seesaw_q_batch() {
  static const bool b = env_choice("MLA_DECODE_SM90_SEESAW_Q", true, {{"loop", false}});
  return b;
}

inline bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Sets p.tile_rows and p.m_tiles for m_rows query rows per request: up to 32 rows, one CTA per (split,
// request) with the rows as wgmma N (kernel_small.cuh, N 8 / 16 / 32); else 64-row tiles with the seesaw
// schedule (kernel_seesaw.cuh). (32-row tiles of the small kernel for more rows measured slower:
// docs/DECODE.md. mqa_decode over a bf16 cache then moves 17..32 rows to one seesaw tile: launch.cu
// rows32_mode.)
inline void set_row_tiles(DecodeSm90Params& p, int64_t m_rows) {
  p.tile_rows = m_rows <= 8 ? 8 : m_rows <= 16 ? 16 : m_rows <= 32 ? 32 : Traits::kBlockM;
  p.m_tiles = static_cast<int32_t>((m_rows + p.tile_rows - 1) / p.tile_rows);
}

// 1 when out [groups, (s_q,) h_q, d_v] (bf16) rows take 4-byte stores: even strides, aligned base.
inline int32_t out_pairs(const TensorView& out) {
  bool ok = aligned(out.data, 4) && out.stride[out.ndim - 1] == 1;
  for (int d = 0; d + 1 < out.ndim; ++d) ok = ok && out.stride[d] % 2 == 0;
  return ok ? 1 : 0;
}

template <class Kernel>
void launch_one(Kernel kernel, int smem, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  if (p.warm) {  // the warm start waits for the previous kernel itself (griddepcontrol.wait in warm_start)
    launch_dependent(kernel, grid, Traits::kThreads, static_cast<std::size_t>(smem), stream, what, map, p);
    return;
  }
  kernel<<<grid, Traits::kThreads, smem, stream>>>(map, p);
  check_launch(what);
}

// `kernel` over `grid` CTAs in clusters of `cluster` consecutive CTAs (the seesaw's row-tile pairs and split
// merge, the raw kernel's small-T sparse split).
template <class Kernel>
void launch_one_clustered(Kernel kernel, int smem, unsigned grid, unsigned cluster, cudaStream_t stream,
                          const CUtensorMap& map, const DecodeSm90Params& p, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  launch_cluster(kernel, grid, cluster, Traits::kThreads, static_cast<std::size_t>(smem), stream, what, map, p);
}

// The small kernel with N rows and key source Src.
template <int N, class Src>
void launch_small(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                  const char* what) {
  launch_one(decode_sm90_small_kernel<N, Src>, SmallTraits<N>::template smem_bytes<Src>(), grid, stream, map, p, what);
}

// The TMA source's seesaw schedule. Default: next (decode_sm90_seesaw_next_kernel: rope of Q in registers,
// one full barrier per V half, precomputed descriptors; nvidia-h200 2026-11-23 at 9f1d265, b 128 page 64:
// h 128 s_k 4096 0.291 / 0.335 ms against the overlapped schedule's 0.397 / 0.344, docs/DECODE.md).
// MLA_DECODE_SM90_SEESAW=overlapped / serial selects the earlier schedules for A/B measurements; read once.
// GatherKeys always takes the serial one: its overlapped build spills (ptxas, 224 consumer registers) and
// measured no faster (docs/DECODE.md); InplaceKeys (40 producer registers) takes next or, under
// MLA_DECODE_SM90_SEESAW=serial, serial.
enum class SeesawSchedule { overlapped, serial, next };
inline SeesawSchedule seesaw_schedule() {
  static const SeesawSchedule s = env_choice(
      "MLA_DECODE_SM90_SEESAW", SeesawSchedule::next,
      {{"serial", SeesawSchedule::serial}, {"overlapped", SeesawSchedule::overlapped}});
  return s;
}

// The next-schedule seesaw kernel in clusters of `cluster` CTAs: the crossover's two row tiles, or the splits of
// p.cluster_merge (cluster_merge.cuh).
template <class Src>
void launch_seesaw_clusters(const DecodeSm90Params& p, unsigned grid, unsigned cluster, cudaStream_t stream,
                            const CUtensorMap& map, const char* what) {
  launch_one_clustered(decode_sm90_seesaw_next_kernel<Src>, SeesawTraits::kSmemBytes, grid, cluster, stream, map, p,
                       what);
}

// The seesaw kernels' lazy maximum (params.h lazy_log2, seesaw_base.cuh next_ref; MLA_DECODE_SM90_LAZY, read once):
// tau = 8 (default: P below 2^8, FlashAttention-4's threshold), 4, or off (0: the running maximum, every tile's
// O scaled as before). nvidia-h100, 2026-11-25, same-call A/B against off (medians of 5..6 rounds, ms): dense bf16
// h 128 s_k 4096 0.292-0.295 / 0.303-0.310, s_k 8192 0.518-0.525 / 0.530-0.533, s_q 2 0.940-0.942 / 0.943-0.959,
// h 64 even, the code formats within their 5..10% spread; 4 was not better than 8 (docs/DECODE.md "Twenty-ninth
// session"). GroupRows (sparse prefill) compiles the running maximum instead (seesaw_base.cuh kLazy).
inline float lazy_log2() {
  static const float t = env_choice("MLA_DECODE_SM90_LAZY", 8.0f, {{"off", 0.0f}, {"0", 0.0f}, {"4", 4.0f}, {"8", 8.0f}});
  return t;
}

// Consumer 1's S in the next seesaw schedule (params.h defer_s1; MLA_DECODE_SM90_DEFER, read once): on (default)
// issued after stage 1's other V half was released, or off (at once). nvidia-h200, 2026-11-25, same-call A/B (4 rounds,
// off / on, ms): sparse prefill T 4096 h 128 4.78-4.79 / 4.66-4.70, dense s_q 2 h 128 0.979-1.035 / 0.982-0.998,
// dense bf16 / fp8 h 128 and h 64, b 4, sparse fp8_ds_mla h 64 / 128 within the spread. Pair trace (dense h 128):
// consumer 0's remote product retires ~200 cycles earlier, consumer 1's S ~370; docs/DECODE.md "Twenty-seventh session".
inline bool defer_s1() {
  enum class Defer { on, off };
  static const Defer d = env_choice("MLA_DECODE_SM90_DEFER", Defer::on, {{"off", Defer::off}});
  return d == Defer::on;
}

// The next-schedule seesaw kernel with key source Src, one CTA per unit or, under p.cluster_merge, in clusters of the
// splits.
template <class Src>
void launch_seesaw_next(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                        const char* what) {
  if (p.cluster_merge) launch_seesaw_clusters<Src>(p, grid, static_cast<unsigned>(p.num_splits), stream, map, what);
  else launch_one(decode_sm90_seesaw_next_kernel<Src>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
}

// The seesaw kernel (64-row tiles) with key source Src.
template <class Src>
void launch_seesaw(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                   const char* what) {
  // The next schedule: the TMA source and InplaceKeys (GatherKeys has no build of it); the overlapped one:
  // the TMA source only (InplaceKeys falls back to serial); everything else serial.
  if constexpr (CrossoverSource<Src>) {  // clusters of the two row tiles of a request (source_cross.cuh)
    launch_seesaw_clusters<Src>(p, grid, Src::kClusterSize, stream, map, what);
  } else {
    const SeesawSchedule s = seesaw_schedule();
    if constexpr (GroupwiseSource<Src> || Src::kTma) {
      if (s == SeesawSchedule::next) {
        launch_one(decode_sm90_seesaw_next_kernel<Src>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
        return;
      }
    }
    if constexpr (Src::kTma) {
      if (s == SeesawSchedule::overlapped) {
        launch_one(decode_sm90_seesaw_kernel<Src, true>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
        return;
      }
    }
    launch_one(decode_sm90_seesaw_kernel<Src, false>, SeesawTraits::kSmemBytes, grid, stream, map, p, what);
  }
}

// The split-KV merge of the seesaw kernels' uniform schedule (cluster_merge.cuh): cluster (default: the splits of
// a row tile as one cluster merging through distributed shared memory, where launch.cu admits it) or combine
// (MLA_DECODE_SM90_MERGE=combine: partials in the workspace and the combine kernel, for A/B). Read once.
enum class Merge { cluster, combine };
inline Merge merge_mode() {
  static const Merge m = env_choice("MLA_DECODE_SM90_MERGE", Merge::cluster, {{"combine", Merge::combine}});
  return m;
}

// How many clusters of `splits` CTAs of `Kernel` (`smem` bytes of dynamic shared memory: one CTA per SM; a cluster
// within one GPC) can be resident at once on `device`: cudaOccupancyMaxActiveClusters, once per (kernel, device,
// size); 0 where none fit. The cluster merges run only where all of a grid's clusters are resident together (a
// second wave of clusters doubled the time: b 16 s_k 1024 h 16, 8 splits, nvidia-h200 2026-11-24, docs/DECODE.md).
template <auto Kernel>
int max_clusters_cached(int device, int splits, int smem, const char* what) {
  static std::array<std::array<std::atomic<int>, ClusterMerge::kMaxSplits + 1>, 64> cached{};  // count + 1; 0 unknown
  if (device < 0 || device >= 64 || splits < 2 || splits > ClusterMerge::kMaxSplits) return 0;
  std::atomic<int>& slot = cached[static_cast<std::size_t>(device)][static_cast<std::size_t>(splits)];
  int v = slot.load(std::memory_order_relaxed);
  if (v == 0) {
    check_cuda(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
    v = max_active_clusters(Kernel, static_cast<unsigned>(splits), Traits::kThreads, static_cast<std::size_t>(smem)) + 1;
    slot.store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

// The seesaw kernel's (mqa_decode's split merge) and the raw kernel's (sparse_mqa's small-T split).
template <class Src>
int seesaw_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_seesaw_next_kernel<Src>>(device, splits, SeesawTraits::kSmemBytes,
                                                                  "mqa_decode (sm90): cluster merge");
}
template <int N, CacheFormat F, class Rows>
int raw_max_clusters(int device, int splits) {
  return max_clusters_cached<decode_sm90_raw_kernel<N, F, Rows>>(device, splits, RawTraitsFor<N, F, Rows>::kSmemBytes,
                                                                 "sparse_mqa (sm90): cluster split");
}

// The kernel for p.tile_rows with key source Src over `grid` CTAs (m_tiles x splits x requests).
template <class Src>
void launch_kernel(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                   const char* what) {
  switch (p.tile_rows) {
    case 8: launch_small<8, Src>(p, grid, stream, map, what); break;
    case 16: launch_small<16, Src>(p, grid, stream, map, what); break;
    case 32: launch_small<32, Src>(p, grid, stream, map, what); break;
    default: launch_seesaw<Src>(p, grid, stream, map, what); break;
  }
}

// The cache fields of the row-copying sources (GatherKeys, StagedKeys): base, byte strides, pages (page_size
// also as a multiply-shift divisor: < 2^30, launch.cu / launch_sparse.cu).
inline void set_gather_cache(DecodeSm90Params::Gather& g, const KVCache& c) {
  const int64_t eb = static_cast<int64_t>(c.data.element_size());
  g.cache = static_cast<const uint8_t*>(c.data.data);
  g.stride_block_bytes = c.data.stride[0] * eb;
  g.stride_row_bytes = c.data.stride[1] * eb;
  g.num_slots = c.num_blocks() * c.page_size();
  g.page_size = static_cast<int32_t>(c.page_size());
  g.page_div = make_fast_divisor(static_cast<uint32_t>(g.page_size));
  g.scale = c.scale;
}

// fp8_ds_mla records / fp8 (per-tensor) rows copied by the producer warps, rows located by Rows (source.cuh:
// IndexedRows for sparse_mqa, PagedRows for mqa_decode). N 8 / 16 / 32: by default the raw-codes kernel
// (kernel_raw.cuh: no bf16 stage, the consumers build wgmma's A operand from the codes; exact codes for both
// formats). Same-run A/B on nvidia-h200, 2026-11-24, b 128 s_k 4096 page 64: h 16 fp8 0.155 ms against the
// raw ring's 0.234, fp8_ds_mla 0.179 against 0.227; h 8 fp8 0.138 against 0.215, fp8_ds_mla 0.160 against
// 0.227; sparse_mqa T 128 topk 2048 h 16 fp8_ds_mla 0.116 against the staged 0.140 (docs/DECODE.md "Raw-codes
// kernel"). MLA_DECODE_SM90_STAGE=ring / staged select the bf16-stage small kernels instead (source_staged.cuh:
// the raw ring, RingKeys, at N 16 of mqa_decode under `automatic` before; the serial raw stage, StagedKeys),
// which read fp8_ds_mla as its bf16 upconvert; at N 32 (no room for a raw stage) fp8_ds_mla StagedKeys, fp8 the
// register path (GatherKeys). N 32 on the raw kernel (then split by d) against those, same run, nvidia-h200,
// 2026-11-25: sparse T 128 topk 2048 fp8_ds_mla h 32 0.108 ms against 0.151, dense b 128 s_k 4096 h 32 fp8 0.146
// against the seesaw tile's 0.304, fp8_ds_mla 0.156 against 0.229; ping-pong since (0.124 / 0.134 ms dense h 32;
// docs/DECODE.md "Ping-pong"). The seesaw kernel dequantises through registers or in place. TMA only in the raw
// kernel's paged rows (p.gather.raw_tma, launch.cu raw_rows_tensor_map); otherwise the tensor map is a zeroed
// placeholder. Read once.
enum class StageChoice { automatic, ring, staged, raw };
inline StageChoice stage_choice() {
  static const StageChoice c =
      env_choice("MLA_DECODE_SM90_STAGE", StageChoice::automatic,
                 {{"ring", StageChoice::ring}, {"staged", StageChoice::staged}, {"raw", StageChoice::raw}});
  return c;
}

// The small kernel with N rows for the row-copied format F (SmallKeysFor or SmallRingKeysFor, stage_choice()).
template <int N, CacheFormat F, class Rows>
void launch_small_copied(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                         const char* what) {
  using Default = SmallKeysFor<F, SmallTraits<N>::kOffExtra, Rows>;
  using Ring = SmallRingKeysFor<F, SmallTraits<N>::kOffExtra, Rows>;
  const StageChoice c = stage_choice();
  if constexpr (!Rows::kPaged) {  // mqa_decode's rows never merge in a cluster on this path (launch.cu)
    if (p.cluster_merge) {  // sparse_mqa's small-T split (launch_sparse.cu): the raw kernel only
      launch_one_clustered(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid,
                           static_cast<unsigned>(p.num_splits), stream, map, p, what);
      return;
    }
  }
  if (c == StageChoice::raw || c == StageChoice::automatic) {
    launch_one(decode_sm90_raw_kernel<N, F, Rows>, RawTraitsFor<N, F, Rows>::kSmemBytes, grid, stream, map, p, what);
    return;
  }
  if constexpr (!std::is_same_v<Ring, Default>) {
    const bool ring = c == StageChoice::ring;
    if (ring) {
      launch_small<N, Ring>(p, grid, stream, map, what);
      return;
    }
  }
  launch_small<N, Default>(p, grid, stream, map, what);
}

// The seesaw kernel's source for the code formats (64-row tiles): GatherKeys (codes through registers, nine
// round trips per stage tile) or InplaceKeys (source_inplace.cuh: the raw codes cp.async'd into their own
// panel rows a release group at a time and expanded in place there; two / three round trips; on the next
// schedule unless MLA_DECODE_SM90_SEESAW=serial). Default: InplaceKeys for both formats (mqa_decode and
// sparse_mqa) wherever the crossover does not run (an odd number of 64-row tiles, e.g. h 64 at s_q 1). fp8_ds_mla
// since the same-run A/Bs on nvidia-h200 2026-11-23 (188efbe: dense b 128 s_k 4096 h 128 fp8_ds_mla 0.691 /
// 0.679 ms against 0.727 / 0.726; sparse T 128 topk 2048 fp8_ds_mla h 128 317 / 397 us against 387 / 385, h 64
// 172 / 205 against 226 / 227; docs/DECODE.md "In-place expansion"); fp8 per-tensor since the in-place loop
// expands two raw chunks per iteration (nvidia-h200 2026-11-25: dense b 128 s_k 4096 h 64 fp8 0.251 ms against
// GatherKeys' 0.312, four rounds in one call; it had been a tie at h 128 before). MLA_DECODE_SM90_EXPAND=inplace /
// registers forces one source for both formats. Read once.
enum class SeesawExpand { automatic, registers, inplace };
inline SeesawExpand seesaw_expand() {
  static const SeesawExpand e = env_choice("MLA_DECODE_SM90_EXPAND", SeesawExpand::automatic,
                                           {{"inplace", SeesawExpand::inplace}, {"registers", SeesawExpand::registers}});
  return e;
}

// The crossover (source_cross.cuh CrossKeys: the two row-tile CTAs of a request expand half of every tile
// each, for both, through a cluster of two) wherever a request has an even number of 64-row tiles (h 128 at
// s_q 1) on the next schedule and the in-place source would run: by default for both code formats
// (docs/DECODE.md "Crossover" has the same-run A/Bs), with each warp's whole V-half share (two panels of its 32
// rows) loaded into registers before the release (CrossKeys kPrefetch; docs/DECODE.md "Register prefetch").
// MLA_DECODE_SM90_CROSS=plain: the codes cp.async'd after the release instead; =off: InplaceKeys / GatherKeys.
// Read once.
enum class Crossover { prefetch, plain, off };
inline Crossover crossover_mode() {
  static const Crossover c =
      env_choice("MLA_DECODE_SM90_CROSS", Crossover::prefetch, {{"off", Crossover::off}, {"plain", Crossover::plain}});
  return c;
}

// The bf16 multicast (source.cuh PagedKeysT<true>: the two row-tile CTAs of a request as a cluster of two,
// each V-half panel read once and multicast into both) wherever a request has an even number of 64-row tiles
// on the next schedule, under MLA_DECODE_SM90_MCAST=on. Not the default: same-run A/Bs, 2026-11-24, b 128 page
// 64, h 128 s_k 4096 / 8192, s_q 2 h 128 s_k 8192: on nvidia-h100 -25% / -22% / -27%, on nvidia-h200 +30% /
// +30% / +31% (docs/DECODE.md "Multicast"); the targets are the H200's. Read once.
enum class Multicast { on, off };
inline Multicast multicast_mode() {
  static const Multicast m = env_choice("MLA_DECODE_SM90_MCAST", Multicast::off, {{"on", Multicast::on}});
  return m;
}

// sparse_mqa's bf16 rows at h > 32: GroupRows (source_inplace.cuh: GatherKeys' copies a release group at a time,
// on the next schedule), by default since the same-run A/B on nvidia-h200, 2026-11-24 (T 128 topk 2048: h 128
// 0.219 / 0.210 / 0.207 ms against GatherKeys' serial 0.237 / 0.245 / 0.232, h 64 0.127 x3 against 0.141 / 0.126 /
// 0.141, h 100 0.203 / 0.184 / 0.199 against 0.221 / 0.216 / 0.264; sparse prefill T 4096 pool 8192 5.32 / 5.29 /
// 5.29 against 6.06 / 6.10 / 6.10: 385 -> 441 TFLOP/s; docs/SPARSE.md). MLA_DECODE_SM90_ROWS=gather: GatherKeys.
enum class SparseRows { gather, groups };
inline SparseRows sparse_rows_mode() {
  static const SparseRows r = env_choice("MLA_DECODE_SM90_ROWS", SparseRows::groups, {{"gather", SparseRows::gather}});
  return r;
}

// `map`: the raw-codes kernel's tensor map when p.gather.raw_tma (launch.cu raw_rows_tensor_map), else unused.
template <CacheFormat F, class Rows>
void launch_copied(const DecodeSm90Params& p, unsigned grid, cudaStream_t stream, const CUtensorMap& map,
                   const char* what) {
  CUtensorMap unused;
  std::memset(&unused, 0, sizeof(unused));
  switch (p.tile_rows) {
    case 8: launch_small_copied<8, F, Rows>(p, grid, stream, map, what); break;
    case 16: launch_small_copied<16, F, Rows>(p, grid, stream, map, what); break;
    case 32: launch_small_copied<32, F, Rows>(p, grid, stream, map, what); break;
    default:
      {
        const SeesawExpand e = seesaw_expand();
        const Crossover x = crossover_mode();
        const bool cross = x != Crossover::off && p.m_tiles % 2 == 0 && e != SeesawExpand::registers &&
                           seesaw_schedule() == SeesawSchedule::next;
        if (cross && x == Crossover::prefetch)
          launch_seesaw<CrossKeys<F, Rows, true>>(p, grid, stream, unused, what);
        else if (cross)
          launch_seesaw<CrossKeys<F, Rows, false>>(p, grid, stream, unused, what);
        else if (e != SeesawExpand::registers)
          launch_seesaw<InplaceKeys<F, Rows>>(p, grid, stream, unused, what);
        else
          launch_seesaw<GatherKeys<F, Rows>>(p, grid, stream, unused, what);
      }
      break;
  }
}

}  // namespace mla::cuda::decode_sm90
