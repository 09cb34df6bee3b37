// SPDX-License-Identifier: Apache-2.0
// Fuzz target: mqa_decode and sparse_mqa on the CPU with hostile shapes, dtypes, block tables,
// seq_lens, top-k indices and lengths, split counts and causal flags; sparse_mqa also with the
// DeepSeek-V4 options (SparseOptions: an extra cache of the same or another layout with its own index
// list and lengths, a per-head sink of any shape / dtype, whole-row values).
// Each call runs twice: rows of the cache that the call may read (the request's positions below its
// seq_len through its block table; the valid top-k entries) hold the same random values in both runs,
// every other row holds poison 0xff (NaN) in run 1 and 0x7e (large finite) in run 2, and out / lse
// are filled with two different byte poisons. Contract:
//   * rejected (mla::Error): out and lse bit-identical to their poisons in both runs;
//   * accepted: out and lse identical in both runs (no unreadable row was read), and equal to the
//     float64 oracle over the readable rows (the unit tests' decoder and softmax) within rounding.
#include <cmath>
#include <optional>

#include "fuzz/fuzz_cache.h"
#include "fuzz/fuzz_util.h"
#include "mla/ops.h"
#include "unit/attention_test_util.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

using Setup = PoisonedCache;

Setup make_setup(Input& in) {
  const CacheFormat fmt = static_cast<CacheFormat>(in.byte() % test::kNumPlainFormats);
  const bool narrow = fmt != CacheFormat::fp8_ds_mla && in.byte() % 4 == 0;
  return Setup(allocate_cache(fmt, in.range(1, 5), in.range(1, 5), Device::cpu(),
                              fmt == CacheFormat::fp8 ? 0.005f : 1.0f, narrow ? 320 : 576));
}

Tensor activation(Input& in, std::initializer_list<int64_t> shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  const int64_t n = t.view().numel();
  for (int64_t i = 0; i < n; ++i)
    num::store(static_cast<uint8_t*>(t.data()) + i * dtype_size(dt), dt, static_cast<int8_t>(in.byte()) / 128.0);
  return t;
}

struct Outputs {
  Tensor out, lse;
  TensorView lse_view() const { return lse.defined() ? lse.view() : TensorView{}; }
};

// Runs `call` twice per the contract above (every cache of the call poisoned alike; null entries are
// absent caches); returns whether it was accepted.
template <class F>
bool run_twice(std::initializer_list<Setup*> caches, Outputs& o, const char* op, F&& call) {
  std::vector<uint8_t> out[2], lse[2];
  bool rejected[2];
  uint64_t seed = 3;
  for (Setup* s : caches)
    if (s) s->randomize(seed++);
  for (int run = 0; run < 2; ++run) {
    for (Setup* s : caches)
      if (s) s->prepare(run);
    mla::fuzz::fill(o.out, run ? kPoisonB : kPoisonA);
    if (o.lse.defined()) mla::fuzz::fill(o.lse, run ? kPoisonB : kPoisonA);
    rejected[run] = rejects(call);
    out[run] = bytes_of(o.out);
    if (o.lse.defined()) lse[run] = bytes_of(o.lse);
  }
  FUZZ_REQUIRE(rejected[0] == rejected[1], "%s accepted once and rejected once", op);
  const int64_t bad_out = poison_violation(out[0], kPoisonA, out[1], kPoisonB, rejected[0]);
  const int64_t bad_lse = poison_violation(lse[0], kPoisonA, lse[1], kPoisonB, rejected[0]);
  FUZZ_REQUIRE(bad_out < 0 && bad_lse < 0, "%s (%s): out byte %lld / lse byte %lld breaks the two-poison contract", op,
               rejected[0] ? "rejected" : "accepted", static_cast<long long>(bad_out), static_cast<long long>(bad_lse));
  if (!rejected[0])
    FUZZ_REQUIRE(out[0] == out[1] && lse[0] == lse[1], "%s: the output depends on the poison of unreadable rows", op);
  return !rejected[0];
}

// The readable rows decoded once (the unit tests' decoder): rows[slot], empty when not readable.
std::vector<std::vector<double>> decoded_rows(const Setup& s) {
  std::vector<std::vector<double>> rows(s.readable.size());
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (s.readable[i]) rows[i] = test::decode_row(s.cb.cache, static_cast<int64_t>(i));
  return rows;
}

// One query row of the oracle vs the op's output row (out [dv] and lse at the given pointers); keys
// are rows[slot] for each slot, then extra_rows[slot] for each extra slot; `sink` -inf: none.
void compare_row(const char* op, const double* q, const std::vector<int64_t>& slots,
                 const std::vector<std::vector<double>>& rows, int64_t d_qk, int64_t dv, double scale,
                 const TensorView& out_row, const void* lse_at, DType lse_dt, int64_t row,
                 const std::vector<int64_t>& extra_slots = {}, const std::vector<std::vector<double>>& extra_rows = {},
                 double sink = -INFINITY) {
  std::vector<const double*> k;
  for (int64_t s : slots) k.push_back(rows[s].data());
  for (int64_t s : extra_slots) k.push_back(extra_rows[s].data());
  test::OracleOut ref;
  test::oracle_attend(q, k, d_qk, k, dv, scale, ref, sink);
  double mag = 0;
  for (double v : ref.out) mag = std::max(mag, std::fabs(v));
  for (int64_t x = 0; x < dv; ++x) {
    const double g = num::load(out_row.ptr_at({x}), out_row.dtype);
    FUZZ_REQUIRE(close(g, ref.out[x], std::ldexp(1.0, -7) * std::fabs(ref.out[x]) + 1e-4 * (1 + mag)),
                 "%s: row %lld column %lld is %g, the oracle says %g (%zu keys)", op, static_cast<long long>(row),
                 static_cast<long long>(x), g, ref.out[x], k.size());
  }
  if (lse_at != nullptr) {
    const double g = num::load(lse_at, lse_dt);
    FUZZ_REQUIRE(close(g, ref.lse[0], 1e-4 * (1 + std::fabs(ref.lse[0]))), "%s: row %lld lse %g, the oracle says %g",
                 op, static_cast<long long>(row), g, ref.lse[0]);
  }
}

std::vector<double> row_of(const TensorView& q) {  // [d] any float dtype
  std::vector<double> v(static_cast<std::size_t>(q.size(0)));
  for (int64_t x = 0; x < q.size(0); ++x) v[x] = num::load(q.ptr_at({x}), q.dtype);
  return v;
}

void fuzz_decode(Input& in) {
  Setup s = make_setup(in);
  const KVCache& c = s.cb.cache;
  const int64_t page = c.page_size(), nb = c.num_blocks();
  const int64_t b = in.range(0, 2), s_q = in.range(1, 2), h = in.range(1, 2);
  const int64_t max_blocks = in.range(0, 5);
  std::vector<std::vector<int32_t>> table(static_cast<std::size_t>(b));
  for (auto& row : table)
    for (int64_t j = 0; j < max_blocks; ++j)
      row.push_back(static_cast<int32_t>(in.flag() ? in.range(0, std::max<int64_t>(nb - 1, 0)) : in.hostile(-1, nb)));
  std::vector<int32_t> lens(static_cast<std::size_t>(b));
  for (int32_t& l : lens) l = static_cast<int32_t>(in.flag() ? in.range(0, max_blocks * page) : in.hostile(0, 30));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t p = 0; p < std::min<int64_t>(lens[r], max_blocks * page); ++p) {
      const int32_t id = table[r][p / page];
      if (id >= 0 && id < nb) s.readable[id * page + p % page] = true;
    }
  const DType dt = in.pick({DType::f32, DType::bf16, DType::f64, DType::i32});
  const int64_t dv = in.pick({int64_t{c.d_latent()}, int64_t{64}, int64_t{c.d_latent()} + 1});
  const Tensor q = activation(in, {b, s_q, h, c.d_qk}, dt);
  Outputs o{Tensor::empty({b, s_q, h, dv}, dt == DType::i32 ? DType::f32 : dt),
            in.flag() ? Tensor::empty({b, s_q, h}, in.flag() ? DType::f32 : DType::f64) : Tensor{}};
  const Tensor table_t = b > 0 && max_blocks > 0 ? test::int_tensor_2d(table) : Tensor::empty({b, max_blocks}, DType::i32);
  const Tensor lens_t = test::int_tensor(lens);
  const bool causal = in.flag();
  const int splits = static_cast<int>(in.hostile(0, 8));
  const double scale = in.pick({0.04, 0.1, 0.0, -0.05});
  const bool reference = in.flag();
  const Context ctx{nullptr, reference ? Precision::reference : Precision::fast};
  const bool accepted = run_twice({&s}, o, "mqa_decode", [&] {
    mqa_decode(q.view(), c, table_t.view(), lens_t.view(), o.out.view(), o.lse_view(), scale, causal, {}, ctx, splits);
  });
  if (!accepted) return;
  const std::vector<std::vector<double>> rows = decoded_rows(s);
  for (int64_t r = 0; r < b; ++r) {
    FUZZ_REQUIRE(lens[r] >= 0 && lens[r] <= max_blocks * page, "accepted seq_len %d", lens[r]);
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t visible = causal ? std::max<int64_t>(0, lens[r] - s_q + 1 + i) : lens[r];
      std::vector<int64_t> slots;
      for (int64_t p = 0; p < std::min<int64_t>(visible, lens[r]); ++p) {
        const int32_t id = table[r][p / page];
        FUZZ_REQUIRE(id >= 0 && id < nb, "accepted block id %d", id);
        slots.push_back(id * page + p % page);
      }
      for (int64_t hh = 0; hh < h; ++hh) {
        const std::vector<double> qr = row_of(q.view().select(0, r).select(0, i).select(0, hh));
        compare_row("mqa_decode", qr.data(), slots, rows, c.d_qk, dv, scale, o.out.view().select(0, r).select(0, i).select(0, hh),
                    o.lse.defined() ? o.lse.view().ptr_at({r, i, hh}) : nullptr, o.lse.dtype(), (r * s_q + i) * h + hh);
      }
    }
  }
}

// One index list of sparse_mqa over the cache of `s` (rows T, or T + 1 one time in eight when `hostile`):
// entries mostly in [-1, num_slots), some hostile; optional lengths, mostly in [0, topk]. Marks the
// rows a call may read.
struct IndexList {
  std::vector<std::vector<int32_t>> idx;
  std::vector<int32_t> len;
  bool with_len = false;
  int64_t topk = 0;
  Tensor idx_t, len_t;

  IndexList(Input& in, Setup& s, int64_t t, int64_t max_topk, bool hostile_rows) {
    const int64_t slots_n = s.cb.cache.num_slots();
    const int64_t rows = hostile_rows && in.byte() % 8 == 0 ? t + 1 : t;
    topk = in.range(0, max_topk);
    idx.resize(static_cast<std::size_t>(rows));
    for (auto& row : idx)
      for (int64_t k = 0; k < topk; ++k)
        row.push_back(static_cast<int32_t>(in.flag() ? in.range(-1, std::max<int64_t>(slots_n - 1, 0)) : in.hostile(-1, 40)));
    with_len = in.flag();
    len.resize(static_cast<std::size_t>(rows));
    for (int32_t& l : len) l = static_cast<int32_t>(in.flag() ? in.range(0, topk) : in.hostile(0, 8));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < topk; ++k)
        if (valid(r, k, slots_n)) s.readable[idx[r][k]] = true;
    idx_t = rows > 0 && topk > 0 ? test::int_tensor_2d(idx) : Tensor::empty({rows, topk}, DType::i32);
    len_t = test::int_tensor(len);
  }
  bool valid(int64_t t, int64_t k, int64_t slots_n) const {
    const int32_t v = idx[t][k];
    return v >= 0 && v < slots_n && (!with_len || k < len[t]);
  }
  TensorView lengths() const { return with_len ? len_t.view() : TensorView{}; }
  std::vector<int64_t> slots(int64_t t, int64_t slots_n) const {
    std::vector<int64_t> v;
    for (int64_t k = 0; k < topk; ++k)
      if (valid(t, k, slots_n)) v.push_back(idx[t][k]);
    return v;
  }
};

void fuzz_sparse(Input& in) {
  Setup s = make_setup(in);
  const KVCache& c = s.cb.cache;
  const int64_t slots_n = c.num_slots();
  const int64_t T = in.range(0, 3), h = in.range(1, 2);
  const IndexList main_list(in, s, T, 6, false);
  const DType dt = in.pick({DType::f32, DType::bf16, DType::f64, DType::i32});
  const int64_t dv = in.pick({int64_t{c.d_latent()}, int64_t{64}, int64_t{c.d_latent()} + 1, int64_t{c.d_qk},
                              int64_t{c.d_qk} + 1});
  const Tensor q = activation(in, {T, h, c.d_qk}, dt);
  Outputs o{Tensor::empty({T, h, dv}, dt == DType::i32 ? DType::f32 : dt),
            in.flag() ? Tensor::empty({T, h}, in.flag() ? DType::f32 : DType::f64) : Tensor{}};
  const double scale = in.pick({0.04, 0.1, 0.0, -0.05});
  const Context ctx{nullptr, in.flag() ? Precision::reference : Precision::fast};
  // DeepSeek-V4 options: an extra cache (one time in eight of any layout, else the main one's) with its
  // own index list, a sink (one time in eight of a hostile shape or dtype), whole-row values.
  SparseOptions opts;
  std::optional<Setup> extra;
  std::optional<IndexList> extra_list;
  Tensor sink;
  std::vector<double> sinks(static_cast<std::size_t>(h), -INFINITY);
  if (in.flag()) {
    if (in.flag()) {
      extra.emplace(in.byte() % 8 == 0 ? make_setup(in)
                                       : Setup(allocate_cache(c.format, in.range(1, 5), in.range(1, 5), Device::cpu(),
                                                              c.scale, c.d_qk, c.d_rope)));
      extra_list.emplace(in, *extra, T, 5, true);
      opts.extra = {extra->cb.cache, extra_list->idx_t.view(), extra_list->lengths()};
    }
    if (in.flag()) {
      const bool odd = in.byte() % 8 == 0;
      const DType sdt = odd ? in.pick({DType::f64, DType::bf16, DType::f16}) : DType::f32;
      sink = Tensor::empty({odd && in.flag() ? h + 1 : h}, sdt);
      for (int64_t hh = 0; hh < sink.view().size(0); ++hh) {
        const double v = in.pick({-HUGE_VAL, -2.0, 0.0, 0.75, 3.0, 40.0});
        num::store(static_cast<uint8_t*>(sink.data()) + hh * dtype_size(sdt), sdt, v);
        if (hh < h) sinks[static_cast<std::size_t>(hh)] = v;
      }
      opts.attn_sink = sink.view();
    }
    opts.values_include_rope = in.flag();
  }
  const bool accepted = run_twice({&s, extra ? &*extra : nullptr}, o, "sparse_mqa", [&] {
    sparse_mqa(q.view(), c, main_list.idx_t.view(), main_list.lengths(), o.out.view(), o.lse_view(), scale, opts, ctx);
  });
  if (!accepted) return;
  const std::vector<std::vector<double>> rows = decoded_rows(s);
  const std::vector<std::vector<double>> extra_rows = extra ? decoded_rows(*extra) : std::vector<std::vector<double>>{};
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int64_t> slots = main_list.slots(t, slots_n);
    const std::vector<int64_t> extra_slots =
        extra ? extra_list->slots(t, extra->cb.cache.num_slots()) : std::vector<int64_t>{};
    for (int64_t hh = 0; hh < h; ++hh) {
      const std::vector<double> qr = row_of(q.view().select(0, t).select(0, hh));
      compare_row("sparse_mqa", qr.data(), slots, rows, c.d_qk, dv, scale, o.out.view().select(0, t).select(0, hh),
                  o.lse.defined() ? o.lse.view().ptr_at({t, hh}) : nullptr, o.lse.dtype(), t * h + hh, extra_slots,
                  extra_rows, sinks[static_cast<std::size_t>(hh)]);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  if (in.flag()) fuzz_decode(in);
  else fuzz_sparse(in);
  return 0;
}
