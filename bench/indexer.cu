// SPDX-License-Identifier: Apache-2.0
// Lightning-indexer benchmarks (docs/INDEXER.md §5): b = 64 decode requests (s_q 1, h 64, page 64) at
// s_k in {8K, 32K, 128K} (--quick: b 8), each request's pages scattered over one cache written by
// indexer_write_k from random bf16 keys.
//   indexer_logits (decode)  bytes = b * s_k * 132 (the cache bytes; q, weights and the logits written,
//                            b * s_k * 4, are left out: the issue's target is bandwidth on cache bytes)
//                            flops = 2 * b * s_q * s_k * h * 128
//   indexer_logits (prefill) T = 1024 rows over a contiguous K of s_k keys, every row sees every key:
//                            bytes = s_k * 132 + T * s_k * 4 (K read once, logits written);
//                            flops = 2 * T * s_k * h * 128
//   indexer_topk (decode)    the decode rows' logits, k = 2048: bytes = T * s_k * 4 (each logit read
//                            once; the kernel reads a row 4 times, from L2 after the first)
#include <algorithm>
#include <string>
#include <vector>

#include "mla/indexer.h"
#include "registry.h"

namespace mla::bench {
namespace {

Tensor device_i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape, Device dev) {
  Tensor h = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), static_cast<int32_t*>(h.data()));
  return h.to(dev);
}

std::string kilo(int64_t n) { return std::to_string(n / 1024) + "K"; }

// b requests of s_k tokens in a page-64 cache; blocks scattered by a seeded permutation.
struct DecodeSetup {
  int64_t b, s_k, page = 64, h = 64;
  IndexerCacheBuffer cache;
  Tensor block_table, seq_lens, q, weights;
};

DecodeSetup make_setup(BenchContext& ctx, int64_t b, int64_t s_k) {
  const Device dev = Device::cuda(ctx.device());
  DecodeSetup s{b, s_k};
  const int64_t pages = s_k / s.page, blocks = b * pages;
  s.cache = allocate_indexer_cache(blocks, s.page, dev);
  // Write every slot from random keys, in batches of 1M tokens.
  const int64_t total = blocks * s.page, batch = std::min<int64_t>(total, int64_t{1} << 20);
  Tensor k = Tensor::empty({batch, 128}, DType::bf16, dev);
  Tensor slots = Tensor::empty({batch}, DType::i32, dev);
  fill_uniform(k, -4, 4, 91, ctx.stream());
  const Context op = ctx.op_context();
  for (int64_t t0 = 0; t0 < total; t0 += batch) {
    const int64_t n = std::min(batch, total - t0);
    fill_iota_i32(slots.view().slice(0, 0, n), static_cast<int32_t>(t0), 1, ctx.stream());
    indexer_write_k(k.view().slice(0, 0, n), slots.view().slice(0, 0, n), s.cache.cache, IndexerScale::ue8m0, op);
  }
  s.block_table = device_i32(random_permutation(blocks, 92), {b, pages}, dev);
  s.seq_lens = device_i32(std::vector<int32_t>(static_cast<std::size_t>(b), static_cast<int32_t>(s_k)), {b}, dev);
  s.q = Tensor::empty({b, s.h, 128}, DType::fp8_e4m3, dev);
  fill_e4m3_codes(s.q, 93, ctx.stream());
  s.weights = Tensor::empty({b, s.h}, DType::f32, dev);
  fill_uniform(s.weights, -0.01, 0.01, 94, ctx.stream());
  return s;
}

void bench_indexer(BenchContext& ctx, bool topk) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t b = ctx.quick() ? 8 : 64, K = kIndexerTopk;
  for (int64_t s_k : {int64_t{8192}, int64_t{32768}, int64_t{131072}}) {
    DecodeSetup s = make_setup(ctx, b, s_k);
    Tensor logits = Tensor::empty({b, s_k}, DType::f32, dev);
    auto run_logits = [&] {
      indexer_logits_decode(s.q, s.weights, s.cache.cache, s.block_table, s.seq_lens, 1, logits, op);
    };
    const std::string cfg = "b=" + std::to_string(b) + " s_q=1 h=64 s_k=" + kilo(s_k) + " page 64";
    if (!topk) {
      const double ms = ctx.time_ms(run_logits);
      ctx.report("indexer_logits", "decode " + cfg, ms, static_cast<double>(b * s_k) * kIndexerEntryBytes,
                 2.0 * static_cast<double>(b * s_k) * s.h * 128,
                 "bytes = b*s_k*132 (cache bytes); flops = 2*b*s_q*s_k*h*128");
      continue;
    }
    run_logits();
    Tensor out = Tensor::empty({b, K}, DType::i32, dev);
    const double ms = ctx.time_ms([&] { indexer_topk_decode(logits, s.seq_lens, 1, out, op); });
    ctx.report("indexer_topk", "decode k=2048 " + cfg, ms, static_cast<double>(b * s_k) * 4.0, 0,
               "bytes = T*s_k*4 (each logit once)");
  }
  if (topk) return;
  // Prefill: T rows over a contiguous K.
  const int64_t T = ctx.quick() ? 128 : 1024;
  for (int64_t s_k : {int64_t{8192}, int64_t{32768}}) {
    Tensor q = Tensor::empty({T, 64, 128}, DType::fp8_e4m3, dev), k = Tensor::empty({s_k, 128}, DType::fp8_e4m3, dev);
    fill_e4m3_codes(q, 95, ctx.stream());
    fill_e4m3_codes(k, 96, ctx.stream());
    Tensor w = Tensor::empty({T, 64}, DType::f32, dev), ks = Tensor::empty({s_k}, DType::f32, dev);
    fill_uniform(w, -0.01, 0.01, 97, ctx.stream());
    fill_uniform(ks, 1e-3, 2e-3, 98, ctx.stream());
    Tensor starts = device_i32(std::vector<int32_t>(static_cast<std::size_t>(T), 0), {T}, dev);
    Tensor ends = device_i32(std::vector<int32_t>(static_cast<std::size_t>(T), static_cast<int32_t>(s_k)), {T}, dev);
    Tensor logits = Tensor::empty({T, s_k}, DType::f32, dev);
    const double ms = ctx.time_ms([&] { indexer_logits_prefill(q, w, k, ks, starts, ends, logits, op); });
    ctx.report("indexer_logits", "prefill T=" + std::to_string(T) + " h=64 s_k=" + kilo(s_k) + " (all visible)", ms,
               static_cast<double>(s_k) * kIndexerEntryBytes + static_cast<double>(T * s_k) * 4.0,
               2.0 * static_cast<double>(T * s_k) * 64 * 128, "bytes = s_k*132 + T*s_k*4; flops = 2*T*s_k*h*128");
  }
}

}  // namespace

void register_indexer(Registry& r) {
  r.add("indexer_logits", "lightning-indexer fp8 logits: paged decode (b 64, s_k 8K/32K/128K) and prefill",
        [](BenchContext& ctx) { bench_indexer(ctx, false); });
  r.add("indexer_topk", "lightning-indexer top-2048 per decode row (b 64, s_k 8K/32K/128K)",
        [](BenchContext& ctx) { bench_indexer(ctx, true); });
}

}  // namespace mla::bench
