// SPDX-License-Identifier: Apache-2.0
// Front ends of the cache data-movement ops (semantics §4, §5): validation, then backend dispatch.
// Everything is checked before the backend runs, so a rejected call writes nothing.
#include <algorithm>
#include <limits>
#include <vector>

#include "core/index_view.h"
#include "mla/ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"

namespace mla {
namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

// Shared by the three gathers: requests read rows of `cache` through `block_table` starting at
// logical position seq_starts[b] (0 when absent) and fill `tot` destination rows.
struct GatherArgs {
  const KVCache& cache;
  const TensorView& dst;
  const TensorView& block_table;
  const TensorView& extents;  // cu_seq_lens [B+1] or workspace_starts [B]
  const TensorView& seq_starts;
  bool extents_are_cu;        // true: cu_seq_lens; false: workspace_starts
  const char* extents_name;
};

int64_t num_requests(const GatherArgs& a) {
  return a.extents_are_cu ? a.extents.size(0) - 1 : a.extents.size(0);
}

// Structural checks common to gather_cache, cp_gather_cache and upconvert_ds_mla (dst checked by the caller).
void check_gather_structure(const GatherArgs& a, const char* op) {
  const Device dev = a.cache.data.device;
  detail::check_i32_vector(a.extents, -1, op, a.extents_name);
  if (a.extents_are_cu)
    MLA_CHECK(a.extents.size(0) >= 1, "{}: cu_seq_lens needs B+1 >= 1 entries, got {}", op, a.extents.describe());
  const int64_t b = num_requests(a);
  detail::check_block_table(a.block_table, b, op);
  if (a.seq_starts.defined()) detail::check_i32_vector(a.seq_starts, b, op, "seq_starts");
  detail::check_devices(dev, op,
                         {{a.dst, "dst"}, {a.block_table, "block_table"}, {a.extents, a.extents_name},
                          {a.seq_starts, "seq_starts"}});
}

// Value checks (CPU): extents inside dst, starts >= 0, every block id read inside the cache.
void check_gather_values(const GatherArgs& a, const char* op) {
  const int64_t tot = a.dst.size(0), b = num_requests(a);
  detail::check_cu_seqlens_values(a.extents, tot, op, a.extents_name);
  if (a.seq_starts.defined()) detail::check_values_in_range(a.seq_starts, 0, kI32Max, op, "seq_starts");
  for (int64_t r = 0; r < b; ++r) {
    const int64_t row0 = index_at(a.extents, r);
    const int64_t row1 = a.extents_are_cu || r + 1 < b ? index_at(a.extents, r + 1) : tot;
    const int64_t start = a.seq_starts.defined() ? index_at(a.seq_starts, r) : 0;
    detail::check_block_ids(a.block_table, r, start, start + (row1 - row0), a.cache.page_size(),
                            a.cache.num_blocks(), op);
  }
}

void check_gather(const GatherArgs& a, const char* op) {
  check_gather_structure(a, op);
  if (a.cache.data.device.is_cpu()) check_gather_values(a, op);
}

}  // namespace

void write_cache(const TensorView& kv_c, const TensorView& k_pe, const TensorView& slot_mapping, const KVCache& cache,
                 DsMlaScale ds_scale, const Context& ctx) {
  constexpr const char* op = "write_cache";
  validate_cache(cache, op);
  const Device dev = cache.data.device;
  detail::check_ndim(kv_c, 2, op, "kv_c [T, L]");
  detail::check_activation(kv_c, false, op, "kv_c", detail::CudaActivations::bf16_f16_f32);
  detail::check_size(kv_c, 1, cache.d_latent(), op, "kv_c");
  detail::check_ndim(k_pe, 2, op, "k_pe [T, R]");
  detail::check_activation(k_pe, false, op, "k_pe", detail::CudaActivations::bf16_f16_f32);
  detail::check_size(k_pe, 1, cache.d_rope, op, "k_pe");
  detail::check_size(k_pe, 0, kv_c.size(0), op, "k_pe (same token count as kv_c)");
  detail::check_ndim(slot_mapping, 1, op, "slot_mapping");
  detail::check_index(slot_mapping, op, "slot_mapping");
  detail::check_strides(slot_mapping, false, op, "slot_mapping");
  MLA_CHECK(slot_mapping.size(0) <= kv_c.size(0),
            "{}: slot_mapping names {} tokens but kv_c holds only {} rows ({})", op, slot_mapping.size(0),
            kv_c.size(0), kv_c.describe());
  check_ds_mla_scale(ds_scale, op);
  detail::check_devices(dev, op, {{kv_c, "kv_c"}, {k_pe, "k_pe"}, {slot_mapping, "slot_mapping"}});
  if (dev.is_cpu()) detail::check_slot_values(slot_mapping, cache.num_slots(), op);
  if (slot_mapping.size(0) == 0) return;
  MLA_DISPATCH(dev, write_cache, kv_c, k_pe, slot_mapping, cache, ds_scale, ctx);
}

void gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                  const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  constexpr const char* op = "gather_cache";
  validate_cache(cache, op);
  detail::check_ndim(dst, 2, op, "dst [TOT, D]");
  detail::check_activation(dst, true, op, "dst", detail::CudaActivations::bf16_f16_f32);
  MLA_CHECK(dst.size(1) == cache.d_qk || dst.size(1) == cache.d_latent(),
            "{}: dst rows must hold d_qk ({}) or d_latent ({}) values, got {}", op, cache.d_qk, cache.d_latent(),
            dst.describe());
  check_gather({cache, dst, block_table, cu_seq_lens, seq_starts, true, "cu_seq_lens"}, op);
  if (dst.size(0) == 0) return;
  MLA_DISPATCH(cache.data.device, gather_cache, cache, dst, block_table, cu_seq_lens, seq_starts, ctx);
}

void cp_gather_cache(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                     const TensorView& cu_seq_lens, const TensorView& seq_starts, const Context& ctx) {
  constexpr const char* op = "cp_gather_cache";
  validate_cache(cache, op);
  MLA_CHECK(page_row_bytes(cache.format) == 0,
            "{}: a {} cache keeps its scales in a per-page region, so a row is not one run of bytes to copy; "
            "use gather_cache or upconvert_ds_mla",
            op, to_string(cache.format));
  detail::check_ndim(dst, 2, op, "dst [TOT, E]");
  // Raw bytes: u8 and fp8_e4m3 are the same bytes (fp8 caches may be held as either).
  const bool same_bytes = (dst.dtype == DType::u8 || dst.dtype == DType::fp8_e4m3) &&
                          (cache.data.dtype == DType::u8 || cache.data.dtype == DType::fp8_e4m3);
  MLA_CHECK(dst.dtype == cache.data.dtype || same_bytes, "{}: dst must have the cache's dtype {}, got {}", op,
            to_string(cache.data.dtype), dst.describe());
  detail::check_size(dst, 1, cache.data.size(2), op, "dst (cache row width)");
  detail::check_inner_contiguous(dst, op, "dst");
  detail::check_strides(dst, true, op, "dst");
  check_gather({cache, dst, block_table, cu_seq_lens, seq_starts, true, "cu_seq_lens"}, op);
  if (dst.size(0) == 0) return;
  MLA_DISPATCH(cache.data.device, cp_gather_cache, cache, dst, block_table, cu_seq_lens, seq_starts, ctx);
}

void upconvert_ds_mla(const KVCache& cache, const TensorView& dst, const TensorView& block_table,
                      const TensorView& workspace_starts, const TensorView& seq_starts, const Context& ctx) {
  constexpr const char* op = "upconvert_ds_mla";
  validate_cache(cache, op);
  MLA_CHECK(cache.format == CacheFormat::fp8_ds_mla || cache_format_info(cache.format).record,
            "{}: the cache must be fp8_ds_mla, v4, v41 or v41_fp4, got {}", op, to_string(cache.format));
  detail::check_ndim(dst, 2, op, "dst [TOT, d_qk]");
  detail::check_activation(dst, true, op, "dst", detail::CudaActivations::bf16_f16_f32);
  detail::check_size(dst, 1, cache.d_qk, op, "dst");
  check_gather({cache, dst, block_table, workspace_starts, seq_starts, false, "workspace_starts"}, op);
  if (dst.size(0) == 0 || workspace_starts.size(0) == 0) return;
  MLA_DISPATCH(cache.data.device, upconvert_ds_mla, cache, dst, block_table, workspace_starts, seq_starts, ctx);
}

}  // namespace mla
