// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the block traces of `mla run` share (run_block.cpp: the V2 / V3 block; run_block_v4.cpp: the
// DeepSeek-V4 block): the check rule, random published-form weights, dtype conversion, rel-L2.
#include <chrono>
#include <cstdint>
#include <vector>

#include "mla/deepseek.h"
#include "mla/tensor.h"

namespace mla::app {

// rel-L2 of each step's output against the float64 twin (the bf16 rule of docs/BLOCK.md).
inline constexpr double kBlockRule = 1e-2;
// The bound of one step. bf16 cache: kBlockRule. Quantised caches: the bf16 block and its twin
// quantise different rows (bf16 vs float64), so codes flip between their caches; the bound adds twice
// the cache's own error in this step, measured as the twin against the exact float64 block (f64
// cache): kBlockRule + 2 * that (DESIGN.md §5's "twice the error of the same computation at the
// storage precision").
inline double step_bound(double cache_error) { return kBlockRule + 2.0 * cache_error; }

double seconds_since(std::chrono::steady_clock::time_point t0);

// A random Linear [out, in] in published form: fp8 codes of uniform(-448, 448) with scale
// sqrt(3 / in) / 448 per block_rows x block_cols block (uniform(+-sqrt(3 / in)): unit-variance outputs),
// or bf16 of the same distribution. The tensors behind the views are appended to `keep`.
DeepseekLinear random_linear(int64_t out, int64_t in, bool fp8, int block_rows, int block_cols, uint64_t seed,
                             std::vector<Tensor>& keep);
// n bf16 values uniform in [lo, hi) as a [n] tensor appended to `keep`.
TensorView random_bf16_vector(int64_t n, uint64_t seed, double lo, double hi, std::vector<Tensor>& keep);

// Rows [T, H] in `dtype` from bf16 values.
Tensor as_dtype(const Tensor& bf16, DType dtype);
// rel-L2 of got against ref (any float dtypes, contiguous, same element count); inf for NaN.
double rel_l2(const TensorView& got, const TensorView& ref);

}  // namespace mla::app
