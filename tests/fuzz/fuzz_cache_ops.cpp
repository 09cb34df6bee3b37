// SPDX-License-Identifier: Apache-2.0
// Fuzz target: write_cache and gather_cache with hostile formats, scales, shapes, strides, dtypes,
// slots, block tables, cu_seq_lens and starts, on the CPU.
// Contract (each call runs twice, its destination filled with two different poisons first):
//   * rejected (mla::Error): the destination is bit-identical to its poison, in both runs; the
//     source (cache of a gather, inputs of a write) is never written;
//   * accepted: every byte is untouched in both runs or written identically in both; written rows
//     equal the reference (the unit tests' independent row decoder, within the format's rounding),
//     and every other row is untouched: write_cache writes exactly the rows of its valid slots,
//     gather_cache exactly the rows whose logical block lies inside the table.
#include <set>

#include "fuzz/fuzz_util.h"
#include "mla/ops.h"
#include "unit/attention_test_util.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

struct Cache {
  Tensor storage;
  KVCache cache;
};

// A small cache; a bad scale or format byte is kept for the ops to refuse.
Cache make_cache(Input& in, bool randomize) {
  const uint8_t f = in.byte();
  const CacheFormat fmt = static_cast<CacheFormat>(f % 16 < 15 ? f % test::kNumPlainFormats : f);
  const bool narrow = fmt != CacheFormat::fp8_ds_mla && in.byte() % 4 == 0;  // d_qk 320 (not fp8_ds_mla)
  const CacheFormat alloc = is_valid(fmt) ? fmt : CacheFormat::bf16;
  Cache c;
  CacheBuffer cb = allocate_cache(alloc, in.range(1, 4), in.range(1, 5), Device::cpu(), 1.0f, narrow ? 320 : 576);
  c.storage = std::move(cb.storage);
  c.cache = cb.cache;
  c.cache.format = fmt;
  c.cache.scale = in.pick({1.0f, 0.01f, 0.5f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity()});
  if (randomize && is_valid(fmt))
    for (int64_t s = 0; s < c.cache.num_slots(); ++s) test::randomize_row(c.cache, s);
  return c;
}

// [rows, cols] of `dtype` with small exact values, viewed inside a wider buffer when `pad` (row stride
// cols + pad).
struct Act {
  Tensor storage;
  TensorView view;
};
Act activation(Input& in, int64_t rows, int64_t cols, DType dtype) {
  const int64_t pad = in.flag() ? in.range(0, 3) : 0;
  Act a;
  a.storage = Tensor::empty({rows, cols + pad}, dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols + pad; ++c)
      num::store(a.storage.view().ptr_at({r, c}), dtype, static_cast<int8_t>(in.byte()) / 8.0);
  a.view = a.storage.view().slice(1, 0, cols);
  return a;
}

double act_at(const TensorView& t, int64_t r, int64_t c) { return num::load(t.ptr_at({r, c}), t.dtype); }

// Largest expected error of a decoded value for `want` in a row of format f (scale: the per-tensor
// scale or the row's tile scale).
double tolerance(CacheFormat f, bool quantised, double want, double scale) {
  if (!quantised) return f == CacheFormat::f64 ? 0.0 : std::fabs(want) * std::ldexp(1.0, -8);  // exact / bf16 rounding
  return std::fabs(want) * std::ldexp(1.0, -4) + std::fabs(scale) * std::ldexp(1.0, -9) + 1e-30;
}

void fuzz_write(Input& in) {
  Cache c = make_cache(in, false);
  const int64_t T = in.range(0, 6);
  const DType dt = in.pick({DType::bf16, DType::f32, DType::f64, DType::f16, DType::i32});
  const int64_t L = c.cache.d_latent() + (in.byte() % 16 == 0 ? 1 : 0), R = c.cache.d_rope;
  Act kv = activation(in, T, L, dt), pe = activation(in, T + (in.byte() % 16 == 0), R, dt);
  const int64_t n = std::min<int64_t>(T + (in.byte() % 16 == 0), in.range(0, T + 1));
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  for (int64_t& s : slots) s = in.flag() ? in.range(-2, c.cache.num_slots() + 1) : in.hostile(-1, 30);
  const bool i32 = in.flag();
  Tensor slot_t = Tensor::empty({n}, i32 ? DType::i32 : DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    if (i32) slot_t.view().data_as<int32_t>()[i] = static_cast<int32_t>(slots[i]);
    else slot_t.view().data_as<int64_t>()[i] = slots[i];
  }
  const DsMlaScale mode = static_cast<DsMlaScale>(in.byte() % 8 < 7 ? in.byte() % 2 : in.byte());

  const std::vector<uint8_t> kv_before = bytes_of(kv.storage), pe_before = bytes_of(pe.storage);
  std::vector<uint8_t> got[2];
  bool rejected[2];
  for (int run = 0; run < 2; ++run) {
    fill(c.storage, run ? kPoisonB : kPoisonA);
    rejected[run] = rejects([&] { write_cache(kv.view, pe.view, slot_t.view(), c.cache, mode); });
    got[run] = bytes_of(c.storage);
  }
  FUZZ_REQUIRE(rejected[0] == rejected[1], "write_cache accepted once and rejected once");
  FUZZ_REQUIRE(bytes_of(kv.storage) == kv_before && bytes_of(pe.storage) == pe_before, "write_cache wrote its input");
  const int64_t bad = poison_violation(got[0], kPoisonA, got[1], kPoisonB, rejected[0]);
  FUZZ_REQUIRE(bad < 0, "write_cache (%s): cache byte %lld breaks the two-poison contract",
               rejected[0] ? "rejected" : "accepted", static_cast<long long>(bad));
  if (rejected[0]) return;

  // Accepted: the valid slots are distinct and inside the cache; exactly their rows are written.
  std::set<int64_t> written;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = i32 ? static_cast<int32_t>(slots[i]) : slots[i];
    if (s < 0) continue;
    FUZZ_REQUIRE(s < c.cache.num_slots() && written.insert(s).second, "accepted slot %lld", static_cast<long long>(s));
  }
  const int64_t row_bytes = cache_entry_bytes(c.cache.format, c.cache.d_qk, c.cache.d_rope);
  for (int64_t s = 0; s < c.cache.num_slots(); ++s) {
    const auto off = static_cast<std::size_t>(test::row_ptr(c.cache, s) - static_cast<const uint8_t*>(c.storage.data()));
    if (!written.count(s)) {
      for (int64_t b = 0; b < row_bytes; ++b)
        FUZZ_REQUIRE(got[0][off + b] == kPoisonA, "row of slot %lld written without being named", static_cast<long long>(s));
    }
  }
  const CacheFormat f = c.cache.format;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = i32 ? static_cast<int32_t>(slots[i]) : slots[i];
    if (s < 0) continue;
    const std::vector<double> row = test::decode_row(c.cache, s);
    for (int64_t x = 0; x < c.cache.d_qk; ++x) {
      const bool latent = x < c.cache.d_latent();
      double want = latent ? act_at(kv.view, i, x) : act_at(pe.view, i, x - c.cache.d_latent());
      double scale = c.cache.scale;
      bool quantised = f == CacheFormat::fp8 || (f == CacheFormat::fp8_ds_mla && latent);
      if (f == CacheFormat::fp8) want = std::clamp(want, -448.0 * scale, 448.0 * scale);
      if (f == CacheFormat::fp8_ds_mla && latent) {
        float ts;
        std::memcpy(&ts, test::row_ptr(c.cache, s) + 512 + 4 * (x / 128), 4);
        scale = ts;
      }
      FUZZ_REQUIRE(close(row[x], want, tolerance(f, quantised, want, scale)),
                   "write_cache %s: slot %lld column %lld holds %g, expected %g", to_string(f),
                   static_cast<long long>(s), static_cast<long long>(x), row[x], want);
    }
  }
}

void fuzz_gather(Input& in) {
  Cache c = make_cache(in, true);
  const int64_t b = in.range(0, 4);
  const int64_t max_blocks = in.range(0, 4);
  std::vector<std::vector<int32_t>> table(static_cast<std::size_t>(b));
  for (auto& row : table)
    for (int64_t j = 0; j < max_blocks; ++j)
      row.push_back(static_cast<int32_t>(in.flag() ? in.range(-1, c.cache.num_blocks()) : in.hostile(0, 8)));
  const int64_t tot = in.range(0, 12);
  std::vector<int32_t> cu{0};
  for (int64_t r = 0; r < b; ++r) cu.push_back(static_cast<int32_t>(in.flag() ? cu.back() + in.range(0, 5) : in.hostile(0, 12)));
  if (in.byte() % 8 == 0) cu[0] = static_cast<int32_t>(in.hostile(0, 3));
  const bool with_starts = in.flag();
  std::vector<int32_t> starts(static_cast<std::size_t>(b));
  for (int32_t& s : starts) s = static_cast<int32_t>(in.flag() ? in.range(0, 12) : in.hostile(0, 12));
  const DType dt = in.pick({DType::f32, DType::bf16, DType::f64, DType::f16, DType::i32});
  const int64_t width = in.pick({int64_t{c.cache.d_qk}, int64_t{c.cache.d_latent()}, int64_t{c.cache.d_qk} + 1});
  Tensor dst = Tensor::empty({tot, width}, dt);
  const Tensor table_t = b > 0 && max_blocks > 0 ? test::int_tensor_2d(table) : Tensor::empty({b, max_blocks}, DType::i32);
  const Tensor cu_t = test::int_tensor(cu), starts_t = test::int_tensor(starts);
  const TensorView starts_v = with_starts ? starts_t.view() : TensorView{};

  const std::vector<uint8_t> cache_before = bytes_of(c.storage);
  std::vector<uint8_t> got[2];
  bool rejected[2];
  for (int run = 0; run < 2; ++run) {
    fill(dst, run ? kPoisonB : kPoisonA);
    rejected[run] = rejects([&] { gather_cache(c.cache, dst.view(), table_t.view(), cu_t.view(), starts_v); });
    got[run] = bytes_of(dst);
  }
  FUZZ_REQUIRE(rejected[0] == rejected[1], "gather_cache accepted once and rejected once");
  FUZZ_REQUIRE(bytes_of(c.storage) == cache_before, "gather_cache wrote the cache");
  const int64_t bad = poison_violation(got[0], kPoisonA, got[1], kPoisonB, rejected[0]);
  FUZZ_REQUIRE(bad < 0, "gather_cache (%s): dst byte %lld breaks the two-poison contract",
               rejected[0] ? "rejected" : "accepted", static_cast<long long>(bad));
  if (rejected[0]) return;

  // Accepted: dst row cu[r] + i holds logical position start + i of request r when its block lies in
  // the table; every other row is untouched.
  const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(dt);
  std::vector<bool> expect_written(static_cast<std::size_t>(tot), false);
  const int64_t page = c.cache.page_size();
  for (int64_t r = 0; r < b; ++r) {
    FUZZ_REQUIRE(0 <= cu[r] && cu[r] <= cu[r + 1] && cu[r + 1] <= tot, "accepted cu_seq_lens");
    const int64_t start = with_starts ? starts[r] : 0;
    FUZZ_REQUIRE(start >= 0, "accepted a negative start");
    for (int64_t i = 0; i < cu[r + 1] - cu[r]; ++i) {
      const int64_t p = start + i, blk = p / page, row = cu[r] + i;
      if (blk >= max_blocks) continue;
      const int32_t id = table[r][blk];
      FUZZ_REQUIRE(id >= 0 && id < c.cache.num_blocks(), "accepted block id %d", id);
      expect_written[row] = true;
      const std::vector<double> want = test::decode_row(c.cache, id * page + p % page);
      for (int64_t x = 0; x < width; ++x) {
        const double g = num::load(dst.view().ptr_at({row, x}), dt);
        // Relative rounding of the dst dtype, plus f16's subnormal step (2^-24) and float's.
        const double tol = std::fabs(want[x]) * (dt == DType::bf16 || dt == DType::f16 ? std::ldexp(1.0, -7) : 1e-6) +
                           (dt == DType::f16 ? std::ldexp(1.0, -24) : 1e-38);
        FUZZ_REQUIRE(close(g, want[x], tol), "gather_cache: dst[%lld][%lld] = %g, expected %g",
                     static_cast<long long>(row), static_cast<long long>(x), g, want[x]);
      }
    }
  }
  for (int64_t row = 0; row < tot; ++row)
    if (!expect_written[row])
      for (std::size_t k = 0; k < row_bytes; ++k)
        FUZZ_REQUIRE(got[0][row * row_bytes + k] == kPoisonA, "gather_cache wrote dst row %lld, which no request names",
                     static_cast<long long>(row));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  test::reseed(size);
  if (in.flag()) fuzz_write(in);
  else fuzz_gather(in);
  return 0;
}
