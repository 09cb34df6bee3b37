// SPDX-License-Identifier: Apache-2.0
#include "ops/validate.h"

#include <algorithm>
#include <vector>

#include "core/index_view.h"

namespace mla::detail {

void check_lse(const TensorView& lse, std::initializer_list<int64_t> shape, bool is_output, const char* op,
               const char* arg) {
  check_ndim(lse, static_cast<int>(shape.size()), op, arg);
  MLA_CHECK(lse.dtype == DType::f32 || (lse.dtype == DType::f64 && lse.device.is_cpu()),
            "{}: {} must be f32 (f64 is accepted on the CPU), got {}", op, arg, lse.describe());
  int d = 0;
  for (int64_t s : shape) check_size(lse, d++, s, op, arg);
  check_strides(lse, is_output, op, arg);
}


void check_activation(const TensorView& t, bool is_output, const char* op, const char* arg, CudaActivations cuda) {
  check_defined(t, op, arg);
  if (t.device.is_cuda()) {
    if (cuda == CudaActivations::bf16)
      MLA_CHECK(t.dtype == DType::bf16, "{}: {} must be bf16 on CUDA, got {}", op, arg, t.describe());
    else
      MLA_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f32,
                "{}: {} must be bf16, f16 or f32 on CUDA, got {}", op, arg, t.describe());
  } else {
    check_float(t, op, arg);
  }
  check_inner_contiguous(t, op, arg);
  check_strides(t, is_output, op, arg);
}

void check_same_dtype_on_cuda(const TensorView& t, const TensorView& like, const char* op, const char* arg,
                              const char* like_arg) {
  if (t.device.is_cuda())
    MLA_CHECK(t.dtype == like.dtype, "{}: {} must have {}'s dtype {} on CUDA, got {}", op, arg, like_arg,
              to_string(like.dtype), t.describe());
}

void check_i32_vector(const TensorView& t, int64_t n, const char* op, const char* arg) {
  check_ndim(t, 1, op, arg);
  check_dtype(t, DType::i32, op, arg);
  if (n >= 0) check_size(t, 0, n, op, arg);
  check_strides(t, false, op, arg);
}

void check_block_table(const TensorView& block_table, int64_t min_rows, const char* op) {
  check_ndim(block_table, 2, op, "block_table");
  check_dtype(block_table, DType::i32, op, "block_table");
  MLA_CHECK(block_table.size(0) >= min_rows, "{}: block_table needs at least {} rows (one per request), got {}", op,
            min_rows, block_table.describe());
  check_inner_contiguous(block_table, op, "block_table");
  check_strides(block_table, false, op, "block_table");
}

void check_cache(const KVCache& cache, Device device, const char* op) {
  validate_cache(cache, op);
  check_device(cache.data, device, op, "cache.data");
}

void check_not_record(const KVCache& cache, const char* op) {
  MLA_CHECK(!cache_format_info(cache.format).record,
            "{}: the {} cache format (DeepSeek-V4 records) is read by sparse_mqa with values_include_rope, "
            "gather_cache, cp_gather_cache (v41, v41_fp4) and upconvert_ds_mla and written by write_cache only "
            "(CPU and CUDA); this op takes bf16, fp8, fp8_ds_mla or f64",
            op, to_string(cache.format));
}

void check_values_in_range(const TensorView& t, int64_t lo, int64_t hi, const char* op, const char* arg) {
  for (int64_t i = 0; i < t.size(0); ++i) {
    const int64_t v = index_at(t, i);
    MLA_CHECK(lo <= v && v <= hi, "{}: {}[{}] must lie in [{}, {}], got {}", op, arg, i, lo, hi, v);
  }
}

void check_cu_seqlens_values(const TensorView& cu, int64_t max_total, const char* op, const char* arg) {
  const int64_t n = cu.size(0);
  if (n == 0) return;
  MLA_CHECK(index_at(cu, 0) >= 0, "{}: {}[0] must be >= 0, got {}", op, arg, index_at(cu, 0));
  for (int64_t i = 1; i < n; ++i) {
    const int64_t a = index_at(cu, i - 1), b = index_at(cu, i);
    MLA_CHECK(a <= b, "{}: {} must be non-decreasing, got {}[{}] = {} > {}[{}] = {}", op, arg, arg, i - 1, a, arg, i,
              b);
  }
  MLA_CHECK(index_at(cu, n - 1) <= max_total, "{}: {}[{}] = {} exceeds the {} rows available", op, arg, n - 1,
            index_at(cu, n - 1), max_total);
}

void check_block_ids(const TensorView& block_table, int64_t row, int64_t begin, int64_t end, int64_t page_size,
                     int64_t num_blocks, const char* op) {
  if (end <= begin) return;
  const int64_t first = begin / page_size;
  const int64_t last = std::min((end - 1) / page_size + 1, block_table.size(1));
  for (int64_t j = first; j < last; ++j) {
    const int64_t id = index_at(block_table, row, j);
    MLA_CHECK(0 <= id && id < num_blocks, "{}: block_table[{}][{}] = {} is not a block of the cache (num_blocks {})",
              op, row, j, id, num_blocks);
  }
}

// Slots must address the cache, and a row may be written once per call: two tokens on one slot
// would race in any parallel backend (vLLM never produces this; a caller bug if it happens).
void check_slot_values(const TensorView& slot_mapping, int64_t num_slots, const char* op) {
  std::vector<int64_t> slots;
  slots.reserve(static_cast<std::size_t>(slot_mapping.size(0)));
  for (int64_t t = 0; t < slot_mapping.size(0); ++t) {
    const int64_t s = index_at(slot_mapping, t);
    MLA_CHECK(s < num_slots, "{}: slot_mapping[{}] = {} is outside the cache ({} slots)", op, t, s, num_slots);
    if (s >= 0) slots.push_back(s);
  }
  std::sort(slots.begin(), slots.end());
  const auto dup = std::adjacent_find(slots.begin(), slots.end());
  MLA_CHECK(dup == slots.end(), "{}: slot_mapping names slot {} more than once (a row is written once per call)", op,
            dup == slots.end() ? 0 : *dup);
}

}  // namespace mla::detail
