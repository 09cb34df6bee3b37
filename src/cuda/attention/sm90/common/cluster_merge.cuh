// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-KV merge inside a thread-block cluster (p.cluster_merge): with the seesaw kernels' uniform schedule
// and 2..8 splits, the num_splits CTAs of one (request, row tile) are one cluster (Unit: split = cluster rank),
// each keeps its partial in its own shared memory, and after a cluster barrier rank k merges the columns
// [k * chunk, (k + 1) * chunk) of every row from all ranks' partials through distributed shared memory and
// writes out (bf16), rank 0 also the LSE. The rule is the merge rule of every combine (attention/combine/
// merge_rule.cuh: an empty split, LSE -inf, weighs 0 and is not read; a NaN LSE makes the row NaN; the splits
// summed in split order), its weights taken as exp(lse_s - lse) in registers (the last bit may differ from the
// combine kernel's exp(lse_s - m) / sum); what goes away is the combine's launch, its wait for the whole attention
// grid and the workspace round trip (docs/design/attention_sm90.md "7. Schedules and the combine"). A second cluster barrier keeps every
// partial alive until all ranks have read it. The raw kernel's small-T sparse split (raw/kernel.cuh, sparse_mqa.cu)
// uses the same merge for its N 8 / 16 / 32 rows, its partial in its drained ring (lse_base: after its N rows).
//
// Every thread of every CTA of the cluster passes both barriers (cluster_merge_protocol): the producers after
// their loop, an empty unit's whole CTA, the consumers after their epilogue, so no CTA exits while a peer may
// still read it and no barrier waits on an exited thread.
//
// Shared memory (after a unit's last products the KV stages and P buffers are free; SeesawTraits):
//   kOffK + kPartialO:   O / l of the unit's rows, [64 rows][kRowFloats] fp32 (130 KiB; rows past m_rows unwritten)
//   kOffK + kPartialLse: natural-log LSE of each row, [64] fp32
#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mqa_params.h"
#include "cuda/common/ptx/cluster.cuh"
#include "cuda/common/ptx/mma_sync.cuh"
#include "cuda/attention/sm90/common/pipeline.cuh"
#include "cuda/common/trace.cuh"

namespace mla::cuda::decode_sm90 {

struct ClusterMerge {
  static constexpr int kMaxSplits = 8;  // the portable cluster size (mqa_decode.cu merges no wider clusters)
  // Row stride of the partial O in floats: 512 + 8, so that the epilogue's stores of the 8 rows of a warp's
  // quads (rows 2080 bytes apart) fall into distinct banks.
  static constexpr int kRowFloats = Traits::kDv + 8;
  static constexpr int kPartialO = 0;
  static constexpr int kPartialLse = Traits::kBlockM * kRowFloats * 4;
  static constexpr int kPartialBytes = kPartialLse + Traits::kBlockM * 4;
  static_assert(kPartialBytes <= 2 * Traits::kTileBytes, "the partial fits in the two KV stages");

  // Columns per rank for `splits` ranks: a multiple of 4 (16-byte reads), the last rank's range clipped to 512.
  __host__ __device__ static constexpr int chunk(int splits) { return ((Traits::kDv + splits - 1) / splits + 3) & ~3; }
};

// Merges rows [u.row0, u.row0 + rows) of the cluster's partials in this rank's columns, by `nthreads` consumer
// threads (index ct), between the two cluster barriers: each item (a row, 4 columns) loads the row's LSE and
// its 4 columns from every rank at once (one distributed round trip), weighs and sums them. lse_off: the byte
// offset of the partial LSE in `stage` (the seesaw tile's kPartialLse; the raw kernel's N rows put it after
// their N rows of O).
__device__ __forceinline__ void merge_cluster_rows(const DecodeSm90Params& p, const Unit& u, const uint8_t* stage,
                                                   int ct, int nthreads, uint32_t lse_base = ClusterMerge::kPartialLse) {
  using T = Traits;
  using M = ClusterMerge;
  const MqaRowParams& rp = p.rows;
  const int splits = p.num_splits, rows = min(p.tile_rows, u.m_rows - u.row0);
  const uint32_t rank = ptx::cluster_ctarank();
  // Each rank's partial in the cluster window, mapped once. Ranks past `splits` map this CTA's own partial (loaded,
  // not used): mapped to one rank, every CTA's phantom loads would queue at that rank's shared memory (with 5
  // splits, three of each item's eight loads went to rank 0 from all five CTAs).
  uint32_t base[M::kMaxSplits];
#pragma unroll
  for (int s = 0; s < M::kMaxSplits; ++s) base[s] = ptx::map_peer(ptx::smem_addr(stage), s < splits ? s : rank);
  const int c0 = static_cast<int>(rank) * M::chunk(splits), c1 = min(T::kDv, c0 + M::chunk(splits));
  const int groups = c1 > c0 ? (c1 - c0) / 4 : 0;
  for (int e = ct; e < rows * groups; e += nthreads) {
    const int r = e / groups, col = c0 + 4 * (e % groups);
    const uint32_t lse_off = lse_base + 4u * r, o_off = M::kPartialO + 4u * (r * M::kRowFloats + col);
    float l[M::kMaxSplits];
    float4 v[M::kMaxSplits];
#pragma unroll
    for (int s = 0; s < M::kMaxSplits; ++s) {  // every load in flight, unconditionally (no branch between them)
      l[s] = ptx::ld_shared_cluster_f32(base[s] + lse_off);
      v[s] = ptx::ld_shared_cluster_v4f32(base[s] + o_off);
    }
#pragma unroll
    for (int s = 0; s < M::kMaxSplits; ++s)
      if (s >= splits) l[s] = -INFINITY;  // an empty split's O (never written) is loaded but not used
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < M::kMaxSplits; ++s) mx = fmaxf(mx, l[s]);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < M::kMaxSplits; ++s) sum += l[s] == -INFINITY ? 0.0f : expf(l[s] - mx);
    // sum == 0: every split empty; a NaN LSE (dropped by fmaxf) makes sum, the LSE and every weight NaN.
    const float lse = sum == 0.0f ? -INFINITY : mx + logf(sum);
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
    for (int s = 0; s < M::kMaxSplits; ++s)
      if (l[s] != -INFINITY) {  // split order, as the combine kernel
        const float w = expf(l[s] - lse);
        a0 += w * v[s].x;
        a1 += w * v[s].y;
        a2 += w * v[s].z;
        a3 += w * v[s].w;
      }
    const int row = u.row0 + r, i = row / rp.h_q, h = row % rp.h_q;
    if (col == 0 && rp.lse) rp.lse[u.g * rp.lse_stride_g + i * rp.lse_stride_i + h * rp.lse_stride_h] = lse;
    uint16_t* dst = static_cast<uint16_t*>(rp.out) + u.g * rp.out_stride_g + i * rp.out_stride_i + h * rp.out_stride_h +
                    col;  // bf16 out (supports() admits no other)
    if (p.out_pairs) {
      reinterpret_cast<uint32_t*>(dst)[0] = ptx::pack_bf16x2(a0, a1);
      reinterpret_cast<uint32_t*>(dst)[1] = ptx::pack_bf16x2(a2, a3);
    } else {
      dst[0] = dev::float_to_bf16(a0);
      dst[1] = dev::float_to_bf16(a1);
      dst[2] = dev::float_to_bf16(a2);
      dst[3] = dev::float_to_bf16(a3);
    }
  }
}

// The two cluster barriers around the merge, for every thread of the CTA: threads with ct in [0, nthreads)
// merge (the consumers, after writing their partial), the others only pass the barriers.
__device__ __forceinline__ void cluster_merge_protocol(const DecodeSm90Params& p, const Unit& u, const uint8_t* stage,
                                                       int ct, int nthreads,
                                                       uint32_t lse_base = ClusterMerge::kPartialLse) {
  ptx::cluster_sync();  // every rank's partial is written and visible
  MLA_DECODE_TRACE_EVENT(8, 128);
  if (ct >= 0 && ct < nthreads) merge_cluster_rows(p, u, stage, ct, nthreads, lse_base);
  MLA_DECODE_TRACE_EVENT(9, 128);
  ptx::cluster_sync();  // every rank has read every partial: the CTAs may exit
  MLA_DECODE_TRACE_EVENT(10, 128);
}

// The same two cluster barriers for threads that take no part in the merge and do not hold its arguments (the
// producers, after their loop).
__device__ __forceinline__ void cluster_merge_pass() {
  ptx::cluster_sync();
  ptx::cluster_sync();
}

}  // namespace mla::cuda::decode_sm90
