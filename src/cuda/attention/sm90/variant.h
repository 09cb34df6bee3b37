// SPDX-License-Identifier: Apache-2.0
#pragma once
// The sm90 variants of mqa_decode and sparse_mqa, one dispatch-table entry per shipped kernel (the op launchers
// attention/mqa_decode.cpp and attention/sparse_mqa.cpp), best first:
//   sm90_small   the small kernel (small/kernel.cuh): bf16 caches, up to 32 query rows per request
//   sm90_raw     the raw-codes kernel (raw/kernel.cuh): fp8 / fp8_ds_mla caches, up to 32 rows
//   sm90_seesaw  the seesaw kernel (seesaw/kernel.cuh): 64-row tiles, every format
//   sm90_convert the converter kernel (convert/kernel.cuh): 64-row tiles over fp8 / fp8_ds_mla codes (sparse_mqa:
//                fp8_ds_mla); forced only until measured
//   sm90_fp8c    the fp8-compute kernel (fp8c/kernel.cuh): 64-row tiles, e4m3 products over fp8 per-tensor caches, only
//                when the call asks for fp8 compute (mqa_decode)
// supports_*: whether the kernel can run the launch (what a forced variant may run); prefers_*: whether the host
// rule (core/decode_regime.h) picks it, for automatic selection. Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::decode_sm90 {

const char* supports_small(const dispatch::DecodeArgs& a);
const char* supports_raw(const dispatch::DecodeArgs& a);
const char* supports_seesaw(const dispatch::DecodeArgs& a);
const char* supports_convert(const dispatch::DecodeArgs& a);
const char* supports_fp8c(const dispatch::DecodeArgs& a);
bool prefers_small(const dispatch::DecodeArgs& a);
bool prefers_raw(const dispatch::DecodeArgs& a);
bool prefers_seesaw(const dispatch::DecodeArgs& a);
bool prefers_convert(const dispatch::DecodeArgs& a);
bool prefers_fp8c(const dispatch::DecodeArgs& a);
void run_small(const dispatch::DecodeArgs& a);
void run_raw(const dispatch::DecodeArgs& a);
void run_seesaw(const dispatch::DecodeArgs& a);
void run_convert(const dispatch::DecodeArgs& a);
void run_fp8c(const dispatch::DecodeArgs& a);

const char* supports_sparse_small(const dispatch::SparseArgs& a);
const char* supports_sparse_raw(const dispatch::SparseArgs& a);
const char* supports_sparse_seesaw(const dispatch::SparseArgs& a);
const char* supports_sparse_convert(const dispatch::SparseArgs& a);
bool prefers_sparse_small(const dispatch::SparseArgs& a);
bool prefers_sparse_raw(const dispatch::SparseArgs& a);
bool prefers_sparse_seesaw(const dispatch::SparseArgs& a);
bool prefers_sparse_convert(const dispatch::SparseArgs& a);
void run_sparse_small(const dispatch::SparseArgs& a);
void run_sparse_raw(const dispatch::SparseArgs& a);
void run_sparse_seesaw(const dispatch::SparseArgs& a);
void run_sparse_convert(const dispatch::SparseArgs& a);

}  // namespace mla::cuda::decode_sm90
