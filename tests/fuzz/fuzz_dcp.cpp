// SPDX-License-Identifier: Apache-2.0
// Fuzz target: decode context parallelism plans (issue 51; mla/dcp.h, make_plan with
// PlannerConfig::dcp). The input gives a group (world size, rank, interleave — also past the 4096
// limit, negative, or not dividing the page), a page size, a context workspace and a batch of
// decodes, extends and prefills. Contract:
//   * the layout functions and make_plan throw mla::Error or nothing; a world past 4096 is refused;
//   * the layout partitions positions: every position has one owner, its index in the owner's shard
//     is the owner's length up to it, and the ranks' lengths sum to the whole;
//   * a plan's decode tokens see exactly their shard of the keys (Plan::dcp_local_lens); its DCP
//     context chunks, one per context chunk, give this rank's share of each prefill's range, and their
//     copy segments put every rank's received rows into the chunk's rows in request order, each row
//     once and none outside;
//   * MlaAttention::workspace_bytes of a DCP layer (rank `rank` of `world`) sizes the plan as made
//     and, after hostile edits of the DCP fields re-sealed with plan_digest, returns or throws
//     mla::Error (it indexed past the chunks).
#include <map>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "mla/dcp.h"
#include "mla/layer.h"
#include "mla/plan.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

// The group a DCP layer names: only its place (rank, world) is used; no collective runs here.
class Place final : public Communicator {
 public:
  Place(int world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "place"; }
  void all_gather(const TensorView&, const TensorView&, const Context&) override { fail(); }
  void all_to_all(const TensorView&, const TensorView&, const Context&) override { fail(); }
  void reduce_scatter(const TensorView&, const TensorView&, const Context&) override { fail(); }
  void synchronize(const Context&) override {}

 private:
  [[noreturn]] static void fail() { throw Error("fuzz_dcp: no collective runs here"); }
  int world_, rank_;
};

constexpr int kHeads = 2;

// A DCP layer of rank r of w (kv_lora_rank 512, rope 64, as DCP needs), one per place.
const MlaAttention& layer_for(int w, int r) {
  static std::map<std::pair<int, int>, std::pair<std::unique_ptr<Place>, std::unique_ptr<MlaAttention>>> layers;
  auto& slot = layers[{w, r}];
  if (!slot.second) {
    if (layers.size() > 256) {
      layers.clear();
      return layer_for(w, r);
    }
    slot.first = std::make_unique<Place>(w, r);
    LayerOptions o;
    o.dims.num_heads = kHeads;
    o.dims.qk_nope_head_dim = o.dims.v_head_dim = 16;
    o.dims.softmax_scale = 0.125;
    o.dtype = DType::f32;
    o.dcp_comm = slot.first.get();
    const Tensor weight = Tensor::zeros({kHeads * 32, 512}, DType::f32);
    slot.second = std::make_unique<MlaAttention>(o, weight);
  }
  return *slot.second;
}

void check_layout(Input& in, const DcpLayout& l) {
  const int64_t w = l.world_size;
  for (int k = 0; k < 8; ++k) {
    const int64_t p = in.range(0, 5000);
    const int owner = dcp_owner(p, l);
    FUZZ_REQUIRE(owner >= 0 && owner < w, "position %lld owned by rank %d of %lld", static_cast<long long>(p), owner,
                 static_cast<long long>(w));
    const DcpLayout lo{l.world_size, owner, l.interleave};
    FUZZ_REQUIRE(dcp_local_position(p, l) == dcp_local_length(p + 1, lo) - 1 &&
                     dcp_local_length(p + 1, lo) == dcp_local_length(p, lo) + 1,
                 "position %lld is not the next of its owner's shard", static_cast<long long>(p));
  }
  if (w > 64) return;
  const int64_t len = in.range(0, 3000);
  int64_t sum = 0;
  for (int r = 0; r < w; ++r) sum += dcp_local_length(len, {l.world_size, r, l.interleave});
  FUZZ_REQUIRE(sum == len, "the shards of %lld positions hold %lld", static_cast<long long>(len),
               static_cast<long long>(sum));
}

void check_plan(const Plan& p, const BatchDesc& b) {
  const DcpLayout& l = p.config.dcp;
  const int64_t w = l.world_size, il = l.interleave, nd = p.split.num_decodes;
  std::size_t k = 0;
  for (int64_t r = 0; r < nd && w > 1; ++r) {  // one rank: no shard lengths
    const int64_t q = int64_t{b.query_start_loc[r + 1]} - b.query_start_loc[r];
    for (int64_t i = 0; i < q; ++i, ++k) {
      FUZZ_REQUIRE(k < p.dcp_local_lens.size(), "dcp_local_lens has %zu entries, decode token %zu needs one",
                   p.dcp_local_lens.size(), k);
      FUZZ_REQUIRE(p.dcp_local_lens[k] == dcp_local_length(b.seq_lens[r] - q + 1 + i, l),
                   "decode token %zu sees %d keys of its shard", k, p.dcp_local_lens[k]);
    }
  }
  FUZZ_REQUIRE(p.dcp_chunks.size() == (w > 1 ? p.context.chunks.size() : 0), "%zu DCP chunks for %zu context chunks",
               p.dcp_chunks.size(), p.context.chunks.size());
  if (w == 1) return;
  for (std::size_t c = 0; c < p.context.chunks.size(); ++c) {
    const ContextChunk& ch = p.context.chunks[c];
    const DcpChunk& dc = p.dcp_chunks[c];
    std::vector<int64_t> recv(static_cast<std::size_t>(w * dc.pad_rows), -1);
    for (int q = 0; q < w; ++q) {
      int64_t at = q * dc.pad_rows;
      for (std::size_t i = 0; i < ch.lens.size(); ++i) {
        if (q == l.rank)
          FUZZ_REQUIRE(dc.local_cu[i] == at - q * dc.pad_rows &&
                           dc.local_starts[i] == dcp_local_length(ch.seq_starts[i], l),
                       "chunk %zu prefill %zu: this rank's share starts wrong", c, i);
        for (int64_t g = ch.seq_starts[i]; g < ch.seq_starts[i] + ch.lens[i]; ++g)
          if (dcp_owner(g, {l.world_size, q, l.interleave}) == q) {
            FUZZ_REQUIRE(at < (q + 1) * dc.pad_rows, "chunk %zu: rank %d has more rows than pad_rows %lld", c, q,
                         static_cast<long long>(dc.pad_rows));
            recv[static_cast<std::size_t>(at++)] = g;
          }
      }
      if (q == l.rank) FUZZ_REQUIRE(dc.local_cu.back() == at - q * dc.pad_rows, "chunk %zu: local_cu ends wrong", c);
    }
    std::vector<int64_t> rows(static_cast<std::size_t>(ch.total), -2);
    for (const DcpSegment& g : dc.segments)
      for (int64_t blk = 0; blk < g.count; ++blk)
        for (int64_t x = 0; x < g.rows; ++x) {
          const int64_t dst = g.dst_row + blk * w * il + x, src = g.src_row + blk * g.rows + x;
          FUZZ_REQUIRE(dst >= 0 && dst < ch.total && src >= 0 && src < w * dc.pad_rows,
                       "chunk %zu: a segment copies row %lld to row %lld", c, static_cast<long long>(src),
                       static_cast<long long>(dst));
          FUZZ_REQUIRE(rows[static_cast<std::size_t>(dst)] == -2, "chunk %zu: row %lld written twice", c,
                       static_cast<long long>(dst));
          rows[static_cast<std::size_t>(dst)] = recv[static_cast<std::size_t>(src)];
        }
    for (std::size_t i = 0; i < ch.lens.size(); ++i)
      for (int64_t j = 0; j < ch.lens[i]; ++j)
        FUZZ_REQUIRE(rows[static_cast<std::size_t>(ch.cu_seq_lens[i] + j)] == ch.seq_starts[i] + j,
                     "chunk %zu: prefill %zu position %lld is not in its row", c, i, static_cast<long long>(j));
  }
}

// A hostile edit of a DCP plan's own fields (and the metadata offsets that point into it).
void edit_dcp(Plan& p, Input& in) {
  const int64_t v = in.hostile(-2, 40);
  switch (in.byte() % 8) {
    case 0: p.dcp_chunks.emplace_back(); break;
    case 1: if (!p.dcp_chunks.empty()) p.dcp_chunks.pop_back(); break;
    case 2: if (!p.dcp_chunks.empty()) p.dcp_chunks[0].pad_rows = v; break;
    case 3:
      if (!p.dcp_chunks.empty()) p.dcp_chunks.back().segments.push_back({v, in.hostile(-2, 40), in.hostile(-1, 8), in.hostile(-1, 4)});
      break;
    case 4: if (!p.dcp_chunks.empty()) p.dcp_chunks[0].local_cu.push_back(static_cast<int32_t>(v)); break;
    case 5: if (!p.metadata.dcp_chunk_cu.empty()) p.metadata.dcp_chunk_cu[0] = v; break;
    case 6: p.metadata.dcp_local_lens = v; break;
    default: if (!p.dcp_local_lens.empty()) p.dcp_local_lens.pop_back(); else p.dcp_local_lens.push_back(1); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  PlannerConfig c;
  c.dims.num_heads = kHeads;
  c.dims.qk_nope_head_dim = c.dims.v_head_dim = 16;
  c.dims.softmax_scale = 0.125;
  c.page_size = in.pick({int64_t{4}, int64_t{16}, int64_t{64}});
  const int w = static_cast<int>(in.byte() % 4 == 0 ? in.hostile(1, 5000) : in.range(1, 8));
  c.dcp = {w, static_cast<int>(in.byte() % 8 == 0 ? in.hostile(-1, w) : in.range(0, std::max<int64_t>(int64_t{w} - 1, 0))),
           static_cast<int>(in.pick({int64_t{1}, int64_t{2}, int64_t{4}, int64_t{16}, int64_t{3}, int64_t{64}}))};
  c.max_model_len = 512;
  c.max_num_seqs = 6;
  c.decode_threshold = in.range(1, 3);
  c.context_workspace_rows = in.pick({int64_t{0}, int64_t{64}, int64_t{256}});
  if (!rejects([&] { validate_dcp_layout(c.dcp, c.page_size); })) {
    FUZZ_REQUIRE(c.dcp.world_size <= 4096, "a group of %d ranks was accepted", c.dcp.world_size);
    check_layout(in, c.dcp);
  }
  // The batch: decodes, extends, prefills (make_plan's order).
  BatchDesc b;
  b.query_start_loc = {0};
  const int64_t nr = in.range(1, 6);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t region = r * 3 / nr;
    const int32_t q = static_cast<int32_t>(region == 0 ? in.range(1, c.decode_threshold) : in.range(1, 40));
    const int32_t ctx = static_cast<int32_t>(region == 2 ? 0 : in.range(0, 400));
    b.query_start_loc.push_back(b.query_start_loc.back() + q);
    b.seq_lens.push_back(std::min<int32_t>(ctx + q, 512));
  }
  Plan p;
  if (rejects([&] { p = make_plan(b, c); })) return 0;
  FUZZ_REQUIRE(w <= 4096, "make_plan accepted a group of %d ranks", w);
  if (w > 64) return 0;  // the simulation below visits every position once per rank
  check_plan(p, b);
  if (w == 1) return 0;
  const MlaAttention& layer = layer_for(w, c.dcp.rank);
  std::size_t need = 0;
  FUZZ_REQUIRE(!rejects([&] { need = layer.workspace_bytes(p); }), "workspace_bytes refused the plan as made");
  const int edits = static_cast<int>(in.range(0, 3));
  for (int e = 0; e < edits; ++e) edit_dcp(p, in);
  p.seal = plan_digest(p);
  (void)rejects([&] { need = layer.workspace_bytes(p); });
  return 0;
}
