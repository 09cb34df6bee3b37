// SPDX-License-Identifier: Apache-2.0
#pragma once
// Timeline trace of the sm90 decode kernels and the split-KV combine that follows them, for diagnosing fixed costs
// (docs/design/attention_sm90.md "10. Where the time goes"; here in cuda/common/ so that the combine, which may
// include only common/, stamps into the same table). Compiled only into a build configured with
// -DMLA_DECODE_TRACE=ON (CMake option; it defines MLA_DECODE_TRACE=1 for the CUDA sources): each CTA
// x < kTraceCtas stamps the global timer (ns) at kTraceEvents points, and the events below that are ns also the SM
// clock (clock64) beside them; trace_dump() (mqa_decode.cu) copies the stamps of the last launch out and zeroes
// them. Without the option every hook is an empty statement and no symbol exists.
//   0 kernel entry (thread 0)            1 producer start (thread 0)        2 producer loop done (thread 0)
//   3 consumers' Q loaded (thread 128)   4 first full-barrier wait returned (thread 128, first tile)
//   5 last products done (thread 128)    6 epilogue written (thread 128)    7 kernel exit (thread 128)
//   8 / 9 / 10 cluster merge: first cluster barrier passed, merge loop done, second barrier passed (thread 128)
//   11 not a time: the units (segments) the CTA ran (small kernel)
//   12 + 10 c + k: the seesaw kernel's steps k of consumer c in its pair kTracePair (thread 128 + 128 c), SM
//      clock cycles (clock64: both consumers run on one SM, so their stamps compare), not ns; the steps are named
//      by kTracePairSteps (bench/attention_bench.cu prints them relative to consumer 0's step 0).
//   32 + 9 s + 3 g + k: the seesaw producer of stage s (warp s: part 0, lane 0) on its tile of pair kTracePair
//      (tile 2 kTracePair + s), release group g (0 rope, 1 the owner's V half, 2 the other): k 0 its empty wait
//      returned, 1 its raw codes landed (code-format sources, after their copy wait), 2 the group issued / expanded
//      and arrived; SM clock cycles, as the pair steps.
//   50 + k: the split-KV combine's CTA x (a dependent launch after the attention kernel; thread 0): k 0 entry, 1 its
//      dependency wait returned, 2 the row's weights ready, 3 its stores issued (ns, as events 0..10).
//   54 + 2 t + k: the producer (thread 0, source.cuh produce) on tile t < 2 of its last unit: k 0 the tile's keys
//      read (block table, mask), 1 its boxes issued (ns).
//   58 + 4 c + k: consumer c's epilogue of the small / raw kernels (small_epilogue, thread 128 + 128 c): k 0 start,
//      1 both warpgroups' (m, l) published, 2 the weights published, 3 the rows written (ns).
//   66 + 3 t + k: the producer's steps between events 54 + 2 t and 55 + 2 t on tile t < 2 (thread 0): k 0 the stage's
//      empty wait returned, 1 the tile's bytes announced (expect_tx), 2 its first panel's boxes issued (ns).
//   72 + k: the small kernel's prologue (thread 0): k 0 the dependency wait returned, 1 the uniform unit read (its
//      length), 2 the barriers' __syncthreads passed, 3 the producer's first unit read (ns).
#include <cstdint>

namespace mla::cuda::decode_sm90 {

inline constexpr int kTraceCtas = 1024, kTracePairBase = 12, kTracePairSteps = 10, kTracePair = 6;
inline constexpr int kTraceProdBase = kTracePairBase + 2 * kTracePairSteps, kTraceProdSteps = 9;
inline constexpr int kTraceCombineBase = kTraceProdBase + 2 * kTraceProdSteps, kTraceCombineSteps = 4;
inline constexpr int kTraceProducerBase = kTraceCombineBase + kTraceCombineSteps;
inline constexpr int kTraceEpilogueBase = kTraceProducerBase + 4;
inline constexpr int kTraceProducerStepBase = kTraceEpilogueBase + 8;
inline constexpr int kTracePrologueBase = kTraceProducerStepBase + 6;
inline constexpr int kTraceEvents = kTracePrologueBase + 4;
// A CTA's row: the events' stamps, then (events stamped by trace_event) the SM clock at the same point, so that the
// steps of one CTA compare to the cycle where the global timer moves in steps of ~0.26 us.
inline constexpr int kTraceStride = 2 * kTraceEvents;
static_assert(kTraceCombineBase == 50 && kTraceProducerBase == 54 && kTraceEpilogueBase == 58 &&
                  kTraceProducerStepBase == 66 && kTracePrologueBase == 72,
              "the events as documented above");
// The producer's slot for stage s, group g of tile t (-1: not traced); part 0's warp stamps.
__device__ __forceinline__ int trace_prod_slot(int s, int part, int g, int t) {
  return part == 0 && t == 2 * kTracePair + s && blockIdx.x < kTraceCtas ? kTraceProdBase + 3 * (3 * s + g) : -1;
}

#if defined(MLA_DECODE_TRACE) && MLA_DECODE_TRACE
}  // namespace mla::cuda::decode_sm90
#include <cuda_runtime.h>
namespace mla::cuda::decode_sm90 {

__device__ unsigned long long g_trace[kTraceCtas][kTraceStride];

__device__ __forceinline__ void trace_event(int ev, unsigned thread, bool once = false) {
  if (threadIdx.x != thread || blockIdx.x >= kTraceCtas) return;
  if (once && g_trace[blockIdx.x][ev] != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  g_trace[blockIdx.x][ev] = t;
  g_trace[blockIdx.x][kTraceEvents + ev] = static_cast<unsigned long long>(clock64());
}
__device__ __forceinline__ void trace_value(int ev, unsigned thread, unsigned long long v) {
  if (threadIdx.x == thread && blockIdx.x < kTraceCtas) g_trace[blockIdx.x][ev] = v;
}
// Step k of consumer c's pair j, stamped when j is kTracePair.
__device__ __forceinline__ void trace_pair(int c, int k, int j) {
  if (j != kTracePair || threadIdx.x != 128u + 128u * static_cast<unsigned>(c) || blockIdx.x >= kTraceCtas) return;
  g_trace[blockIdx.x][kTracePairBase + kTracePairSteps * c + k] = static_cast<unsigned long long>(clock64());
}
// A stamp into producer slot + k (trace_prod_slot) from lane 0 of that warp.
__device__ __forceinline__ void trace_prod(int slot, int k) {
  if (slot >= 0 && (threadIdx.x & 31u) == 0)
    g_trace[blockIdx.x][slot + k] = static_cast<unsigned long long>(clock64());
}
#define MLA_DECODE_TRACE_EVENT(...) ::mla::cuda::decode_sm90::trace_event(__VA_ARGS__)
#define MLA_DECODE_TRACE_PROD(...) ::mla::cuda::decode_sm90::trace_prod(__VA_ARGS__)
#define MLA_DECODE_TRACE_VALUE(...) ::mla::cuda::decode_sm90::trace_value(__VA_ARGS__)
#define MLA_DECODE_TRACE_PAIR(...) ::mla::cuda::decode_sm90::trace_pair(__VA_ARGS__)
// The producer tile's slot (a member of the code-format tiles in a trace build only, stamped by the source itself).
#define MLA_DECODE_TRACE_SLOT(tile, v) ((tile).trace_slot = (v))

// Host: each .cu that launches traced kernels has its own g_trace (no relocatable device code). This one's stamps go
// into out where out holds 0 (a call's kernels stamp one unit's array), then are zeroed. false when a copy failed.
static inline bool trace_take_tu(uint64_t* out) {
  static unsigned long long stamps[kTraceCtas][kTraceStride];
  static const unsigned long long zeros[kTraceCtas][kTraceStride] = {};
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(stamps, g_trace, sizeof(g_trace)) != cudaSuccess ||
      cudaMemcpyToSymbol(g_trace, zeros, sizeof(g_trace)) != cudaSuccess)
    return false;
  for (int c = 0; c < kTraceCtas; ++c)
    for (int e = 0; e < kTraceStride; ++e)
      if (out[c * kTraceStride + e] == 0) out[c * kTraceStride + e] = stamps[c][e];
  return true;
}
// Every translation unit that includes this header (each kernel instantiation file) registers its stamps for
// trace_dump (mqa_decode.cu), before main.
using TraceTake = bool (*)(uint64_t*);
bool trace_register(TraceTake take);
namespace {
[[maybe_unused]] const bool trace_registered_tu = trace_register(&trace_take_tu);
}  // namespace
#else
#define MLA_DECODE_TRACE_EVENT(...) ((void)0)
#define MLA_DECODE_TRACE_PROD(...) ((void)0)
#define MLA_DECODE_TRACE_VALUE(...) ((void)0)
#define MLA_DECODE_TRACE_PAIR(...) ((void)0)
#define MLA_DECODE_TRACE_SLOT(tile, v) ((void)0)
#endif

// The stamps of the CTAs of the last traced launch (mqa_decode's or sparse_mqa's), [kTraceCtas][kTraceStride]: ns
// (0: not reached), then the SM clock of the same events, zeroed after the copy; false (and nothing written) in a
// build without the trace.
bool trace_dump(uint64_t* out);

}  // namespace mla::cuda::decode_sm90
