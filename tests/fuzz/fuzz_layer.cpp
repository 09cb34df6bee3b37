// SPDX-License-Identifier: Apache-2.0
// Fuzz target: MlaAttention::forward on small CPU layers of every cache format, dense and sparse
// (fp8_ds_mla sparse in mixed-batch and separate mode), for valid plans with hostile ForwardArgs:
// slots, block-table entries, seq_lens, top-k positions (past seq_len, negative, huge), tensor
// shapes and dtypes, short or misaligned workspace and metadata, edited plans.
// Each step runs twice. Cache rows the step may read (every request's positions below its seq_len
// through its block table, and the rows its slots name) hold the same random finite values in both
// runs; every other row holds poison 0xff (NaN) in run 1 and 0x7e (large finite) in run 2; out holds
// two byte poisons. Contract:
//   * rejected (mla::Error): cache and out bit-identical to their state before the call, both runs;
//   * accepted: cache and out changed identically in both runs (no unreadable row read), out finite
//     for every actual token (every input it may read is finite) and untouched past them.
#include "fuzz/fuzz_cache.h"
#include "fuzz/fuzz_layer_step.h"

using namespace mla;
using namespace mla::fuzz;
using namespace mla::test::layer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  const Scenario sc = scenario(in);
  const Step* step = step_for(sc);
  if (!step) return 0;
  const StepData& d = step->d;
  const DeviceArgs& a = step->a;
  const MlaAttention& layer = layer_for(d);
  const int64_t page = sc.page_size, T = d.T, nr = d.plan.num_reqs;
  PoisonedCache pc(allocate_cache(sc.format, d.num_blocks, page, Device::cpu(), sc.fp8_scale));
  const CacheBuffer& cb = pc.cb;
  const int64_t need = static_cast<int64_t>(layer.workspace_bytes(d.plan));
  Tensor ws = Tensor::empty({need + 64}, DType::u8);

  // Hostile edits.
  Plan plan = d.plan;
  std::vector<int64_t> slots = int64s(a.slots), lens = int64s(a.seq_lens);
  std::vector<std::vector<int32_t>> table = d.bt;
  std::vector<std::vector<int32_t>> topk;
  if (sc.sparse)
    for (int64_t t = 0; t < T; ++t) {
      topk.emplace_back();
      for (int64_t k = 0; k < sc.topk; ++k) topk.back().push_back(d.topk.view().data_as<int32_t>()[t * sc.topk + k]);
    }
  TensorView workspace = ws.view().slice(0, 0, need);
  ForwardArgs args = a.args();
  Tensor metadata;
  int64_t table_cols = d.max_blocks;
  const int edits = static_cast<int>(in.range(0, 3));
  for (int e = 0; e < edits; ++e) {
    const int kind = in.byte() % 10;
    if (std::getenv("FUZZ_VERBOSE")) std::fprintf(stderr, "edit %d\n", kind);
    switch (kind) {
      case 0: if (!slots.empty()) slots[in.range(0, slots.size() - 1)] = in.hostile(-1, d.num_blocks * page + 2); break;
      case 1:
        if (nr > 0 && d.max_blocks > 0)
          table[in.range(0, nr - 1)][in.range(0, d.max_blocks - 1)] = static_cast<int32_t>(in.hostile(-1, d.num_blocks + 1));
        break;
      case 2: { int64_t& l = lens[in.range(0, nr - 1)]; l = wrap_add(l, in.hostile(-2, 2)); break; }
      case 3:
        if (!topk.empty()) topk[in.range(0, T - 1)][in.range(0, sc.topk - 1)] = static_cast<int32_t>(in.hostile(-1, 80));
        break;
      case 4: args.q = args.q.slice(0, 0, std::max<int64_t>(T - 1, 0)); break;
      case 5: {  // misaligned and / or short
        const int64_t from = in.range(0, 17);
        workspace = ws.view().slice(0, from, std::max(from, from + need - in.range(0, 3)));
        break;
      }
      case 6:
        metadata = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(plan.metadata.bytes()) - in.range(0, 4), 1) + 16},
                                 DType::u8);
        if (plan.metadata.bytes() > 0)
          std::memcpy(metadata.data(), plan.metadata.data.data(),
                      std::min<std::size_t>(plan.metadata.bytes(), static_cast<std::size_t>(metadata.nbytes())));
        args.metadata = metadata.view().slice(0, in.range(0, 1) * 16, metadata.view().size(0));
        break;
      case 7: plan.max_prefill_query_len = wrap_add(plan.max_prefill_query_len, in.hostile(-3, 3)); break;
      case 8: table_cols = std::max<int64_t>(table_cols - 1, 0); break;
      default: plan.num_actual_tokens = in.hostile(0, T + 1); break;
    }
  }
  const Tensor slots_t = test::int64_tensor(slots);
  // seq_lens travel as int32: the layer sees an edited length modulo 2^32, and so do the readable rows.
  std::vector<int32_t> lens32;
  for (int64_t& l : lens) {
    lens32.push_back(static_cast<int32_t>(l));
    l = lens32.back();
  }
  const Tensor lens_t = test::int_tensor(lens32), table_t = test::int_tensor_2d(table);
  Tensor topk_t;
  if (sc.sparse) topk_t = test::int_tensor_2d(topk);
  args.slot_mapping = slots_t.view().slice(0, 0, std::min<int64_t>(args.slot_mapping.size(0), T));
  args.block_table = table_t.view().slice(1, 0, table_cols);
  args.seq_lens = lens_t.view();
  if (sc.sparse) args.topk_indices = topk_t.view();

  // Rows the step may read: positions below each request's (edited) seq_len through the (edited)
  // table, and every row a slot names.
  const int64_t num_slots = cb.cache.num_slots();
  std::vector<bool>& readable = pc.readable;
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t p = 0; p < std::min<int64_t>(lens[r], table_cols * page); ++p) {
      const int32_t id = table[r][p / page];
      if (id >= 0 && id < d.num_blocks) readable[id * page + p % page] = true;
    }
  for (int64_t s : slots)
    if (s >= 0 && s < num_slots) readable[s] = true;

  if (std::getenv("FUZZ_VERBOSE")) {  // describe the step (for reproducers)
    std::fprintf(stderr, "%s %s h %d page %lld T %lld t_act %lld edits %d, requests (context, query):", to_string(sc.format),
                 sc.sparse ? "sparse" : "dense", sc.h, static_cast<long long>(page), static_cast<long long>(T),
                 static_cast<long long>(d.t_act), edits);
    for (const Req& r : sc.reqs) std::fprintf(stderr, " (%d, %d)", r.context, r.query);
    std::fprintf(stderr, "\nslots:");
    for (int64_t s : slots) std::fprintf(stderr, " %lld", static_cast<long long>(s));
    std::fprintf(stderr, "\nseq_lens:");
    for (int64_t l : lens) std::fprintf(stderr, " %lld", static_cast<long long>(l));
    std::fprintf(stderr, "\ntable:");
    for (const auto& row : table) {
      std::fprintf(stderr, " [");
      for (int32_t id : row) std::fprintf(stderr, " %d", id);
      std::fprintf(stderr, " ]");
    }
    std::fprintf(stderr, "\n");
  }
  std::vector<uint8_t> before[2], after[2], out[2];
  bool rejected[2];
  pc.randomize(7);
  for (int run = 0; run < 2; ++run) {
    pc.prepare(run);
    mla::fuzz::fill(a.out, run ? kPoisonB : kPoisonA);
    before[run] = bytes_of(cb.storage);
    rejected[run] = rejects([&] { layer.forward(plan, args, cb.cache, workspace); });
    after[run] = bytes_of(cb.storage);
    out[run] = bytes_of(a.out);
  }
  FUZZ_REQUIRE(rejected[0] == rejected[1], "forward accepted once and rejected once");
  FUZZ_REQUIRE(input_bytes(a) == step->inputs, "forward (%s) wrote its q / kv_c / k_pe", rejected[0] ? "rejected" : "accepted");
  const int64_t bad_cache = change_violation(before[0], after[0], before[1], after[1], rejected[0]);
  const int64_t bad_out = poison_violation(out[0], kPoisonA, out[1], kPoisonB, rejected[0]);
  FUZZ_REQUIRE(bad_cache < 0 && bad_out < 0, "forward (%s, %s %s): cache byte %lld / out byte %lld breaks the contract",
               rejected[0] ? "rejected" : "accepted", to_string(sc.format), sc.sparse ? "sparse" : "dense",
               static_cast<long long>(bad_cache), static_cast<long long>(bad_out));
  if (rejected[0]) return 0;
  const int64_t row_bytes = sc.h * sc.V * 4;
  FUZZ_REQUIRE(std::equal(out[0].begin(), out[0].begin() + d.t_act * row_bytes, out[1].begin()),
               "forward (%s %s): out depends on the poison of unreadable rows", to_string(sc.format),
               sc.sparse ? "sparse" : "dense");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t x = 0; x < sc.h * sc.V; ++x) {
      float v;
      std::memcpy(&v, out[0].data() + t * row_bytes + 4 * x, 4);
      if (t < d.t_act)
        FUZZ_REQUIRE(std::isfinite(v), "forward (%s %s): token %lld output %lld is %g", to_string(sc.format),
                     sc.sparse ? "sparse" : "dense", static_cast<long long>(t), static_cast<long long>(x), v);
      else
        FUZZ_REQUIRE(out[0][t * row_bytes + 4 * x] == kPoisonA, "forward wrote padding row %lld", static_cast<long long>(t));
    }
  return 0;
}
