// SPDX-License-Identifier: Apache-2.0
#pragma once
// The list of benchmark families (registry.h says how to add one). Each family is one bench/*.cu file
// defining its register_* function; CUDA builds only.
#include "registry.h"

namespace mla::bench {

#if MLA_WITH_CUDA
void register_ceilings(Registry& r);  // ceilings.cu: copy bandwidth and cuBLAS GEMM (always run first)
void register_cache(Registry& r);     // cache.cu: write_cache, gather_cache (+ cp_gather), upconvert
void register_merge(Registry& r);     // merge.cu: merge, convert_topk
void register_gemm(Registry& r);      // gemm.cu: the layer's GEMM / BMM shapes
void register_attention(Registry& r); // attention_bench.cu: mqa_decode, mha_prefill, sparse_mqa
void register_layer(Registry& r);     // layer_bench.cu: MlaAttention::forward for whole steps
void register_dcp(Registry& r);       // dcp.cu: decode context parallelism over NCCL (tokens/s, 1 vs N GPUs)
void register_indexer(Registry& r);   // indexer.cu: lightning-indexer logits (decode / prefill) and top-k
void register_block(Registry& r);     // block_bench.cu: DeepseekAttention::forward (V3 rank), its GEMMs

inline void register_all(Registry& r) {
  register_ceilings(r);
  register_cache(r);
  register_merge(r);
  register_gemm(r);
  register_attention(r);
  register_layer(r);
  register_dcp(r);
  register_indexer(r);
  register_block(r);
}
#endif

}  // namespace mla::bench
