// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the step's plan and metadata (issue 51). A valid step of a small CPU layer (dense or
// sparse, every cache format; fuzz_layer_step.h) gets hostile edits of its Plan — vector lengths,
// context / DCP / sparse chunks, decode runs, metadata offsets near 2^62 or negative, metadata words,
// counts — and is then re-sealed with plan_digest (a caller outside the contract) or left as edited;
// workspace_bytes and forward run on it, and upload_step_metadata copies its metadata into staging
// and device buffers of hostile size, offset, overlap and device. Contract:
//   * workspace_bytes and forward throw nothing but mla::Error (no crash, no sanitizer report: the
//     ops never read or write outside their tensors, re-sealed or not);
//   * a plan edited without re-sealing is refused before anything is written (cache and out
//     bit-identical), as is a re-sealed plan whose vectors or metadata offsets do not fit together
//     (workspace_bytes refuses it too);
//   * forward never writes its q / kv_c / k_pe;
//   * upload_step_metadata: refused, staging and device buffer untouched; accepted, the device buffer
//     holds exactly the plan's metadata bytes.
#include "fuzz/fuzz_cache.h"
#include "fuzz/fuzz_layer_step.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

// One hostile edit of a plan; false when the plan has nothing of that kind to edit.
bool edit_plan(Plan& p, Input& in) {
  auto pick = [&in](auto& v) -> decltype(&v[0]) { return v.empty() ? nullptr : &v[in.range(0, v.size() - 1)]; };
  const int64_t big = in.hostile(-4, 64);
  switch (in.byte() % 20) {
    case 0: if (auto* x = pick(p.metadata.chunk_cu)) return *x = big, true; return false;
    case 1: if (auto* x = pick(p.metadata.chunk_starts)) return *x = big, true; return false;
    case 2: p.metadata.prefill_qsl = big; return true;
    case 3: p.metadata.req_id = big; return true;
    case 4: p.metadata.prefill_ids = big; return true;
    case 5: p.metadata.workspace_starts = big; return true;
    case 6: p.metadata.dcp_local_lens = big; return true;
    case 7: if (in.flag()) p.metadata.chunk_cu.push_back(big); else if (!p.metadata.chunk_cu.empty()) p.metadata.chunk_cu.pop_back(); return true;
    case 8: if (auto* x = pick(p.metadata.data)) return *x = static_cast<int32_t>(big), true; return false;
    case 9: p.metadata.data.resize(static_cast<std::size_t>(in.range(0, p.metadata.data.size() + 4))); return true;
    case 10: {  // an extra, missing or copied DCP chunk with hostile rows
      if (in.flag() && !p.dcp_chunks.empty()) { p.dcp_chunks.pop_back(); return true; }
      DcpChunk c;
      c.local_cu.assign(static_cast<std::size_t>(in.range(0, 4)), static_cast<int32_t>(in.range(0, 8)));
      c.local_starts.assign(static_cast<std::size_t>(in.range(0, 3)), 0);
      c.pad_rows = in.hostile(0, 16);
      c.segments.push_back({in.hostile(0, 16), in.hostile(0, 16), in.hostile(0, 8), in.hostile(0, 4)});
      p.dcp_chunks.push_back(c);
      p.metadata.dcp_chunk_cu.push_back(in.hostile(-1, 8));
      p.metadata.dcp_chunk_starts.push_back(in.hostile(-1, 8));
      return true;
    }
    case 11: {  // a context chunk copied, dropped or with its vectors resized
      if (p.context.chunks.empty()) return false;
      const int k = in.byte() % 3;
      if (k == 0) p.context.chunks.push_back(p.context.chunks[0]);
      if (k == 1) p.context.chunks.pop_back();
      if (k == 2) pick(p.context.chunks)->cu_seq_lens.resize(static_cast<std::size_t>(in.range(0, 6)));
      return true;
    }
    case 12: if (auto* c = pick(p.context.chunks)) return c->total = big, true; return false;
    case 13: {
      DecodeRun* r = pick(p.decode.runs);
      if (!r) return false;
      int64_t* f[] = {&r->req_begin, &r->req_end, &r->s_q, &r->token_begin, &r->block_cols};
      *f[in.byte() % 5] = big;
      if (in.flag()) r->num_splits = static_cast<int>(in.hostile(0, 70));
      return true;
    }
    case 14: {
      SparsePrefillChunk* c = pick(p.sparse_chunks);
      if (!c) return false;
      int64_t* f[] = {&c->req_begin, &c->req_end, &c->token_begin, &c->token_end, &c->total_rows};
      *f[in.byte() % 5] = big;
      if (in.flag()) c->workspace_starts.resize(static_cast<std::size_t>(in.range(0, 4)));
      return true;
    }
    case 15: if (auto* x = pick(p.req_id_per_token)) return *x = static_cast<int32_t>(big), true; return false;
    case 16: if (auto* x = pick(p.prefill_query_start_loc)) return *x = static_cast<int32_t>(big), true; return false;
    case 17: p.num_tokens = wrap_add(p.num_tokens, in.hostile(-2, 2)); return true;
    case 18: p.split.num_decodes = wrap_add(p.split.num_decodes, in.hostile(-1, 1)); p.split.num_prefills = static_cast<int64_t>(static_cast<uint64_t>(p.num_reqs) - static_cast<uint64_t>(p.split.num_decodes)); return true;
    default: if (auto* x = pick(p.dcp_local_lens)) return *x = static_cast<int32_t>(big), true; p.dcp_local_lens.push_back(static_cast<int32_t>(big)); return true;
  }
}

// upload_step_metadata with hostile buffers: all or nothing.
void fuzz_upload(const Plan& plan, Input& in) {
  const int64_t n = static_cast<int64_t>(plan.metadata.bytes());
  Tensor pool = Tensor::empty({2 * n + 96}, DType::u8);
  mla::fuzz::fill(pool, kPoisonA);
  auto region = [&](int64_t at, int64_t len) {
    at = std::clamp<int64_t>(at, 0, pool.view().size(0));
    return pool.view().slice(0, at, std::clamp<int64_t>(at + len, at, pool.view().size(0)));
  };
  TensorView staging = region(in.range(0, 2) * 16, n + in.range(-2, 2));
  TensorView device = region(in.pick({int64_t{0}, int64_t{16}, n + 32, n + 48, int64_t{3}}), n + in.range(-2, 2));
  const int kind = in.byte() % 8;
  if (kind == 1) device.device = Device::cuda(static_cast<int>(in.range(0, 1 << 20)));
  if (kind == 2) device.device.type = static_cast<DeviceType>(in.range(0, 9));
  if (kind == 3) device = TensorView(device.data, DType::i32, {std::max<int64_t>(n / 4, 1)});
  if (kind == 4) staging.device = Device::cuda(0);
  const std::vector<uint8_t> before = bytes_of(pool);
  const bool rejected = rejects([&] { upload_step_metadata(plan, staging, device); });
  const std::vector<uint8_t> after = bytes_of(pool);
  if (rejected) {
    FUZZ_REQUIRE(before == after, "upload_step_metadata was refused after writing (kind %d)", kind);
    return;
  }
  FUZZ_REQUIRE(n == 0 || std::memcmp(device.data, plan.metadata.data.data(), static_cast<std::size_t>(n)) == 0,
               "upload_step_metadata accepted but the device buffer does not hold the metadata (kind %d)", kind);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  const Scenario sc = scenario(in);
  const Step* step = step_for(sc);
  if (!step) return 0;
  const StepData& d = step->d;
  const DeviceArgs& a = step->a;
  const MlaAttention& layer = layer_for(d);

  Plan plan = d.plan;
  const int edits = static_cast<int>(in.range(1, 3));
  bool changed = false;  // some edit wrote a field (maybe its old value)
  for (int e = 0; e < edits; ++e) changed |= edit_plan(plan, in);
  const bool resealed = in.byte() % 4 != 0;
  if (resealed) plan.seal = plan_digest(plan);
  // Edited as forward sees it: the digest differs from the seal. Two edits can also keep the digest
  // (FNV over words: any word's change can be cancelled by the next word's); forward then takes the
  // plan as sealed, and only its structural checks stand, as for a re-sealed one.
  const bool edited = changed && plan_digest(plan) != d.plan.seal;

  fuzz_upload(in.flag() ? plan : d.plan, in);

  std::size_t need = 0;
  const bool sized = !rejects([&] { need = layer.workspace_bytes(plan); });
  const std::size_t made = layer.workspace_bytes(d.plan);
  // A re-sealed plan may claim any size: past 64 MiB it gets the made plan's (forward refuses it).
  const std::size_t give = need <= (std::size_t{64} << 20) ? std::max(need, made) : made;
  Tensor ws = Tensor::empty({static_cast<int64_t>(give) + 64}, DType::u8);
  PoisonedCache pc(allocate_cache(sc.format, d.num_blocks, sc.page_size, Device::cpu(), sc.fp8_scale));
  for (std::size_t s = 0; s < pc.readable.size(); ++s) pc.readable[s] = true;
  pc.randomize(7);
  pc.prepare(0);
  mla::fuzz::fill(a.out, kPoisonA);
  const std::vector<uint8_t> cache_before = bytes_of(pc.cb.storage);
  const bool rejected = rejects([&] {
    layer.forward(plan, a.args(), pc.cb.cache, ws.view().slice(0, 0, static_cast<int64_t>(give)));
  });
  FUZZ_REQUIRE(input_bytes(a) == step->inputs, "forward wrote its q / kv_c / k_pe");
  const bool untouched = bytes_of(pc.cb.storage) == cache_before &&
                         poison_violation(bytes_of(a.out), kPoisonA, bytes_of(a.out), kPoisonA, true) < 0;
  if (edited && !resealed) FUZZ_REQUIRE(rejected && untouched, "an edited, unsealed plan was not refused before a write");
  if (!sized) FUZZ_REQUIRE(rejected && untouched, "workspace_bytes refused the plan but forward wrote before refusing it");
  // The plan as made runs (a step of no tokens has empty top-k indices of the wrong width: refused).
  if (!changed) FUZZ_REQUIRE(sized && (!rejected || d.T == 0), "the plan as made was refused");
  return 0;
}
