// Attention benchmarks (DESIGN.md §6 formulas):
//   mqa_decode:  b in {64, 128} requests x s_k 4096 keys, s_q 1, h in {16, 128}, page 64, bf16 and
//                fp8_ds_mla caches, split-KV workspace as sized by mqa_decode_workspace_bytes.
//                FLOPs = 2*b*h*s_q*s_k*(576+512); bytes = b*s_k*row_bytes (cache rows once) + q + out
//   mha_prefill: causal self-attention (b x s tokens, s_q = s_k = s) and a non-causal context chunk;
//                h 128 / 16, d_qk 192 (k_pe shared by all heads), d_v 128.
//                FLOPs causal = b*h*(s^2/2)*2*(192+128), non-causal = b*h*s_q*s_k*2*(192+128);
//                bytes = q + k_nope + k_pe + v + out (+ lse), each once
//   sparse_mqa:  T tokens x topk 2048 distinct cache rows (page 64), h 128 / 16, bf16 and fp8_ds_mla.
//                FLOPs = 2*T*h*topk*(576+512); bytes = distinct rows * row_bytes + q + out
#include <string>
#include <vector>

#include "mla/cache.h"
#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr double kScale = 0.0722;  // 1/sqrt(192)

// Cache contents: random bf16 in [-1, 1), or fp8_ds_mla records with finite codes and positive scales.
void fill_cache(const KVCache& c, uint64_t seed, void* stream) {
  if (c.format == CacheFormat::fp8_ds_mla) fill_ds_mla_rows(c.data, seed, stream);
  else if (c.format == CacheFormat::fp8) fill_e4m3_codes(c.data, seed, stream);
  else fill_uniform(c.data, -1, 1, seed, stream);
}

Tensor device_i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape, Device dev) {
  Tensor h = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), static_cast<int32_t*>(h.data()));
  return h.to(dev);
}

void bench_decode(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t s_k = ctx.quick() ? 1024 : 4096, s_q = 1, page = 64, pages = s_k / page;
  const std::vector<int64_t> batches = ctx.quick() ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    for (int64_t b : batches) {
      // Every request owns `pages` scattered blocks of one cache (allocated once per format and batch).
      CacheBuffer cb = allocate_cache(f, b * pages, page, dev);
      fill_cache(cb.cache, 61, ctx.stream());
      Tensor bt = device_i32(random_permutation(b * pages, 62), {b, pages}, dev);
      Tensor sl = device_i32(std::vector<int32_t>(static_cast<std::size_t>(b), static_cast<int32_t>(s_k)), {b}, dev);
      for (int64_t h : {16, 128}) {
        Tensor q = Tensor::empty({b, s_q, h, 576}, DType::bf16, dev);
        fill_uniform(q, -1, 1, 63, ctx.stream());
        Tensor out = Tensor::empty({b, s_q, h, 512}, DType::bf16, dev), lse = Tensor::empty({b, s_q, h}, DType::f32, dev);
        const std::size_t ws_bytes = mqa_decode_workspace_bytes(b, s_q, h, s_k, dev);
        Tensor ws = ws_bytes ? Tensor::empty({static_cast<int64_t>(ws_bytes)}, DType::u8, dev) : Tensor();
        const double ms =
            ctx.time_ms([&] { mqa_decode(q, cb.cache, bt, sl, out, lse, kScale, true, ws.view(), op); });
        const double bytes = static_cast<double>(b) * s_k * static_cast<double>(cache_entry_bytes(f)) +
                             static_cast<double>(b) * s_q * h * (576 + 512) * 2.0;
        const double flops = 2.0 * b * h * s_q * s_k * (576 + 512);
        ctx.report("mqa_decode",
                   "b=" + std::to_string(b) + " s_k=" + std::to_string(s_k) + " h=" + std::to_string(h) + " " +
                       to_string(f) + (ws_bytes ? " split" : ""),
                   ms, bytes, flops, "FLOPs = 2*b*h*s_q*s_k*(576+512); bytes = b*s_k*row_bytes + q + out");
      }
    }
  }
}

void bench_prefill(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  struct Shape {
    int64_t b, sq, sk, h;
    bool causal;
  };
  const int64_t div = ctx.quick() ? 4 : 1;
  for (const Shape s : {Shape{1, 4096 / div, 4096 / div, 128, true}, Shape{4, 2048 / div, 2048 / div, 16, true},
                        Shape{1, 1024 / div, 8192 / div, 128, false}}) {
    const int64_t tq = s.b * s.sq, tk = s.b * s.sk;
    Tensor q = Tensor::empty({tq, s.h, 192}, DType::bf16, dev), kn = Tensor::empty({tk, s.h, 128}, DType::bf16, dev);
    Tensor kp_store = Tensor::empty({tk, 1, 64}, DType::bf16, dev), v = Tensor::empty({tk, s.h, 128}, DType::bf16, dev);
    for (const Tensor* t : {&q, &kn, &kp_store, &v}) fill_uniform(*t, -1, 1, 71, ctx.stream());
    const int64_t kp_shape[] = {tk, s.h, 64}, kp_stride[] = {64, 0, 1};
    const TensorView kp(kp_store.data(), DType::bf16, kp_shape, kp_stride, dev);
    std::vector<int32_t> cq, ck;
    for (int64_t r = 0; r <= s.b; ++r) {
      cq.push_back(static_cast<int32_t>(r * s.sq));
      ck.push_back(static_cast<int32_t>(r * s.sk));
    }
    Tensor cu_q = device_i32(cq, {s.b + 1}, dev), cu_k = device_i32(ck, {s.b + 1}, dev);
    Tensor out = Tensor::empty({tq, s.h, 128}, DType::bf16, dev), lse = Tensor::empty({s.h, tq}, DType::f32, dev);
    const double ms = ctx.time_ms(
        [&] { mha_prefill(q, kn, kp, v, cu_q, cu_k, s.sq, s.sk, out, lse, kScale, s.causal, op); });
    const double pairs = s.causal ? static_cast<double>(s.sq) * s.sq / 2 : static_cast<double>(s.sq) * s.sk;
    const double flops = static_cast<double>(s.b) * s.h * pairs * 2.0 * (192 + 128);
    const double bytes = 2.0 * (tq * s.h * (192 + 128) + tk * s.h * (128 + 128) + tk * 64) + 4.0 * tq * s.h;
    ctx.report("mha_prefill",
               "b=" + std::to_string(s.b) + " s_q=" + std::to_string(s.sq) + " s_k=" + std::to_string(s.sk) +
                   " h=" + std::to_string(s.h) + (s.causal ? " causal" : " non-causal"),
               ms, bytes, flops,
               "FLOPs = b*h*(s^2/2 causal | s_q*s_k)*2*(192+128); bytes = q + k_nope + k_pe + v + out + lse");
  }
}

void bench_sparse(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t topk = 2048, page = 64;
  const std::vector<int64_t> tokens = ctx.quick() ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla}) {
    for (int64_t t : tokens) {
      // T * topk distinct rows (a permutation of the whole cache): every index is read once.
      const int64_t rows = t * topk;
      CacheBuffer cb = allocate_cache(f, rows / page, page, dev);
      fill_cache(cb.cache, 81, ctx.stream());
      Tensor idx = device_i32(random_permutation(rows, 82), {t, topk}, dev);
      for (int64_t h : {16, 128}) {
        Tensor q = Tensor::empty({t, h, 576}, DType::bf16, dev);
        fill_uniform(q, -1, 1, 83, ctx.stream());
        Tensor out = Tensor::empty({t, h, 512}, DType::bf16, dev), lse = Tensor::empty({t, h}, DType::f32, dev);
        const double ms = ctx.time_ms([&] { sparse_mqa(q, cb.cache, idx, {}, out, lse, kScale, op); });
        const double bytes = static_cast<double>(rows) * static_cast<double>(cache_entry_bytes(f)) +
                             static_cast<double>(t) * h * (576 + 512) * 2.0;
        const double flops = 2.0 * t * h * topk * (576 + 512);
        ctx.report("sparse_mqa",
                   "T=" + std::to_string(t) + " topk=2048 h=" + std::to_string(h) + " " + to_string(f), ms, bytes,
                   flops, "FLOPs = 2*T*h*topk*(576+512); bytes = distinct rows*row_bytes + q + out");
      }
    }
  }
}

}  // namespace

void register_attention(Registry& r) {
  r.add("mqa_decode", "absorbed MQA decode over the paged cache (bf16, fp8_ds_mla; h 16 / 128)", bench_decode);
  r.add("mha_prefill", "varlen MHA prefill (causal self-attention, non-causal context chunk)", bench_prefill);
  r.add("sparse_mqa", "sparse MQA over top-2048 cache rows (bf16, fp8_ds_mla)", bench_sparse);
}

}  // namespace mla::bench
