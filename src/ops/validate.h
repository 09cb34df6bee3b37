// SPDX-License-Identifier: Apache-2.0
#pragma once
// Validation shared by the op front ends (cache ops, merge, top-k, attention). Structural checks
// (shape, dtype, device, strides) apply to every device; the *_values checks read integer metadata
// and are called only for CPU tensors, where the values are host-readable (docs/DEVELOPING.md).
// Every check throws mla::Error naming the op and the argument, with what was expected and what came.
#include <cstdint>
#include <initializer_list>

#include "core/check.h"
#include "mla/block_ops.h"
#include "mla/cache.h"
#include "mla/tensor.h"

namespace mla::detail {

// The activation dtypes a CUDA op takes: bf16 only, or bf16 / f16 / f32 (kernels templated on the
// activation type: merge_attn_states, gather_cache / upconvert_ds_mla dst, mqa_decode, sparse_mqa).
enum class CudaActivations { bf16, bf16_f16_f32 };

// Activations: bf16/f16/f32/f64 on the CPU, `cuda` on CUDA (ops.h); unit inner stride, strides >= 0
// (and non-overlapping when `is_output`).
void check_activation(const TensorView& t, bool is_output, const char* op, const char* arg,
                      CudaActivations cuda = CudaActivations::bf16);

// On CUDA, `t` has the dtype of `like` (kernels with one activation type for all their views); any
// float dtypes mix on the CPU.
void check_same_dtype_on_cuda(const TensorView& t, const TensorView& like, const char* op, const char* arg,
                              const char* like_arg);

// An LSE view of exactly `shape` with any non-negative strides (non-overlapping when `is_output`):
// a transposed buffer is accepted. fp32 on every device; the CPU also accepts f64 (the float64
// oracle keeps full-precision LSEs so that merged results stay exact to ~1e-15).
void check_lse(const TensorView& lse, std::initializer_list<int64_t> shape, bool is_output, const char* op,
               const char* arg);

// A 1-D int32 vector of `n` elements (n < 0: any length), non-negative stride.
void check_i32_vector(const TensorView& t, int64_t n, const char* op, const char* arg);

// block_table [rows, max_blocks] int32 with rows >= min_rows, unit inner stride, non-negative strides.
void check_block_table(const TensorView& block_table, int64_t min_rows, const char* op);

// The cache is well formed (validate_cache) and lives on `device`.
void check_cache(const KVCache& cache, Device device, const char* op);
// Throws mla::Error unless the cache's format follows the plain row rule: ops other than write_cache,
// the gathers and sparse_mqa with values_include_rope refuse the block-scaled records (v4, v41, v41_fp4).
void check_not_record(const KVCache& cache, const char* op);

// ---- value checks (CPU tensors only) -------------------------------------------------------

// Every element of the 1-D index view lies in [lo, hi].
void check_values_in_range(const TensorView& t, int64_t lo, int64_t hi, const char* op, const char* arg);

// cu [B+1]: cu[0] >= 0, non-decreasing, cu[B] <= max_total (the rows available to write).
void check_cu_seqlens_values(const TensorView& cu, int64_t max_total, const char* op, const char* arg);

// The block ids that logical positions [begin, end) of request `row` map to lie in [0, num_blocks),
// for the blocks inside the table (blocks at or beyond block_table.size(1) are skipped by the ops
// that read only inside the table; ops that require every position inside the table check that
// bound themselves).
void check_block_ids(const TensorView& block_table, int64_t row, int64_t begin, int64_t end, int64_t page_size,
                     int64_t num_blocks, const char* op);

// slot_mapping values are < num_slots (negative = skipped) and no slot is named twice (a row is
// written once per call: two tokens on one slot would race in a parallel backend).
void check_slot_values(const TensorView& slot_mapping, int64_t num_slots, const char* op);

// Every argument rule of quantize_output (mla/block_ops.h; defined in src/ops/block_ops.cpp), for
// callers that must refuse before an earlier write (the layer checks its quantised output up front).
void check_quantize_output(const TensorView& x, OutputQuant key, const TensorView& codes, const TensorView& scales,
                           float scale, const char* op);

}  // namespace mla::detail
