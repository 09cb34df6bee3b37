// SPDX-License-Identifier: Apache-2.0
#pragma once
// The "sm90" variants of mqa_decode and sparse_mqa (kernel_small.cuh, kernel_seesaw.cuh with a paged or a
// gathering key source), as entries of the families' dispatch tables (src/cuda/decode/launch.cu,
// src/cuda/sparse/launch.cu). Plain C++.
#include "cuda/dispatch/families.h"

namespace mla::cuda::decode_sm90 {

// nullptr when the variant runs the launch; else why not (the portable variant runs it instead).
const char* supports(const dispatch::DecodeArgs& a);
void run(const dispatch::DecodeArgs& a);

// sparse_mqa (launch_sparse.cu, docs/SPARSE.md).
const char* supports_sparse(const dispatch::SparseArgs& a);
void run_sparse(const dispatch::SparseArgs& a);

}  // namespace mla::cuda::decode_sm90
